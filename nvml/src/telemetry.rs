//! Power, temperatures, fan, utilization, performance state, modes, ECC, retired pages and
//! remapped rows, MIG mode, processes.

use alloc::vec::Vec;

use crate::device::getter;
use crate::ffi::{self, Device, Ret};
use crate::out::{put, put_list};
use crate::state::{Device as Gpu, with_device};

getter! {
    nvmlDeviceGetPowerUsage: u32 => |d| d.power[0];
    nvmlDeviceGetPowerManagementLimit: u32 => |d| d.power[1];
    nvmlDeviceGetPowerManagementDefaultLimit: u32 => |d| d.power[1];
    nvmlDeviceGetEnforcedPowerLimit: u32 => |d| d.power[1];
    nvmlDeviceGetPowerManagementMode: u32 => |_d| ffi::FEATURE_ENABLED;
    nvmlDeviceGetUtilizationRates: ffi::Utilization => |_d| ffi::Utilization { gpu: 0, memory: 0 };
    nvmlDeviceGetPerformanceState: u32 => |_d| ffi::PSTATE_0;
    nvmlDeviceGetPowerState: u32 => |_d| ffi::PSTATE_0;
    nvmlDeviceGetPersistenceMode: u32 => |_d| ffi::FEATURE_ENABLED;
    nvmlDeviceGetComputeMode: u32 => |_d| ffi::COMPUTEMODE_DEFAULT;
    nvmlDeviceGetRetiredPagesPendingStatus: u32 => |d| u32::from(d.retired_pending && !row_remapping(d));
}

/// Whether the GPU remaps rows (Ampere and later) rather than retiring pages.
fn row_remapping(d: &Gpu) -> bool {
    d.architecture >= ffi::DEVICE_ARCH_AMPERE
}

/// # Safety
/// `min` and `max` are NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    device: Device,
    min: *mut u32,
    max: *mut u32,
) -> Ret {
    with_device(device, |d| {
        if min.is_null() || max.is_null() {
            return ffi::ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: both checked non-null, valid by the caller's contract.
        unsafe {
            put(min, d.power[2]);
            put(max, d.power[3])
        }
    })
}

/// # Safety
/// `temp` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: Device,
    sensor: u32,
    temp: *mut u32,
) -> Ret {
    if sensor != ffi::TEMPERATURE_GPU {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: the caller's contract.
    with_device(device, |d| unsafe { put(temp, d.temperatures[0]) })
}

/// # Safety
/// `temp` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: Device,
    kind: u32,
    temp: *mut u32,
) -> Ret {
    with_device(device, |d| {
        let v = match kind {
            ffi::TEMPERATURE_THRESHOLD_SHUTDOWN => d.temperatures[2],
            ffi::TEMPERATURE_THRESHOLD_SLOWDOWN => d.temperatures[1],
            ffi::TEMPERATURE_THRESHOLD_MEM_MAX => d.temperatures[4],
            ffi::TEMPERATURE_THRESHOLD_GPU_MAX => d.temperatures[3],
            4..=6 => return ffi::ERROR_NOT_SUPPORTED,
            _ => return ffi::ERROR_INVALID_ARGUMENT,
        };
        // SAFETY: the caller's contract.
        unsafe { put(temp, v) }
    })
}

/// # Safety
/// `count` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumFans(device: Device, count: *mut u32) -> Ret {
    // SAFETY: the caller's contract.
    with_device(device, |d| unsafe {
        put(count, u32::from(d.fan_speed.is_some()))
    })
}

/// # Safety
/// `speed` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed_v2(
    device: Device,
    fan: u32,
    speed: *mut u32,
) -> Ret {
    with_device(device, |d| match (d.fan_speed, fan) {
        // SAFETY: the caller's contract.
        (Some(s), 0) => unsafe { put(speed, s) },
        (Some(_), _) => ffi::ERROR_INVALID_ARGUMENT,
        (None, _) => ffi::ERROR_NOT_SUPPORTED,
    })
}

/// # Safety
/// `speed` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(device: Device, speed: *mut u32) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { nvmlDeviceGetFanSpeed_v2(device, 0, speed) }
}

/// # Safety
/// `current` and `pending` are NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: Device,
    current: *mut u32,
    pending: *mut u32,
) -> Ret {
    with_device(device, |d| {
        if current.is_null() || pending.is_null() {
            return ffi::ERROR_INVALID_ARGUMENT;
        }
        let mode = u32::from(d.ecc);
        // SAFETY: both checked non-null, valid by the caller's contract.
        unsafe {
            put(current, mode);
            put(pending, mode)
        }
    })
}

/// The served error counts (corrected, uncorrected), volatile and aggregate alike
/// (`NVML_ERROR_NOT_SUPPORTED` with ECC off).
///
/// # Safety
/// `count` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: Device,
    error: u32,
    counter: u32,
    count: *mut u64,
) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { ecc_errors(device, error, counter, ffi::MEMORY_LOCATION_DRAM, count) }
}

/// The counts are in device memory (DRAM); every other location has none.
///
/// # Safety
/// `count` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryErrorCounter(
    device: Device,
    error: u32,
    counter: u32,
    location: u32,
    count: *mut u64,
) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { ecc_errors(device, error, counter, location, count) }
}

/// The `error` count (`nvmlMemoryErrorType_t`) in `location`.
///
/// # Safety
/// `count` is NULL or valid.
unsafe fn ecc_errors(
    device: Device,
    error: u32,
    counter: u32,
    location: u32,
    count: *mut u64,
) -> Ret {
    if counter >= ffi::ECC_COUNTER_TYPE_COUNT || location >= ffi::MEMORY_LOCATION_COUNT {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    with_device(device, |d| {
        let Some(&n) = d.ecc_errors.get(error as usize) else {
            return ffi::ERROR_INVALID_ARGUMENT;
        };
        if !d.ecc {
            return ffi::ERROR_NOT_SUPPORTED;
        }
        let n = if location == ffi::MEMORY_LOCATION_DRAM {
            n
        } else {
            0
        };
        // SAFETY: the caller's contract.
        unsafe { put(count, n) }
    })
}

/// Before Ampere, the pages retired for double-bit errors (one per uncorrectable error, at
/// made-up addresses); from Ampere on rows are remapped instead and no page is retired.
///
/// # Safety
/// `count` is NULL or valid; `addresses` and `timestamps` are NULL or valid for `*count` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: Device,
    cause: u32,
    count: *mut u32,
    addresses: *mut u64,
    timestamps: *mut u64,
) -> Ret {
    if cause >= ffi::PAGE_RETIREMENT_CAUSE_COUNT {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    with_device(device, |d| {
        let retired =
            if cause == ffi::PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR && !row_remapping(d) {
                d.retired
            } else {
                0
            };
        let pages: Vec<u64> = (1..=u64::from(retired))
            .map(|i| i.saturating_mul(4096))
            .collect();
        // SAFETY: the caller's contract.
        let r = unsafe { put_list(count, addresses, &pages) };
        if r == ffi::SUCCESS && !timestamps.is_null() && !pages.is_empty() {
            // SAFETY: as `addresses`, which took the list.
            unsafe { core::ptr::write_bytes(timestamps, 0, pages.len()) };
        }
        r
    })
}

/// # Safety
/// `count` is NULL or valid; `addresses` is NULL or valid for `*count` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: Device,
    cause: u32,
    count: *mut u32,
    addresses: *mut u64,
) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { nvmlDeviceGetRetiredPages_v2(device, cause, count, addresses, core::ptr::null_mut()) }
}

/// From Ampere on, the rows remapped for uncorrectable errors, pending and failed (before: none).
///
/// # Safety
/// The four pointers are NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: Device,
    corrected: *mut u32,
    uncorrected: *mut u32,
    pending: *mut u32,
    failed: *mut u32,
) -> Ret {
    with_device(device, |d| {
        if [corrected, uncorrected, pending, failed]
            .iter()
            .any(|p| p.is_null())
        {
            return ffi::ERROR_INVALID_ARGUMENT;
        }
        let on = row_remapping(d);
        let values = [
            0,
            if on { d.retired } else { 0 },
            u32::from(on && d.retired_pending),
            u32::from(on && d.remap_failure),
        ];
        for (p, v) in [corrected, uncorrected, pending, failed]
            .into_iter()
            .zip(values)
        {
            // SAFETY: checked non-null, valid by the caller's contract.
            unsafe { put(p, v) };
        }
        ffi::SUCCESS
    })
}

/// # Safety
/// `current` and `pending` are NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: Device,
    current: *mut u32,
    pending: *mut u32,
) -> Ret {
    with_device(device, |_| {
        if current.is_null() || pending.is_null() {
            return ffi::ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: both checked non-null, valid by the caller's contract.
        unsafe {
            put(current, ffi::DEVICE_MIG_DISABLE);
            put(pending, ffi::DEVICE_MIG_DISABLE)
        }
    })
}

/// Defines the running-process lists: no process runs on a mock GPU.
macro_rules! no_processes {
    ($($name:ident),*) => {$(
        /// # Safety
        /// `count` is NULL or valid.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: Device, count: *mut u32, infos: *mut u8) -> Ret {
            // SAFETY: the caller's contract.
            with_device(device, |_| unsafe { put_list::<u8>(count, infos, &[]) })
        }
    )*};
}

no_processes!(
    nvmlDeviceGetComputeRunningProcesses,
    nvmlDeviceGetComputeRunningProcesses_v2,
    nvmlDeviceGetComputeRunningProcesses_v3,
    nvmlDeviceGetGraphicsRunningProcesses,
    nvmlDeviceGetGraphicsRunningProcesses_v2,
    nvmlDeviceGetGraphicsRunningProcesses_v3,
    nvmlDeviceGetMPSComputeRunningProcesses,
    nvmlDeviceGetMPSComputeRunningProcesses_v2,
    nvmlDeviceGetMPSComputeRunningProcesses_v3
);

/// No process has samples: `NVML_ERROR_NOT_FOUND`, as on an idle GPU.
///
/// # Safety
/// `count` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: Device,
    _samples: *mut u8,
    count: *mut u32,
    _since: u64,
) -> Ret {
    with_device(device, |_| {
        // SAFETY: the caller's contract.
        match unsafe { put(count, 0) } {
            ffi::SUCCESS => ffi::ERROR_NOT_FOUND,
            r => r,
        }
    })
}
