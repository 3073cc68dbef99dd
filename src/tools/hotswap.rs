//! Measures a task hot-swap against a restart: the same engine switched
//! from its task to another ([`EngineSpec::swap_task`]) beside a fresh load
//! with the other task, in one process — bytes read, seconds, the bytes
//! the plans' difference holds, and whether both answer the same (greedy).

use crate::engine::{Engine, GenerateOptions};
use crate::engine::{EngineSpec, SwapReport};
use crate::model::footprint::Footprint;
use crate::sys::memory;
use anyhow::{bail, Context, Result};
use std::time::Instant;

/// Prompts both engines answer after the swap.
pub(crate) const PROMPTS: [&str; 3] = [
    "Translate into English: Der Roboter fährt in die Küche.",
    "Summarize in one sentence: The robot charged its battery and then mapped the lab.",
    "What is the capital of France?",
];

/// One swap against one restart.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HotSwapReport {
    pub from: String,
    pub swap: SwapReport,
    /// Bytes of the neurons the new plan adds (what an exact swap reads).
    pub plan_difference_bytes: u64,
    /// A fresh load with the new task: seconds and weight bytes read.
    pub restart_s: f64,
    pub restart_bytes: u64,
    pub rss_before_swap: u64,
    pub rss_after_swap: u64,
    /// Greedy answers to [`PROMPTS`] after the swap equal the restart's.
    pub same_answers: bool,
}

fn answers(engine: &mut Engine, new_tokens: usize) -> Result<Vec<Vec<u32>>> {
    let opts = GenerateOptions {
        max_new_tokens: new_tokens,
        ..Default::default()
    };
    PROMPTS
        .iter()
        .map(|p| Ok(engine.generate_chat(p, &opts, |_| true)?.token_ids))
        .collect()
}

/// Loads `spec`, answers the prompts once (so the layers are arranged as
/// a serving engine's are), swaps to `to`, then loads `spec` with task `to`
/// afresh and compares.
pub fn measure(spec: &EngineSpec, to: &str, new_tokens: usize) -> Result<HotSwapReport> {
    if !spec.mode.needs_ranking() {
        bail!(
            "mode {} holds no task's base set: hot-swap applies to load-only and selectinfer",
            spec.mode.name()
        );
    }
    let target = EngineSpec {
        params: crate::method::SelectionParams {
            task: to.into(),
            ..spec.params.clone()
        },
        ..spec.clone()
    };
    let mut engine = spec.load()?;
    answers(&mut engine, new_tokens)?;
    let rss_before_swap = memory::rss_bytes();
    let swap = spec.swap_task(&mut engine, to)?;
    let rss_after_swap = memory::rss_bytes();
    let swapped = answers(&mut engine, new_tokens)?;
    let plans = |s: &EngineSpec| -> Result<Vec<Vec<u32>>> {
        let m = s.method()?.context("a selective mode")?;
        Ok(m.plan
            .context("a load plan")?
            .layers
            .into_iter()
            .map(|l| l.loaded)
            .collect())
    };
    let (old, new) = (plans(spec)?, plans(&target)?);
    let fp = Footprint::of(&spec.model, &spec.load_options()?)?;
    let plan_difference_bytes = old
        .iter()
        .zip(&new)
        .zip(&fp.neuron_bytes)
        .map(|((a, b), bytes)| b.iter().filter(|n| !a.contains(n)).count() as u64 * bytes)
        .sum();
    drop(engine);
    let t = Instant::now();
    let mut fresh = target.load()?;
    let restart_s = t.elapsed().as_secs_f64();
    let restart_bytes = fresh.model.weight_bytes_read();
    let same_answers = answers(&mut fresh, new_tokens)? == swapped;
    Ok(HotSwapReport {
        from: spec.params.task.clone(),
        swap,
        plan_difference_bytes,
        restart_s,
        restart_bytes,
        rss_before_swap,
        rss_after_swap,
        same_answers,
    })
}

impl std::fmt::Display for HotSwapReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        write!(
            f,
            "task {} -> {}: swap read {:.1} MiB ({} neurons; the plans' difference holds {:.1} MiB) in {:.3} s; restart read {:.1} MiB in {:.3} s (swap/restart time {:.2}); RSS {:.0} -> {:.0} MiB; same answers as the restart: {}",
            self.from,
            self.swap.task,
            mib(self.swap.bytes_read),
            self.swap.neurons_read,
            mib(self.plan_difference_bytes),
            self.swap.seconds,
            mib(self.restart_bytes),
            self.restart_s,
            self.swap.seconds / self.restart_s.max(1e-9),
            mib(self.rss_before_swap),
            mib(self.rss_after_swap),
            self.same_answers
        )
    }
}
