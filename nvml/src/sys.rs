//! The system services the library uses: libc's allocator, raw system calls (no new glibc
//! symbol version, and no `LD_PRELOAD` hook in the way), the environment, a lock and stderr.

use alloc::vec::Vec;
#[cfg(not(test))]
use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ffi::{c_char, c_int, c_long};
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, Ordering};

// Linked explicitly: libc's own `#[link(name = "c")]` is left out when its `std` feature is on,
// which feature unification does in a whole-workspace build.
#[link(name = "c")]
unsafe extern "C" {
    fn secure_getenv(name: *const c_char) -> *mut c_char;
}

/// The global allocator: libc's `malloc` (16-byte aligned) and `posix_memalign` above that.
#[cfg(not(test))]
pub struct Malloc;

#[cfg(not(test))]
const MALLOC_ALIGN: usize = 16;

// SAFETY: malloc, posix_memalign and free satisfy GlobalAlloc's contract.
#[cfg(not(test))]
unsafe impl GlobalAlloc for Malloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN {
            // SAFETY: plain malloc.
            return unsafe { libc::malloc(layout.size()) }.cast();
        }
        let mut p: *mut core::ffi::c_void = core::ptr::null_mut();
        // SAFETY: the alignment is a power of two, a multiple of the pointer size.
        match unsafe { libc::posix_memalign(&mut p, layout.align(), layout.size()) } {
            0 => p.cast(),
            _ => core::ptr::null_mut(),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _: Layout) {
        // SAFETY: `ptr` came from malloc or posix_memalign.
        unsafe { libc::free(ptr.cast()) }
    }
}

/// A value behind a spin lock (held for microseconds: a lookup, or loading the tree once).
pub struct Lock<T> {
    held: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialised by `held`.
unsafe impl<T: Send> Sync for Lock<T> {}

impl<T> Lock<T> {
    pub const fn new(value: T) -> Self {
        Lock {
            held: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    pub fn lock(&self) -> Guard<'_, T> {
        while self
            .held
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::syscall(libc::SYS_sched_yield) };
        }
        Guard { lock: self }
    }
}

pub struct Guard<'a, T> {
    lock: &'a Lock<T>,
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock exclusively.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        self.lock.held.store(false, Ordering::Release);
    }
}

/// An environment variable, read with `secure_getenv`.
pub fn env(name: &core::ffi::CStr) -> Option<&'static [u8]> {
    // SAFETY: `name` is NUL-terminated.
    let v = unsafe { secure_getenv(name.as_ptr()) };
    // SAFETY: a non-null result is a NUL-terminated string that lives as long as the process.
    (!v.is_null()).then(|| unsafe { core::ffi::CStr::from_ptr(v) }.to_bytes())
}

fn check(r: c_long) -> Option<usize> {
    usize::try_from(r).ok()
}

/// Most bytes read from one file (the served files are a few KiB).
const MAX_FILE: usize = 1 << 20;

/// `path` NUL-terminated.
fn c_path(path: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(path.len().saturating_add(1));
    p.extend_from_slice(path);
    p.push(0);
    p
}

fn open(path: &[u8], flags: c_int) -> Option<c_int> {
    open_at(libc::AT_FDCWD, path, flags)
}

fn open_at(dirfd: c_int, path: &[u8], flags: c_int) -> Option<c_int> {
    let p = c_path(path);
    // SAFETY: `p` is NUL-terminated.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat,
            dirfd,
            p.as_ptr(),
            flags | libc::O_CLOEXEC,
            0,
        )
    };
    check(r).and_then(|fd| c_int::try_from(fd).ok())
}

fn close(fd: c_int) {
    // SAFETY: closes a descriptor this library opened.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// The content of the file at `path` (`None` when it cannot be opened or read).
pub fn read_file(path: &[u8]) -> Option<Vec<u8>> {
    read_fd(open(path, libc::O_RDONLY)?)
}

/// An open directory, whose files are read relative to it (one path walk for many files).
pub struct Dir(c_int);

impl Dir {
    pub fn open(path: &[u8]) -> Option<Dir> {
        open(path, libc::O_PATH | libc::O_DIRECTORY).map(Dir)
    }

    /// The content of the file `name` in this directory.
    pub fn read(&self, name: &[u8]) -> Option<Vec<u8>> {
        read_fd(open_at(self.0, name, libc::O_RDONLY)?)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        close(self.0);
    }
}

/// Reads `fd` to its end and closes it.
fn read_fd(fd: c_int) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    let ok = loop {
        // SAFETY: `buf` is writable for its length.
        let r = unsafe { libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), buf.len()) };
        match check(r) {
            Some(0) => break true,
            Some(n) if out.len() < MAX_FILE => {
                out.extend_from_slice(buf.get(..n).unwrap_or_default())
            }
            _ => break false,
        }
    };
    close(fd);
    ok.then_some(out)
}

/// The names in the directory `path`, without `.` and `..` (`None` when it cannot be read).
pub fn list_dir(path: &[u8]) -> Option<Vec<Vec<u8>>> {
    let fd = open(path, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let mut names = Vec::new();
    let mut buf = [0u8; 4096];
    let ok = loop {
        // SAFETY: `buf` is writable for its length.
        let r = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        let Some(n) = check(r) else { break false };
        if n == 0 {
            break true;
        }
        let mut at = 0usize;
        // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
        while let Some(rec) = buf.get(at..n) {
            let Some(&[lo, hi]) = rec.get(16..18) else {
                break;
            };
            let reclen = usize::from(u16::from_ne_bytes([lo, hi]));
            if reclen == 0 {
                break;
            }
            let name = rec.get(19..reclen).unwrap_or_default();
            let name = name.split(|&b| b == 0).next().unwrap_or_default();
            if !matches!(name, b"." | b"..") {
                names.push(name.to_vec());
            }
            at = at.saturating_add(reclen);
        }
    };
    close(fd);
    ok.then_some(names)
}

/// How opening a device node read-write answered (the node is closed again at once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// It opened, or failed past the device cgroup's check (`ENXIO`: no driver behind its
    /// number, as on a mock node; `EACCES`: its mode).
    Allowed,
    /// `EPERM`: the device cgroup refused it (Slurm's `ConstrainDevices`, a container's rules).
    Denied,
    /// `ENOENT`: there is no such node.
    Missing,
}

/// Opens `path` read-write with a raw `openat` (no `LD_PRELOAD` hook redirects it) and closes it.
pub fn probe_device(path: &[u8]) -> Access {
    match open(path, libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK) {
        Some(fd) => {
            close(fd);
            Access::Allowed
        }
        // SAFETY: glibc's per-thread errno location is always valid.
        None => match unsafe { *libc::__errno_location() } {
            libc::EPERM => Access::Denied,
            libc::ENOENT => Access::Missing,
            _ => Access::Allowed,
        },
    }
}

/// Sleeps `ms` milliseconds (`clock_nanosleep`, monotonic; restarted after a signal).
pub fn sleep_ms(ms: u32) {
    let mut ts = libc::timespec {
        tv_sec: libc::time_t::from(ms / 1000),
        tv_nsec: c_long::from(ms % 1000).saturating_mul(1_000_000),
    };
    loop {
        let mut rem = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: both timespecs are valid; relative sleep (flags 0).
        let r = unsafe {
            libc::syscall(
                libc::SYS_clock_nanosleep,
                libc::CLOCK_MONOTONIC,
                0,
                &ts as *const libc::timespec,
                &mut rem as *mut libc::timespec,
            )
        };
        // SAFETY: glibc's per-thread errno location is always valid.
        if r == 0 || unsafe { *libc::__errno_location() } != libc::EINTR {
            break;
        }
        ts = rem;
    }
}

/// Writes `libnvidia-ml: <parts…>\n` to stderr in one `write(2)`.
pub fn log(parts: &[&[u8]]) {
    let mut line: Vec<u8> = Vec::new();
    line.extend_from_slice(b"libnvidia-ml (mockgpu): ");
    for p in parts {
        line.extend_from_slice(p);
    }
    line.push(b'\n');
    // SAFETY: `line` is initialised for its length.
    unsafe { libc::syscall(libc::SYS_write, 2, line.as_ptr(), line.len()) };
}
