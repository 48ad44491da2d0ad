//! Helpers shared by the agent's integration tests.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use mockgpu_agent::render::driver_tree;
use mockgpu_agent::tree::{Kind, Tree};
use mockgpu_api::{
    CpuSet, HostNumaNode, HostPciDevice, HostSocket, HostTopology, NodeTopology, Profile,
};

/// The fixed host's `/proc/devices`: it uses 509 and 510 (where guesses of nvidia-uvm's major
/// land) and the first majors of the extended dynamic range.
pub const HOST_DEVICES: &str = "Character devices:\n  1 mem\n  4 /dev/vc/0\n  4 tty\n 10 misc\n384 first\n509 aux\n510 rpmb\n\nBlock devices:\n  7 loop\n";

/// A fixed two-socket host (CPUs 0-3 and 4-7, one NUMA node each) with two real PCI devices,
/// one of them at the T4's usual address.
pub fn fixed_host() -> HostTopology {
    let socket = |id: u32, cpus: std::ops::Range<u32>| HostSocket {
        id,
        cpus: CpuSet::from_ids(cpus),
    };
    HostTopology {
        cpus: CpuSet::from_ids(0..8),
        nr_cpu_ids: 8,
        sockets: vec![socket(0, 0..4), socket(1, 4..8)],
        numa_nodes: vec![
            HostNumaNode {
                id: 0,
                cpus: CpuSet::from_ids(0..4),
            },
            HostNumaNode {
                id: 1,
                cpus: CpuSet::from_ids(4..8),
            },
        ],
        pci_devices: ["0000:00:00.0", "0000:00:1e.0"]
            .iter()
            .map(|d| HostPciDevice {
                bus_id: d.parse().unwrap(),
                sysfs_path: format!("/sys/devices/pci0000:00/{d}"),
            })
            .collect(),
        devices: mockgpu_api::ProcDevices::parse(HOST_DEVICES).unwrap(),
    }
}

/// The tree of a built-in profile on [`fixed_host`] for node `node-0`.
pub fn fixed_tree(profile: &str) -> (NodeTopology, Tree) {
    profile_tree(&Profile::builtin(profile).unwrap())
}

/// The tree of `profile` on [`fixed_host`] for node `node-0`.
pub fn profile_tree(profile: &Profile) -> (NodeTopology, Tree) {
    let host = fixed_host();
    let topo = NodeTopology::build(profile, "node-0", &host).unwrap();
    let tree = driver_tree(&topo, &host);
    (topo, tree)
}

/// The text of the file at `path` in `tree`.
pub fn text(tree: &Tree, path: &str) -> String {
    match tree.get(path).map(|e| &e.kind) {
        Some(Kind::File(c)) => String::from_utf8(c.to_vec()).unwrap(),
        other => panic!("{path} is not a file: {other:?}"),
    }
}

/// A fake sysfs tree of `tests/fixtures` (see the README there).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A reviewable text dump of a tree: one line per entry, file contents indented below it.
pub fn dump(tree: &Tree) -> String {
    let mut out = String::new();
    for (path, entry) in tree.iter() {
        let path = if path.is_empty() { "." } else { path };
        match &entry.kind {
            Kind::Dir => writeln!(out, "d {:o} {path}", entry.mode).unwrap(),
            Kind::Symlink(t) => writeln!(out, "l {path} -> {t}").unwrap(),
            Kind::CharDev { major, minor } => {
                writeln!(out, "c {:o} {path} {major}:{minor}", entry.mode).unwrap()
            }
            Kind::File(c) => match std::str::from_utf8(c).ok().filter(|s| !s.contains('\0')) {
                Some(text) => {
                    writeln!(out, "f {:o} {path} ({} bytes)", entry.mode, c.len()).unwrap();
                    for line in text.split_inclusive('\n') {
                        writeln!(out, "  |{}", line.escape_debug()).unwrap();
                    }
                }
                None => {
                    let nonzero: Vec<String> = c
                        .iter()
                        .enumerate()
                        .filter(|(_, b)| **b != 0)
                        .map(|(i, b)| format!("{i:03x}:{b:02x}"))
                        .collect();
                    writeln!(
                        out,
                        "b {:o} {path} ({} bytes) nonzero {}",
                        entry.mode,
                        c.len(),
                        nonzero.join(" ")
                    )
                    .unwrap();
                }
            },
        }
    }
    out
}

/// Runs `f` on a fresh thread in a private mount namespace of its own, which processes it
/// starts inherit: whatever it mounts vanishes with the thread and those processes, even when
/// it fails. A test's panic is passed on. Make temporary directories before calling it: one that
/// holds a mount point of the namespace cannot be removed from inside it.
pub fn in_private_namespace<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    use mockgpu_agent::sys::{Linux, enter_private_namespace};
    std::thread::scope(|s| {
        s.spawn(|| {
            enter_private_namespace(&Linux).expect("cannot enter a private mount namespace");
            f()
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Waits until `cond` holds, for at most 15 seconds.
pub fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    wait_within(std::time::Duration::from_secs(15), what, cond);
}

/// Polls `cond` until it holds, failing the test after `limit`; returns how long it took.
pub fn wait_within(
    limit: std::time::Duration,
    what: &str,
    mut cond: impl FnMut() -> bool,
) -> std::time::Duration {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    start.elapsed()
}
