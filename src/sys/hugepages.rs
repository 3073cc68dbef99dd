//! Transparent huge pages (2 MiB) for the weights the CPU decode streams.
//!
//! Decode reads every weight once per token, front to back. With 4 KiB pages
//! the hardware prefetcher stops at every page boundary and each page costs
//! a TLB entry; on huge pages the same kernels stream markedly faster (SmolLM2
//! f16 decode ~12 % more tokens/s on our Zen 3 VMs, docs/BENCHMARKS.md).
//! Most systems run THP in `madvise` mode, so memory gets huge pages only
//! when asked: [`advise`] for a buffer before it is first written,
//! [`collapse_tensor`] for weights that already hold data (those candle
//! allocated while loading). Both are best effort: where the kernel cannot
//! (not Linux, THP disabled, `MADV_COLLAPSE` older than Linux 6.1, no free
//! huge page) memory stays as it was, and only speed differs.

use candle_core::{CpuStorage, Storage, Tensor};

const HUGE_PAGE: usize = 2 << 20;

/// Asks for huge pages in `[ptr, ptr + bytes)` of one live allocation that
/// has not been written yet (page faults then allocate huge pages).
pub fn advise(ptr: *const u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = (ptr as usize).div_ceil(PAGE) * PAGE;
        let end = (ptr as usize + bytes) / PAGE * PAGE;
        if end > start {
            // SAFETY: the range lies inside one live allocation; MADV_HUGEPAGE
            // only changes how the kernel backs it, never its contents.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes);
}

/// Moves the memory under `[ptr, ptr + bytes)` onto huge pages now
/// (`MADV_COLLAPSE`), contents unchanged. Covers every huge page the range
/// touches, also parts shared with neighbouring allocations: collapsing
/// changes only how memory is backed.
pub(crate) fn collapse(ptr: *const u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        /// `MADV_COLLAPSE` (Linux 6.1); older kernels refuse it with EINVAL.
        const MADV_COLLAPSE: libc::c_int = 25;
        let start = ptr as usize / HUGE_PAGE * HUGE_PAGE;
        let end = (ptr as usize + bytes).div_ceil(HUGE_PAGE) * HUGE_PAGE;
        if bytes > 0 {
            // SAFETY: changes how the kernel backs the range, never its
            // contents; parts outside any mapping are refused, not touched.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, MADV_COLLAPSE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes);
}

/// [`collapse`] for the data of an f32/f16 CPU tensor; other tensors are
/// left alone.
pub(crate) fn collapse_tensor(t: &Tensor) {
    let (storage, layout) = t.storage_and_layout();
    let Some((a, b)) = layout.contiguous_offsets() else {
        return;
    };
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => collapse(v[a..b].as_ptr().cast(), (b - a) * 4),
        Storage::Cpu(CpuStorage::F16(v)) => collapse(v[a..b].as_ptr().cast(), (b - a) * 2),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapsing_and_advising_keep_the_contents() {
        // 9 MiB, not aligned to a huge page: the collapse reaches past both
        // ends into whatever memory shares those huge pages.
        let n = (9 << 20) / 4 + 123;
        let data: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let t = Tensor::from_vec(data, n, &candle_core::Device::Cpu).unwrap();
        let neighbour: Vec<u64> = (0..1000).collect();
        collapse_tensor(&t);
        let back = t.to_vec1::<f32>().unwrap();
        assert!(back.iter().enumerate().all(|(i, &v)| v == i as f32 * 0.5));
        assert!(neighbour.iter().enumerate().all(|(i, &v)| v == i as u64));

        let mut fresh: Vec<u16> = Vec::with_capacity(n);
        advise(fresh.as_ptr().cast(), n * 2);
        fresh.extend((0..n).map(|i| i as u16));
        assert!(fresh.iter().enumerate().all(|(i, &v)| v == i as u16));
    }
}
