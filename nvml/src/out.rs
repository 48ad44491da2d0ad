//! Writing results through the caller's pointers: NULL is `NVML_ERROR_INVALID_ARGUMENT`, a
//! short buffer `NVML_ERROR_INSUFFICIENT_SIZE`.

use core::ffi::c_char;

use crate::ffi::{self, Ret};

/// `*p = v`.
///
/// # Safety
/// `p` is NULL or valid for a write of `T`.
pub unsafe fn put<T>(p: *mut T, v: T) -> Ret {
    if p.is_null() {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null, and valid by the caller's contract.
    unsafe { p.write(v) };
    ffi::SUCCESS
}

/// Copies `s` and a NUL into `buf` of `len` bytes.
///
/// # Safety
/// `buf` is NULL or valid for `len` bytes.
pub unsafe fn put_str(buf: *mut c_char, len: u32, s: &[u8]) -> Ret {
    if buf.is_null() {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    if (len as usize) <= s.len() {
        return ffi::ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: `buf` holds `len > s.len()` bytes.
    unsafe {
        core::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        buf.add(s.len()).write(0);
    }
    ffi::SUCCESS
}

/// The `count`/array convention: with `*count` too small (or `array` NULL), sets `*count` to
/// the length and returns `NVML_ERROR_INSUFFICIENT_SIZE` (`NVML_SUCCESS` when the list is
/// empty); else copies the list and sets `*count`.
///
/// # Safety
/// `count` is NULL or valid; `array` is NULL or valid for `*count` elements.
pub unsafe fn put_list<T: Copy>(count: *mut u32, array: *mut T, list: &[T]) -> Ret {
    if count.is_null() {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    let Ok(n) = u32::try_from(list.len()) else {
        return ffi::ERROR_UNKNOWN;
    };
    // SAFETY: `count` is valid.
    let room = unsafe { count.read() };
    // SAFETY: as above.
    unsafe { count.write(n) };
    if list.is_empty() {
        return ffi::SUCCESS;
    }
    if array.is_null() || room < n {
        return ffi::ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: `array` holds `room >= n` elements.
    unsafe { core::ptr::copy_nonoverlapping(list.as_ptr(), array, list.len()) };
    ffi::SUCCESS
}

/// Sets the bits of `ids` in the caller's `unsigned long` array of `words` words (cleared first).
///
/// # Safety
/// `mask` is NULL or valid for `words` elements.
pub unsafe fn put_mask(
    mask: *mut core::ffi::c_ulong,
    words: u32,
    ids: impl Iterator<Item = u32>,
) -> Ret {
    if mask.is_null() || words == 0 {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    let bits = core::ffi::c_ulong::BITS;
    for w in 0..words as usize {
        // SAFETY: `w < words`.
        unsafe { mask.add(w).write(0) };
    }
    for id in ids {
        let word = id / bits;
        if word < words {
            // SAFETY: `word < words`.
            unsafe { *mask.add(word as usize) |= 1 << (id % bits) };
        }
    }
    ffi::SUCCESS
}
