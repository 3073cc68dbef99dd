//! How many threads the process computes with: rayon's global pool (which
//! sizes the decode kernels' spin pool, [`crate::kernels::spin_pool`]) and
//! candle's matmuls (prefill), which read `RAYON_NUM_THREADS` at each call.
//! A robot's computer runs other nodes: leaving them a core beats fighting
//! them for it (a spinning decode pool with one core taken loses 2/3 of
//! its speed).

use anyhow::{bail, Result};

/// Uses `n` threads from now on. Call it once, before anything computes
/// (the pools are built on first use and keep their size).
pub fn set(n: usize) -> Result<()> {
    if n == 0 {
        bail!("threads must be >= 1 (or unset for one per core), got 0");
    }
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    if n > 4 * cores {
        bail!("threads {n} is more than 4 per core ({cores} cores here)");
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .map_err(|e| anyhow::anyhow!("threads must be set before anything computes: {e}"))?;
    // Only candle reads it (each matmul); set while no other thread of
    // ours reads the environment.
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    Ok(())
}

/// Threads computing now (rayon's global pool).
pub(crate) fn current() -> usize {
    rayon::current_num_threads()
}
