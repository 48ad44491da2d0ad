//! NVLink (state, version, capabilities, the remote GPU of each link) and the GPU fabric.

use crate::device::pci_info;
use crate::ffi::{self, Device, Ret};
use crate::out::put;
use crate::parse::BusId;
use crate::state::{Device as Gpu, with_device, with_loaded};

/// Runs `f` with the device and the remote bus id of `link` (`NVML_ERROR_NOT_SUPPORTED` without
/// NVLink, `NVML_ERROR_INVALID_ARGUMENT` past the last link).
fn with_link(device: Device, link: u32, f: impl FnOnce(&Gpu, BusId) -> Ret) -> Ret {
    with_device(device, |d| {
        if d.nvlink_remotes.is_empty() {
            return ffi::ERROR_NOT_SUPPORTED;
        }
        match d.nvlink_remotes.get(link as usize) {
            Some(&bus) => f(d, bus),
            None => ffi::ERROR_INVALID_ARGUMENT,
        }
    })
}

/// # Safety
/// `active` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: Device,
    link: u32,
    active: *mut u32,
) -> Ret {
    with_link(device, link, |d, _| {
        let down = d.nvlink_down.checked_shr(link).unwrap_or(0) & 1 == 1;
        let state = if down {
            ffi::FEATURE_DISABLED
        } else {
            ffi::FEATURE_ENABLED
        };
        // SAFETY: the caller's contract.
        unsafe { put(active, state) }
    })
}

/// # Safety
/// `version` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkVersion(
    device: Device,
    link: u32,
    version: *mut u32,
) -> Ret {
    with_device(device, |d| {
        match (d.nvlink_version, d.nvlink_remotes.get(link as usize)) {
            // SAFETY: the caller's contract.
            (Some(v), Some(_)) => unsafe { put(version, v) },
            (None, _) => ffi::ERROR_NOT_SUPPORTED,
            _ => ffi::ERROR_INVALID_ARGUMENT,
        }
    })
}

/// Every capability but the SLI bridge.
///
/// # Safety
/// `result` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkCapability(
    device: Device,
    link: u32,
    capability: u32,
    result: *mut u32,
) -> Ret {
    if capability >= ffi::NVLINK_CAP_COUNT {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    let value = u32::from(capability != ffi::NVLINK_CAP_SLI_BRIDGE);
    // SAFETY: the caller's contract.
    with_link(device, link, |_, _| unsafe { put(result, value) })
}

/// # Safety
/// `pci` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: Device,
    link: u32,
    pci: *mut ffi::PciInfo,
) -> Ret {
    let mut remote = None;
    let r = with_link(device, link, |_, bus| {
        remote = Some(bus);
        ffi::SUCCESS
    });
    let Some(bus) = remote else { return r };
    with_loaded(|l| match l.devices.iter().find(|d| d.bus == bus) {
        // SAFETY: the caller's contract.
        Some(d) => unsafe { put(pci, pci_info(d)) },
        None => ffi::ERROR_UNKNOWN,
    })
}

/// # Safety
/// `pci` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo(
    device: Device,
    link: u32,
    pci: *mut ffi::PciInfo,
) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci) }
}

/// # Safety
/// `info` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    device: Device,
    info: *mut ffi::GpuFabricInfo,
) -> Ret {
    with_device(device, |d| {
        let Some((cluster_uuid, clique_id)) = d.fabric else {
            return ffi::ERROR_NOT_SUPPORTED;
        };
        // SAFETY: the caller's contract.
        unsafe {
            put(
                info,
                ffi::GpuFabricInfo {
                    cluster_uuid,
                    status: ffi::SUCCESS,
                    clique_id,
                    state: ffi::GPU_FABRIC_STATE_COMPLETED,
                },
            )
        }
    })
}

/// # Safety
/// `info` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device: Device,
    info: *mut ffi::GpuFabricInfoV2,
) -> Ret {
    with_device(device, |d| {
        if info.is_null() {
            return ffi::ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null, valid by the caller's contract.
        if unsafe { (*info).version } != ffi::GPU_FABRIC_INFO_V2 {
            return ffi::ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let Some((cluster_uuid, clique_id)) = d.fabric else {
            return ffi::ERROR_NOT_SUPPORTED;
        };
        // SAFETY: as above.
        unsafe {
            put(
                info,
                ffi::GpuFabricInfoV2 {
                    version: ffi::GPU_FABRIC_INFO_V2,
                    cluster_uuid,
                    status: ffi::SUCCESS,
                    clique_id,
                    state: ffi::GPU_FABRIC_STATE_COMPLETED,
                    health_mask: 0,
                },
            )
        }
    })
}
