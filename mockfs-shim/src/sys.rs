//! The few system services the shim uses itself: raw system calls (so that none of them needs a
//! new glibc symbol version or re-enters a hook), `errno`, `dlsym`, and the debug log.

use core::ffi::{CStr, c_char, c_int, c_long, c_void};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::path::{PATH_MAX, TooLong};

// Linked explicitly: libc's own `#[link(name = "c")]` is left out when its `std` feature is on
// (it expects `std` to link libc), and in a whole-workspace build feature unification turns that
// feature on for this crate too (the agent, nix and tokio ask for it). Without `-lc` the linker
// cannot bind the versioned `dlsym` below; GNU ld for aarch64 rejects it even when libc arrives
// through `libdl.so.2`.
#[link(name = "c")]
unsafe extern "C" {
    // Pinned to the oldest version: plain `dlsym` would bind to dlsym@GLIBC_2.34.
    #[cfg_attr(target_arch = "x86_64", link_name = "dlsym@GLIBC_2.2.5")]
    #[cfg_attr(target_arch = "aarch64", link_name = "dlsym@GLIBC_2.17")]
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn secure_getenv(name: *const c_char) -> *mut c_char;
}

/// `RTLD_NEXT`: the next definition after this library in the lookup order.
const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;

/// The real definition of one hooked function, looked up once and cached.
pub struct Real {
    name: &'static CStr,
    addr: AtomicUsize,
}

const UNRESOLVED: usize = 0;
const MISSING: usize = 1;

impl Real {
    pub const fn new(name: &'static CStr) -> Real {
        Real {
            name,
            addr: AtomicUsize::new(UNRESOLVED),
        }
    }

    /// Looks the function up (done for every hook at load; later only if a hook ran earlier).
    pub fn resolve(&self) -> usize {
        // SAFETY: `name` is NUL-terminated; dlsym has no other precondition.
        let addr = unsafe { dlsym(RTLD_NEXT, self.name.as_ptr()) } as usize;
        let addr = if addr == UNRESOLVED { MISSING } else { addr };
        self.addr.store(addr, Ordering::Relaxed);
        addr
    }

    /// The function's address, or `None` when this glibc lacks it.
    pub fn get(&self) -> Option<usize> {
        match self.addr.load(Ordering::Relaxed) {
            UNRESOLVED => Some(self.resolve()).filter(|&a| a != MISSING),
            MISSING => None,
            addr => Some(addr),
        }
    }
}

pub fn errno() -> c_int {
    // SAFETY: glibc's per-thread errno location is always valid.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(e: c_int) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e }
}

/// Reads an environment variable with `secure_getenv` (ignored in setuid programs).
pub fn env(name: &CStr) -> Option<&'static [u8]> {
    // SAFETY: the environment is not modified while the constructor runs.
    let v = unsafe { secure_getenv(name.as_ptr()) };
    // SAFETY: a non-null result is a NUL-terminated string that lives as long as the process.
    (!v.is_null()).then(|| unsafe { CStr::from_ptr(v) }.to_bytes())
}

/// Turns a raw `syscall()` result into a length, `None` on failure (errno is then set).
fn check(r: c_long) -> Option<usize> {
    usize::try_from(r).ok()
}

/// `openat(2)` without going through any hook (`O_CLOEXEC` only when `flags` has it).
pub fn open_at(dirfd: c_int, path: &CStr, flags: c_int) -> Option<c_int> {
    // SAFETY: `path` is NUL-terminated.
    let r = unsafe { libc::syscall(libc::SYS_openat, dirfd, path.as_ptr(), flags, 0) };
    check(r).and_then(|fd| c_int::try_from(fd).ok())
}

pub fn close(fd: c_int) {
    // SAFETY: closes a descriptor this library opened.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// Reads up to `buf.len()` bytes (a short read only at end of file).
pub fn read_full(fd: c_int, buf: &mut [u8]) -> usize {
    let mut done = 0;
    while let Some(rest) = buf.get_mut(done..).filter(|r| !r.is_empty()) {
        // SAFETY: `rest` is writable for its length.
        let r = unsafe { libc::syscall(libc::SYS_read, fd, rest.as_mut_ptr(), rest.len()) };
        match check(r) {
            Some(0) | None => break,
            Some(n) => done = done.saturating_add(n),
        }
    }
    done
}

/// Whether the directory `fd` has an entry other than `.` and `..` (an empty mount point does not).
pub fn dir_has_entries(fd: c_int) -> bool {
    let mut buf = [0u8; 1024];
    // SAFETY: `buf` is writable for its length.
    let r = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
    let Some(n) = check(r) else { return false };
    let mut at = 0;
    // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
    while let Some(rec) = buf.get(at..n) {
        let Some(&[lo, hi]) = rec.get(16..18) else {
            break;
        };
        let reclen = usize::from(u16::from_ne_bytes([lo, hi]));
        let name = rec.get(19..reclen).unwrap_or_default();
        let name = name.split(|&b| b == 0).next().unwrap_or_default();
        if !matches!(name, b"." | b"..") {
            return true;
        }
        if reclen == 0 {
            break;
        }
        at = at.saturating_add(reclen);
    }
    false
}

/// The directory a relative path is resolved against: the working directory for `AT_FDCWD`,
/// else the path of `dirfd` (from `/proc/self/fd`). `None` when unavailable; `Some(Err)` when it
/// does not fit `buf`.
pub fn base_dir(dirfd: c_int, buf: &mut [u8]) -> Option<Result<&[u8], TooLong>> {
    let n = if dirfd == libc::AT_FDCWD {
        // SAFETY: `buf` is writable for its length.
        let r = unsafe { libc::syscall(libc::SYS_getcwd, buf.as_mut_ptr(), buf.len()) };
        match check(r) {
            Some(n) => n.saturating_sub(1), // the kernel counts the NUL
            None if errno() == libc::ERANGE => return Some(Err(TooLong)),
            None => return None,
        }
    } else {
        let mut link = [0u8; 32];
        let fd = u32::try_from(dirfd).ok()?;
        let name = fd_link(fd, &mut link)?;
        // SAFETY: `name` is NUL-terminated and `buf` writable for its length.
        let r = unsafe {
            libc::syscall(
                libc::SYS_readlinkat,
                libc::AT_FDCWD,
                name.as_ptr(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        let n = check(r)?;
        if n >= buf.len() {
            return Some(Err(TooLong));
        }
        n
    };
    buf.get(..n).map(Ok)
}

/// The physical path of `path` (symlinks and `..` resolved by the kernel), for `Config::resolve`.
pub fn physical<'o>(path: &CStr, out: &'o mut [u8; PATH_MAX]) -> Option<&'o [u8]> {
    let fd = open_at(libc::AT_FDCWD, path, libc::O_PATH | libc::O_CLOEXEC)?;
    let real = base_dir(fd, out).and_then(Result::ok);
    close(fd);
    real
}

/// Writes `/proc/self/fd/<fd>` into `buf`.
fn fd_link(fd: u32, buf: &mut [u8; 32]) -> Option<&CStr> {
    const HEAD: &[u8] = b"/proc/self/fd/";
    let mut digits = [0u8; 10];
    let mut n = fd;
    let mut len = 0;
    loop {
        *digits.get_mut(len)? = b'0'.saturating_add(u8::try_from(n % 10).ok()?);
        len = len.saturating_add(1);
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.get_mut(..HEAD.len())?.copy_from_slice(HEAD);
    for (dst, src) in buf
        .get_mut(HEAD.len()..)?
        .iter_mut()
        .zip(digits.get(..len)?.iter().rev())
    {
        *dst = *src;
    }
    let end = HEAD.len().saturating_add(len);
    *buf.get_mut(end)? = 0;
    CStr::from_bytes_with_nul(buf.get(..=end)?).ok()
}

static DEBUG: AtomicBool = AtomicBool::new(false);

pub fn set_debug(on: bool) {
    DEBUG.store(on, Ordering::Relaxed);
}

pub fn debug() -> bool {
    DEBUG.load(Ordering::Relaxed)
}

/// Writes `mockfs: <parts…>\n` to stderr in one `write(2)` when `MOCKFS_DEBUG=1` (each part cut
/// to 300 bytes: this is a log line, not a path).
pub fn note(parts: &[&[u8]]) {
    if !debug() {
        return;
    }
    let mut line = [0u8; 2048];
    let mut len = 0;
    let parts = parts.iter().map(|p| p.get(..300).unwrap_or(p));
    for part in core::iter::once(&b"mockfs: "[..])
        .chain(parts)
        .chain(core::iter::once(&b"\n"[..]))
    {
        for (dst, src) in line.get_mut(len..).unwrap_or_default().iter_mut().zip(part) {
            *dst = *src;
            len = len.saturating_add(1);
        }
    }
    // SAFETY: `line[..len]` is initialised.
    unsafe { libc::syscall(libc::SYS_write, 2, line.as_ptr(), len) };
}
