//! Renders a node's mock GPUs as the NVIDIA driver's files: `/proc/driver/nvidia`, PCI sysfs,
//! `/sys/module/nvidia` and the `/dev/nvidia*` nodes, byte for byte as the driver branch of the
//! profile prints them (see `docs/driver-files.md`), the merged `/proc/devices` that
//! publishes the device majors, and the data only NVML has, for the mock `libnvidia-ml.so.1`
//! (`nvml/`, see `docs/nvml.md`).

use std::fmt::Write as _;

use mockgpu_api::fault::{self, Fault, GpuState};
use mockgpu_api::layout::PREFIXES_FILE;
use mockgpu_api::{Arch, Gpu, HostTopology, NodeTopology, Profile, information, nvml};

use crate::tree::Tree;

const PROC: &str = "proc/driver/nvidia";
const DRIVER: &str = "sys/bus/pci/drivers/nvidia";

/// Builds the whole tree for `topo` on `host`, without faults.
pub fn driver_tree(topo: &NodeTopology, host: &HostTopology) -> Tree {
    driver_tree_with(topo, host, &[])
}

/// Builds the whole tree for `topo` on `host` as `faults` (validated against `topo`) leave it:
/// see [`mockgpu_api::fault`] for what each fault changes.
pub fn driver_tree_with(topo: &NodeTopology, host: &HostTopology, faults: &[Fault]) -> Tree {
    let p = &topo.profile;
    let mut t = Tree::new();
    t.file(
        "proc/devices",
        topo.devices.merge_into(&host.devices).render(),
    );
    t.file(&format!("{PROC}/version"), version_file(p));
    t.file(&format!("{PROC}/params"), params_file(p));
    t.file(&format!("{PROC}/registry"), "Binary: \"\"\n");
    t.file_mode(&format!("{PROC}/suspend"), "", 0o200);
    t.file_mode(&format!("{PROC}/suspend_depth"), "default\n", 0o644);
    t.file(&format!("{PROC}/warnings/README"), WARNINGS_README);
    t.file(&format!("{PROC}/patches/README"), PATCHES_README);
    for (name, minor, mode) in [("mig/config", 1, 256), ("mig/monitor", 2, 292)] {
        t.file(
            &format!("{PROC}/capabilities/{name}"),
            format!("DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"),
        );
    }
    t.file(
        &format!("{PROC}/capabilities/fabric-imex-mgmt"),
        "DeviceFileMinor: 4095\nDeviceFileMode: 256\nDeviceFileModify: 1\n",
    );
    t.dir(&format!("{PROC}/gpus"));
    t.file(nvml::SYSTEM_FILE, nvml::render_system(p));
    let numa_base = host.numa_nodes.iter().map(|n| n.id + 1).max().unwrap_or(1);

    for (id, path) in host
        .pci_devices
        .iter()
        .map(|d| (d.bus_id, d.sysfs_path.as_str()))
    {
        t.host_symlink(&format!("sys/bus/pci/devices/{id}"), path);
    }
    for file in ["bind", "unbind", "new_id", "remove_id", "uevent"] {
        t.file_mode(&format!("{DRIVER}/{file}"), "", 0o200);
    }
    t.symlink(&format!("{DRIVER}/module"), "../../../../module/nvidia");
    t.file(
        "sys/module/nvidia/version",
        format!("{}\n", p.driver_version),
    );

    t.file(fault::XID_LOG_FILE, fault::xid_log(topo, faults));
    let mut prefixes = String::new();
    for gpu in &topo.gpus {
        let state = GpuState::of(faults, gpu.index);
        t.file(
            &nvml::gpu_file(&gpu.bus_id),
            nvml::render_gpu(topo, gpu, &state),
        );
        // A GPU fallen off the bus is gone from the driver's directory and from PCI.
        if state.lost {
            continue;
        }
        let bdf = gpu.bus_id.to_string();
        let gdir = format!("{PROC}/gpus/{bdf}");
        t.file(
            &format!("{gdir}/information"),
            information::render(p, gpu, state.excluded),
        );
        t.file(&format!("{gdir}/registry"), "Binary: \"\"\n");
        t.file(&format!("{gdir}/power"), power_file(p));
        if p.numa_status {
            let node = numa_base + gpu.index;
            t.file(
                &format!("{gdir}/numa_status"),
                format!(
                    "Node:      {node}\nStatus:    online\nAddress:   {:x}\nSize:      {:x}\n",
                    0x4000_0000_0000u64 + u64::from(gpu.index) * 0x100_0000_0000,
                    p.memory_mib << 20
                ),
            );
            t.file(&format!("{gdir}/offline_pages"), "");
        }

        let dev = format!("sys/{}", gpu.bus_id.sysfs_device_path());
        sysfs_device(&mut t, &dev, p, gpu, topo.nr_cpu_ids);
        t.symlink(
            &format!("sys/bus/pci/devices/{bdf}"),
            format!("../../../{}", gpu.bus_id.sysfs_device_path()),
        );
        t.symlink(
            &format!("{DRIVER}/{bdf}"),
            format!("../../../../{}", gpu.bus_id.sysfs_device_path()),
        );
        // The shim redirects the whole root bus when the host has no such bus (so that tools
        // walking component by component find the parent too), else only the device.
        let bus = format!("/sys/devices/{}", gpu.bus_id.root_complex());
        let host_has_bus = host
            .pci_devices
            .iter()
            .any(|d| d.sysfs_path.starts_with(&format!("{bus}/")));
        let prefix = if host_has_bus { format!("/{dev}") } else { bus };
        if !prefixes.lines().any(|l| l == prefix) {
            writeln!(prefixes, "{prefix}").ok();
        }
    }
    for node in topo.devices.all_nodes(topo.gpus.iter().map(|g| g.minor)) {
        let path = node.path.trim_start_matches('/');
        t.chardev(path, node.major, node.minor, node.mode as u16);
    }
    t.file(PREFIXES_FILE, prefixes);
    t
}

/// `/proc/driver/nvidia/version`.
fn version_file(p: &Profile) -> String {
    let module = if p.open_kernel_module {
        format!("NVIDIA UNIX Open Kernel Module for {}", p.arch.as_str())
    } else {
        format!("NVIDIA UNIX {} Kernel Module", p.arch.as_str())
    };
    let gcc = match p.arch {
        Arch::X86_64 => "gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) ",
        Arch::Aarch64 => "gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04.2) ",
    };
    format!(
        "NVRM version: {module}  {}  Release Build  (dvs-builder@U22-I3-B17-02-5)  Mon Sep 29 20:04:11 UTC 2025\nGCC version:  {gcc}\n",
        p.driver_version
    )
}

/// `/proc/driver/nvidia/params`.
fn params_file(p: &Profile) -> String {
    let mut s = String::new();
    for (name, value) in NUMERIC_PARAMS {
        writeln!(s, "{name}: {value}").ok();
    }
    if p.driver_version.at_least(580, 65) {
        s.push_str("CoherentGPUMemoryMode: \"\"\n");
    }
    for name in STRING_PARAMS {
        writeln!(s, "{name}: \"\"").ok();
    }
    s
}

const NUMERIC_PARAMS: &[(&str, u32)] = &[
    ("ResmanDebugLevel", 4294967295),
    ("RmLogonRC", 1),
    ("ModifyDeviceFiles", 1),
    ("DeviceFileUID", 0),
    ("DeviceFileGID", 0),
    ("DeviceFileMode", 438),
    ("InitializeSystemMemoryAllocations", 1),
    ("UsePageAttributeTable", 4294967295),
    ("EnableMSI", 1),
    ("EnablePCIeGen3", 0),
    ("MemoryPoolSize", 0),
    ("KMallocHeapMaxSize", 0),
    ("VMallocHeapMaxSize", 0),
    ("IgnoreMMIOCheck", 0),
    ("EnableStreamMemOPs", 0),
    ("EnableUserNUMAManagement", 1),
    ("NvLinkDisable", 0),
    ("RmProfilingAdminOnly", 1),
    ("PreserveVideoMemoryAllocations", 0),
    ("EnableS0ixPowerManagement", 0),
    ("S0ixPowerManagementVideoMemoryThreshold", 256),
    ("DynamicPowerManagement", 3),
    ("DynamicPowerManagementVideoMemoryThreshold", 200),
    ("RegisterPCIDriver", 1),
    ("EnablePCIERelaxedOrderingMode", 0),
    ("EnableResizableBar", 0),
    ("EnableGpuFirmware", 18),
    ("EnableGpuFirmwareLogs", 2),
    ("RmNvlinkBandwidthLinkCount", 0),
    ("EnableDbgBreakpoint", 0),
    ("OpenRmEnableUnsupportedGpus", 1),
    ("DmaRemapPeerMmio", 1),
    ("ImexChannelCount", 2048),
    ("CreateImexChannel0", 0),
    ("GrdmaPciTopoCheckOverride", 0),
];

const STRING_PARAMS: &[&str] = &[
    "RegistryDwords",
    "RegistryDwordsPerDevice",
    "RmMsg",
    "GpuBlacklist",
    "TemporaryFilePath",
    "ExcludedGpus",
];

const WARNINGS_README: &str = "The NVIDIA graphics driver tries to detect potential problems\n\
with the host system and warns about them using the system's\n\
logging mechanisms. Important warning message are also logged\n\
to dedicated text files in this directory.\n";

const PATCHES_README: &str = "The NVIDIA graphics driver's kernel interface files can be\n\
patched to improve compatibility with new Linux kernels or to\n\
fix bugs in these files. When applied, each official patch\n\
provides a short text file with a short description of itself\n\
in this directory.\n";

/// `/proc/driver/nvidia/gpus/<bdf>/power`, whose layout changed in 555 and 590.44.
fn power_file(p: &Profile) -> String {
    let v = &p.driver_version;
    let mut s = String::from("Runtime D3 status:          Disabled by default\n");
    if v.at_least(590, 44) {
        s.push_str("Tegra iGPU Rail-Gating:     Disabled\n");
    }
    s.push_str(
        "Video Memory:               Active\n\nGPU Hardware Support:\n Video Memory Self Refresh: Not Supported\n Video Memory Off:          Supported\n",
    );
    if v.at_least(555, 0) {
        s.push_str(
            "\nS0ix Power Management:\n Platform Support:          Not Supported\n Status:                    Disabled\n\nNotebook Dynamic Boost:     Not Supported\n",
        );
    }
    s
}

/// `current_link_speed` for a PCIe generation.
fn link_speed(gen_: u8) -> &'static str {
    match gen_ {
        1 => "2.5 GT/s PCIe",
        2 => "5.0 GT/s PCIe",
        3 => "8.0 GT/s PCIe",
        4 => "16.0 GT/s PCIe",
        5 => "32.0 GT/s PCIe",
        _ => "64.0 GT/s PCIe",
    }
}

/// The GPU's three memory BARs: (start, size, flags). BAR0 (registers, 16 MiB, 32-bit) sits below
/// 4 GiB; BAR1 (memory aperture, the memory size rounded up to a power of two) and BAR3 (32 MiB)
/// share one 64-bit window per GPU, twice the larger of them and at least 1 TiB, so windows
/// never overlap and every BAR is aligned to its size. With 16 TiB per GPU and 64 GPUs the
/// windows end near 2 PiB, far from overflowing.
fn bars(p: &Profile, gpu: &Gpu) -> [(u64, u64, u64); 3] {
    const BAR0_BASE: u64 = 0x9000_0000;
    const BAR0_SIZE: u64 = 16 << 20;
    const BAR3_SIZE: u64 = 32 << 20;
    const WINDOW_BASE: u64 = 0x2000_0000_0000;
    let i = u64::from(gpu.index);
    let bar1_size = nvml::bar1_bytes(p);
    let half = bar1_size.max(BAR3_SIZE);
    let window = WINDOW_BASE + i * (2 * half).max(1 << 40);
    [
        (BAR0_BASE + i * BAR0_SIZE, BAR0_SIZE, 0x0004_0200),
        (window, bar1_size, 0x0014_220c),
        (window + half, BAR3_SIZE, 0x0014_220c),
    ]
}

/// The device directory `sys/devices/pci<dddd>:<bb>/<bdf>/` with its attributes.
fn sysfs_device(t: &mut Tree, dir: &str, p: &Profile, gpu: &Gpu, nr_cpu_ids: u32) {
    let class = p.class;
    let attrs = [
        ("vendor", "0x10de".to_string()),
        ("device", format!("0x{:04x}", p.pci_device)),
        ("subsystem_vendor", format!("0x{:04x}", p.subsystem_vendor)),
        ("subsystem_device", format!("0x{:04x}", p.subsystem_device)),
        ("class", format!("0x{class:06x}")),
        ("revision", format!("0x{:02x}", p.revision)),
        ("numa_node", gpu.numa_node.to_string()),
        ("local_cpulist", gpu.cpus.to_list()),
        ("local_cpus", gpu.cpus.to_mask(nr_cpu_ids)),
        ("irq", gpu.irq.to_string()),
        ("enable", "1".to_string()),
        ("current_link_speed", link_speed(p.pcie_gen).to_string()),
        ("current_link_width", p.pcie_width.to_string()),
        ("max_link_speed", link_speed(p.pcie_gen).to_string()),
        ("max_link_width", p.pcie_width.to_string()),
        (
            "modalias",
            format!(
                "pci:v000010DEd{:08X}sv{:08X}sd{:08X}bc{:02X}sc{:02X}i{:02X}",
                p.pci_device,
                p.subsystem_vendor,
                p.subsystem_device,
                class >> 16,
                (class >> 8) & 0xff,
                class & 0xff
            ),
        ),
    ];
    for (name, value) in attrs {
        t.file(&format!("{dir}/{name}"), format!("{value}\n"));
    }
    let bars = bars(p, gpu);
    let mut resource = String::new();
    for line in 0..7 {
        let (start, end, flags) = match line {
            0 => (bars[0].0, bars[0].0 + bars[0].1 - 1, bars[0].2),
            1 => (bars[1].0, bars[1].0 + bars[1].1 - 1, bars[1].2),
            3 => (bars[2].0, bars[2].0 + bars[2].1 - 1, bars[2].2),
            _ => (0, 0, 0),
        };
        writeln!(resource, "0x{start:016x} 0x{end:016x} 0x{flags:016x}").ok();
    }
    t.file(&format!("{dir}/resource"), resource);
    t.file_mode(&format!("{dir}/config"), config_space(p, gpu), 0o644);
    t.symlink(&format!("{dir}/driver"), "../../../bus/pci/drivers/nvidia");
}

/// 4096 bytes of PCIe configuration space: the type-0 header and a PCI Express capability.
fn config_space(p: &Profile, gpu: &Gpu) -> Vec<u8> {
    let mut c = vec![0u8; 4096];
    let mut put = |off: usize, bytes: &[u8]| c[off..off + bytes.len()].copy_from_slice(bytes);
    put(0x00, &0x10deu16.to_le_bytes());
    put(0x02, &p.pci_device.to_le_bytes());
    put(0x04, &0x0006u16.to_le_bytes()); // memory space + bus master
    put(0x06, &0x0010u16.to_le_bytes()); // capabilities list
    put(0x08, &[p.revision]);
    put(
        0x09,
        &[
            (p.class & 0xff) as u8,
            ((p.class >> 8) & 0xff) as u8,
            (p.class >> 16) as u8,
        ],
    );
    let [bar0, bar1, bar3] = bars(p, gpu);
    put(0x10, &(bar0.0 as u32).to_le_bytes());
    put(0x14, &((bar1.0 as u32) | 0x0c).to_le_bytes());
    put(0x18, &((bar1.0 >> 32) as u32).to_le_bytes());
    put(0x1c, &((bar3.0 as u32) | 0x0c).to_le_bytes());
    put(0x20, &((bar3.0 >> 32) as u32).to_le_bytes());
    put(0x2c, &p.subsystem_vendor.to_le_bytes());
    put(0x2e, &p.subsystem_device.to_le_bytes());
    put(0x34, &[0x60]);
    put(0x3c, &[(gpu.irq & 0xff) as u8, 1]);
    // PCI Express capability (id 0x10), version 2, endpoint, last in the list.
    let link = u16::from(p.pcie_gen) | (u16::from(p.pcie_width) << 4);
    put(0x60, &[0x10, 0x00]);
    put(0x62, &0x0002u16.to_le_bytes());
    put(0x6c, &u32::from(link).to_le_bytes());
    put(0x72, &link.to_le_bytes());
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use mockgpu_api::{CpuSet, HostSocket};

    fn one_socket_host() -> HostTopology {
        HostTopology {
            cpus: CpuSet::from_ids(0..2),
            nr_cpu_ids: 2,
            sockets: vec![HostSocket {
                id: 0,
                cpus: CpuSet::from_ids(0..2),
            }],
            ..Default::default()
        }
    }

    fn file<'a>(t: &'a Tree, path: &str) -> &'a [u8] {
        match &t.get(path).unwrap_or_else(|| panic!("no {path}")).kind {
            crate::tree::Kind::File(f) => f,
            _ => panic!("{path} is not a file"),
        }
    }

    /// The memory BARs of every GPU as `resource` lists them, `(start, end)`, after checking
    /// that `config` holds the same addresses.
    fn rendered_bars(yaml: &str) -> Vec<(u64, u64)> {
        let p = Profile::from_yaml(yaml, "t").unwrap();
        let host = one_socket_host();
        let topo = NodeTopology::build(&p, "n", &host).unwrap();
        let t = driver_tree(&topo, &host);
        let mut all = Vec::new();
        for gpu in &topo.gpus {
            let dir = format!("sys/{}", gpu.bus_id.sysfs_device_path());
            let resource = std::str::from_utf8(file(&t, &format!("{dir}/resource"))).unwrap();
            let lines: Vec<Vec<u64>> = resource
                .lines()
                .map(|l| {
                    l.split(' ')
                        .map(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).unwrap())
                        .collect()
                })
                .collect();
            assert_eq!(lines.len(), 7, "{resource}");
            let config = file(&t, &format!("{dir}/config"));
            let reg = |off: usize| {
                u64::from(u32::from_le_bytes(config[off..off + 4].try_into().unwrap()))
            };
            // BAR0: 32-bit memory; BAR1 and BAR3: 64-bit prefetchable (type bits 0xc).
            assert_eq!(reg(0x10), lines[0][0], "BAR0 of GPU {}", gpu.index);
            assert_eq!(
                reg(0x14) | reg(0x18) << 32,
                lines[1][0] | 0xc,
                "BAR1 of GPU {}",
                gpu.index
            );
            assert_eq!(
                reg(0x1c) | reg(0x20) << 32,
                lines[3][0] | 0xc,
                "BAR3 of GPU {}",
                gpu.index
            );
            assert!(
                lines[0][1] < 1 << 32,
                "BAR0 of GPU {} ends above 4 GiB",
                gpu.index
            );
            for bar in [0, 1, 3] {
                let (start, end) = (lines[bar][0], lines[bar][1]);
                let size = end - start + 1;
                assert!(
                    size.is_power_of_two() && start % size == 0,
                    "BAR{bar} {start:#x}-{end:#x}"
                );
                all.push((start, end));
            }
        }
        all
    }

    #[test]
    fn bars_never_overlap_up_to_the_largest_profiles() {
        for memory_mib in [1, 81559, 512 * 1024, 512 * 1024 + 1, 16 * 1024 * 1024] {
            let yaml = format!("base: h100\ngpus: 64\nmemory_mib: {memory_mib}\n");
            let mut bars = rendered_bars(&yaml);
            assert_eq!(bars.len(), 64 * 3);
            bars.sort();
            for w in bars.windows(2) {
                assert!(
                    w[0].1 < w[1].0,
                    "{memory_mib} MiB: {:x?} overlaps {:x?}",
                    w[0],
                    w[1]
                );
            }
            // BAR1 holds the whole memory.
            let bar1 = rendered_bars(&yaml.replace("gpus: 64", "gpus: 1"))[1];
            assert!(bar1.1 - bar1.0 + 1 >= memory_mib << 20, "{memory_mib} MiB");
        }
    }

    #[test]
    fn power_follows_the_driver_branch() {
        let mut p = Profile::builtin("a100").unwrap();
        p.driver_version = "550.54.15".parse().unwrap();
        assert!(!power_file(&p).contains("S0ix"));
        p.driver_version = "570.148.08".parse().unwrap();
        assert!(power_file(&p).contains("S0ix") && !power_file(&p).contains("Tegra"));
        p.driver_version = "590.44.01".parse().unwrap();
        assert!(power_file(&p).contains("Tegra"));
    }

    #[test]
    fn params_gain_coherent_mode_in_580_65() {
        let mut p = Profile::builtin("a100").unwrap();
        assert!(!params_file(&p).contains("CoherentGPUMemoryMode"));
        p.driver_version = "580.65.06".parse().unwrap();
        let s = params_file(&p);
        let coherent = s.find("CoherentGPUMemoryMode").unwrap();
        assert!(coherent < s.find("RegistryDwords").unwrap());
    }

    #[test]
    fn proprietary_module_without_firmware_prints_na_only_from_590_44() {
        let mut p = Profile::builtin("t4").unwrap();
        p.open_kernel_module = false;
        let topo = NodeTopology::build(&p, "n", &one_socket_host()).unwrap();
        assert!(information::render(&p, &topo.gpus[0], false).contains("GPU Firmware: \t N/A\n"));
        p.driver_version = "580.105.08".parse().unwrap();
        assert!(!information::render(&p, &topo.gpus[0], false).contains("GPU Firmware"));
        assert!(
            version_file(&p).starts_with("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580")
        );
    }

    #[test]
    fn config_space_carries_the_ids() {
        let p = Profile::builtin("gb300").unwrap();
        let topo = NodeTopology::build(&p, "n", &one_socket_host()).unwrap();
        let c = config_space(&p, &topo.gpus[0]);
        assert_eq!(c.len(), 4096);
        assert_eq!(&c[0..4], &[0xde, 0x10, 0xc2, 0x31]);
        assert_eq!(&c[0x09..0x0c], &[0x00, 0x02, 0x03]);
        assert_eq!(&c[0x2c..0x30], &[0xde, 0x10, 0xf1, 0x21]);
    }

    #[test]
    fn numa_status_names_a_node_the_host_lacks() {
        let p = Profile::from_yaml("base: gb300\nnuma_status: true\n", "t").unwrap();
        let host = one_socket_host();
        let topo = NodeTopology::build(&p, "n", &host).unwrap();
        let t = driver_tree(&topo, &host);
        let path = format!("{PROC}/gpus/{}/numa_status", topo.gpus[0].bus_id);
        let crate::tree::Kind::File(f) = &t.get(&path).unwrap().kind else {
            panic!("numa_status is not a file")
        };
        assert!(f.starts_with(b"Node:      1\n"));
        let plain = NodeTopology::build(&Profile::builtin("gb300").unwrap(), "n", &host).unwrap();
        assert!(driver_tree(&plain, &host).get(&path).is_none());
    }
}
