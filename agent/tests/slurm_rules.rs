//! Parses rendered trees the way Slurm's gpu/nvidia plugin does (docs/driver-files.md), with a
//! parser written here independently of the renderer, and checks what Slurm would detect.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use mockgpu_agent::host::SysfsHost;
use mockgpu_agent::render::driver_tree;
use mockgpu_api::profile::BUILTIN;
use mockgpu_api::{NodeTopology, Profile};

/// What slurmd's AutoDetect=nvidia derives from one GPU directory.
#[derive(Debug)]
struct Detected {
    gres_type: String,
    minor: u32,
    cpus: BTreeSet<u32>,
    /// The directory name, which Slurm takes as the PCI address.
    pci_address: String,
}

/// A kernel CPU list (`0-3,8-11`).
fn cpu_list(list: &str) -> BTreeSet<u32> {
    let mut cpus = BTreeSet::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap());
    }
    cpus
}

/// Slurm's rules: `Model:` lowercased with spaces turned into `_`, `Device Minor:`, keys matched
/// case-sensitively at the start of a line; `local_cpulist` parsed as a CPU list, last line wins.
fn detect(root: &Path) -> Vec<Detected> {
    let gpus = root.join("proc/driver/nvidia/gpus");
    let mut found = Vec::new();
    for entry in fs::read_dir(&gpus).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.len() < 5 {
            continue;
        }
        let info = fs::read_to_string(gpus.join(&name).join("information")).unwrap();
        let mut gres_type = None;
        let mut minor = None;
        for line in info.lines() {
            if let Some(v) = line.strip_prefix("Model:") {
                gres_type = Some(
                    v.trim_start_matches([' ', '\t'])
                        .to_lowercase()
                        .replace(' ', "_"),
                );
            } else if let Some(v) = line.strip_prefix("Device Minor:") {
                minor = Some(v.trim().parse::<u32>().unwrap());
            }
        }
        let cpulist = fs::read_to_string(
            root.join("sys/bus/pci/drivers/nvidia")
                .join(&name)
                .join("local_cpulist"),
        )
        .unwrap();
        found.push(Detected {
            gres_type: gres_type.unwrap(),
            minor: minor.unwrap(),
            cpus: cpu_list(cpulist.lines().last().unwrap_or("")),
            pci_address: name,
        });
    }
    found.sort_by_key(|d| d.minor);
    found
}

#[test]
fn slurm_detects_the_profiles_gpus() {
    let socket0: BTreeSet<u32> = (0..4).collect();
    let socket1: BTreeSet<u32> = (4..8).collect();
    let cases = [
        ("gb300", "nvidia_gb300", 4),
        ("gb200", "nvidia_gb200", 4),
        ("b200", "nvidia_b200", 8),
        ("h200", "nvidia_h200", 8),
        ("h100", "nvidia_h100_80gb_hbm3", 8),
        ("a100", "nvidia_a100-sxm4-40gb", 8),
        ("l40s", "nvidia_l40s", 1),
        ("t4", "tesla_t4", 1),
    ];
    for (profile, gres_type, count) in cases {
        let (_, tree) = common::fixed_tree(profile);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        mockgpu_agent::output::write_tree(&tree, &root).unwrap();
        let found = detect(&root);
        assert_eq!(found.len(), count, "{profile}");
        for (i, d) in found.iter().enumerate() {
            assert_eq!(d.gres_type, gres_type, "{profile}");
            assert_eq!(d.minor, i as u32, "{profile}");
            // Each GPU's CPUs are exactly one whole host socket: the first half of the GPUs on
            // socket 0, the second half on socket 1 (single-GPU boards on socket 0).
            let want = if i < count.div_ceil(2) {
                &socket0
            } else {
                &socket1
            };
            assert_eq!(&d.cpus, want, "{profile} GPU {i}");
        }
    }
}

/// Every built-in profile on the fake sysfs trees, probed as the agent probes a host: each GPU's
/// CPUs are exactly one whole socket (slurmctld refuses anything else on a multi-socket host,
/// NUMA nodes included) and its `numa_node` is a node inside that socket.
#[test]
fn every_gpu_gets_a_whole_socket_on_multi_socket_hosts() {
    // The sockets as the fixtures' physical_package_id files define them.
    let fixtures = [
        ("two-socket", ["0-3", "4-7"]),
        ("four-numa", ["0-3,8-11", "4-7,12-15"]),
    ];
    for (fixture, sockets) in fixtures {
        let sysfs = common::fixture(fixture);
        let sockets = sockets.map(cpu_list);
        let host = SysfsHost::new(&sysfs).probe().unwrap();
        for (name, _) in BUILTIN {
            let profile = Profile::builtin(name).unwrap();
            let topo = NodeTopology::build(&profile, "node-0", &host).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().join("root");
            mockgpu_agent::output::write_tree(&driver_tree(&topo, &host), &root).unwrap();
            let found = detect(&root);
            assert_eq!(found.len() as u32, profile.gpu_count(), "{fixture} {name}");
            // Profile socket s holds the next sockets[s] GPUs; it lands on host socket s mod 2.
            let want_socket = profile
                .sockets
                .iter()
                .enumerate()
                .flat_map(|(s, &n)| std::iter::repeat_n(s % 2, n as usize));
            for (d, socket) in found.iter().zip(want_socket) {
                let what = format!("{fixture} {name} GPU {}", d.minor);
                assert_eq!(d.cpus, sockets[socket], "{what}");
                let device = root.join("sys/bus/pci/drivers/nvidia").join(&d.pci_address);
                let numa_node = fs::read_to_string(device.join("numa_node")).unwrap();
                let numa_node: u32 = numa_node.trim().parse().unwrap_or_else(|_| {
                    panic!("{what}: numa_node {numa_node:?} is not a host node")
                });
                let node_cpus = fs::read_to_string(
                    sysfs.join(format!("devices/system/node/node{numa_node}/cpulist")),
                )
                .unwrap();
                assert!(
                    cpu_list(&node_cpus).is_subset(&d.cpus),
                    "{what}: node {numa_node} ({node_cpus:?}) is not inside the GPU's socket"
                );
            }
        }
    }
}
