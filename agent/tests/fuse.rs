//! The FUSE tree against the same tree rendered as plain files (needs root and /dev/fuse; CI
//! runs as root): every entry read back byte for byte, writes refused with EROFS, a reload
//! visible at once, other users allowed, and a clean unmount.

mod common;

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use mockgpu_agent::render::driver_tree;
use mockgpu_api::{NodeTopology, Profile};

/// Walks `root` and returns (relative path, description) pairs, contents included.
fn snapshot(root: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for path in names {
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let md = fs::symlink_metadata(&path).unwrap();
            let perm = md.permissions().mode() & 0o7777;
            let desc = if md.is_dir() {
                stack.push(path.clone());
                format!("dir {perm:o}")
            } else if md.file_type().is_symlink() {
                format!("link {}", fs::read_link(&path).unwrap().display())
            } else if md.file_type().is_char_device() {
                format!(
                    "chr {perm:o} {}:{}",
                    libc::major(md.rdev()),
                    libc::minor(md.rdev())
                )
            } else {
                let content = if perm & 0o444 != 0 {
                    fs::read(&path).unwrap()
                } else {
                    Vec::new()
                };
                if perm & 0o444 != 0 {
                    assert_eq!(md.len(), content.len() as u64, "st_size of {rel}");
                }
                format!("file {perm:o} {} {:?}", md.len(), content)
            };
            out.push((rel, desc));
        }
    }
    out.sort();
    out
}

fn mounted(path: &Path) -> bool {
    mockgpu_agent::mounts::is_mount_point(path)
}

#[test]
fn fuse_tree_matches_render_refuses_writes_and_reloads() {
    let (_, tree) = common::fixed_tree("gb300");
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let plain = dir.path().join("plain");
    let mnt = dir.path().join("fs");
    fs::create_dir(&mnt).unwrap();
    mockgpu_agent::output::write_tree(&tree, &plain).unwrap();
    let m = mockgpu_agent::fs::mount(&tree, &mnt).expect("mount FUSE (needs root and /dev/fuse)");
    assert!(mounted(&mnt));

    let (fuse_view, plain_view) = (snapshot(&mnt), snapshot(&plain));
    assert_eq!(fuse_view.len(), tree.len() - 1);
    for (f, p) in fuse_view.iter().zip(&plain_view) {
        assert!(
            f == p,
            "FUSE {} != render {}",
            &format!("{f:?}")[..160.min(format!("{f:?}").len())],
            &format!("{p:?}")[..160.min(format!("{p:?}").len())]
        );
    }
    assert_eq!(fuse_view.len(), plain_view.len());

    // Writes of every kind fail with EROFS.
    let info = mnt.join("proc/driver/nvidia/gpus/0008:06:00.0/information");
    let erofs = |r: std::io::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
    };
    erofs(
        fs::OpenOptions::new().write(true).open(&info).map(drop),
        "open for writing",
    );
    erofs(fs::write(mnt.join("proc/new"), "x"), "create");
    erofs(fs::create_dir(mnt.join("proc/d")), "mkdir");
    erofs(fs::remove_file(&info), "unlink");
    erofs(fs::rename(&info, mnt.join("proc/x")), "rename");
    erofs(
        fs::set_permissions(&info, fs::Permissions::from_mode(0o777)),
        "chmod",
    );
    erofs(
        std::os::unix::fs::symlink("x", mnt.join("proc/l")),
        "symlink",
    );

    // Another user reads (allow_other) but cannot read a write-only file.
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(args)
            .output()
            .unwrap()
    };
    let out = as_nobody(&["cat", info.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Model: \t\t NVIDIA GB300\n"));
    let suspend = mnt.join("proc/driver/nvidia/suspend");
    assert!(
        !as_nobody(&["cat", suspend.to_str().unwrap()])
            .status
            .success()
    );

    // A reload shows at once, cached pages included.
    let before = fs::read_to_string(&info).unwrap();
    let p = Profile::from_yaml(
        "base: gb300\ngpus: 2\nmodel: NVIDIA GB300 NVL\n",
        "reload.yaml",
    )
    .unwrap();
    let host = common::fixed_host();
    let topo = NodeTopology::build(&p, "node-0", &host).unwrap();
    let changed = m.handle.replace(&driver_tree(&topo, &host));
    assert!(changed > 0);
    let after = fs::read_to_string(&info).unwrap();
    assert_ne!(before, after);
    assert!(
        after.starts_with("Model: \t\t NVIDIA GB300 NVL\n"),
        "{after}"
    );
    assert_eq!(
        fs::read_dir(mnt.join("proc/driver/nvidia/gpus"))
            .unwrap()
            .count(),
        2
    );
    let gone = mnt.join("proc/driver/nvidia/gpus/0018:06:00.0/information");
    assert_eq!(fs::metadata(gone).unwrap_err().kind(), ErrorKind::NotFound);

    // A busy mount (an open directory) is detached lazily rather than left behind.
    let busy = fs::File::open(mnt.join("proc")).unwrap();
    m.unmount().unwrap();
    assert!(!mounted(&mnt));
    drop(busy);
}
