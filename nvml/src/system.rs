//! Initialisation, versions, error strings, device count and handles.

use alloc::vec::Vec;
use core::ffi::{CStr, c_char};

use crate::device::pci_info;
use crate::ffi::{self, Device, Ret};
use crate::out::{put, put_list, put_str};
use crate::parse::BusId;
use crate::state::{self, with_loaded};

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> Ret {
    state::init(0)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> Ret {
    state::init(0)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(flags: u32) -> Ret {
    state::init(flags)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> Ret {
    state::shutdown()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    ffi::error_string(result).as_ptr()
}

/// # Safety
/// `version` is NULL or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: u32) -> Ret {
    // SAFETY: the caller's contract.
    with_loaded(|l| unsafe { put_str(version, length, &l.driver_version) })
}

/// `<CUDA major>.<driver version>`, as NVML numbers itself (`13.580.173.02`).
///
/// # Safety
/// `version` is NULL or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: u32) -> Ret {
    with_loaded(|l| {
        let mut v = alloc::format!("{}.", l.cuda_version / 1000).into_bytes();
        v.extend_from_slice(&l.driver_version);
        // SAFETY: the caller's contract.
        unsafe { put_str(version, length, &v) }
    })
}

/// # Safety
/// `version` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut i32) -> Ret {
    // SAFETY: the caller's contract.
    with_loaded(|l| unsafe { put(version, i32::try_from(l.cuda_version).unwrap_or(0)) })
}

/// # Safety
/// `version` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut i32) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { nvmlSystemGetCudaDriverVersion(version) }
}

/// # Safety
/// `count` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut u32) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

/// # Safety
/// `count` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut u32) -> Ret {
    // SAFETY: the caller's contract.
    with_loaded(|l| unsafe { put(count, u32::try_from(l.devices.len()).unwrap_or(0)) })
}

/// Writes the handle of the first device `pick` accepts, else `NVML_ERROR_NOT_FOUND`; for a GPU
/// fallen off the bus `NVML_ERROR_GPU_IS_LOST` (its handle, written too, answers only
/// `nvmlDeviceGetPciInfo*`, so that a tool can name the lost GPU by its bus id).
///
/// # Safety
/// `device` is NULL or valid.
unsafe fn handle_of(device: *mut Device, pick: impl Fn(&state::Device) -> bool) -> Ret {
    with_loaded(|l| match l.devices.iter().find(|d| pick(d)) {
        // SAFETY: the caller's contract.
        Some(d) => match unsafe { put(device, d.handle()) } {
            ffi::SUCCESS if d.lost => ffi::ERROR_GPU_IS_LOST,
            r => r,
        },
        None if device.is_null() => ffi::ERROR_INVALID_ARGUMENT,
        None => ffi::ERROR_NOT_FOUND,
    })
}

/// # Safety
/// `device` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(index: u32, device: *mut Device) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// # Safety
/// `device` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: u32, device: *mut Device) -> Ret {
    let r = with_loaded(|l| {
        if usize::try_from(index).is_ok_and(|i| i < l.devices.len()) {
            ffi::SUCCESS
        } else {
            ffi::ERROR_INVALID_ARGUMENT
        }
    });
    if r != ffi::SUCCESS {
        return r;
    }
    // SAFETY: the caller's contract.
    unsafe { handle_of(device, |d| d.index == index) }
}

/// A C string argument's bytes, `None` for NULL.
///
/// # Safety
/// `s` is NULL or NUL-terminated.
unsafe fn c_arg<'a>(s: *const c_char) -> Option<&'a [u8]> {
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_bytes())
}

/// # Safety
/// `uuid` is NULL or NUL-terminated; `device` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut Device,
) -> Ret {
    // SAFETY: the caller's contract.
    let Some(uuid) = (unsafe { c_arg(uuid) }) else {
        return ffi::ERROR_INVALID_ARGUMENT;
    };
    // SAFETY: the caller's contract.
    unsafe { handle_of(device, |d| d.uuid.eq_ignore_ascii_case(uuid)) }
}

/// # Safety
/// `serial` is NULL or NUL-terminated; `device` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    device: *mut Device,
) -> Ret {
    // SAFETY: the caller's contract.
    let Some(serial) = (unsafe { c_arg(serial) }) else {
        return ffi::ERROR_INVALID_ARGUMENT;
    };
    // SAFETY: the caller's contract.
    unsafe { handle_of(device, |d| d.serial == serial) }
}

/// # Safety
/// `bus_id` is NULL or NUL-terminated; `device` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    device: *mut Device,
) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(bus_id, device) }
}

/// # Safety
/// `bus_id` is NULL or NUL-terminated; `device` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut Device,
) -> Ret {
    // SAFETY: the caller's contract.
    let Some(bus) = (unsafe { c_arg(bus_id) }).and_then(BusId::parse) else {
        return ffi::ERROR_INVALID_ARGUMENT;
    };
    // SAFETY: the caller's contract.
    unsafe { handle_of(device, |d| d.bus == bus) }
}

/// # Safety
/// `count` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGetExcludedDeviceCount(count: *mut u32) -> Ret {
    // SAFETY: the caller's contract.
    with_loaded(|l| unsafe { put(count, u32::try_from(l.excluded.len()).unwrap_or(0)) })
}

/// # Safety
/// `info` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGetExcludedDeviceInfoByIndex(
    index: u32,
    info: *mut ffi::ExcludedDeviceInfo,
) -> Ret {
    with_loaded(|l| {
        let Some(d) = l.excluded.get(index as usize) else {
            return ffi::ERROR_INVALID_ARGUMENT;
        };
        let mut uuid = [0; ffi::DEVICE_UUID_BUFFER_SIZE];
        for (to, &from) in uuid.iter_mut().zip(
            d.uuid
                .iter()
                .take(ffi::DEVICE_UUID_BUFFER_SIZE.saturating_sub(1)),
        ) {
            *to = from as c_char;
        }
        // SAFETY: the caller's contract.
        unsafe {
            put(
                info,
                ffi::ExcludedDeviceInfo {
                    pci: pci_info(d),
                    uuid,
                },
            )
        }
    })
}

/// The GPUs whose CPU affinity includes `cpu`.
///
/// # Safety
/// `count` is NULL or valid; `devices` is NULL or valid for `*count` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetTopologyGpuSet(
    cpu: u32,
    count: *mut u32,
    devices: *mut Device,
) -> Ret {
    with_loaded(|l| {
        let near: Vec<Device> = l
            .devices
            .iter()
            .filter(|d| d.cpus.contains(&cpu))
            .map(|d| d.handle())
            .collect();
        // SAFETY: the caller's contract.
        unsafe { put_list(count, devices, &near) }
    })
}
