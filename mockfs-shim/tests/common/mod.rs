//! Shared helpers: locate the built `libmockfs.so`, build mock trees, run programs under the shim.
#![allow(dead_code)] // each test binary uses a different subset

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub mod cargo;
pub mod elf;

/// The target triple these tests were built for (from build.rs): the library under test is built
/// for it, so that an aarch64 test run tests an aarch64 `libmockfs.so`.
pub const TARGET: &str = env!("MOCKFS_SHIM_TARGET");

/// The release `libmockfs.so`, built once per test binary. Cargo does not build a cdylib for
/// integration tests, so the tests build it themselves, into their own target directory (the
/// one running the tests stays locked by the outer `cargo test`).
pub fn shim() -> PathBuf {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        cargo_build(&["--release", "-p", "mockfs-shim"]).join("release/libmockfs.so")
    })
    .clone()
}

/// `cargo build --target TARGET ARGS` of the shim into the tests' own target directory (see
/// [`cargo::build`]).
pub fn cargo_build(args: &[&str]) -> PathBuf {
    cargo::build(
        TARGET,
        Path::new(env!("CARGO_MANIFEST_DIR")),
        "mockfs-shim-tests",
        args,
    )
}

/// The Python interpreter used for probes (the distribution's, not a wrapper script).
pub fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// A hand-made mock tree in a temporary directory.
pub struct Tree {
    pub dir: tempfile::TempDir,
}

pub const GPU: &str = "0008:06:00.0";
/// The host's one PCI device in the tree's merged listing, and its vendor file.
pub const HOST_DEVICE: &str = "0000:00:1e.0";
pub const HOST_VENDOR: &str = "0x8086\n";
pub const VERSION: &str =
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.173.02  Release Build\n";

impl Tree {
    /// A small driver tree: version, one GPU, its sysfs device, the merged PCI listing (a host
    /// device as an absolute link beside the mock one) and `/dev/nvidia0`.
    pub fn new() -> Tree {
        let t = Tree {
            dir: tempfile::tempdir().unwrap(),
        };
        t.file("proc/driver/nvidia/version", VERSION);
        t.file(
            &format!("proc/driver/nvidia/gpus/{GPU}/information"),
            "Model: \t\t NVIDIA GB300\nDevice Minor: \t 0\n",
        );
        t.file("proc/driver/nvidia/params", "EnableMSI: 1\n");
        let dev = format!("sys/devices/pci0008:06/{GPU}");
        t.file(&format!("{dev}/vendor"), "0x10de\n");
        t.file(&format!("{dev}/local_cpulist"), "0-1\n");
        t.link(
            &format!("sys/bus/pci/devices/{GPU}"),
            &format!("../../../devices/pci0008:06/{GPU}"),
        );
        t.link(
            &format!("sys/bus/pci/drivers/nvidia/{GPU}"),
            &format!("../../../../devices/pci0008:06/{GPU}"),
        );
        // The host's device: an absolute link out of the tree, to a directory of this one
        // outside every prefix (not the machine's sysfs, which may have no PCI devices).
        let host = t
            .root()
            .join(format!("host/devices/pci0000:00/{HOST_DEVICE}"));
        t.file(
            &format!("host/devices/pci0000:00/{HOST_DEVICE}/vendor"),
            HOST_VENDOR,
        );
        t.link(
            &format!("sys/bus/pci/devices/{HOST_DEVICE}"),
            host.to_str().unwrap(),
        );
        t.file("sys/module/nvidia/version", "580.173.02\n");
        t.file("dev/nvidia0", "");
        t.file("prefixes", "/sys/devices/pci0008:06\n");
        t
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn file(&self, rel: &str, content: &str) {
        let p = self.root().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, content).unwrap();
    }

    pub fn link(&self, rel: &str, target: &str) {
        let p = self.root().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        symlink(target, p).unwrap();
    }

    /// A command preloaded with the shim against this tree.
    pub fn cmd(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env("LD_PRELOAD", shim())
            .env("MOCKFS_ROOT", self.root())
            .env_remove("MOCKFS_PREFIXES");
        c.env_remove("MOCKFS_DEBUG").env_remove("MOCKFS_DEV");
        c
    }

    /// Runs `program args…` under the shim and returns its stdout, failing on a non-zero exit.
    pub fn run(&self, program: &str, args: &[&str]) -> String {
        ok(self.cmd(program).args(args).output().unwrap())
    }

    /// Runs a Python snippet under the shim and returns its stdout.
    pub fn python(&self, code: &str) -> String {
        ok(self.cmd(python()).arg("-c").arg(code).output().unwrap())
    }
}

/// Stdout of a successful run; panics with stderr otherwise.
pub fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Stdout of `program args…` without the shim.
pub fn plain(program: &str, args: &[&str]) -> String {
    ok(Command::new(program).args(args).output().unwrap())
}

/// Runs a shell script as root in a private mount namespace (mounts made there vanish with it;
/// the host's `/etc` and `/run` are never modified). `$SHIM` and `$TREE` are set.
pub fn in_namespace(tree: &Tree, script: &str) -> Output {
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-ec", script])
        .env("SHIM", shim())
        .env("TREE", tree.root())
        .env_remove("LD_PRELOAD")
        .env_remove("MOCKFS_ROOT")
        .output()
        .unwrap()
}
