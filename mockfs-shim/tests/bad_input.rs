//! Bad configuration and hostile paths: each behaves as documented and never crashes the program.

mod common;

use common::{GPU, Tree, VERSION, in_namespace, ok, plain};
use std::process::Output;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `cat /proc/driver/nvidia/version` under the shim with `MOCKFS_ROOT=root`.
fn cat_version(t: &Tree, root: &str) -> Output {
    t.cmd("cat")
        .arg("/proc/driver/nvidia/version")
        .env("MOCKFS_ROOT", root)
        .env("MOCKFS_DEBUG", "1")
        .output()
        .unwrap()
}

/// The shim passed everything through: the driver file is missing, real files are readable.
fn assert_pass_through(t: &Tree, root: &str, note: &str) {
    let out = cat_version(t, root);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = stderr(&out);
    assert!(
        err.contains(note) && err.contains("No such file or directory"),
        "{err}"
    );
    let real = t
        .cmd("cat")
        .arg("/etc/hostname")
        .env("MOCKFS_ROOT", root)
        .output()
        .unwrap();
    assert_eq!(ok(real), plain("cat", &["/etc/hostname"]));
}

#[test]
fn unusable_roots_mean_pass_through() {
    let t = Tree::new();
    let parent = t.root().parent().unwrap();
    let name = t.root().file_name().unwrap().to_str().unwrap();
    // Relative, even though it names the tree from the working directory.
    let out = t
        .cmd("cat")
        .arg("/proc/driver/nvidia/version")
        .current_dir(parent)
        .env("MOCKFS_ROOT", name)
        .env("MOCKFS_DEBUG", "1")
        .output()
        .unwrap();
    assert!(
        !out.status.success() && stderr(&out).contains("is not an absolute path"),
        "{}",
        stderr(&out)
    );
    assert_pass_through(&t, "relative/dir", "is not an absolute path");
    assert_pass_through(&t, "/nonexistent/mockgpu/fs", "is missing");
    let empty = tempfile::tempdir().unwrap();
    assert_pass_through(&t, empty.path().to_str().unwrap(), "is empty");
    let file = t.root().join("proc/driver/nvidia/version");
    assert_pass_through(&t, file.to_str().unwrap(), "is missing");
    assert_pass_through(
        &t,
        &format!("/{}", "r".repeat(5000)),
        "is not an absolute path",
    );
}

#[test]
fn unclean_and_symlinked_roots_are_canonicalised() {
    let t = Tree::new();
    let root = t.root().to_str().unwrap();
    assert_eq!(ok(cat_version(&t, &format!("{root}/")).clone()), VERSION);
    assert_eq!(
        ok(cat_version(&t, &format!("/{root}/./proc/..//"))),
        VERSION
    );
    let link_dir = tempfile::tempdir().unwrap();
    let link = link_dir.path().join("fs");
    std::os::unix::fs::symlink(t.root(), &link).unwrap();
    let out = t
        .cmd("sh")
        .args([
            "-c",
            "cat /proc/driver/nvidia/version && cd /proc/driver/nvidia/gpus && /bin/pwd",
        ])
        .env("MOCKFS_ROOT", &link)
        .output()
        .unwrap();
    assert_eq!(ok(out), format!("{VERSION}/proc/driver/nvidia/gpus\n"));
}

#[test]
fn unset_and_empty_root_use_the_default() {
    let t = Tree::new();
    // A private /run with the tree at the default root, so the host's /run is untouched.
    let out = in_namespace(
        &t,
        "mount -t tmpfs mockgpu-test /run && mkdir -p /run/mockgpu/fs && cp -a \"$TREE\"/. /run/mockgpu/fs/ \
         && LD_PRELOAD=$SHIM cat /proc/driver/nvidia/version \
         && MOCKFS_ROOT= LD_PRELOAD=$SHIM cat /proc/driver/nvidia/params",
    );
    assert_eq!(ok(out), format!("{VERSION}EnableMSI: 1\n"));
    // Without the default root present: pass-through.
    let out = in_namespace(
        &t,
        "mount -t tmpfs mockgpu-test /run && MOCKFS_DEBUG=1 LD_PRELOAD=$SHIM cat /etc/hostname",
    );
    let err = stderr(&out);
    assert_eq!(ok(out), plain("cat", &["/etc/hostname"]));
    assert!(
        err.contains("mock root '/run/mockgpu/fs' is missing"),
        "{err}"
    );
}

#[test]
fn malformed_prefixes_are_ignored_with_a_note() {
    let t = Tree::new();
    let long = format!("/{}", "x".repeat(300));
    let list = format!(":relative/dir:/a/../b:/://./:/dev/*:{long}:/proc/driver/nvidia/gpus:");
    let run = |path: &str, debug: bool| {
        let mut c = t.cmd("cat");
        c.arg(path).env("MOCKFS_PREFIXES", &list);
        if debug {
            c.env("MOCKFS_DEBUG", "1");
        }
        c.output().unwrap()
    };
    let info = format!("/proc/driver/nvidia/gpus/{GPU}/information");
    let out = run(&info, true);
    let err = stderr(&out);
    assert!(ok(out).starts_with("Model:"));
    for why in [
        "ignoring prefix '': empty",
        "ignoring prefix 'relative/dir': not absolute",
        "ignoring prefix '/a/../b': contains '..'",
        "ignoring prefix '/': is '/'",
        "ignoring prefix '//./': is '/'",
        "ignoring prefix '/dev/*': '*' must follow a name",
        "too long",
        "prefix /proc/driver/nvidia/gpus",
    ] {
        assert!(err.contains(why), "missing note {why:?} in:\n{err}");
    }
    // Silent without MOCKFS_DEBUG.
    let out = run(&info, false);
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
    // The list replaced the defaults, the prefixes file included.
    assert!(!run("/proc/driver/nvidia/version", false).status.success());
    assert!(
        !run(&format!("/sys/devices/pci0008:06/{GPU}/vendor"), false)
            .status
            .success()
    );
    // Nothing valid at all: pass-through.
    let out = t
        .cmd("cat")
        .arg("/etc/hostname")
        .env("MOCKFS_PREFIXES", "rel::/")
        .output()
        .unwrap();
    assert_eq!(ok(out), plain("cat", &["/etc/hostname"]));
}

#[test]
fn overlong_paths_get_enametoolong() {
    let t = Tree::new();
    let long = "x".repeat(5000);
    for path in [
        format!("/proc/driver/nvidia/{long}"),
        format!("/tmp/{long}"),
        format!("proc/driver/nvidia/{long}"),
    ] {
        let out = t.cmd("cat").arg(&path).current_dir("/").output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("File name too long"),
            "{}",
            stderr(&out)
        );
    }
    // Long but within the limit: redirected (past the first, small buffer the shim tries).
    let deep = format!("proc/driver/nvidia/{}f", "deep/".repeat(200));
    t.file(&deep, "deep\n");
    assert_eq!(t.run("cat", &[&format!("/{deep}")]), "deep\n");
    assert_eq!(
        t.run(
            "sh",
            &[
                "-c",
                &format!(
                    "cd /proc/driver/nvidia/{} && cat ../deep/f",
                    "deep/".repeat(200)
                )
            ]
        ),
        "deep\n"
    );
    // Under the limit but too long once the mock root is prepended: refused, not truncated.
    let near = format!("/proc/driver/nvidia/{}", "y".repeat(4060));
    let out = t.python(&format!(
        "import os, errno\n\
         for p in ['{near}', '/{long}', '/proc/driver/nvidia/' + 'a/' * 3000]:\n\
         \x20   try: os.stat(p)\n\
         \x20   except OSError as e: print(errno.errorcode[e.errno])\n\
         print(open('/proc/driver/nvidia/version').read() == {VERSION:?})"
    ));
    assert_eq!(out, "ENAMETOOLONG\nENAMETOOLONG\nENAMETOOLONG\nTrue\n");
}

#[test]
fn dotdot_cannot_escape_into_or_out_of_the_mock_root() {
    let t = Tree::new();
    // Decoys inside the mock root that an escaping rewrite would hit.
    t.file("etc/passwd", "DECOY\n");
    t.file("proc/driver/etc/passwd", "DECOY\n");
    let real = plain("cat", &["/etc/passwd"]);
    for path in [
        "/proc/driver/nvidia/../../../etc/passwd",
        "/proc/driver/nvidia/gpus/../../../../../../../../etc/passwd",
        "/sys/bus/pci/devices/../../../../etc/passwd",
        "/proc/driver/nvidia/../../../etc/./passwd",
    ] {
        assert_eq!(t.run("cat", &[path]), real, "{path}");
    }
    let out = t.run(
        "sh",
        &[
            "-c",
            "cd /proc/driver/nvidia/gpus && cat ../../../../etc/passwd",
        ],
    );
    assert_eq!(out, real);
    // Climbing back into a prefix stays in the mock.
    assert_eq!(
        t.run("cat", &["/proc/driver/nvidia/gpus/../../nvidia/version"]),
        VERSION
    );
    // `..` that does not leave the driver tree: the mock's own file, not the real /proc/driver one.
    let out = t
        .cmd("cat")
        .arg("/proc/driver/nvidia/../etc/passwd")
        .output()
        .unwrap();
    assert!(!out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("DECOY"));
}
