//! Clocks: current, maximum, application and supported clocks; application and locked clocks
//! set and reset (Slurm's `--gpu-freq`).

use crate::device::getter;
use crate::ffi::{self, Device, Ret};
use crate::out::{put, put_list};
use crate::state::{Device as Gpu, with_device};

/// The clock of `kind` for `id`, `None` for an unknown kind or id.
fn clock(d: &Gpu, kind: u32, id: u32) -> Option<u32> {
    let (max, app, default) = match kind {
        ffi::CLOCK_GRAPHICS | ffi::CLOCK_SM => (d.graphics_max, d.app_graphics, d.graphics_default),
        ffi::CLOCK_MEM => (d.memory_clock, d.memory_clock, d.memory_clock),
        ffi::CLOCK_VIDEO => (d.video_max, d.video_max, d.video_max),
        _ => return None,
    };
    match id {
        ffi::CLOCK_ID_CURRENT if kind <= ffi::CLOCK_SM => Some(d.graphics_now()),
        ffi::CLOCK_ID_CURRENT => Some(app),
        ffi::CLOCK_ID_APP_CLOCK_TARGET => Some(app),
        ffi::CLOCK_ID_APP_CLOCK_DEFAULT => Some(default),
        ffi::CLOCK_ID_CUSTOMER_BOOST_MAX => Some(max),
        _ => None,
    }
}

/// Writes `clock(d, kind, id)`.
///
/// # Safety
/// `mhz` is NULL or valid.
unsafe fn put_clock(device: Device, kind: u32, id: u32, mhz: *mut u32) -> Ret {
    with_device(device, |d| match clock(d, kind, id) {
        // SAFETY: the caller's contract.
        Some(v) => unsafe { put(mhz, v) },
        None => ffi::ERROR_INVALID_ARGUMENT,
    })
}

/// # Safety
/// `mhz` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(device: Device, kind: u32, mhz: *mut u32) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { put_clock(device, kind, ffi::CLOCK_ID_CURRENT, mhz) }
}

/// # Safety
/// `mhz` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: Device,
    kind: u32,
    mhz: *mut u32,
) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { put_clock(device, kind, ffi::CLOCK_ID_CUSTOMER_BOOST_MAX, mhz) }
}

/// # Safety
/// `mhz` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxCustomerBoostClock(
    device: Device,
    kind: u32,
    mhz: *mut u32,
) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { put_clock(device, kind, ffi::CLOCK_ID_CUSTOMER_BOOST_MAX, mhz) }
}

/// # Safety
/// `mhz` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetApplicationsClock(
    device: Device,
    kind: u32,
    mhz: *mut u32,
) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { put_clock(device, kind, ffi::CLOCK_ID_APP_CLOCK_TARGET, mhz) }
}

/// # Safety
/// `mhz` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDefaultApplicationsClock(
    device: Device,
    kind: u32,
    mhz: *mut u32,
) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { put_clock(device, kind, ffi::CLOCK_ID_APP_CLOCK_DEFAULT, mhz) }
}

/// # Safety
/// `mhz` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClock(
    device: Device,
    kind: u32,
    id: u32,
    mhz: *mut u32,
) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { put_clock(device, kind, id, mhz) }
}

/// # Safety
/// `count` is NULL or valid; `clocks` is NULL or valid for `*count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedMemoryClocks(
    device: Device,
    count: *mut u32,
    clocks: *mut u32,
) -> Ret {
    // SAFETY: the caller's contract.
    with_device(device, |d| unsafe {
        put_list(count, clocks, &[d.memory_clock])
    })
}

/// # Safety
/// `count` is NULL or valid; `clocks` is NULL or valid for `*count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedGraphicsClocks(
    device: Device,
    memory_mhz: u32,
    count: *mut u32,
    clocks: *mut u32,
) -> Ret {
    with_device(device, |d| {
        if memory_mhz != d.memory_clock {
            return ffi::ERROR_NOT_FOUND;
        }
        // SAFETY: the caller's contract.
        unsafe { put_list(count, clocks, &d.supported_graphics) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceSetApplicationsClocks(
    device: Device,
    memory_mhz: u32,
    graphics_mhz: u32,
) -> Ret {
    with_device(device, |d| {
        if memory_mhz != d.memory_clock || !d.supported_graphics.contains(&graphics_mhz) {
            return ffi::ERROR_INVALID_ARGUMENT;
        }
        d.app_graphics = graphics_mhz;
        ffi::SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceResetApplicationsClocks(device: Device) -> Ret {
    with_device(device, |d| {
        d.app_graphics = d.graphics_default;
        ffi::SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceSetGpuLockedClocks(device: Device, min_mhz: u32, max_mhz: u32) -> Ret {
    with_device(device, |d| {
        if min_mhz > max_mhz {
            return ffi::ERROR_INVALID_ARGUMENT;
        }
        d.locked = Some((min_mhz, max_mhz));
        ffi::SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceResetGpuLockedClocks(device: Device) -> Ret {
    with_device(device, |d| {
        d.locked = None;
        ffi::SUCCESS
    })
}

getter! {
    nvmlDeviceGetCurrentClocksEventReasons: u64 => |d| clocks_reasons(d);
    nvmlDeviceGetCurrentClocksThrottleReasons: u64 => |d| clocks_reasons(d);
    nvmlDeviceGetSupportedClocksEventReasons: u64 => |_d| SUPPORTED_REASONS;
    nvmlDeviceGetSupportedClocksThrottleReasons: u64 => |_d| SUPPORTED_REASONS;
}

const THERMAL_REASONS: u64 =
    ffi::CLOCKS_EVENT_REASON_SW_THERMAL_SLOWDOWN | ffi::CLOCKS_EVENT_REASON_HW_THERMAL_SLOWDOWN;

const SUPPORTED_REASONS: u64 = ffi::CLOCKS_EVENT_REASON_GPU_IDLE
    | ffi::CLOCKS_EVENT_REASON_APPLICATIONS_CLOCKS_SETTING
    | THERMAL_REASONS;

/// Idle, held by the application clock when it is below the maximum, and slowed down (software
/// and hardware thermal) over the slowdown temperature.
fn clocks_reasons(d: &Gpu) -> u64 {
    let mut reasons = ffi::CLOCKS_EVENT_REASON_GPU_IDLE;
    if d.graphics_now() < d.graphics_max {
        reasons |= ffi::CLOCKS_EVENT_REASON_APPLICATIONS_CLOCKS_SETTING;
    }
    if d.thermal {
        reasons |= THERMAL_REASONS;
    }
    reasons
}
