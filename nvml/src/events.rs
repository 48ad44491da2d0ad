//! Event sets. Sets accept Xid registrations; nothing raises events yet, so a wait ends with
//! `NVML_ERROR_TIMEOUT` after its timeout. A source (Xid faults) adds a queue to `EventSet` that
//! the wait polls.

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::ffi::{self, Device, Ret};
use crate::out::put;
use crate::state::{with_device, with_loaded};
use crate::sys::{self, Lock};

/// One event set: the devices registered (by handle address) and the event kinds each wants.
pub struct EventSet {
    registered: Vec<(usize, u64)>,
}

/// The live sets, owned here; a handle is a set's address (boxed, so that it does not move).
#[allow(clippy::vec_box)]
static SETS: Lock<Vec<Box<EventSet>>> = Lock::new(Vec::new());

fn with_set(set: *mut EventSet, f: impl FnOnce(&mut EventSet) -> Ret) -> Ret {
    match SETS.lock().iter_mut().find(|s| core::ptr::eq(&***s, set)) {
        Some(s) => f(s),
        None => ffi::ERROR_INVALID_ARGUMENT,
    }
}

/// # Safety
/// `set` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut *mut EventSet) -> Ret {
    with_loaded(|_| {
        if set.is_null() {
            return ffi::ERROR_INVALID_ARGUMENT;
        }
        let mut new = Box::new(EventSet {
            registered: Vec::new(),
        });
        let handle = core::ptr::from_mut(&mut *new);
        SETS.lock().push(new);
        // SAFETY: checked non-null, valid by the caller's contract.
        unsafe { put(set, handle) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetFree(set: *mut EventSet) -> Ret {
    with_loaded(|_| {
        let mut sets = SETS.lock();
        let before = sets.len();
        sets.retain(|s| !core::ptr::eq(&**s, set));
        if sets.len() == before {
            ffi::ERROR_INVALID_ARGUMENT
        } else {
            ffi::SUCCESS
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(device: Device, kinds: u64, set: *mut EventSet) -> Ret {
    let r = with_device(device, |_| ffi::SUCCESS);
    if r != ffi::SUCCESS {
        return r;
    }
    if kinds & !ffi::EVENT_TYPE_XID_CRITICAL_ERROR != 0 {
        return ffi::ERROR_NOT_SUPPORTED;
    }
    with_set(set, |s| {
        let address = device as usize;
        match s.registered.iter_mut().find(|(d, _)| *d == address) {
            Some((_, registered)) => *registered |= kinds,
            None => s.registered.push((address, kinds)),
        }
        ffi::SUCCESS
    })
}

/// # Safety
/// `kinds` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(device: Device, kinds: *mut u64) -> Ret {
    // SAFETY: the caller's contract.
    with_device(device, |_| unsafe {
        put(kinds, ffi::EVENT_TYPE_XID_CRITICAL_ERROR)
    })
}

/// # Safety
/// `data` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: *mut EventSet,
    data: *mut ffi::EventData,
    timeout_ms: u32,
) -> Ret {
    let r = with_loaded(|_| with_set(set, |_| ffi::SUCCESS));
    if r != ffi::SUCCESS {
        return r;
    }
    if data.is_null() {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    sys::sleep_ms(timeout_ms);
    ffi::ERROR_TIMEOUT
}

/// # Safety
/// `data` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: *mut EventSet,
    data: *mut ffi::EventData,
    timeout_ms: u32,
) -> Ret {
    // SAFETY: the caller's contract.
    unsafe { nvmlEventSetWait_v2(set, data, timeout_ms) }
}
