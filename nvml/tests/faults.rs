//! GPU faults (`mockgpu_api::fault`) as the library shows them: trees rendered with faults by the
//! agent's renderer, read through the built library; Xid events raised by the log file changing
//! during a wait.

mod common;

use std::ffi::{CStr, CString, c_char, c_void};
use std::path::Path;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use common::{Dev, EventData, Nvml, PciInfo, Rendered, set_root, text};
use mockgpu_api::BusId;
use mockgpu_api::fault::{Fault, FaultKind, XID_LOG_FILE, Xid};

const INVALID_ARGUMENT: u32 = 2;
const TIMEOUT: u32 = 10;
const GPU_IS_LOST: u32 = 15;
const XID_CRITICAL_ERROR: u64 = 8;

fn ecc(gpu: u32, single: u64, double: u64) -> Fault {
    Fault {
        single_bit: Some(single),
        double_bit: Some(double),
        ..Fault::new(gpu, FaultKind::Ecc)
    }
}

/// `nvmlInit` on `r`'s tree.
fn init(nv: &Nvml, r: &Rendered) {
    set_root(&r.root());
    assert_eq!(nvml!(nv, nvmlInit_v2())(), 0);
}

fn by_index(nv: &Nvml, i: u32) -> (u32, Dev) {
    let mut d = null_mut();
    let ret = nvml!(nv, nvmlDeviceGetHandleByIndex_v2(u32, *mut Dev))(i, &mut d);
    (ret, d)
}

fn handle(nv: &Nvml, i: u32) -> Dev {
    let (ret, d) = by_index(nv, i);
    assert_eq!(ret, 0, "GPU {i}");
    d
}

fn uuid(nv: &Nvml, d: Dev) -> String {
    let mut buf = [0u8; 96];
    assert_eq!(
        nvml!(nv, nvmlDeviceGetUUID(Dev, *mut u8, u32))(d, buf.as_mut_ptr(), 96),
        0
    );
    text(&buf).to_string()
}

fn count(nv: &Nvml) -> u32 {
    let mut n = 0;
    assert_eq!(nvml!(nv, nvmlDeviceGetCount_v2(*mut u32))(&mut n), 0);
    n
}

/// `nvmlExcludedDeviceInfo_t`.
#[repr(C)]
struct ExcludedInfo {
    pci: PciInfo,
    uuid: [u8; 80],
}

/// NVML's form of a bus id: `00000008:06:00.0`.
fn nvml_bus(b: &BusId) -> String {
    format!("0000{}", b.to_string().to_ascii_uppercase())
}

#[test]
fn a_gpu_fallen_off_the_bus_is_lost_at_its_index() {
    let (nv, _lock) = Nvml::get();
    let r = Rendered::with_faults("gb300", &[Fault::xid(1, 79)]);
    init(nv, &r);
    let gpus = &r.topo.gpus;
    assert_eq!(count(nv), 4, "a lost GPU still counts");
    for i in [0, 2, 3] {
        let d = handle(nv, i);
        assert_eq!(
            uuid(nv, d),
            gpus[i as usize].uuid,
            "GPU {i} keeps its index"
        );
    }
    let (ret, lost) = by_index(nv, 1);
    assert_eq!(ret, GPU_IS_LOST);
    assert_eq!(
        nvml!(nv, nvmlDeviceGetHandleByIndex(u32, *mut Dev))(1, &mut null_mut()),
        GPU_IS_LOST
    );
    let by_text = |f: &str, id: &str| {
        let id = CString::new(id).unwrap();
        // SAFETY: the header's signature of both lookups.
        let f = unsafe { nv.sym::<extern "C" fn(*const c_char, *mut Dev) -> u32>(f) };
        f(id.as_ptr(), &mut null_mut())
    };
    assert_eq!(
        by_text("nvmlDeviceGetHandleByUUID", &gpus[1].uuid),
        GPU_IS_LOST
    );
    let bus = nvml_bus(&gpus[1].bus_id);
    assert_eq!(
        by_text("nvmlDeviceGetHandleByPciBusId_v2", &bus),
        GPU_IS_LOST
    );
    assert_eq!(by_text("nvmlDeviceGetHandleByUUID", &gpus[2].uuid), 0);
    // SAFETY: the header's signature; the text is static.
    let message = unsafe {
        let f = nv.sym::<extern "C" fn(u32) -> *const c_char>("nvmlErrorString");
        CStr::from_ptr(f(GPU_IS_LOST))
    };
    assert_eq!(message.to_str().unwrap(), "GPU is lost");
    // The lost GPU's handle names its bus and answers nothing else.
    let mut pci: PciInfo = unsafe { std::mem::zeroed() };
    assert_eq!(
        nvml!(nv, nvmlDeviceGetPciInfo_v3(Dev, *mut PciInfo))(lost, &mut pci),
        0
    );
    assert_eq!(text(&pci.bus_id), bus);
    let mut minor = 0;
    assert_eq!(
        nvml!(nv, nvmlDeviceGetMinorNumber(Dev, *mut u32))(lost, &mut minor),
        GPU_IS_LOST
    );
    assert_eq!(nvml!(nv, nvmlShutdown())(), 0);
}

#[test]
fn an_excluded_gpu_is_not_enumerated_but_listed_apart() {
    let (nv, _lock) = Nvml::get();
    let r = Rendered::with_faults("gb300", &[Fault::new(2, FaultKind::Excluded)]);
    init(nv, &r);
    let gpus = &r.topo.gpus;
    assert_eq!(count(nv), 3);
    for (i, want) in [0, 1, 3].into_iter().enumerate() {
        assert_eq!(uuid(nv, handle(nv, i as u32)), gpus[want].uuid);
    }
    let mut n = 0;
    assert_eq!(nvml!(nv, nvmlGetExcludedDeviceCount(*mut u32))(&mut n), 0);
    assert_eq!(n, 1);
    let info = nvml!(nv, nvmlGetExcludedDeviceInfoByIndex(u32, *mut ExcludedInfo));
    let mut e: ExcludedInfo = unsafe { std::mem::zeroed() };
    assert_eq!(info(0, &mut e), 0);
    assert_eq!(text(&e.uuid), gpus[2].uuid);
    assert_eq!(text(&e.pci.bus_id), nvml_bus(&gpus[2].bus_id));
    assert_eq!(info(1, &mut e), INVALID_ARGUMENT);
    assert_eq!(nvml!(nv, nvmlShutdown())(), 0);
}

/// Corrected and uncorrected ECC errors: (volatile, aggregate) totals and the DRAM and L1 counters.
fn ecc_counts(nv: &Nvml, d: Dev, uncorrected: u32) -> [u64; 4] {
    let total = nvml!(nv, nvmlDeviceGetTotalEccErrors(Dev, u32, u32, *mut u64));
    let counter = nvml!(
        nv,
        nvmlDeviceGetMemoryErrorCounter(Dev, u32, u32, u32, *mut u64)
    );
    let mut out = [u64::MAX; 4];
    assert_eq!(total(d, uncorrected, 0, &mut out[0]), 0);
    assert_eq!(total(d, uncorrected, 1, &mut out[1]), 0);
    assert_eq!(counter(d, uncorrected, 0, 2, &mut out[2]), 0);
    assert_eq!(counter(d, uncorrected, 1, 0, &mut out[3]), 0);
    out
}

fn remapped_rows(nv: &Nvml, d: Dev) -> [u32; 4] {
    let mut v = [u32::MAX; 4];
    let [a, b, c, e] = v.each_mut().map(|p| p as *mut u32);
    assert_eq!(
        nvml!(
            nv,
            nvmlDeviceGetRemappedRows(Dev, *mut u32, *mut u32, *mut u32, *mut u32)
        )(d, a, b, c, e),
        0
    );
    v
}

fn retired_pages(nv: &Nvml, d: Dev) -> (Vec<u64>, u32) {
    let mut n = 8;
    let mut pages = [0u64; 8];
    assert_eq!(
        nvml!(nv, nvmlDeviceGetRetiredPages(Dev, u32, *mut u32, *mut u64))(
            d,
            1,
            &mut n,
            pages.as_mut_ptr()
        ),
        0
    );
    let mut pending = u32::MAX;
    assert_eq!(
        nvml!(nv, nvmlDeviceGetRetiredPagesPendingStatus(Dev, *mut u32))(d, &mut pending),
        0
    );
    (pages[..n as usize].to_vec(), pending)
}

#[test]
fn ecc_errors_count_and_leave_rows_remapped_from_ampere_on() {
    let (nv, _lock) = Nvml::get();
    let r = Rendered::with_faults("h100", &[ecc(0, 5, 2), Fault::xid(1, 64)]);
    init(nv, &r);
    let (d0, d1) = (handle(nv, 0), handle(nv, 1));
    assert_eq!(ecc_counts(nv, d0, 0), [5, 5, 5, 0]);
    assert_eq!(ecc_counts(nv, d0, 1), [2, 2, 2, 0]);
    assert_eq!(remapped_rows(nv, d0), [0, 2, 1, 0]);
    assert_eq!(
        retired_pages(nv, d0),
        (vec![], 0),
        "no page retirement on Hopper"
    );
    assert_eq!(ecc_counts(nv, d1, 1), [0; 4]);
    assert_eq!(
        remapped_rows(nv, d1),
        [0, 0, 0, 1],
        "Xid 64: a failed remapping"
    );
    assert_eq!(remapped_rows(nv, handle(nv, 2)), [0; 4]);
    assert_eq!(nvml!(nv, nvmlShutdown())(), 0);
}

#[test]
fn double_bit_errors_retire_pages_before_ampere() {
    let (nv, _lock) = Nvml::get();
    let r = Rendered::with_faults("t4", &[ecc(0, 0, 3)]);
    init(nv, &r);
    let d = handle(nv, 0);
    let (pages, pending) = retired_pages(nv, d);
    assert_eq!((pages.len(), pending), (3, 1));
    assert_eq!(remapped_rows(nv, d), [0; 4]);
    assert_eq!(nvml!(nv, nvmlShutdown())(), 0);
}

#[test]
fn thermal_slowdown_is_a_clocks_event_reason() {
    let (nv, _lock) = Nvml::get();
    let r = Rendered::with_faults("h100", &[Fault::new(0, FaultKind::Thermal)]);
    init(nv, &r);
    let thermal = 0x20 | 0x40;
    let current = nvml!(nv, nvmlDeviceGetCurrentClocksEventReasons(Dev, *mut u64));
    let throttle = nvml!(nv, nvmlDeviceGetCurrentClocksThrottleReasons(Dev, *mut u64));
    let supported = nvml!(nv, nvmlDeviceGetSupportedClocksEventReasons(Dev, *mut u64));
    let (d0, d1) = (handle(nv, 0), handle(nv, 1));
    let (mut a, mut b, mut s) = (0u64, 0u64, 0u64);
    assert_eq!(
        current(d0, &mut a) | throttle(d0, &mut b) | supported(d0, &mut s),
        0
    );
    assert_eq!(
        (a & thermal, b & thermal, s & thermal),
        (thermal, thermal, thermal)
    );
    assert_eq!(current(d1, &mut a), 0);
    assert_eq!(a & thermal, 0);
    let temperature = nvml!(nv, nvmlDeviceGetTemperature(Dev, u32, *mut u32));
    let threshold = nvml!(nv, nvmlDeviceGetTemperatureThreshold(Dev, u32, *mut u32));
    let (mut t, mut slowdown) = (0, 0);
    assert_eq!(
        temperature(d0, 0, &mut t) | threshold(d0, 1, &mut slowdown),
        0
    );
    assert!(
        t > slowdown,
        "{t} °C over the slowdown threshold {slowdown} °C"
    );
    assert_eq!(nvml!(nv, nvmlShutdown())(), 0);
}

#[test]
fn a_link_down_is_disabled() {
    let (nv, _lock) = Nvml::get();
    let down = Fault {
        link: Some(2),
        ..Fault::new(0, FaultKind::NvLinkDown)
    };
    let r = Rendered::with_faults("gb300", &[down]);
    init(nv, &r);
    let state = nvml!(nv, nvmlDeviceGetNvLinkState(Dev, u32, *mut u32));
    let active = |d, link| {
        let mut v = u32::MAX;
        assert_eq!(state(d, link, &mut v), 0);
        v
    };
    let (d0, d1) = (handle(nv, 0), handle(nv, 1));
    assert_eq!(
        [active(d0, 1), active(d0, 2), active(d0, 3), active(d1, 2)],
        [1, 0, 1, 1]
    );
    assert_eq!(nvml!(nv, nvmlShutdown())(), 0);
}

/// Replaces the Xid log at once (write and rename), as a reader must never see it half written.
fn write_log(root: &Path, lines: &[String]) {
    let path = root.join(XID_LOG_FILE);
    let tmp = path.with_extension("tmp");
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

#[test]
fn xid_events_arrive_during_a_wait_once_each() {
    let (nv, _lock) = Nvml::get();
    // Xid 48 on GPU 0 is in the log before anyone registers: not an event.
    let r = Rendered::with_faults("gb300", &[Fault::xid(0, 48)]);
    init(nv, &r);
    let line = |gpu: usize, code: u32| Xid::of(code).unwrap().log_line(&r.topo.gpus[gpu].bus_id);
    let (d0, d1) = (handle(nv, 0), handle(nv, 1));
    let mut set = null_mut::<c_void>();
    assert_eq!(nvml!(nv, nvmlEventSetCreate(*mut *mut c_void))(&mut set), 0);
    let register = nvml!(nv, nvmlDeviceRegisterEvents(Dev, u64, *mut c_void));
    assert_eq!(register(d0, XID_CRITICAL_ERROR, set), 0);
    assert_eq!(register(d1, XID_CRITICAL_ERROR, set), 0);
    let wait = nvml!(nv, nvmlEventSetWait_v2(*mut c_void, *mut EventData, u32));
    let mut data = EventData {
        device: null_mut(),
        event_type: 0,
        event_data: 0,
        gpu_instance_id: 0,
        compute_instance_id: 0,
    };
    assert_eq!(
        wait(set, &mut data, 100),
        TIMEOUT,
        "the baseline is no event"
    );

    // A line for GPU 1 comes while the wait runs.
    let root = r.root();
    let mut log = vec![line(0, 48)];
    let later = {
        let (root, mut log) = (root.clone(), log.clone());
        log.push(line(1, 13));
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            write_log(&root, &log);
        })
    };
    let start = Instant::now();
    assert_eq!(wait(set, &mut data, 10_000), 0);
    let waited = start.elapsed();
    later.join().unwrap();
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(
        (data.device, data.event_type, data.event_data),
        (d1, XID_CRITICAL_ERROR, 13)
    );
    assert_eq!(
        (data.gpu_instance_id, data.compute_instance_id),
        (u32::MAX, u32::MAX)
    );
    assert_eq!(wait(set, &mut data, 100), TIMEOUT, "delivered once");
    log.push(line(1, 13));

    // GPU 2 is not registered; GPU 0 falls off the bus after nvmlInit: its handle still names it.
    log.extend([line(2, 31), line(0, 79)]);
    write_log(&root, &log);
    assert_eq!(wait(set, &mut data, 1000), 0);
    assert_eq!((data.device, data.event_data), (d0, 79));
    assert_eq!(wait(set, &mut data, 100), TIMEOUT);

    // Cleared, then raised again: a new event.
    log.retain(|l| *l != line(1, 13));
    write_log(&root, &log);
    assert_eq!(wait(set, &mut data, 100), TIMEOUT);
    log.push(line(1, 13));
    write_log(&root, &log);
    assert_eq!(wait(set, &mut data, 1000), 0);
    assert_eq!((data.device, data.event_data), (d1, 13));

    assert_eq!(nvml!(nv, nvmlEventSetFree(*mut c_void))(set), 0);
    assert_eq!(nvml!(nv, nvmlShutdown())(), 0);
}
