//! A small fork-join pool for the decode kernels, whose helper threads spin
//! between jobs instead of going to sleep.
//!
//! Decoding one token runs ~120 parallel kernels of 20–500 µs each, separated
//! by a few to tens of µs of single-threaded work (norms, rope, attention,
//! candle's bookkeeping). rayon parks idle workers on a futex after a short
//! spell of `sched_yield`, and on a VM waking a parked thread on an idle vCPU
//! costs an inter-processor interrupt: in a `perf` profile of f16 decode each
//! thread spent ~12% of its samples in futex wake/sleep and `sched_yield`.
//! Here the helpers spin (with `spin_loop` hints) for [`SPIN_BEFORE_PARK`]
//! after each job before they park, so the kernels of one token, and of the
//! next token, find them awake.
//!
//! The calling thread takes part in every job; work is handed out in blocks
//! from an atomic cursor, so a helper that the host deschedules for a moment
//! does not hold the job up. One job runs at a time: a caller that finds the
//! pool busy (another thread decoding, or a kernel inside a kernel) runs its
//! blocks itself.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle helper spins before it parks. Longer than the gaps
/// between the kernels of a token and between tokens, short enough that an
/// idle node does not burn a core.
pub(crate) const SPIN_BEFORE_PARK: Duration = Duration::from_millis(2);

/// The job being run: a type-erased `&dyn Fn()` valid until every helper has
/// reported back (the caller waits for that before it returns).
type JobRef = *const (dyn Fn() + Sync);

struct Shared {
    /// Bumped for every job; helpers wait for it to change.
    epoch: AtomicU64,
    /// Helpers that have not yet finished the current job.
    running: AtomicUsize,
    /// Helpers parked on `wake`.
    parked: AtomicUsize,
    /// Set while a caller owns the pool.
    busy: AtomicBool,
    /// Set when a block panicked on a helper.
    panicked: AtomicBool,
    job: UnsafeCell<Option<JobRef>>,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the caller that owns the pool (`busy`)
// before it publishes the job with a release increment of `epoch`, and read by
// helpers after they acquire that increment; it is not written again until
// every helper has decremented `running`.
unsafe impl Sync for Shared {}

/// The pool: `helpers` threads plus whichever thread calls
/// [`SpinPool::for_each_block`].
pub struct SpinPool {
    shared: &'static Shared,
    helpers: usize,
}

impl SpinPool {
    /// The process-wide pool, sized like rayon's (`RAYON_NUM_THREADS` or the
    /// number of CPUs): one thread fewer, as the caller works too.
    pub fn global() -> &'static SpinPool {
        static POOL: OnceLock<SpinPool> = OnceLock::new();
        POOL.get_or_init(|| SpinPool::new(rayon::current_num_threads().saturating_sub(1)))
    }

    fn new(helpers: usize) -> Self {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            epoch: AtomicU64::new(0),
            running: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            job: UnsafeCell::new(None),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }));
        let mut started = 0;
        for i in 0..helpers {
            let spawned = std::thread::Builder::new()
                .name(format!("selectinfer-decode-{i}"))
                .spawn(move || helper_loop(shared));
            // Without the thread the pool is smaller, not broken.
            if spawned.is_ok() {
                started += 1;
            }
        }
        Self {
            shared,
            helpers: started,
        }
    }

    /// Threads that work on a job (helpers and the caller).
    pub(crate) fn threads(&self) -> usize {
        self.helpers + 1
    }

    /// Splits `0..n` into the blocks [`SpinPool::for_each_block`] hands out:
    /// largest first (guided scheduling: an even share of what is left, at
    /// least `min_block`), so the threads start on long runs of memory and
    /// finish together on short ones. (A quarter of what is left, with more
    /// and shorter blocks, streamed ~10% slower in SmolLM2 f16 decode.)
    /// Depends only on `n`, `min_block` and the number of threads, so sums
    /// over blocks added up in block order are the same from run to run.
    pub fn partition(&self, n: usize, min_block: usize) -> Vec<Range<usize>> {
        let share = self.threads();
        let mut blocks = Vec::new();
        let mut start = 0;
        while start < n {
            let end = n.min(start + ((n - start) / share).max(min_block.max(1)));
            blocks.push(start..end);
            start = end;
        }
        blocks
    }

    /// Runs `body(index, block)` for each block of
    /// [`SpinPool::partition`]`(n, min_block)`, on the pool's threads and the
    /// caller's, and returns when all are done. Blocks are taken in order
    /// from an atomic cursor. A panic in `body` is raised again here after
    /// every thread has stopped.
    pub(crate) fn for_each_block(
        &self,
        n: usize,
        min_block: usize,
        body: impl Fn(usize, Range<usize>) + Sync,
    ) {
        self.run_blocks(&self.partition(n, min_block), body);
    }

    /// [`SpinPool::for_each_block`] over blocks the caller already has from
    /// [`SpinPool::partition`] (to size a buffer per block, say).
    pub fn run_blocks(&self, blocks: &[Range<usize>], body: impl Fn(usize, Range<usize>) + Sync) {
        let next = AtomicUsize::new(0);
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(block) = blocks.get(i) else {
                break;
            };
            body(i, block.clone());
        };
        if blocks.len() <= 1 {
            return work();
        }
        self.run_on_every_thread(&work);
    }

    /// Runs `work()` once on each thread (the caller's too), or
    /// only on the caller when the pool is busy or has no helper.
    fn run_on_every_thread(&self, work: &(dyn Fn() + Sync)) {
        let s = self.shared;
        if self.helpers == 0
            || s.busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return work();
        }
        s.panicked.store(false, Ordering::Relaxed);
        // SAFETY: erases the lifetime of `work`; the guard below does not let
        // this function return (or unwind) before every helper is done with it.
        let job: JobRef = unsafe { std::mem::transmute::<&(dyn Fn() + Sync), JobRef>(work) };
        // SAFETY: we own the pool (`busy`) and no helper is running a job.
        unsafe { *s.job.get() = Some(job) };
        s.running.store(self.helpers, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.parked.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        struct Finish(&'static Shared);
        impl Drop for Finish {
            fn drop(&mut self) {
                while self.0.running.load(Ordering::Acquire) != 0 {
                    std::hint::spin_loop();
                }
                // SAFETY: every helper is done with the job.
                unsafe { *self.0.job.get() = None };
                self.0.busy.store(false, Ordering::Release);
            }
        }
        let finish = Finish(s);
        work();
        drop(finish);
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a decode kernel block panicked on a helper thread");
        }
    }
}

/// A mutable slice that the blocks of one [`SpinPool::for_each_block`] call
/// write to, each its own range.
pub struct DisjointSlice<'a, T> {
    ptr: *mut T,
    len: usize,
    _slice: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: only hands out disjoint ranges (see `range`), like `chunks_mut`.
unsafe impl<T: Send> Sync for DisjointSlice<'_, T> {}

impl<'a, T> DisjointSlice<'a, T> {
    pub fn new(slice: &'a mut [T]) -> Self {
        Self {
            ptr: slice.as_mut_ptr(),
            len: slice.len(),
            _slice: std::marker::PhantomData,
        }
    }

    /// The elements in `r`.
    ///
    /// # Safety
    /// No two live borrows may overlap: call it once per block of a
    /// [`SpinPool::for_each_block`] call (whose blocks are disjoint).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn range(&self, r: Range<usize>) -> &mut [T] {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "range {r:?} out of {}",
            self.len
        );
        std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.end - r.start)
    }
}

fn helper_loop(s: &'static Shared) {
    // The epoch the pool started with: a job published before this thread
    // got going must still be seen as new.
    let mut seen = 0;
    loop {
        let mut spun_since = Instant::now();
        let mut spins = 0u32;
        while s.epoch.load(Ordering::Acquire) == seen {
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(256) && spun_since.elapsed() > SPIN_BEFORE_PARK {
                let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.parked.fetch_add(1, Ordering::SeqCst);
                while s.epoch.load(Ordering::SeqCst) == seen {
                    g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                s.parked.fetch_sub(1, Ordering::SeqCst);
                spun_since = Instant::now();
            }
        }
        seen += 1;
        // SAFETY: published before the epoch increment we acquired; valid
        // until we decrement `running`.
        if let Some(job) = unsafe { *s.job.get() } {
            if catch_unwind(AssertUnwindSafe(|| unsafe { (*job)() })).is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
        }
        s.running.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts how often each index is visited; checks the block indices.
    fn visits(pool: &SpinPool, n: usize, min_block: usize) -> Vec<usize> {
        let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        let blocks = pool.partition(n, min_block);
        pool.for_each_block(n, min_block, |index, block| {
            assert_eq!(blocks[index], block);
            for i in block {
                hits[i].fetch_add(1, Ordering::Relaxed);
            }
        });
        hits.into_iter().map(|h| h.into_inner()).collect()
    }

    #[test]
    fn every_index_is_visited_exactly_once() {
        // A fresh pool: the first job may be published before the helper
        // has started (it must still pick it up, not hang).
        let pool = SpinPool::new(1);
        for (n, min_block) in [(0, 1), (1, 1), (2, 1), (17, 4), (1000, 16), (3072, 0)] {
            assert!(visits(&pool, n, min_block).iter().all(|&h| h == 1), "n {n}");
        }
    }

    #[test]
    fn blocks_shrink_and_cover_the_range() {
        let pool = SpinPool::new(1);
        let blocks = pool.partition(3072, 16);
        assert_eq!(blocks[0], 0..1536, "half first with two threads");
        assert!(blocks.windows(2).all(|b| b[0].end == b[1].start));
        assert!(blocks.windows(2).all(|b| b[0].len() >= b[1].len()));
        assert_eq!(blocks.last().unwrap().end, 3072);
        assert!(blocks.iter().rev().skip(1).all(|b| b.len() >= 16));
    }

    #[test]
    fn a_parked_helper_wakes_for_the_next_job_and_works_on_it() {
        let pool = SpinPool::new(1);
        std::thread::sleep(SPIN_BEFORE_PARK * 5);
        let helper_ran = AtomicBool::new(false);
        let caller = std::thread::current().id();
        // The caller's first block (half of them) takes 20 ms: time enough
        // for the helper to wake and take the next.
        pool.for_each_block(400, 1, |_, block| {
            if std::thread::current().id() != caller {
                helper_ran.store(true, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_micros(100) * block.len() as u32);
        });
        assert!(helper_ran.load(Ordering::Relaxed));
    }

    #[test]
    fn concurrent_callers_and_nested_jobs_still_visit_every_index() {
        let pool = SpinPool::new(1);
        let total = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    for _ in 0..50 {
                        pool.for_each_block(8, 1, |_, outer| {
                            for _ in outer {
                                let inner = visits(&pool, 4, 1);
                                total.fetch_add(inner.iter().sum(), Ordering::Relaxed);
                            }
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 50 * 8 * 4);
    }

    #[test]
    fn a_panicking_block_is_raised_in_the_caller() {
        let pool = SpinPool::new(1);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.for_each_block(64, 1, |_, block| {
                std::thread::sleep(Duration::from_micros(50));
                assert!(!block.contains(&40), "block with 40");
            })
        }));
        assert!(r.is_err());
        // The pool is usable afterwards.
        assert!(visits(&pool, 100, 1).iter().all(|&h| h == 1));
    }
}
