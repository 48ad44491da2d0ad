//! The host's CPU and PCI layout, and the node's mock GPUs placed onto it.
//!
//! [`NodeTopology::build`] is a pure, deterministic function of (profile, node name, host):
//! the same inputs give the same UUIDs, bus ids, minors and CPU affinities on any machine.

use crate::{BusId, CpuSet, DeviceNumbers, DevicesError, MAX_CPUS, ProcDevices, Profile};

/// NUMA node ids are at most this (Linux allows 1024 nodes at most; ids stay far below
/// `i32::MAX`, the type of `numa_node`).
pub const MAX_NUMA_NODE: u32 = 65_535;

/// One CPU socket (physical package) of the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSocket {
    /// `physical_package_id`.
    pub id: u32,
    /// The socket's online CPUs.
    pub cpus: CpuSet,
}

/// One NUMA node of the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNumaNode {
    /// Node id (`nodeN`).
    pub id: u32,
    /// The node's CPUs (may be empty for memory-only nodes).
    pub cpus: CpuSet,
}

/// A real PCI device of the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPciDevice {
    /// Its address.
    pub bus_id: BusId,
    /// Absolute sysfs path of its device directory (`/sys/devices/pci0000:00/0000:00:01.0`).
    pub sysfs_path: String,
}

/// What the agent reads of the host it runs on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostTopology {
    /// Online CPUs.
    pub cpus: CpuSet,
    /// Possible CPU ids (`nr_cpu_ids`), which sets the width of `local_cpus` masks.
    pub nr_cpu_ids: u32,
    /// Sockets, ordered by id.
    pub sockets: Vec<HostSocket>,
    /// NUMA nodes, ordered by id; empty when the host has no NUMA.
    pub numa_nodes: Vec<HostNumaNode>,
    /// Real PCI devices.
    pub pci_devices: Vec<HostPciDevice>,
    /// The host's `/proc/devices` (the device majors in use).
    pub devices: ProcDevices,
}

/// Errors placing a profile onto a host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// The node name is unusable.
    #[error("invalid node name {0:?}: must be 1-253 printable characters without '/'")]
    NodeName(String),
    /// The host reported no CPUs.
    #[error("the host reports no online CPUs")]
    NoCpus,
    /// A CPU id, the possible-CPU count or a NUMA node id of the host is too large.
    #[error("host {what} {value} is out of range (at most {max})")]
    HostRange {
        /// Which number.
        what: &'static str,
        /// Its value.
        value: u32,
        /// The largest accepted value.
        max: u32,
    },
    /// No free bus is left for a GPU.
    #[error("no free PCI bus left for GPU {0}")]
    NoFreeBus(u32),
    /// The host's device numbers leave none for the mock.
    #[error(transparent)]
    Devices(#[from] DevicesError),
}

/// One mock GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Position in the profile (0-based).
    pub index: u32,
    /// Device minor (`/dev/nvidia<minor>`).
    pub minor: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// PCI address.
    pub bus_id: BusId,
    /// Interrupt line printed in `information` and `irq`.
    pub irq: u32,
    /// Host socket whose CPUs the GPU is local to.
    pub socket: u32,
    /// Host NUMA node of that socket, or -1.
    pub numa_node: i32,
    /// The GPU's local CPUs: a whole host socket, or all CPUs.
    pub cpus: CpuSet,
}

/// A node's mock GPUs, as the agent serves and reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTopology {
    /// Kubernetes node name (part of the identity).
    pub node_name: String,
    /// The profile the GPUs come from.
    pub profile: Profile,
    /// The GPUs, ordered by minor.
    pub gpus: Vec<Gpu>,
    /// Width of `local_cpus` masks.
    pub nr_cpu_ids: u32,
    /// The majors of NVIDIA's dynamic device nodes on this host.
    pub devices: DeviceNumbers,
}

impl NodeTopology {
    /// Places the profile's GPUs onto `host`.
    pub fn build(
        profile: &Profile,
        node_name: &str,
        host: &HostTopology,
    ) -> Result<NodeTopology, TopologyError> {
        if node_name.is_empty()
            || node_name.len() > 253
            || node_name.contains('/')
            || node_name.chars().any(char::is_control)
        {
            return Err(TopologyError::NodeName(node_name.to_string()));
        }
        if host.cpus.is_empty() {
            return Err(TopologyError::NoCpus);
        }
        check_ranges(host)?;
        let devices = DeviceNumbers::choose(&host.devices)?;
        let whole_host = [HostSocket {
            id: 0,
            cpus: host.cpus.clone(),
        }];
        let sockets = if host.sockets.is_empty() {
            &whole_host[..]
        } else {
            &host.sockets[..]
        };
        let mut taken: Vec<BusId> = Vec::new();
        let mut gpus = Vec::new();
        let per_socket = profile
            .sockets
            .iter()
            .enumerate()
            .flat_map(|(s, &n)| std::iter::repeat_n(s, n as usize));
        for (index, (profile_socket, &wanted)) in per_socket.zip(&profile.bus_ids).enumerate() {
            let index = index as u32;
            let socket = &sockets[profile_socket % sockets.len()];
            let cpus = if sockets.len() == 1 {
                host.cpus.clone()
            } else {
                socket.cpus.clone()
            };
            let numa_node = host
                .numa_nodes
                .iter()
                .find(|n| !n.cpus.is_empty() && n.cpus.is_subset(&socket.cpus))
                .map_or(-1, |n| n.id as i32);
            let bus_id = free_bus(wanted, host, &taken).ok_or(TopologyError::NoFreeBus(index))?;
            taken.push(bus_id);
            gpus.push(Gpu {
                index,
                minor: index,
                uuid: gpu_uuid(profile, node_name, index),
                bus_id,
                irq: 180 + index * 16,
                socket: socket.id,
                numa_node,
                cpus,
            });
        }
        Ok(NodeTopology {
            node_name: node_name.to_string(),
            profile: profile.clone(),
            gpus,
            devices,
            // No overflow: `check_ranges` keeps every CPU id below `MAX_CPUS`.
            nr_cpu_ids: host
                .nr_cpu_ids
                .max(host.cpus.last().map_or(0, |last| last + 1)),
        })
    }
}

/// Rejects host numbers that later arithmetic (`id + 1`, masks of `nr_cpu_ids` bits, `numa_node`
/// as `i32`) cannot take.
fn check_ranges(host: &HostTopology) -> Result<(), TopologyError> {
    let range = |what, value: u32, max: u32| {
        if value > max {
            Err(TopologyError::HostRange { what, value, max })
        } else {
            Ok(())
        }
    };
    range("possible cpu count", host.nr_cpu_ids, MAX_CPUS)?;
    let sets = std::iter::once(&host.cpus)
        .chain(host.sockets.iter().map(|s| &s.cpus))
        .chain(host.numa_nodes.iter().map(|n| &n.cpus));
    for cpus in sets {
        range("cpu id", cpus.last().unwrap_or(0), MAX_CPUS - 1)?;
    }
    for node in &host.numa_nodes {
        range("numa node id", node.id, MAX_NUMA_NODE)?;
    }
    Ok(())
}

/// The bus after `id` (same domain), slot 0 function 0; wraps into the next domain.
pub(crate) fn next_bus(id: BusId) -> BusId {
    let (domain, bus) = match id.bus.checked_add(1) {
        Some(bus) => (id.domain, bus),
        None => (id.domain.wrapping_add(1), 0),
    };
    BusId {
        domain,
        bus,
        slot: 0,
        function: 0,
    }
}

/// `wanted` unless a real device (or an earlier mock GPU) is there; then the next bus that has
/// no real device at all and no mock GPU.
fn free_bus(wanted: BusId, host: &HostTopology, taken: &[BusId]) -> Option<BusId> {
    let clash = |id: BusId| host.pci_devices.iter().any(|d| d.bus_id == id) || taken.contains(&id);
    if !clash(wanted) {
        return Some(wanted);
    }
    let bus_used = |id: BusId| {
        host.pci_devices
            .iter()
            .map(|d| d.bus_id)
            .chain(taken.iter().copied())
            .any(|d| (d.domain, d.bus) == (id.domain, id.bus))
    };
    let mut id = wanted;
    for _ in 0..=u16::MAX {
        id = next_bus(id);
        if !bus_used(id) {
            return Some(id);
        }
    }
    None
}

/// 128-bit FNV-1a.
pub(crate) fn fnv1a128(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u128::from(b)).wrapping_mul(PRIME))
}

/// The GPU's UUID: a 128-bit FNV-1a hash of every field of the resolved profile (GPU count,
/// socket layout and driver version included), the node name and the GPU's index.
///
/// Any change to the resolved profile makes new GPUs with new UUIDs, as swapping the board
/// would; the same profile on the same node keeps its UUIDs across agent restarts and
/// reschedules, because nothing else (host layout, time, process) goes into the hash. Bus ids
/// enter as the profile requests them, not as moved around real devices of the host.
fn gpu_uuid(profile: &Profile, node_name: &str, index: u32) -> String {
    // Destructured so that a new profile field cannot be left out of the identity unnoticed.
    let Profile {
        name,
        model,
        sockets,
        pci_device,
        subsystem_vendor,
        subsystem_device,
        class,
        revision,
        bus_ids,
        vbios,
        driver_version,
        memory_mib,
        pcie_gen,
        pcie_width,
        arch,
        open_kernel_module,
        coherent_memory,
        numa_status,
        // Health is not identity: a GPU keeps its UUID when it fails.
        failed_gpus: _,
        // NVML's data (clocks, power, …) describes the board's behaviour, not which board it is,
        // and leaving it out keeps the UUIDs GPUs had before it existed.
        nvml: _,
    } = profile;
    let bus_ids: Vec<String> = bus_ids.iter().map(BusId::to_string).collect();
    // Fields are NUL-separated; none can contain a NUL (validated text, numbers, lists).
    let key = format!(
        "mockgpu-v2\0{name}\0{model}\0{sockets:?}\0{pci_device:04x}\0{subsystem_vendor:04x}\0\
         {subsystem_device:04x}\0{class:06x}\0{revision:02x}\0{}\0{vbios}\0{driver_version}\0\
         {memory_mib}\0{pcie_gen}\0{pcie_width}\0{}\0{open_kernel_module}\0{coherent_memory}\0\
         {numa_status}\0{node_name}\0{index}",
        bus_ids.join(","),
        arch.as_str(),
    );
    let h = format!("{:032x}", fnv1a128(key.as_bytes()));
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A host with these sockets and NUMA nodes (id, CPU range each); shared by the crate's tests.
    pub(crate) fn host(
        sockets: &[(u32, std::ops::Range<u32>)],
        numa: &[(u32, std::ops::Range<u32>)],
    ) -> HostTopology {
        let cpus = CpuSet::from_ids(sockets.iter().flat_map(|(_, r)| r.clone()));
        HostTopology {
            nr_cpu_ids: cpus.len() as u32,
            cpus,
            sockets: sockets
                .iter()
                .map(|(id, r)| HostSocket {
                    id: *id,
                    cpus: CpuSet::from_ids(r.clone()),
                })
                .collect(),
            numa_nodes: numa
                .iter()
                .map(|(id, r)| HostNumaNode {
                    id: *id,
                    cpus: CpuSet::from_ids(r.clone()),
                })
                .collect(),
            pci_devices: vec![],
            devices: ProcDevices::default(),
        }
    }

    #[test]
    fn one_socket_host_gives_every_gpu_all_cpus() {
        let p = Profile::builtin("gb300").unwrap();
        let t = NodeTopology::build(&p, "node-a", &host(&[(0, 0..2)], &[(0, 0..2)])).unwrap();
        assert_eq!(t.gpus.len(), 4);
        for g in &t.gpus {
            assert_eq!(g.cpus.to_list(), "0-1");
            assert_eq!(g.numa_node, 0);
        }
    }

    #[test]
    fn two_socket_host_maps_profile_sockets_to_host_sockets() {
        let p = Profile::builtin("gb300").unwrap();
        // Two NUMA nodes per socket (SNC): a GPU still gets its whole socket.
        let h = host(
            &[(0, 0..8), (1, 8..16)],
            &[(0, 0..4), (1, 4..8), (2, 8..12), (3, 12..16)],
        );
        let t = NodeTopology::build(&p, "node-a", &h).unwrap();
        let lists: Vec<_> = t.gpus.iter().map(|g| g.cpus.to_list()).collect();
        assert_eq!(lists, ["0-7", "0-7", "8-15", "8-15"]);
        let numa: Vec<_> = t.gpus.iter().map(|g| g.numa_node).collect();
        assert_eq!(numa, [0, 0, 2, 2]);
    }

    #[test]
    fn identity_is_deterministic_and_node_specific() {
        let p = Profile::builtin("h100").unwrap();
        let h = host(&[(0, 0..4)], &[]);
        let a = NodeTopology::build(&p, "node-a", &h).unwrap();
        assert_eq!(a, NodeTopology::build(&p, "node-a", &h).unwrap());
        let b = NodeTopology::build(&p, "node-b", &h).unwrap();
        assert_ne!(a.gpus[0].uuid, b.gpus[0].uuid);
        // The host's layout is no part of the identity.
        let two = NodeTopology::build(&p, "node-a", &host(&[(0, 0..4), (1, 4..8)], &[])).unwrap();
        let uuid = |t: &NodeTopology| t.gpus.iter().map(|g| g.uuid.clone()).collect::<Vec<_>>();
        assert_eq!(uuid(&a), uuid(&two));
        assert_eq!(a.gpus[0].uuid.len(), 40);
        assert_eq!(a.gpus[0].numa_node, -1);
        let uuids: std::collections::BTreeSet<_> = a.gpus.iter().map(|g| &g.uuid).collect();
        assert_eq!(uuids.len(), 8);
    }

    fn uuids(yaml: &str) -> Vec<String> {
        let p = Profile::from_yaml(yaml, "t").unwrap();
        let t = NodeTopology::build(&p, "node-a", &host(&[(0, 0..4)], &[])).unwrap();
        t.gpus.into_iter().map(|g| g.uuid).collect()
    }

    #[test]
    fn every_profile_change_is_a_new_identity() {
        let base = uuids("base: h100\n");
        assert_eq!(base, uuids("base: h100\n"));
        for change in [
            "gpus: 4",
            "driver_version: 570.148.08",
            "memory_mib: 81920",
            "sockets: [8]",
            "vbios: 96.00.99.00.02",
            "open_kernel_module: false",
        ] {
            let other = uuids(&format!("base: h100\n{change}\n"));
            for (a, b) in base.iter().zip(&other) {
                assert_ne!(a, b, "{change}");
            }
        }
    }

    #[test]
    fn uuid_hash_is_pinned() {
        // A literal from one fixed input: a change of the hash or the key fails here.
        assert_eq!(
            uuids("base: t4\n"),
            ["GPU-cb9ae115-8892-98e0-f9ac-edec77d63a49"]
        );
    }

    #[test]
    fn bus_ids_never_collide_with_real_devices() {
        let p = Profile::builtin("t4").unwrap();
        let mut h = host(&[(0, 0..2)], &[]);
        for d in ["0000:00:1e.0", "0000:01:00.0"] {
            h.pci_devices.push(HostPciDevice {
                bus_id: d.parse().unwrap(),
                sysfs_path: format!("/sys/devices/pci0000:00/{d}"),
            });
        }
        let t = NodeTopology::build(&p, "n", &h).unwrap();
        assert_eq!(t.gpus[0].bus_id.to_string(), "0000:02:00.0");
        assert_eq!(NodeTopology::build(&p, "n", &h).unwrap(), t);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let p = Profile::builtin("t4").unwrap();
        assert!(NodeTopology::build(&p, "", &host(&[(0, 0..2)], &[])).is_err());
        assert!(NodeTopology::build(&p, "a/b", &host(&[(0, 0..2)], &[])).is_err());
        assert_eq!(
            NodeTopology::build(&p, "n", &HostTopology::default()),
            Err(TopologyError::NoCpus)
        );
    }

    #[test]
    fn out_of_range_host_numbers_are_errors() {
        let p = Profile::builtin("t4").unwrap();
        let range = |what, value, max| Err(TopologyError::HostRange { what, value, max });
        let mut h = host(&[(0, 0..2)], &[(0, 0..2)]);
        h.cpus = CpuSet::from_ids([0, 1, u32::MAX]);
        assert_eq!(
            NodeTopology::build(&p, "n", &h),
            range("cpu id", u32::MAX, MAX_CPUS - 1)
        );
        let mut h = host(&[(0, 0..2)], &[(0, 0..2)]);
        h.sockets[0].cpus = CpuSet::from_ids([MAX_CPUS]);
        assert_eq!(
            NodeTopology::build(&p, "n", &h),
            range("cpu id", MAX_CPUS, MAX_CPUS - 1)
        );
        let mut h = host(&[(0, 0..2)], &[(0, 0..2)]);
        h.nr_cpu_ids = u32::MAX;
        assert_eq!(
            NodeTopology::build(&p, "n", &h),
            range("possible cpu count", u32::MAX, MAX_CPUS)
        );
        let mut h = host(&[(0, 0..2)], &[(0, 0..2)]);
        h.numa_nodes[0].id = u32::MAX;
        let e = NodeTopology::build(&p, "n", &h).unwrap_err();
        assert_eq!(
            e.to_string(),
            "host numa node id 4294967295 is out of range (at most 65535)"
        );
        // The largest accepted ids work, and the mask width follows the highest CPU.
        let mut h = host(&[(0, 0..2)], &[(0, 0..2)]);
        h.cpus = CpuSet::from_ids([0, MAX_CPUS - 1]);
        h.sockets[0].cpus = h.cpus.clone();
        let t = NodeTopology::build(&p, "n", &h).unwrap();
        assert_eq!(t.nr_cpu_ids, MAX_CPUS);
    }
}
