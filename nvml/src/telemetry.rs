//! Power, temperatures, fan, utilization, performance state, modes, ECC, retired pages and
//! remapped rows, MIG mode, processes.

use crate::device::getter;
use crate::ffi::{self, Device, Ret};
use crate::out::{put, put_list};
use crate::state::with_device;

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
    nvmlDeviceGetRetiredPagesPendingStatus: u32 => |_d| ffi::FEATURE_DISABLED;
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

/// No error has happened: every counter is 0 (`NVML_ERROR_NOT_SUPPORTED` with ECC off).
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
    if error >= ffi::MEMORY_ERROR_TYPE_COUNT || counter >= ffi::ECC_COUNTER_TYPE_COUNT {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    with_device(device, |d| {
        if !d.ecc {
            return ffi::ERROR_NOT_SUPPORTED;
        }
        // SAFETY: the caller's contract.
        unsafe { put(count, 0) }
    })
}

/// # Safety
/// `count` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryErrorCounter(
    device: Device,
    error: u32,
    counter: u32,
    _location: u32,
    count: *mut u64,
) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { nvmlDeviceGetTotalEccErrors(device, error, counter, count) }
}

/// No page has been retired.
///
/// # Safety
/// `count` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: Device,
    cause: u32,
    count: *mut u32,
    addresses: *mut u64,
) -> Ret {
    if cause >= ffi::PAGE_RETIREMENT_CAUSE_COUNT {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: the caller's contract.
    with_device(device, |_| unsafe {
        put_list::<u64>(count, addresses, &[])
    })
}

/// # Safety
/// `count` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: Device,
    cause: u32,
    count: *mut u32,
    addresses: *mut u64,
    _timestamps: *mut u64,
) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { nvmlDeviceGetRetiredPages(device, cause, count, addresses) }
}

/// No row has been remapped, none is pending, none failed.
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
    with_device(device, |_| {
        let outs = [corrected, uncorrected, pending, failed];
        if outs.iter().any(|p| p.is_null()) {
            return ffi::ERROR_INVALID_ARGUMENT;
        }
        for p in outs {
            // SAFETY: checked non-null, valid by the caller's contract.
            unsafe { put(p, 0) };
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
