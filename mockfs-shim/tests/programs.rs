//! Real programs under the shim against a hand-made mock tree.

mod common;

use common::{GPU, HOST_DEVICE, HOST_VENDOR, Tree, VERSION, ok, plain};

#[test]
fn cat_reads_redirected_files_and_leaves_others_alone() {
    let t = Tree::new();
    assert_eq!(t.run("cat", &["/proc/driver/nvidia/version"]), VERSION);
    assert_eq!(
        t.run("cat", &["//proc/./driver//nvidia/gpus/../version"]),
        VERSION
    );
    assert_eq!(
        t.run("cat", &["/sys/module/nvidia/version"]),
        "580.173.02\n"
    );
    assert_eq!(
        t.run("cat", &[&format!("/sys/bus/pci/devices/{GPU}/vendor")]),
        "0x10de\n"
    );
    assert_eq!(
        t.run(
            "cat",
            &[&format!("/sys/bus/pci/drivers/nvidia/{GPU}/local_cpulist")]
        ),
        "0-1\n"
    );
    // Outside the prefixes: the real files.
    assert_eq!(
        t.run("cat", &["/etc/hostname"]),
        plain("cat", &["/etc/hostname"])
    );
    assert_eq!(t.run("cat", &["/proc/self/comm"]), "cat\n");
    // The host's device, seen through the merged listing's absolute link.
    assert_eq!(
        t.run(
            "cat",
            &[&format!("/sys/bus/pci/devices/{HOST_DEVICE}/vendor")]
        ),
        HOST_VENDOR
    );
}

#[test]
fn ls_and_find_list_the_mock_tree() {
    let t = Tree::new();
    assert_eq!(
        t.run("ls", &["/proc/driver/nvidia"]),
        "gpus\nparams\nversion\n"
    );
    assert_eq!(
        t.run("ls", &["/proc/driver/nvidia/gpus"]),
        format!("{GPU}\n")
    );
    let long = t.run("ls", &["-l", "/proc/driver/nvidia/"]);
    assert!(
        long.contains(" version\n") && !long.contains("cannot"),
        "{long}"
    );
    // The merged listing: the host's device beside the mock GPU.
    assert_eq!(
        t.run("ls", &["/sys/bus/pci/devices"]),
        format!("{HOST_DEVICE}\n{GPU}\n")
    );
    assert_eq!(
        t.run("find", &["/proc/driver/nvidia", "-type", "f"])
            .lines()
            .collect::<std::collections::BTreeSet<_>>(),
        [
            "/proc/driver/nvidia/version".to_string(),
            "/proc/driver/nvidia/params".to_string(),
            format!("/proc/driver/nvidia/gpus/{GPU}/information"),
        ]
        .iter()
        .map(String::as_str)
        .collect()
    );
    // `find` walks with openat/fstatat relative to directory descriptors.
    assert_eq!(
        t.run("find", &["/sys/bus/pci/devices/", "-name", GPU]),
        format!("/sys/bus/pci/devices/{GPU}\n")
    );
    // Outside: identical to a run without the shim.
    assert_eq!(
        t.run("ls", &["/proc/driver"]),
        plain("ls", &["/proc/driver"])
    );
    assert_eq!(
        t.run("find", &["/etc/apt", "-maxdepth", "1"]),
        plain("find", &["/etc/apt", "-maxdepth", "1"])
    );
}

#[test]
fn stat_and_readlink_see_mock_entries() {
    let t = Tree::new();
    assert_eq!(
        t.run("stat", &["-c", "%s %F", "/proc/driver/nvidia/version"]),
        format!("{} regular file\n", VERSION.len())
    );
    assert_eq!(
        t.run("stat", &["-c", "%F", "/proc/driver/nvidia/gpus"]),
        "directory\n"
    );
    assert_eq!(
        t.run(
            "stat",
            &["-L", "-c", "%F", &format!("/sys/bus/pci/devices/{GPU}")]
        ),
        "directory\n"
    );
    assert_eq!(
        t.run("readlink", &[&format!("/sys/bus/pci/devices/{GPU}")]),
        format!("../../../devices/pci0008:06/{GPU}\n")
    );
    // Canonicalisation follows the mock link and reports the logical path, not the mock root.
    assert_eq!(
        t.run("readlink", &["-f", &format!("/sys/bus/pci/devices/{GPU}")]),
        format!("/sys/devices/pci0008:06/{GPU}\n")
    );
    assert_eq!(
        t.run("realpath", &["/proc/driver/nvidia/gpus/"]),
        "/proc/driver/nvidia/gpus\n"
    );
}

#[test]
fn dev_nodes_only_with_mockfs_dev() {
    let t = Tree::new();
    let without = t
        .cmd("stat")
        .args(["-c", "%s", "/dev/nvidia0"])
        .output()
        .unwrap();
    assert_eq!(
        without.status.success(),
        std::path::Path::new("/dev/nvidia0").exists()
    );
    let with = ok(t
        .cmd("stat")
        .args(["-c", "%F", "/dev/nvidia0"])
        .env("MOCKFS_DEV", "1")
        .output()
        .unwrap());
    assert_eq!(with, "regular empty file\n");
    // Name-prefix rule: /dev/nvidia* covers nvidia0, nvidiactl…, but /dev/null stays real.
    let null = ok(t
        .cmd("stat")
        .args(["-c", "%F", "/dev/null"])
        .env("MOCKFS_DEV", "1")
        .output()
        .unwrap());
    assert_eq!(null, "character special file\n");
}

#[test]
fn relative_paths_through_cwd() {
    let t = Tree::new();
    let script = "cd /proc/driver/nvidia && cat version && cat gpus/*/information | head -1 && \
                  cat ../nvidia/params && pwd && /bin/pwd && cd gpus && cat ../version && \
                  cd /proc/driver && cat nvidia/params && cd / && cat proc/driver/nvidia/params";
    let out = t.run("sh", &["-c", script]);
    assert_eq!(
        out,
        format!(
            "{VERSION}Model: \t\t NVIDIA GB300\nEnableMSI: 1\n/proc/driver/nvidia\n/proc/driver/nvidia\n{VERSION}EnableMSI: 1\nEnableMSI: 1\n"
        )
    );
    // Climbing out of a redirected working directory lands on the real parent.
    let up = t.run(
        "sh",
        &[
            "-c",
            "cd /proc/driver/nvidia && ls .. && cd ../.. && pwd && /bin/pwd",
        ],
    );
    assert_eq!(
        up,
        format!("{}/proc\n/proc\n", plain("ls", &["/proc/driver"]))
    );
}

#[test]
fn python_listdir_open_and_walk() {
    let t = Tree::new();
    let out = t.python(
        "import os, glob\n\
         print(sorted(os.listdir('/proc/driver/nvidia')))\n\
         print(open('/proc/driver/nvidia/gpus/0008:06:00.0/information').readline().split()[-1])\n\
         print(os.path.isdir('/sys/bus/pci/drivers/nvidia/0008:06:00.0'))\n\
         print(os.path.realpath('/sys/bus/pci/devices/0008:06:00.0'))\n\
         print([r for r, d, f in os.walk('/proc/driver/nvidia')])\n\
         print(glob.glob('/proc/driver/nvidia/gpus/*/information'))\n\
         print(os.path.exists('/proc/driver/nvidia2'), os.path.exists('/etc/hostname'))",
    );
    assert_eq!(
        out,
        "['gpus', 'params', 'version']\nGB300\nTrue\n/sys/devices/pci0008:06/0008:06:00.0\n\
         ['/proc/driver/nvidia', '/proc/driver/nvidia/gpus', '/proc/driver/nvidia/gpus/0008:06:00.0']\n\
         ['/proc/driver/nvidia/gpus/0008:06:00.0/information']\nFalse True\n"
    );
}

/// Calls glibc entry points directly (ctypes resolves them through the global scope, so the
/// preloaded hooks win), including the legacy and the internally-resolving ones.
#[test]
fn every_entry_point_is_redirected() {
    let t = Tree::new();
    let out = t.python(include_str!("probe.py"));
    let expected = "open ok\nopen64 ok\n__open_2 ok\n__open64_2 ok\nopenat ok\nopenat64 ok\n__openat_2 ok\n\
                    __openat64_2 ok\nopenat-rootfd ok\nfopen ok\nfopen64 ok\nfreopen ok\nopendir ok\n\
                    scandir 5\nscandir64 5\nstat ok\nlstat ok\nstat64 ok\nlstat64 ok\nfstatat ok\n\
                    fstatat64 ok\n__xstat ok\n__lxstat ok\n__xstat64 ok\n__lxstat64 ok\n__fxstatat ok\n\
                    __fxstatat64 ok\nstatx ok\naccess ok\neuidaccess ok\neaccess ok\nfaccessat ok\n\
                    readlink ../../../devices/pci0008:06/0008:06:00.0\nreadlinkat ../../../devices/pci0008:06/0008:06:00.0\n\
                    realpath /sys/devices/pci0008:06/0008:06:00.0\ncanonicalize_file_name /proc/driver/nvidia/gpus\n\
                    __realpath_chk /proc/driver/nvidia\nnftw 6\nftw 6\nglob /proc/driver/nvidia/params /proc/driver/nvidia/version\n\
                    chdir+getcwd /proc/driver/nvidia\nget_current_dir_name /proc/driver/nvidia\n\
                    errno kept 1234\nmissing ENOENT\noutside /etc/hostname ok\n";
    assert_eq!(out, expected);
}

#[test]
fn threads_and_fork() {
    let t = Tree::new();
    let out = t.python(
        "import os, threading\n\
         bad = []\n\
         def work():\n\
         \x20   for _ in range(2000):\n\
         \x20       if open('/proc/driver/nvidia/version').read()[:4] != 'NVRM': bad.append(1)\n\
         \x20       if not os.path.exists('/etc/hostname'): bad.append(2)\n\
         \x20       if os.path.exists('/proc/driver/nvidia/none'): bad.append(3)\n\
         ts = [threading.Thread(target=work) for _ in range(8)]\n\
         [t.start() for t in ts]; [t.join() for t in ts]\n\
         pid = os.fork()\n\
         if pid == 0:\n\
         \x20   os._exit(0 if open('/proc/driver/nvidia/params').read() == 'EnableMSI: 1\\n' else 7)\n\
         print(len(bad), os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))",
    );
    assert_eq!(out, "0 0\n");
}

/// Work on unrelated paths gives byte-identical results with and without the shim.
#[test]
fn unrelated_work_is_identical() {
    let t = Tree::new();
    let scripts = [
        "find /usr/lib /etc -maxdepth 3 -printf '%p %y %s %l\\n' 2>/dev/null | sort",
        "ls -laR /etc/apt /usr/share/doc/coreutils 2>&1",
        "du -s /usr/share/doc; tar -cf - /usr/share/doc/coreutils 2>/dev/null | md5sum",
        "cd /usr/share && ls doc/../doc | wc -l && cd - >/dev/null && readlink -f /usr/bin/../lib/./os-release",
        "stat -c '%n %s %F' /etc/hostname /usr/bin /dev/null /proc/cpuinfo /sys/kernel",
    ];
    for script in scripts {
        assert_eq!(
            t.run("sh", &["-c", script]),
            plain("sh", &["-c", script]),
            "{script}"
        );
    }
    let py = "import os\nprint(sum(len(f) for _, _, f in os.walk('/usr/lib/python3')))\nprint(sorted(os.listdir('/proc/driver')))";
    assert_eq!(
        t.python(py),
        ok(std::process::Command::new(common::python())
            .args(["-c", py])
            .output()
            .unwrap())
    );
}
