//! The process allocator: the system one, with large blocks backed by transparent huge pages.
//!
//! Why: a training step allocates and frees tensors of hundreds of MB (logits over the
//! vocabulary, their gradients, activations). The system allocator returns each to the kernel
//! and the next step faults it back in, zeroed, 4 KiB at a time: with
//! `madvise(MADV_HUGEPAGE)` those faults come 2 MiB at a time. Measured on the 8 × 256
//! SmolLM2 train bench: 133 → 145 tokens/s (README, Benchmarks). Small blocks are untouched.

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks at least this big get the huge-page advice (the size of one huge page).
const HUGE: usize = 2 << 20;

/// [`System`] plus huge-page advice for large blocks.
pub struct HugePageAlloc;

fn advise(ptr: *mut u8, size: usize) {
    #[cfg(target_os = "linux")]
    {
        let page = 4096usize;
        let start = (ptr as usize).next_multiple_of(page);
        let end = (ptr as usize + size) / page * page;
        if end > start {
            // SAFETY: the range lies inside a block we just obtained; MADV_HUGEPAGE is advice
            // only (it never changes contents), and a failure (e.g. THP off) is harmless.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, size);
}

// SAFETY: every call forwards to `System` with the same arguments; `advise` only adds advice.
unsafe impl GlobalAlloc for HugePageAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() && layout.size() >= HUGE {
            advise(p, layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() && layout.size() >= HUGE {
            advise(p, layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() && new_size >= HUGE {
            advise(p, new_size);
        }
        p
    }
}
