//! The FUSE tree against the same tree rendered as plain files (needs root and /dev/fuse; CI
//! runs as root): every entry read back byte for byte, writes refused with EROFS, a reload
//! visible at once, other users allowed, and a clean unmount; `nodev,nosuid` in the mount
//! table; the host's PCI devices listed live; listings consistent across a reload; the
//! process that pins a warmed tree, and a warmed file read without a request after its pages
//! were dropped.

mod common;

use std::fs;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mockgpu_agent::render::driver_tree;
use mockgpu_agent::tree::{Kind, Tree};
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
    let m = mockgpu_agent::fuse::mount(&tree, &mnt, None)
        .expect("mount FUSE (needs root and /dev/fuse)");
    assert!(mounted(&mnt));
    let options = mount_options(&mnt);
    for flag in ["ro", "nodev", "nosuid"] {
        assert!(
            options.split(',').any(|o| o == flag),
            "{flag} missing from {options}"
        );
    }

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

/// The per-mount options (`ro,nosuid,nodev,...`) of the mount at `path`, from
/// `/proc/self/mountinfo`.
fn mount_options(path: &Path) -> String {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.to_str().unwrap();
    info.lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .rfind(|f| f.get(4) == Some(&path))
        .and_then(|f| f.get(5).map(|o| o.to_string()))
        .unwrap_or_else(|| panic!("{path} not in /proc/self/mountinfo"))
}

/// Waits up to 5 s for `cond`, checking every 20 ms.
fn wait_for(what: &str, cond: impl FnMut() -> bool) -> Duration {
    common::wait_within(Duration::from_secs(5), what, cond)
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn host_pci_devices_are_listed_live_beside_the_mock_gpus() {
    let (topo, tree) = common::fixed_tree("gb300");
    let dir = tempfile::tempdir().unwrap();
    // A fake sysfs that lacks one of the devices the tree was rendered with.
    let sysfs = dir.path().join("sys");
    let devices = sysfs.join("bus/pci/devices");
    fs::create_dir_all(&devices).unwrap();
    let add = |bdf: &str| {
        std::os::unix::fs::symlink(
            format!("../../../devices/pci0000:00/{bdf}"),
            devices.join(bdf),
        )
        .unwrap()
    };
    add("0000:00:1e.0");
    let mnt = dir.path().join("fs");
    fs::create_dir(&mnt).unwrap();
    let m = mockgpu_agent::fuse::mount(&tree, &mnt, Some(&sysfs)).unwrap();
    let pci = mnt.join("sys/bus/pci/devices");
    let gpus: Vec<String> = topo.gpus.iter().map(|g| g.bus_id.to_string()).collect();
    let mut expected = gpus.clone();
    expected.push("0000:00:1e.0".into());
    expected.sort();
    assert_eq!(
        names(&pci),
        expected,
        "host part read live, not as rendered"
    );
    assert_eq!(
        fs::read_link(pci.join("0000:00:1e.0")).unwrap(),
        Path::new("/sys/devices/pci0000:00/0000:00:1e.0")
    );
    assert!(fs::metadata(pci.join(&gpus[0]).join("vendor")).is_ok());

    // A hot-plugged device appears in a listing and a lookup.
    add("0000:00:1f.0");
    let took = wait_for("new device listed", || {
        names(&pci).contains(&"0000:00:1f.0".to_string())
    });
    assert!(took < Duration::from_secs(3), "listed after {took:?}");
    assert_eq!(
        fs::read_link(pci.join("0000:00:1f.0")).unwrap(),
        Path::new("/sys/devices/pci0000:00/0000:00:1f.0")
    );
    // A removed one disappears from both, once the kernel's short TTL ran out.
    fs::remove_file(devices.join("0000:00:1e.0")).unwrap();
    let took = wait_for("removed device gone", || {
        !names(&pci).contains(&"0000:00:1e.0".to_string())
            && fs::symlink_metadata(pci.join("0000:00:1e.0")).is_err()
    });
    assert!(took < Duration::from_secs(3), "gone after {took:?}");
    let listed = names(&pci);
    assert!(gpus.iter().all(|g| listed.contains(g)), "{listed:?}");
    m.unmount().unwrap();
}

/// Names listed by `getdents64` on `fd` with a buffer of `len` bytes (a few entries a call),
/// calling `between` after the first call.
fn list_in_small_steps(fd: i32, len: usize, mut between: impl FnMut()) -> Vec<String> {
    let mut buf = vec![0u64; len / 8];
    let mut out = Vec::new();
    let mut calls = 0;
    loop {
        // SAFETY: the kernel writes at most `len` bytes into `buf`.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), len) };
        assert!(n >= 0, "getdents64: {}", std::io::Error::last_os_error());
        if n == 0 {
            return out;
        }
        // SAFETY: `buf` holds `n` bytes of `linux_dirent64` records.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n as usize) };
        let mut at = 0;
        while at < bytes.len() {
            let reclen = u16::from_ne_bytes([bytes[at + 16], bytes[at + 17]]) as usize;
            let name = &bytes[at + 19..at + reclen];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap()];
            out.push(String::from_utf8(name.to_vec()).unwrap());
            at += reclen;
        }
        calls += 1;
        if calls == 3 {
            between();
        }
    }
}

#[test]
fn a_reload_between_readdir_calls_neither_skips_nor_repeats_entries() {
    let tree_with = |names: &mut dyn Iterator<Item = String>| {
        let mut t = Tree::new();
        for n in names {
            t.file(&format!("d/{n}"), "x");
        }
        t
    };
    // f00-f29 before; f00-f09 gone and g00-g09 new after; f10-f29 in both.
    let before = tree_with(&mut (0..30).map(|i| format!("f{i:02}")));
    let after = tree_with(
        &mut (10..30)
            .map(|i| format!("f{i:02}"))
            .chain((0..10).map(|i| format!("g{i:02}"))),
    );
    let dir = tempfile::tempdir().unwrap();
    let m = mockgpu_agent::fuse::mount(&before, dir.path(), None).unwrap();
    let d = fs::File::open(dir.path().join("d")).unwrap();
    let listed = list_in_small_steps(d.as_raw_fd(), 48, || {
        m.handle.replace(&after);
    });
    // The reload came after the listing began (three calls returned entries) and before it
    // ended: entries of the new tree were listed. Listings follow inode numbers, which are
    // hashes of the paths, so which old entries came first is not known in advance.
    assert!(listed.iter().any(|l| l.starts_with('g')), "{listed:?}");
    for i in 10..30 {
        let name = format!("f{i:02}");
        let n = listed.iter().filter(|l| **l == name).count();
        assert_eq!(n, 1, "{name} listed {n} times in {listed:?}");
    }
    let mut unique = listed.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), listed.len(), "repeated entries in {listed:?}");
    drop(d);
    m.unmount().unwrap();
}

/// The first `information` file of `tree`.
fn information(tree: &Tree) -> String {
    tree.iter()
        .map(|(p, _)| p.to_string())
        .find(|p| p.ends_with("/information"))
        .unwrap()
}

/// Drops what the kernel caches of `file`'s pages (as `drop_caches` does for every file), then
/// reads it: the read requests that reached `m`'s server, and what was read.
fn drop_and_read(m: &mockgpu_agent::fuse::Mounted, file: &Path) -> (u64, String) {
    let f = fs::File::open(file).unwrap();
    nix::fcntl::posix_fadvise(
        &f,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .unwrap();
    let before = m.handle.reads();
    let read = fs::read_to_string(file).unwrap();
    (m.handle.reads() - before, read)
}

#[test]
fn a_warmed_file_is_read_without_a_request_after_its_cached_pages_are_dropped() {
    let (_, tree) = common::fixed_tree("gb300");
    let path = information(&tree);
    let dir = tempfile::tempdir().unwrap();
    let m = mockgpu_agent::fuse::mount(&tree, dir.path(), None).unwrap();
    let file = dir.path().join(&path);
    m.handle
        .warm(&tree, Path::new(env!("CARGO_BIN_EXE_mockgpu-agent")));
    let served = common::text(&tree, &path);
    assert_eq!(drop_and_read(&m, &file), (0, served), "{path} while pinned");
    // A change still reaches readers: the invalidation drops the pinned pages.
    let mut changed = tree.clone();
    changed.file(&path, "changed\n");
    m.handle.replace(&changed);
    let changed = (1, "changed\n".to_string());
    assert_eq!(drop_and_read(&m, &file), changed, "{path} changed");
    m.handle.unpin();
    assert_eq!(drop_and_read(&m, &file), changed, "{path} unpinned");
    m.unmount().unwrap();
}

#[test]
fn without_the_memory_lock_pin_tree_keeps_the_pages_mapped_and_says_so() {
    use std::io::{BufRead, Write};
    use std::os::unix::process::CommandExt;
    let (_, tree) = common::fixed_tree("gb300");
    let path = information(&tree);
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let m = mockgpu_agent::fuse::mount(&tree, dir.path(), None).unwrap();
    // `pin-tree` as another user (no CAP_IPC_LOCK) whose memory lock limit is 0
    let mut pin_tree = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"));
    pin_tree
        .arg("pin-tree")
        .arg(dir.path())
        .uid(65534)
        .gid(65534)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        pin_tree.pre_exec(|| {
            use nix::sys::resource::{Resource, setrlimit};
            setrlimit(Resource::RLIMIT_MEMLOCK, 0, 0).map_err(std::io::Error::from)
        });
    }
    let mut child = pin_tree.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(format!("f{path}\0\0").as_bytes()).unwrap();
    let mut answer = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut answer)
        .unwrap();
    assert_eq!(answer, "walked 1 1 1 0\n");
    // mapped, not locked: still safe from dropped caches
    let served = common::text(&tree, &path);
    assert_eq!(drop_and_read(&m, &dir.path().join(&path)), (0, served));
    drop(input);
    assert!(child.wait().unwrap().success());
    m.unmount().unwrap();
}

#[test]
fn warm_pins_every_entry_in_a_child_until_unpinned() {
    let (_, tree) = common::fixed_tree("gb300");
    let dir = tempfile::tempdir().unwrap();
    let m = mockgpu_agent::fuse::mount(&tree, dir.path(), None).unwrap();
    let agent = Path::new(env!("CARGO_BIN_EXE_mockgpu-agent"));
    // descriptors of process `pid` on the mounted tree
    let pins = |pid: &str| {
        fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| fs::read_link(e.unwrap().path()).ok())
            .filter(|t| t.starts_with(dir.path()))
            .count()
    };
    // files of the mounted tree that process `pid` maps
    let mapped = |pid: &str| {
        fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap()
            .lines()
            .filter(|l| l.contains(dir.path().to_str().unwrap()))
            .count()
    };
    let exited = |pid: u32| !Path::new(&format!("/proc/{pid}")).exists();
    assert_eq!(m.handle.pinner_id(), None);
    assert_eq!(m.handle.warm(&tree, agent), tree.len() - 1);
    let first = m.handle.pinner_id().expect("a pin-tree process");
    assert_eq!(pins(&first.to_string()), tree.len() - 1);
    // every file that has a page is mapped, once
    let files = tree
        .iter()
        .filter(|(_, e)| matches!(&e.kind, Kind::File(c) if !c.is_empty()))
        .count();
    assert_eq!(mapped(&first.to_string()), files);
    // none of them is this process's own: a killed agent never waits on its own mount
    assert_eq!((pins("self"), mapped("self")), (0, 0));
    // A second walk replaces the first one's process.
    m.handle.warm(&tree, agent);
    let second = m.handle.pinner_id().unwrap();
    assert_ne!(first, second);
    assert!(
        exited(first),
        "the first pin-tree process {first} is still there"
    );
    assert_eq!(pins(&second.to_string()), tree.len() - 1);
    m.handle.unpin();
    assert_eq!(m.handle.pinner_id(), None);
    assert!(exited(second), "pin-tree {second} outlived unpin");
    // A program that is not the agent: nothing is warmed, and nothing breaks.
    assert_eq!(m.handle.warm(&tree, Path::new("/bin/true")), 0);
    assert_eq!(m.handle.pinner_id(), None);
    m.handle.warm(&tree, agent);
    let third = m.handle.pinner_id().unwrap();
    // Unmounting ends it first (else its descriptors would keep the mount busy, and the file
    // system that holds them alive).
    m.unmount().unwrap();
    assert!(exited(third), "pin-tree {third} outlived the unmount");
    assert!(!mounted(dir.path()));
}
