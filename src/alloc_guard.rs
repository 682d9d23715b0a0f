//! A global allocator that keeps hostile length prefixes from aborting the
//! process.
//!
//! The protocol codec pre-sizes a `Vec` from an array length read off the
//! wire. A random or malicious frame can claim two billion elements of a large
//! struct: hundreds of gigabytes. The system allocator refuses that, and Rust
//! aborts on allocation failure, taking every other client down with it.
//! Very large requests are therefore served from address space reserved with
//! `MAP_NORESERVE`: nothing is committed until touched, the decode fails a
//! few bytes later on the truncated input, and the mapping is returned. Normal
//! allocations go to the system allocator untouched.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations at or above this size are reserved rather than committed.
const RESERVE_THRESHOLD_BYTES: usize = 1 << 32;
const PAGE_BYTES: usize = 4096;

pub struct GuardedAllocator;

impl GuardedAllocator {
    fn is_huge(layout: &Layout) -> bool {
        layout.size() >= RESERVE_THRESHOLD_BYTES && layout.align() <= PAGE_BYTES
    }
}

// SAFETY: every method either forwards to `System` with the same layout or
// maps/unmaps anonymous memory of exactly `layout.size()` bytes; the choice
// depends only on the layout, so `dealloc` always undoes what `alloc` did.
unsafe impl GlobalAlloc for GuardedAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if Self::is_huge(&layout) {
            // SAFETY: anonymous private mapping, no file descriptor; checked below.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    layout.size(),
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                return std::ptr::null_mut();
            }
            return ptr as *mut u8;
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if Self::is_huge(&layout) {
            // Fresh anonymous mappings are zero-filled.
            // SAFETY: same contract as `alloc`.
            return unsafe { self.alloc(layout) };
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if Self::is_huge(&layout) {
            // SAFETY: `ptr` came from our mmap of exactly this size.
            unsafe { libc::munmap(ptr as *mut libc::c_void, layout.size()) };
            return;
        }
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = match Layout::from_size_align(new_size, layout.align()) {
            Ok(l) => l,
            Err(_) => return std::ptr::null_mut(),
        };
        if !Self::is_huge(&layout) && !Self::is_huge(&new_layout) {
            // SAFETY: both sides belong to `System`.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: allocate, copy the common prefix, free the old block, each
        // through the methods above so the huge/small choice stays consistent.
        unsafe {
            let new_ptr = self.alloc(new_layout);
            if !new_ptr.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new_ptr, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new_ptr
        }
    }
}

#[global_allocator]
static GLOBAL: GuardedAllocator = GuardedAllocator;

#[cfg(test)]
mod tests {
    #[test]
    fn absurd_capacity_is_reserved_not_fatal() {
        // 64 GiB on a machine with far less memory: the system allocator would fail and abort.
        let v: Vec<u64> = Vec::with_capacity(8 << 30);
        assert!(v.capacity() >= 8 << 30);
        drop(v);
        let small: Vec<u8> = vec![1, 2, 3];
        assert_eq!(small.iter().sum::<u8>(), 6);
    }
}
