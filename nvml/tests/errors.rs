//! Errors as the real library returns them: no tree, calls before `nvmlInit`, bad handles and
//! NULL pointers, short buffers, malformed files; reference counting, clocks, events, threads.

mod common;

use std::ffi::{c_char, c_void};
use std::os::fd::AsRawFd;
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

use common::{Dev, EventData, Nvml, Rendered, set_root, text};

const UNINITIALIZED: u32 = 1;
const INVALID_ARGUMENT: u32 = 2;
const NOT_FOUND: u32 = 6;
const INSUFFICIENT_SIZE: u32 = 7;
const DRIVER_NOT_LOADED: u32 = 9;
const TIMEOUT: u32 = 10;
const UNKNOWN: u32 = 999;

fn first(nv: &Nvml) -> Dev {
    let mut d = null_mut();
    assert_eq!(
        nvml!(nv, nvmlDeviceGetHandleByIndex_v2(u32, *mut Dev))(0, &mut d),
        0
    );
    d
}

#[test]
fn without_a_tree_the_driver_is_not_loaded() {
    let (nv, _lock) = Nvml::get();
    let mut n = 0;
    assert_eq!(
        nvml!(nv, nvmlDeviceGetCount_v2(*mut u32))(&mut n),
        UNINITIALIZED
    );
    assert_eq!(nvml!(nv, nvmlShutdown())(), UNINITIALIZED);
    let empty = tempfile::tempdir().unwrap();
    set_root(empty.path());
    assert_eq!(nvml!(nv, nvmlInit_v2())(), DRIVER_NOT_LOADED);
    assert_eq!(nvml!(nv, nvmlInitWithFlags(u32))(1), DRIVER_NOT_LOADED);
    assert_eq!(
        nvml!(nv, nvmlDeviceGetCount_v2(*mut u32))(&mut n),
        UNINITIALIZED
    );
    // nvmlErrorString returns a `const char *`, not a code.
    let s = |code| {
        // SAFETY: the same symbol with its real signature.
        let f: extern "C" fn(u32) -> *const c_char = unsafe { nv.sym("nvmlErrorString") };
        // SAFETY: a static NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(f(code)) }
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(s(DRIVER_NOT_LOADED), "Driver Not Loaded");
    assert_eq!(s(3), "Not Supported");
    assert_eq!(s(12345), "Unknown Error");
}

#[test]
fn bad_arguments_and_short_buffers() {
    let (nv, _lock) = Nvml::get();
    let r = Rendered::new("gb300");
    set_root(&r.root());
    assert_eq!(nvml!(nv, nvmlInit_v2())(), 0);
    let d = first(nv);
    let name = nvml!(nv, nvmlDeviceGetName(Dev, *mut c_char, u32));
    let mut buf = [0u8; 64];
    assert_eq!(
        name(d, buf.as_mut_ptr().cast(), 12),
        INSUFFICIENT_SIZE,
        "NVIDIA GB300 needs 13 bytes"
    );
    assert_eq!(name(d, buf.as_mut_ptr().cast(), 13), 0);
    assert_eq!(text(&buf), "NVIDIA GB300");
    assert_eq!(name(d, null_mut(), 64), INVALID_ARGUMENT);
    let bogus = 0x1000 as Dev;
    assert_eq!(name(bogus, buf.as_mut_ptr().cast(), 64), INVALID_ARGUMENT);
    assert_eq!(
        name(null_mut(), buf.as_mut_ptr().cast(), 64),
        INVALID_ARGUMENT
    );
    assert_eq!(
        nvml!(nv, nvmlDeviceGetMinorNumber(Dev, *mut u32))(d, null_mut()),
        INVALID_ARGUMENT
    );
    let mut h = null_mut();
    assert_eq!(
        nvml!(nv, nvmlDeviceGetHandleByIndex_v2(u32, *mut Dev))(4, &mut h),
        INVALID_ARGUMENT
    );
    assert_eq!(
        nvml!(nv, nvmlDeviceGetHandleByUUID(*const c_char, *mut Dev))(null(), &mut h),
        INVALID_ARGUMENT
    );
    let by_bus = nvml!(
        nv,
        nvmlDeviceGetHandleByPciBusId_v2(*const c_char, *mut Dev)
    );
    assert_eq!(by_bus(c"0000:99:00.0".as_ptr(), &mut h), NOT_FOUND);
    assert_eq!(by_bus(c"not a bus".as_ptr(), &mut h), INVALID_ARGUMENT);
    // Lists: a short count gets the length needed.
    let supported = nvml!(
        nv,
        nvmlDeviceGetSupportedGraphicsClocks(Dev, u32, *mut u32, *mut u32)
    );
    let (mut count, mut clocks) = (1, [0u32; 1]);
    let memory = r.topo.profile.nvml.memory_mhz;
    assert_eq!(
        supported(d, memory, &mut count, clocks.as_mut_ptr()),
        INSUFFICIENT_SIZE
    );
    assert_eq!(
        count as usize,
        mockgpu_api::nvml::supported_graphics_clocks(&r.topo.profile.nvml).len()
    );
    assert_eq!(
        supported(d, memory + 1, &mut count, clocks.as_mut_ptr()),
        NOT_FOUND
    );
    // Functions the mock does not implement are there, and say so.
    assert_eq!(nvml!(nv, nvmlDeviceGetEncoderUtilization())(), 3);
    assert_eq!(nvml!(nv, nvmlShutdown())(), 0);
    assert_eq!(name(d, buf.as_mut_ptr().cast(), 64), UNINITIALIZED);
}

#[test]
fn init_is_counted() {
    let (nv, _lock) = Nvml::get();
    let r = Rendered::new("t4");
    set_root(&r.root());
    assert_eq!(nvml!(nv, nvmlInit_v2())(), 0);
    assert_eq!(nvml!(nv, nvmlInitWithFlags(u32))(0), 0);
    assert_eq!(nvml!(nv, nvmlShutdown())(), 0);
    let mut n = 0;
    assert_eq!(
        nvml!(nv, nvmlDeviceGetCount_v2(*mut u32))(&mut n),
        0,
        "one init is left"
    );
    assert_eq!(nvml!(nv, nvmlShutdown())(), 0);
    assert_eq!(nvml!(nv, nvmlShutdown())(), UNINITIALIZED);
}

/// Runs `f` with stderr (fd 2) captured; returns what was written.
fn stderr_of(f: impl FnOnce()) -> String {
    let file = tempfile::tempfile().unwrap();
    // SAFETY: plain descriptor juggling on fds this test owns (2 is restored below).
    let saved = unsafe { libc::dup(2) };
    // SAFETY: as above.
    assert!(unsafe { libc::dup2(file.as_raw_fd(), 2) } >= 0);
    f();
    // SAFETY: as above.
    unsafe {
        libc::dup2(saved, 2);
        libc::close(saved);
    }
    let mut file = file;
    use std::io::{Read, Seek};
    file.rewind().unwrap();
    let mut s = String::new();
    file.read_to_string(&mut s).unwrap();
    s
}

#[test]
fn a_malformed_file_is_an_unknown_error_and_one_log_line() {
    let (nv, _lock) = Nvml::get();
    let r = Rendered::new("gb300");
    set_root(&r.root());
    let bus = r.topo.gpus[1].bus_id;
    let path = r.root().join(mockgpu_api::nvml::gpu_file(&bus));
    let good = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, good.replace("Memory Total: ", "Memory Total: lots ")).unwrap();
    let log = stderr_of(|| assert_eq!(nvml!(nv, nvmlInit_v2())(), UNKNOWN));
    assert_eq!(
        log,
        format!(
            "libnvidia-ml (mockgpu): {}: `Memory Total:` is not a number\n",
            path.display()
        )
    );
    std::fs::write(&path, good.replace("Serial: ", "Serial")).unwrap();
    let log = stderr_of(|| assert_eq!(nvml!(nv, nvmlInit_v2())(), UNKNOWN));
    assert!(log.ends_with(": no `Serial:` line\n"), "{log}");
    let info = r
        .root()
        .join(format!("proc/driver/nvidia/gpus/{bus}/information"));
    std::fs::write(&path, good).unwrap();
    std::fs::write(&info, "Model: x\n").unwrap();
    let log = stderr_of(|| assert_eq!(nvml!(nv, nvmlInit_v2())(), UNKNOWN));
    assert!(
        log.contains("information: no `Bus Location:` line"),
        "{log}"
    );
    let mut n = 0;
    assert_eq!(
        nvml!(nv, nvmlDeviceGetCount_v2(*mut u32))(&mut n),
        UNINITIALIZED
    );
}

#[test]
fn clocks_set_and_reset_as_slurm_does() {
    let (nv, _lock) = Nvml::get();
    let r = Rendered::new("h100");
    set_root(&r.root());
    assert_eq!(nvml!(nv, nvmlInit_v2())(), 0);
    let d = first(nv);
    let n = &r.topo.profile.nvml;
    let low = mockgpu_api::nvml::supported_graphics_clocks(n)[10];
    let app = nvml!(nv, nvmlDeviceGetApplicationsClock(Dev, u32, *mut u32));
    let current = nvml!(nv, nvmlDeviceGetClockInfo(Dev, u32, *mut u32));
    let mut mhz = 0;
    assert_eq!(
        nvml!(nv, nvmlDeviceSetApplicationsClocks(Dev, u32, u32))(d, n.memory_mhz, low),
        0
    );
    assert_eq!(app(d, 0, &mut mhz), 0);
    assert_eq!(mhz, low);
    assert_eq!(current(d, 0, &mut mhz), 0);
    assert_eq!(mhz, low);
    assert_eq!(
        nvml!(nv, nvmlDeviceSetApplicationsClocks(Dev, u32, u32))(d, n.memory_mhz, low + 1),
        INVALID_ARGUMENT
    );
    assert_eq!(nvml!(nv, nvmlDeviceResetApplicationsClocks(Dev))(d), 0);
    assert_eq!(app(d, 0, &mut mhz), 0);
    assert_eq!(mhz, n.graphics_mhz[2]);
    assert_eq!(
        nvml!(nv, nvmlDeviceSetGpuLockedClocks(Dev, u32, u32))(d, 500, 1000),
        0
    );
    assert_eq!(current(d, 1, &mut mhz), 0);
    assert_eq!(mhz, 1000);
    assert_eq!(nvml!(nv, nvmlDeviceResetGpuLockedClocks(Dev))(d), 0);
    assert_eq!(current(d, 1, &mut mhz), 0);
    assert_eq!(mhz, n.graphics_mhz[2]);
    assert_eq!(nvml!(nv, nvmlShutdown())(), 0);
}

#[test]
fn an_event_wait_times_out() {
    let (nv, _lock) = Nvml::get();
    let r = Rendered::new("gb300");
    set_root(&r.root());
    assert_eq!(nvml!(nv, nvmlInit_v2())(), 0);
    let d = first(nv);
    let mut set = null_mut::<c_void>();
    assert_eq!(nvml!(nv, nvmlEventSetCreate(*mut *mut c_void))(&mut set), 0);
    let xid = 8u64;
    let register = nvml!(nv, nvmlDeviceRegisterEvents(Dev, u64, *mut c_void));
    assert_eq!(register(d, xid, set), 0);
    assert_eq!(register(d, xid, 0x1000 as *mut c_void), INVALID_ARGUMENT);
    let mut data = EventData {
        device: null_mut(),
        event_type: 0,
        event_data: 0,
        gpu_instance_id: 0,
        compute_instance_id: 0,
    };
    let start = Instant::now();
    assert_eq!(
        nvml!(nv, nvmlEventSetWait_v2(*mut c_void, *mut EventData, u32))(set, &mut data, 50),
        TIMEOUT
    );
    assert!(start.elapsed() >= Duration::from_millis(50));
    assert_eq!(nvml!(nv, nvmlEventSetFree(*mut c_void))(set), 0);
    assert_eq!(
        nvml!(nv, nvmlEventSetFree(*mut c_void))(set),
        INVALID_ARGUMENT
    );
    assert_eq!(nvml!(nv, nvmlShutdown())(), 0);
}

#[test]
fn threads_read_at_once() {
    let (nv, _lock) = Nvml::get();
    let r = Rendered::new("gb300");
    set_root(&r.root());
    assert_eq!(nvml!(nv, nvmlInit_v2())(), 0);
    let d = first(nv) as usize;
    let minors: Vec<u32> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(move || {
                    let minor = nvml!(nv, nvmlDeviceGetMinorNumber(Dev, *mut u32));
                    let mut sum = 0;
                    for _ in 0..10_000 {
                        let mut m = 9;
                        assert_eq!(minor(d as Dev, &mut m), 0);
                        sum += m;
                    }
                    sum
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert_eq!(minors, [0; 8]);
    assert_eq!(nvml!(nv, nvmlShutdown())(), 0);
}
