//! Process and machine measurements: resident memory and memory bandwidth.

use rayon::prelude::*;
use std::time::Instant;

/// The value (kB) of the line starting with `field` in `/proc/self/<file>`;
/// 0 if unknown.
fn proc_kib(file: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/self/{file}"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Peak resident set size of this process (VmHWM), in bytes; 0 if unknown.
pub fn peak_rss_bytes() -> u64 {
    proc_kib("status", "VmHWM:") * 1024
}

/// Current resident set size (VmRSS), in bytes; 0 if unknown.
pub(crate) fn rss_bytes() -> u64 {
    proc_kib("status", "VmRSS:") * 1024
}

/// Anonymous memory of this process on transparent huge pages
/// (`AnonHugePages` of `/proc/self/smaps_rollup`), bytes; 0 if unknown.
pub fn anon_huge_page_bytes() -> u64 {
    proc_kib("smaps_rollup", "AnonHugePages:") * 1024
}

/// A buffer to measure read bandwidth with: summed by rayon's threads, on
/// huge pages where the system has them (like the weights,
/// `crate::sys::hugepages`), so that it shows the best this machine's memory
/// delivers. Holding it keeps its memory resident.
pub(crate) struct BandwidthProbe {
    data: Vec<f32>,
}

impl BandwidthProbe {
    /// A probe over `bytes` bytes (well past the last-level cache), filled.
    pub(crate) fn new(bytes: usize) -> Self {
        let n = bytes / 4;
        let mut data: Vec<f32> = Vec::with_capacity(n);
        crate::sys::hugepages::advise(data.as_ptr().cast(), n * 4);
        data.extend((0..n).map(|i| (i % 7) as f32));
        let probe = Self { data };
        // One warm pass: page faults, thread pool.
        probe.pass();
        probe
    }

    /// One timed pass over the buffer: read bandwidth, GB/s (1e9 bytes).
    pub(crate) fn pass(&self) -> f64 {
        let data = &self.data;
        let chunk = data.len().div_ceil(rayon::current_num_threads().max(1) * 8);
        let t = Instant::now();
        let s: f32 = data
            .par_chunks(chunk)
            .map(|c| {
                // Eight independent accumulators so the loop vectorises.
                let mut acc = [0f32; 8];
                for block in c.chunks_exact(8) {
                    for (a, v) in acc.iter_mut().zip(block) {
                        *a += v;
                    }
                }
                acc.iter().sum::<f32>()
            })
            .sum();
        let dt = t.elapsed().as_secs_f64();
        std::hint::black_box(s);
        (data.len() * 4) as f64 / dt / 1e9
    }

    /// The best of `passes` passes, GB/s: the roofline.
    pub(crate) fn best(&self, passes: usize) -> f64 {
        (0..passes.max(1)).map(|_| self.pass()).fold(0.0, f64::max)
    }

    /// The median of `passes` passes, GB/s.
    pub(crate) fn median(&self, passes: usize) -> f64 {
        let mut v: Vec<f64> = (0..passes.max(1)).map(|_| self.pass()).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }
}

/// Measures read bandwidth (GB/s, 1e9 bytes) over a `bytes`-sized buffer
/// ([`BandwidthProbe`]): the best of `repeats` passes after one warm pass.
pub fn measure_read_bandwidth(bytes: usize, repeats: usize) -> f64 {
    BandwidthProbe::new(bytes).best(repeats)
}

/// Keeps the allocator from holding freed transients as resident memory.
/// glibc's malloc serves a block of at least `mmap_threshold` bytes with a
/// mapping of its own, unmapped at `free`; by default it raises that
/// threshold to the size of each such block freed (up to 32 MiB), after
/// which blocks of that size come from the heap and stay resident when
/// freed (SmolLM2 q4: 129 MiB after load, 163 MiB after a bench, most of it
/// free heap). Fixing the threshold turns that adjustment off; one arena
/// (instead of one per thread) keeps the threads' freed blocks in one
/// place. Call before the model loads; no-op where malloc is not glibc's.
pub(crate) fn bound_allocator_retention(mmap_threshold: usize, arenas: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets the allocator's parameters.
    unsafe {
        let int = |v: usize| v.min(i32::MAX as usize) as libc::c_int;
        libc::mallopt(libc::M_MMAP_THRESHOLD, int(mmap_threshold));
        libc::mallopt(libc::M_ARENA_MAX, int(arenas.max(1)));
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (mmap_threshold, arenas);
}

/// Gives the allocator's free memory back to the system (glibc keeps freed
/// heap in its arenas, the worker thread's included): after a large free
/// such as unloading a model. No-op elsewhere.
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::malloc_trim(0);
    }
}
