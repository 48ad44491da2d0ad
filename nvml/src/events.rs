//! Event sets and Xid events. The agent writes the driver's kernel-log line of every Xid fault to
//! `log/nvidia-xid` below the mock root (`NVRM: Xid (PCI:0000:06:00): 79, pid=…, <text>`). A set
//! remembers the file's lines; each wait re-reads it and turns every new line naming a registered
//! GPU into an event. A line that goes (the fault cleared) and comes back is new again.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::ffi::{self, Device, Ret};
use crate::out::put;
use crate::parse::{self, BusId};
use crate::state::{self, Loaded, with_device, with_loaded};
use crate::sys::{self, Lock};

/// The Xid log, relative to the mock root (`mockgpu_api::fault::XID_LOG_FILE`).
const XID_LOG: &[u8] = b"log/nvidia-xid";

/// How often a wait re-reads the log (ms).
const POLL_MS: u32 = 20;

/// One event set: the devices registered (by handle address) and the event kinds each wants, the
/// log's lines as last read, and the Xid events found but not yet returned (handle address, code).
pub struct EventSet {
    registered: Vec<(usize, u64)>,
    seen: Vec<Vec<u8>>,
    queued: VecDeque<(usize, u64)>,
}

/// The live sets, owned here; a handle is a set's address (boxed, so that it does not move).
#[allow(clippy::vec_box)]
static SETS: Lock<Vec<Box<EventSet>>> = Lock::new(Vec::new());

/// Runs `f` on the set and the loaded tree (the state's lock is always taken before the sets').
fn with_set(set: *mut EventSet, f: impl FnOnce(&mut EventSet, &mut Loaded) -> Ret) -> Ret {
    with_loaded(
        |l| match SETS.lock().iter_mut().find(|s| core::ptr::eq(&***s, set)) {
            Some(s) => f(s, l),
            None => ffi::ERROR_INVALID_ARGUMENT,
        },
    )
}

/// The lines of the Xid log now (none without the file).
fn xid_lines() -> Vec<Vec<u8>> {
    let text = sys::read_file(&state::join(state::root(), &[XID_LOG])).unwrap_or_default();
    text.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

/// The GPU (domain, bus, device) and the code of a driver Xid line.
fn parse_xid(line: &[u8]) -> Option<(BusId, u64)> {
    const MARK: &[u8] = b"Xid (PCI:";
    let at = line.windows(MARK.len()).position(|w| w == MARK)?;
    let rest = line.get(at.checked_add(MARK.len())?..)?;
    let close = rest.iter().position(|&b| b == b')')?;
    let mut bus = rest.get(..close)?.to_vec();
    bus.extend_from_slice(b".0");
    let bus = BusId::parse(&bus)?;
    let code = rest.get(close.checked_add(2)?..)?;
    let end = code.iter().position(|&b| b == b',')?;
    Some((bus, parse::number(code.get(..end)?)?))
}

impl EventSet {
    /// Reads the log and queues an event for each line not there at the last read that names a
    /// GPU registered for Xid events.
    fn poll(&mut self, loaded: &Loaded) {
        let now = xid_lines();
        let mut before = core::mem::take(&mut self.seen);
        for line in &now {
            if let Some(i) = before.iter().position(|l| l == line) {
                before.swap_remove(i);
                continue;
            }
            let Some((bus, code)) = parse_xid(line) else {
                continue;
            };
            let device = loaded.devices.iter().find(|d| {
                (d.bus.domain, d.bus.bus, d.bus.device) == (bus.domain, bus.bus, bus.device)
                    && self.registered.iter().any(|&(a, kinds)| {
                        a == d.handle() as usize && kinds & ffi::EVENT_TYPE_XID_CRITICAL_ERROR != 0
                    })
            });
            if let Some(d) = device {
                self.queued.push_back((d.handle() as usize, code));
            }
        }
        self.seen = now;
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
            seen: Vec::new(),
            queued: VecDeque::new(),
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

/// Registers the device; the Xid log as it is now is the baseline for its events (lines already
/// there are not events; those new since the set's last read are queued for the devices
/// registered before).
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(device: Device, kinds: u64, set: *mut EventSet) -> Ret {
    let r = with_device(device, |_| ffi::SUCCESS);
    if r != ffi::SUCCESS {
        return r;
    }
    if kinds & !ffi::EVENT_TYPE_XID_CRITICAL_ERROR != 0 {
        return ffi::ERROR_NOT_SUPPORTED;
    }
    with_set(set, |s, l| {
        s.poll(l);
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

/// Returns the next Xid event, re-reading the log every [`POLL_MS`] until one comes or
/// `timeout_ms` has passed (`NVML_ERROR_TIMEOUT`).
///
/// # Safety
/// `data` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: *mut EventSet,
    data: *mut ffi::EventData,
    timeout_ms: u32,
) -> Ret {
    let r = with_set(set, |_, _| ffi::SUCCESS);
    if r != ffi::SUCCESS {
        return r;
    }
    if data.is_null() {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    let mut waited = 0u32;
    loop {
        let mut event = None;
        // The set may have been freed meanwhile.
        let r = with_set(set, |s, l| {
            if s.queued.is_empty() {
                s.poll(l);
            }
            event = s.queued.pop_front();
            ffi::SUCCESS
        });
        if r != ffi::SUCCESS {
            return r;
        }
        if let Some((device, code)) = event {
            let e = ffi::EventData {
                device: device as ffi::Device,
                event_type: ffi::EVENT_TYPE_XID_CRITICAL_ERROR,
                event_data: code,
                gpu_instance_id: ffi::INSTANCE_ID_NONE,
                compute_instance_id: ffi::INSTANCE_ID_NONE,
            };
            // SAFETY: checked non-null, valid by the caller's contract.
            return unsafe { put(data, e) };
        }
        if waited >= timeout_ms {
            return ffi::ERROR_TIMEOUT;
        }
        let step = POLL_MS.min(timeout_ms.saturating_sub(waited));
        sys::sleep_ms(step);
        waited = waited.saturating_add(step);
    }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn xid_lines_name_the_gpu_and_the_code() {
        let (bus, code) = parse_xid(
            b"NVRM: Xid (PCI:0008:06:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        )
        .unwrap();
        assert_eq!((bus.domain, bus.bus, bus.device, code), (8, 6, 0, 79));
        let (bus, code) =
            parse_xid(b"[ 12.5] NVRM: Xid (PCI:0000:1b:00): 13, pid=42, name=a, x").unwrap();
        assert_eq!((bus.bus, code), (0x1b, 13));
        assert!(parse_xid(b"NVRM: Xid (PCI:0000:1b:00): x, y").is_none());
        assert!(parse_xid(b"NVRM: something else").is_none());
    }
}
