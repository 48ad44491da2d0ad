//! Every value the library reports equals the profile's and the driver files' (gb300 with
//! NVLink and fabric, h100 with NVLink, t4 without either).

mod common;

use std::ffi::{c_char, c_ulong};
use std::ptr::null_mut;

use common::{Dev, Nvml, PciInfo, Rendered, set_root, text};
use mockgpu_api::nvml::{
    bar1_bytes, nvlink_remotes, serial, supported_graphics_clocks, uuid_bytes,
};

#[repr(C)]
#[derive(Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
#[derive(Default)]
struct FabricInfo {
    cluster_uuid: [u8; 16],
    status: u32,
    clique_id: u32,
    state: u8,
}

fn string(f: extern "C" fn(Dev, *mut c_char, u32) -> u32, d: Dev) -> String {
    let mut buf = [0u8; 96];
    assert_eq!(f(d, buf.as_mut_ptr().cast(), 96), 0);
    text(&buf).to_string()
}

fn number(f: extern "C" fn(Dev, *mut u32) -> u32, d: Dev) -> u32 {
    let mut n = u32::MAX;
    assert_eq!(f(d, &mut n), 0);
    n
}

fn check(profile: &str) {
    let (nv, _lock) = Nvml::get();
    let r = Rendered::new(profile);
    set_root(&r.root());
    let topo = &r.topo;
    let p = &topo.profile;
    let n = &p.nvml;
    let driver = r.driver_gpus();
    assert_eq!(nvml!(nv, nvmlInit_v2())(), 0);

    let mut buf = [0u8; 80];
    assert_eq!(
        nvml!(nv, nvmlSystemGetDriverVersion(*mut c_char, u32))(buf.as_mut_ptr().cast(), 80),
        0
    );
    assert_eq!(text(&buf), p.driver_version.to_string());
    let mut cuda = 0i32;
    assert_eq!(
        nvml!(nv, nvmlSystemGetCudaDriverVersion_v2(*mut i32))(&mut cuda),
        0
    );
    assert_eq!(cuda as u32, n.cuda_version.0 * 1000 + n.cuda_version.1 * 10);
    assert_eq!(
        nvml!(nv, nvmlSystemGetNVMLVersion(*mut c_char, u32))(buf.as_mut_ptr().cast(), 80),
        0
    );
    assert_eq!(
        text(&buf),
        format!("{}.{}", n.cuda_version.0, p.driver_version)
    );

    let mut count = 0;
    assert_eq!(nvml!(nv, nvmlDeviceGetCount_v2(*mut u32))(&mut count), 0);
    assert_eq!(count as usize, topo.gpus.len());
    assert_eq!(driver.len(), topo.gpus.len());

    let by_index = nvml!(nv, nvmlDeviceGetHandleByIndex_v2(u32, *mut Dev));
    let handles: Vec<Dev> = (0..count)
        .map(|i| {
            let mut d = null_mut();
            assert_eq!(by_index(i, &mut d), 0);
            d
        })
        .collect();
    for ((gpu, drv), &d) in topo.gpus.iter().zip(&driver).zip(&handles) {
        let ctx = format!("{profile} GPU {}", gpu.index);
        // Identity: the profile, the topology and the driver files agree with NVML.
        let name = string(nvml!(nv, nvmlDeviceGetName(Dev, *mut c_char, u32)), d);
        assert_eq!(name, p.model, "{ctx}");
        assert_eq!(name, drv.information.model, "{ctx}");
        let uuid = string(nvml!(nv, nvmlDeviceGetUUID(Dev, *mut c_char, u32)), d);
        assert_eq!(
            (uuid.as_str(), uuid.as_str()),
            (gpu.uuid.as_str(), drv.information.uuid.as_str()),
            "{ctx}"
        );
        assert_eq!(
            number(nvml!(nv, nvmlDeviceGetMinorNumber(Dev, *mut u32)), d),
            drv.information.device_minor
        );
        assert_eq!(
            number(nvml!(nv, nvmlDeviceGetIndex(Dev, *mut u32)), d),
            gpu.index
        );
        let vbios = string(
            nvml!(nv, nvmlDeviceGetVbiosVersion(Dev, *mut c_char, u32)),
            d,
        );
        assert_eq!(vbios, p.vbios, "{ctx}");
        assert_eq!(
            Some(vbios.to_lowercase()),
            drv.information.video_bios,
            "{ctx}"
        );
        let serial_no = string(nvml!(nv, nvmlDeviceGetSerial(Dev, *mut c_char, u32)), d);
        assert_eq!(serial_no, serial(gpu));
        let part = string(
            nvml!(nv, nvmlDeviceGetBoardPartNumber(Dev, *mut c_char, u32)),
            d,
        );
        assert_eq!(part, n.board_part_number);
        let image = string(
            nvml!(nv, nvmlDeviceGetInforomImageVersion(Dev, *mut c_char, u32)),
            d,
        );
        assert_eq!(image, n.inforom[0]);
        assert_eq!(
            number(nvml!(nv, nvmlDeviceGetBrand(Dev, *mut u32)), d),
            n.brand.value()
        );
        assert_eq!(
            number(nvml!(nv, nvmlDeviceGetArchitecture(Dev, *mut u32)), d),
            n.architecture.value()
        );
        let (mut major, mut minor) = (0i32, 0i32);
        assert_eq!(
            nvml!(
                nv,
                nvmlDeviceGetCudaComputeCapability(Dev, *mut i32, *mut i32)
            )(d, &mut major, &mut minor),
            0
        );
        assert_eq!((major as u32, minor as u32), n.compute_capability);

        // Handles by UUID, serial and bus id find the same device.
        let bus = gpu.bus_id.to_string();
        for (f, key) in [
            (
                nvml!(nv, nvmlDeviceGetHandleByUUID(*const c_char, *mut Dev)),
                uuid.clone(),
            ),
            (
                nvml!(nv, nvmlDeviceGetHandleBySerial(*const c_char, *mut Dev)),
                serial_no.clone(),
            ),
            (
                nvml!(
                    nv,
                    nvmlDeviceGetHandleByPciBusId_v2(*const c_char, *mut Dev)
                ),
                bus.clone(),
            ),
        ] {
            let key = std::ffi::CString::new(key).unwrap();
            let mut h = null_mut();
            assert_eq!(f(key.as_ptr(), &mut h), 0, "{ctx}: {key:?}");
            assert_eq!(h, d, "{ctx}: {key:?}");
        }

        // PCI: bus id, ids from sysfs.
        let mut pci = PciInfo::default();
        assert_eq!(
            nvml!(nv, nvmlDeviceGetPciInfo_v3(Dev, *mut PciInfo))(d, &mut pci),
            0
        );
        assert_eq!(
            text(&pci.bus_id),
            format!(
                "{:08X}:{:02X}:{:02X}.0",
                gpu.bus_id.domain, gpu.bus_id.bus, gpu.bus_id.slot
            )
        );
        assert_eq!(text(&pci.bus_id_legacy), bus.to_uppercase());
        assert_eq!(
            (pci.domain, pci.bus, pci.device),
            (
                gpu.bus_id.domain.into(),
                gpu.bus_id.bus.into(),
                gpu.bus_id.slot.into()
            )
        );
        assert_eq!(pci.pci_device_id, u32::from(p.pci_device) << 16 | 0x10de);
        assert_eq!(
            pci.pci_sub_system_id,
            u32::from(p.subsystem_device) << 16 | u32::from(p.subsystem_vendor)
        );
        assert_eq!(drv.information.bus_location, gpu.bus_id);

        // Memory and BAR1.
        let mut mem = Memory::default();
        assert_eq!(
            nvml!(nv, nvmlDeviceGetMemoryInfo(Dev, *mut Memory))(d, &mut mem),
            0
        );
        assert_eq!(mem.total, p.memory_mib << 20);
        assert_eq!(
            (mem.used, mem.free),
            (n.reserved_mib << 20, (p.memory_mib - n.reserved_mib) << 20)
        );
        assert_eq!(
            nvml!(nv, nvmlDeviceGetBAR1MemoryInfo(Dev, *mut Memory))(d, &mut mem),
            0
        );
        assert_eq!(mem.total, bar1_bytes(p));

        // CPU and memory affinity: the driver files' local_cpulist and numa_node.
        let mut mask = [0 as c_ulong; 4];
        assert_eq!(
            nvml!(nv, nvmlDeviceGetCpuAffinity(Dev, u32, *mut c_ulong))(d, 4, mask.as_mut_ptr()),
            0
        );
        let bits = c_ulong::BITS;
        let cpus: Vec<u32> = (0..4 * bits)
            .filter(|&c| mask[(c / bits) as usize] >> (c % bits) & 1 == 1)
            .collect();
        assert_eq!(cpus, drv.gpu.cpus.iter().collect::<Vec<_>>(), "{ctx}");
        assert_eq!(cpus, gpu.cpus.iter().collect::<Vec<_>>(), "{ctx}");
        let mut node = u32::MAX;
        assert_eq!(
            nvml!(nv, nvmlDeviceGetNumaNodeId(Dev, *mut u32))(d, &mut node),
            0
        );
        assert_eq!(node as i32, drv.gpu.numa_node);
        assert_eq!(
            nvml!(nv, nvmlDeviceGetMemoryAffinity(Dev, u32, *mut c_ulong, u32))(
                d,
                1,
                mask.as_mut_ptr(),
                0
            ),
            0
        );
        assert_eq!(mask[0], 1 << node);

        // Power, temperatures, clocks.
        let mw = |w: u32| w * 1000;
        assert_eq!(
            number(nvml!(nv, nvmlDeviceGetPowerUsage(Dev, *mut u32)), d),
            mw(n.power_w[0])
        );
        assert_eq!(
            number(
                nvml!(nv, nvmlDeviceGetPowerManagementLimit(Dev, *mut u32)),
                d
            ),
            mw(n.power_w[1])
        );
        assert_eq!(
            number(nvml!(nv, nvmlDeviceGetEnforcedPowerLimit(Dev, *mut u32)), d),
            mw(n.power_w[1])
        );
        let (mut lo, mut hi) = (0, 0);
        assert_eq!(
            nvml!(
                nv,
                nvmlDeviceGetPowerManagementLimitConstraints(Dev, *mut u32, *mut u32)
            )(d, &mut lo, &mut hi),
            0
        );
        assert_eq!((lo, hi), (mw(n.power_w[2]), mw(n.power_w[3])));
        let mut t = 0;
        assert_eq!(
            nvml!(nv, nvmlDeviceGetTemperature(Dev, u32, *mut u32))(d, 0, &mut t),
            0
        );
        assert_eq!(t, n.temperatures_c[0]);
        let threshold = nvml!(nv, nvmlDeviceGetTemperatureThreshold(Dev, u32, *mut u32));
        for (kind, want) in [
            (0, n.temperatures_c[2]),
            (1, n.temperatures_c[1]),
            (2, n.temperatures_c[4]),
            (3, n.temperatures_c[3]),
        ] {
            assert_eq!(threshold(d, kind, &mut t), 0);
            assert_eq!(t, want, "{ctx}: threshold {kind}");
        }
        let mut fan = 0;
        let want_fan = if n.fan_percent.is_some() { 0 } else { 3 };
        assert_eq!(
            nvml!(nv, nvmlDeviceGetFanSpeed(Dev, *mut u32))(d, &mut fan),
            want_fan
        );
        let max_clock = nvml!(nv, nvmlDeviceGetMaxClockInfo(Dev, u32, *mut u32));
        let mut mhz = 0;
        for (kind, want) in [
            (0, n.graphics_mhz[0]),
            (1, n.graphics_mhz[0]),
            (2, n.memory_mhz),
            (3, n.video_max_mhz),
        ] {
            assert_eq!(max_clock(d, kind, &mut mhz), 0);
            assert_eq!(mhz, want, "{ctx}: clock {kind}");
        }
        let mut len = 1024;
        let mut clocks = vec![0u32; 1024];
        assert_eq!(
            nvml!(
                nv,
                nvmlDeviceGetSupportedGraphicsClocks(Dev, u32, *mut u32, *mut u32)
            )(d, n.memory_mhz, &mut len, clocks.as_mut_ptr()),
            0
        );
        clocks.truncate(len as usize);
        assert_eq!(clocks, supported_graphics_clocks(n));
        let (mut current, mut pending) = (9, 9);
        assert_eq!(
            nvml!(nv, nvmlDeviceGetEccMode(Dev, *mut u32, *mut u32))(d, &mut current, &mut pending),
            0
        );
        assert_eq!((current, pending), (u32::from(n.ecc), u32::from(n.ecc)));
        assert_eq!(
            nvml!(nv, nvmlDeviceGetMigMode(Dev, *mut u32, *mut u32))(d, &mut current, &mut pending),
            0
        );
        assert_eq!((current, pending), (0, 0));

        // NVLink: one link per profile link, each to the GPU the topology names.
        let remotes = nvlink_remotes(topo, gpu);
        let link_count = n.nvlink.map_or(0, |(l, _)| l);
        assert_eq!(remotes.len() as u32, link_count, "{ctx}");
        let state = nvml!(nv, nvmlDeviceGetNvLinkState(Dev, u32, *mut u32));
        let remote = nvml!(
            nv,
            nvmlDeviceGetNvLinkRemotePciInfo_v2(Dev, u32, *mut PciInfo)
        );
        let version = nvml!(nv, nvmlDeviceGetNvLinkVersion(Dev, u32, *mut u32));
        for (link, want) in remotes.iter().enumerate() {
            let mut active = 0;
            assert_eq!(state(d, link as u32, &mut active), 0);
            assert_eq!(active, 1);
            assert_eq!(remote(d, link as u32, &mut pci), 0);
            assert_eq!(
                text(&pci.bus_id_legacy),
                want.to_string().to_uppercase(),
                "{ctx} link {link}"
            );
            let mut v = 0;
            assert_eq!(version(d, link as u32, &mut v), 0);
            assert_eq!(Some(v), n.nvlink.map(|(_, v)| v));
        }
        let mut active = 0;
        let past = if link_count == 0 { 3 } else { 2 };
        assert_eq!(
            state(d, link_count, &mut active),
            past,
            "{ctx}: link past the last"
        );

        // Fabric (GB200/GB300).
        let mut fabric = FabricInfo::default();
        let r = nvml!(nv, nvmlDeviceGetGpuFabricInfo(Dev, *mut FabricInfo))(d, &mut fabric);
        match &n.fabric {
            Some(f) => {
                assert_eq!(r, 0);
                assert_eq!(Some(fabric.cluster_uuid), uuid_bytes(&f.cluster_uuid));
                assert_eq!(
                    (fabric.clique_id, fabric.state, fabric.status),
                    (f.clique_id, 3, 0)
                );
            }
            None => assert_eq!(r, 3, "{ctx}"),
        }
    }

    // Topology: the GPUs of one NUMA node are each other's nearest.
    if let [a, b, ..] = handles[..] {
        let mut level = 0;
        assert_eq!(
            nvml!(nv, nvmlDeviceGetTopologyCommonAncestor(Dev, Dev, *mut u32))(a, b, &mut level),
            0
        );
        let same_node = driver[0].gpu.numa_node == driver[1].gpu.numa_node;
        assert_eq!(level, if same_node { 40 } else { 50 });
    }
    assert_eq!(nvml!(nv, nvmlShutdown())(), 0);
}

#[test]
fn gb300_with_nvlink_and_fabric() {
    check("gb300");
}

#[test]
fn h100_with_nvlink() {
    check("h100");
}

#[test]
fn t4_without_nvlink() {
    check("t4");
}
