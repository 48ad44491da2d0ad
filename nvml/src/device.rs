//! Identity, PCI, memory, CPU and memory affinity, and topology.

use alloc::vec::Vec;
use core::ffi::{c_char, c_ulong};

use crate::ffi::{self, Device, Ret};
use crate::out::{put, put_list, put_mask, put_str};
use crate::state::{self, with_any_device, with_device, with_loaded};

/// Defines `unsafe extern "C" fn $name(device, buf, length)` writing the string `$field`.
macro_rules! string_getter {
    ($($name:ident => |$d:ident| $value:expr;)*) => {$(
        /// # Safety
        /// `buf` is NULL or valid for `length` bytes.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: Device, buf: *mut c_char, length: u32) -> Ret {
            // SAFETY: the caller's contract.
            with_device(device, |$d| unsafe { put_str(buf, length, $value) })
        }
    )*};
}

/// Defines `unsafe extern "C" fn $name(device, out)` writing one value.
macro_rules! getter {
    ($($name:ident: $ty:ty => |$d:ident| $value:expr;)*) => {$(
        /// # Safety
        /// `out` is NULL or valid.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: Device, out: *mut $ty) -> Ret {
            // SAFETY: the caller's contract.
            with_device(device, |$d| unsafe { put(out, $value) })
        }
    )*};
}
pub(crate) use getter;

string_getter! {
    nvmlDeviceGetName => |d| &d.name;
    nvmlDeviceGetUUID => |d| &d.uuid;
    nvmlDeviceGetSerial => |d| &d.serial;
    nvmlDeviceGetBoardPartNumber => |d| &d.board_part_number;
    nvmlDeviceGetVbiosVersion => |d| &d.vbios;
    nvmlDeviceGetInforomImageVersion => |d| &d.inforom[0];
}

getter! {
    nvmlDeviceGetIndex: u32 => |d| d.index;
    nvmlDeviceGetMinorNumber: u32 => |d| d.minor;
    nvmlDeviceGetBrand: u32 => |d| d.brand;
    nvmlDeviceGetArchitecture: u32 => |d| d.architecture;
    nvmlDeviceGetMemoryInfo: ffi::Memory => |d| ffi::Memory {
        total: d.memory_total,
        free: d.memory_total.saturating_sub(d.memory_reserved),
        used: d.memory_reserved,
    };
    nvmlDeviceGetBAR1MemoryInfo: ffi::Bar1Memory => |d| ffi::Bar1Memory {
        total: d.bar1_total,
        free: d.bar1_total.saturating_sub(BAR1_USED),
        used: BAR1_USED.min(d.bar1_total),
    };
}

/// Defines the PCI info getters, which answer for a GPU fallen off the bus too (its bus id; the
/// ids read 0, its sysfs entry being gone).
macro_rules! pci_getter {
    ($($name:ident),*) => {$(
        /// # Safety
        /// `out` is NULL or valid.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: Device, out: *mut ffi::PciInfo) -> Ret {
            // SAFETY: the caller's contract.
            with_any_device(device, |d| unsafe { put(out, pci_info(d)) })
        }
    )*};
}

pci_getter!(
    nvmlDeviceGetPciInfo,
    nvmlDeviceGetPciInfo_v2,
    nvmlDeviceGetPciInfo_v3
);

/// BAR1 the driver maps for itself on an idle GPU (bytes).
const BAR1_USED: u64 = 2 << 20;

/// `nvmlPciInfo_t` of `d`.
pub fn pci_info(d: &state::Device) -> ffi::PciInfo {
    let mut legacy = [0u8; 16];
    let mut full = [0u8; 32];
    d.bus.legacy(&mut legacy);
    d.bus.full(&mut full);
    ffi::PciInfo {
        bus_id_legacy: legacy.map(|b| b as c_char),
        domain: d.bus.domain,
        bus: d.bus.bus,
        device: d.bus.device,
        pci_device_id: d.pci_device_id,
        pci_sub_system_id: d.pci_subsystem_id,
        bus_id: full.map(|b| b as c_char),
    }
}

/// # Safety
/// `major` and `minor` are NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: Device,
    major: *mut i32,
    minor: *mut i32,
) -> Ret {
    with_device(device, |d| {
        if major.is_null() || minor.is_null() {
            return ffi::ERROR_INVALID_ARGUMENT;
        }
        let (ma, mi) = d.compute_capability;
        // SAFETY: both are valid (checked non-null; the caller's contract).
        unsafe {
            put(major, i32::try_from(ma).unwrap_or(0));
            put(minor, i32::try_from(mi).unwrap_or(0))
        }
    })
}

/// # Safety
/// `buf` is NULL or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetInforomVersion(
    device: Device,
    object: u32,
    buf: *mut c_char,
    length: u32,
) -> Ret {
    with_device(device, |d| {
        let v = match object {
            ffi::INFOROM_OEM => &d.inforom[1],
            ffi::INFOROM_ECC => &d.inforom[2],
            ffi::INFOROM_POWER => &d.inforom[3],
            _ => return ffi::ERROR_INVALID_ARGUMENT,
        };
        if v.as_slice() == b"N/A" {
            return ffi::ERROR_NOT_SUPPORTED;
        }
        // SAFETY: the caller's contract.
        unsafe { put_str(buf, length, v) }
    })
}

/// # Safety
/// `pci` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfoExt(device: Device, pci: *mut ffi::PciInfoExt) -> Ret {
    with_device(device, |d| {
        if pci.is_null() {
            return ffi::ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null, valid by the caller's contract.
        if unsafe { (*pci).version } != ffi::PCI_INFO_EXT_V1 {
            return ffi::ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let p = pci_info(d);
        // SAFETY: as above.
        unsafe {
            put(
                pci,
                ffi::PciInfoExt {
                    version: ffi::PCI_INFO_EXT_V1,
                    domain: p.domain,
                    bus: p.bus,
                    device: p.device,
                    pci_device_id: p.pci_device_id,
                    pci_sub_system_id: p.pci_sub_system_id,
                    base_class: d.class >> 16,
                    sub_class: (d.class >> 8) & 0xff,
                    bus_id: p.bus_id,
                },
            )
        }
    })
}

/// # Safety
/// `memory` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: Device,
    memory: *mut ffi::MemoryV2,
) -> Ret {
    with_device(device, |d| {
        if memory.is_null() {
            return ffi::ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null, valid by the caller's contract.
        if unsafe { (*memory).version } != ffi::MEMORY_V2 {
            return ffi::ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        // SAFETY: as above.
        unsafe {
            put(
                memory,
                ffi::MemoryV2 {
                    version: ffi::MEMORY_V2,
                    total: d.memory_total,
                    reserved: d.memory_reserved,
                    free: d.memory_total.saturating_sub(d.memory_reserved),
                    used: 0,
                },
            )
        }
    })
}

/// # Safety
/// `node` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(device: Device, node: *mut u32) -> Ret {
    with_device(device, |d| match u32::try_from(d.numa_node) {
        // SAFETY: the caller's contract.
        Ok(n) => unsafe { put(node, n) },
        Err(_) => ffi::ERROR_NOT_SUPPORTED,
    })
}

/// The GPU's `local_cpulist` as a CPU mask; both scopes give it (the GPU's CPUs are its NUMA
/// node's, and the agent places each GPU on one socket).
///
/// # Safety
/// `set` is NULL or valid for `size` words.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinityWithinScope(
    device: Device,
    size: u32,
    set: *mut c_ulong,
    scope: u32,
) -> Ret {
    if scope > ffi::AFFINITY_SCOPE_SOCKET {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: the caller's contract.
    with_device(device, |d| unsafe {
        put_mask(set, size, d.cpus.iter().copied())
    })
}

/// # Safety
/// `set` is NULL or valid for `size` words.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    device: Device,
    size: u32,
    set: *mut c_ulong,
) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { nvmlDeviceGetCpuAffinityWithinScope(device, size, set, ffi::AFFINITY_SCOPE_NODE) }
}

/// The GPU's NUMA node as a node mask (empty without one).
///
/// # Safety
/// `set` is NULL or valid for `size` words.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryAffinity(
    device: Device,
    size: u32,
    set: *mut c_ulong,
    scope: u32,
) -> Ret {
    if scope > ffi::AFFINITY_SCOPE_SOCKET {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    with_device(device, |d| {
        let node = u32::try_from(d.numa_node).ok();
        // SAFETY: the caller's contract.
        unsafe { put_mask(set, size, node.into_iter()) }
    })
}

/// The path between two GPUs: the same GPU, the same NUMA node (through the host bridges of one
/// CPU), or across the system interconnect.
fn level(a: &state::Device, b: &state::Device) -> u32 {
    if core::ptr::eq(a, b) {
        ffi::TOPOLOGY_INTERNAL
    } else if a.numa_node >= 0 && a.numa_node == b.numa_node {
        ffi::TOPOLOGY_NODE
    } else {
        ffi::TOPOLOGY_SYSTEM
    }
}

/// # Safety
/// `path` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    a: Device,
    b: Device,
    path: *mut u32,
) -> Ret {
    with_loaded(|l| {
        let (Some(i), Some(j)) = (
            l.devices.iter().position(|d| d.is(a)),
            l.devices.iter().position(|d| d.is(b)),
        ) else {
            return ffi::ERROR_INVALID_ARGUMENT;
        };
        match (l.devices.get(i), l.devices.get(j)) {
            (Some(a), Some(b)) if a.lost || b.lost => ffi::ERROR_GPU_IS_LOST,
            // SAFETY: the caller's contract.
            (Some(a), Some(b)) => unsafe { put(path, level(a, b)) },
            _ => ffi::ERROR_INVALID_ARGUMENT,
        }
    })
}

/// The other GPUs at most `lvl` away.
///
/// # Safety
/// `count` is NULL or valid; `devices` is NULL or valid for `*count` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyNearestGpus(
    device: Device,
    lvl: u32,
    count: *mut u32,
    devices: *mut Device,
) -> Ret {
    with_loaded(|l| {
        let Some(me) = l.devices.iter().find(|d| d.is(device)) else {
            return ffi::ERROR_INVALID_ARGUMENT;
        };
        if me.lost {
            return ffi::ERROR_GPU_IS_LOST;
        }
        let near: Vec<Device> = l
            .devices
            .iter()
            .filter(|d| !d.lost && !d.is(device) && level(me, d) <= lvl)
            .map(|d| d.handle())
            .collect();
        // SAFETY: the caller's contract.
        unsafe { put_list(count, devices, &near) }
    })
}
