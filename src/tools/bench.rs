//! Benchmarks: fixed prompts, a warm-up, then prefill and decode speed, TTFT,
//! peak RSS and weight bytes read per decoded token, with the memory
//! bandwidth roofline (`tok/s ≤ bandwidth / bytes per token`).
//!
//! Two engines run the same token ids: our dense model (`dense`) and, as the
//! 4-bit baseline, candle-transformers' quantized model on the kept GGUF
//! (`candle-gguf`).

use crate::engine::TextCodec;
use crate::engine::{Engine, GenerateOptions};
use crate::model::LoadOptions;
use crate::sys::memory;
use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use candle_transformers::generation::LogitsProcessor;
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// The fixed benchmark prompts (chat-formatted by the model's template).
pub(crate) const BENCH_PROMPTS: &[&str] = &[
    "Explain in a few sentences why the sky is blue.",
    "Write a short story about a robot that learns to paint.",
    "Translate to English: Der Roboter fährt morgen früh zur Ladestation zurück.",
];

/// Which implementation runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BenchEngine {
    /// Our engine on the converted safetensors (any mode).
    Dense,
    /// candle-transformers' quantized_llama / quantized_qwen2 on model.gguf.
    CandleGguf,
}

crate::sys::named::impl_named!(BenchEngine, "engine", { Dense => "dense", CandleGguf => "candle-gguf" });

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub engine: BenchEngine,
    pub mode: crate::method::Mode,
    pub dtype: String,
    pub prompts: usize,
    pub new_tokens_per_prompt: usize,
    pub mean_prompt_tokens: f64,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    pub ttft_s: f64,
    /// Mean one-time build of the compact weights per prompt (selective
    /// modes; done after the first token, counted in neither TTFT nor
    /// decode tok/s).
    pub compact_build_s: f64,
    pub peak_rss_bytes: u64,
    /// Peak RSS right after the engine loaded (before any prompt): what
    /// loading cost, transients included.
    pub peak_rss_after_load_bytes: u64,
    /// RSS right after the engine loaded (before any prompt).
    pub rss_after_load_bytes: u64,
    /// RSS after the runs, engine still loaded (the steady state a node
    /// serving prompts holds, including a selective mode's per-prompt
    /// decode weights; peak RSS also counts load-time transients).
    pub rss_after_bytes: u64,
    /// Of `rss_after_bytes`, anonymous memory on transparent huge pages
    /// (the CPU weights, where the system grants them: `crate::sys::hugepages`).
    pub huge_page_bytes: u64,
    /// GPU runs: device memory this process holds after the runs (weights,
    /// caches, allocator pools), bytes; `None` on CPU.
    pub device_memory_bytes: Option<u64>,
    pub weight_bytes_per_token: u64,
    /// Measured read bandwidth, GB/s, when asked for.
    pub bandwidth_gb_s: Option<f64>,
    /// `bandwidth / bytes per token`.
    pub roofline_tokens_per_s: Option<f64>,
    /// `decode tok/s ÷ roofline`, in percent.
    pub roofline_percent: Option<f64>,
    /// The roofline measured around each prompt when asked for: after the
    /// runs above, each prompt is decoded once more between two sets of
    /// bandwidth passes (median of 3 before, 3 after), and its decode
    /// tok/s is set against the bandwidth of that moment, in percent. This
    /// machine's bandwidth moves between levels within a minute, so a
    /// best-of pass taken apart from the decode can sit in another level.
    pub paired_roofline_percents: Vec<f64>,
    /// The bandwidth, GB/s, each of `paired_roofline_percents` was set against.
    pub paired_bandwidths_gb_s: Vec<f64>,
    /// The chat-formatted prompts as token ids, so other engines can be run
    /// on exactly the same input (`scripts/bench_engines.py`).
    pub prompt_token_ids: Vec<Vec<u32>>,
    /// The memory plan's expected peak for this configuration at its
    /// longest context (`--max-context`; [`crate::method::budget`]), CPU
    /// only: compare with `peak_rss_bytes` of a prompt that fills it.
    pub planned_peak_bytes: Option<u64>,
}

impl std::fmt::Display for BenchReport {
    /// One line of speed and memory, and the roofline when measured.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} {:?} {}: prefill {:.1} tok/s, decode {:.2} tok/s, TTFT {:.3} s, peak RSS {:.0} MiB, RSS after load {:.0} MiB, after the runs {:.0} MiB, {:.1} MB weights/token",
            self.engine,
            self.mode,
            self.dtype,
            self.prefill_tokens_per_s,
            self.decode_tokens_per_s,
            self.ttft_s,
            self.peak_rss_bytes as f64 / 1048576.0,
            self.rss_after_load_bytes as f64 / 1048576.0,
            self.rss_after_bytes as f64 / 1048576.0,
            self.weight_bytes_per_token as f64 / 1e6
        )?;
        if let (Some(b), Some(r), Some(p)) = (
            self.bandwidth_gb_s,
            self.roofline_tokens_per_s,
            self.roofline_percent,
        ) {
            write!(
                f,
                "\nbandwidth {b:.1} GB/s, roofline {r:.1} tok/s, {p:.0}% of roofline"
            )?;
        }
        if !self.paired_roofline_percents.is_empty() {
            let p: Vec<String> = self
                .paired_roofline_percents
                .iter()
                .zip(&self.paired_bandwidths_gb_s)
                .map(|(p, b)| format!("{p:.0}% of {b:.1} GB/s"))
                .collect();
            write!(
                f,
                "\nroofline measured around each prompt's decode: {}",
                p.join(", ")
            )?;
        }
        Ok(())
    }
}

/// Greedy generation of `n` tokens from a prompt, timed, by some engine.
type RunFn<'a> = Box<dyn FnMut(&[u32], usize) -> Result<Run> + 'a>;

/// One prompt's timings.
struct Run {
    prompt_tokens: usize,
    ttft_s: f64,
    decode_s: f64,
    compact_build_s: f64,
    /// Weight bytes read per decode token.
    weight_bytes: u64,
}

/// Runs greedy generation of exactly `n` tokens through `forward(tokens, pos)`.
fn timed_run(
    prompt: &[u32],
    n: usize,
    weight_bytes: u64,
    forward: &mut dyn FnMut(&[u32], usize) -> Result<Tensor>,
) -> Result<Run> {
    let mut sampler =
        LogitsProcessor::from_sampling(0, candle_transformers::generation::Sampling::ArgMax);
    let start = Instant::now();
    let mut logits = forward(prompt, 0)?;
    let mut next = sampler.sample(&logits)?;
    let ttft_s = start.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 1..n {
        logits = forward(&[next], prompt.len() + i - 1)?;
        next = sampler.sample(&logits)?;
    }
    Ok(Run {
        prompt_tokens: prompt.len(),
        ttft_s,
        decode_s: t.elapsed().as_secs_f64(),
        compact_build_s: 0.0,
        weight_bytes,
    })
}

pub(crate) struct BenchOptions {
    pub engine: BenchEngine,
    /// Selective mode of our engine (`None`: dense).
    pub method: Option<crate::method::Method>,
    pub new_tokens: usize,
    pub measure_bandwidth: bool,
    /// Which output tokens our engine's decode computes.
    pub vocab: crate::method::vocab::VocabRule,
    /// lm_head rows computed exactly behind its screen (0: none), and the
    /// bits a weight of the screen's copy takes.
    pub head_screen: (usize, crate::model::head_screen::ScreenBits),
    /// The prompts as token ids, run as they are (no chat template);
    /// `None`: [`BENCH_PROMPTS`], chat-formatted.
    pub prompt_ids: Option<Vec<Vec<u32>>>,
}

/// Reads a prompt-ids file: a JSON list of token-id lists (the
/// `prompt_token_ids` of a bench report; what
/// `scripts/reference/bench_llamacpp.py --token-ids` reads), none empty.
fn read_prompt_ids(path: &Path) -> Result<Vec<Vec<u32>>> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "prompt ids file {}{}",
            path.display(),
            crate::store::home::resolved_against(path)
        )
    })?;
    let ids: Vec<Vec<u32>> = serde_json::from_str(&text).with_context(|| {
        format!(
            "prompt ids file {}: want a JSON list of token-id lists, e.g. [[151644, 872]]",
            path.display()
        )
    })?;
    if ids.is_empty() || ids.iter().any(|p| p.is_empty()) {
        bail!(
            "prompt ids file {}: no prompts, or an empty one",
            path.display()
        );
    }
    Ok(ids)
}

/// Benchmarks the engine `spec` describes, γ as its memory budget plans it
/// (the tokenizer resident while planning, as in a load).
pub fn run_spec(
    spec: &crate::engine::EngineSpec,
    engine: BenchEngine,
    new_tokens: usize,
    measure_bandwidth: bool,
    prompt_ids: Option<&Path>,
) -> Result<BenchReport> {
    let prompt_ids = prompt_ids.map(read_prompt_ids).transpose()?;
    let codec = TextCodec::from_model_dir(&spec.model)?;
    let (spec, plan) = spec.planned(&codec)?;
    // The plan's prediction of this run's peak (the tokenizer resident, as
    // in a load): the budget's plan, or the settings' as given.
    let planned = match plan {
        Some(p) => Some(p.expected_peak()),
        None if spec.load_options()?.device.is_cpu() => {
            Some(spec.predicted_plan(&codec)?.expected_peak())
        }
        None => None,
    };
    drop(codec);
    let load = spec.load_options()?; // first: a missing device is the error to report
    let opts = BenchOptions {
        method: spec.method()?,
        engine,
        new_tokens,
        measure_bandwidth,
        vocab: spec.vocab,
        head_screen: (spec.head_screen, spec.head_screen_bits),
        prompt_ids,
    };
    let mut report = run(&spec.model, &load, &opts)?;
    report.planned_peak_bytes = planned;
    Ok(report)
}

/// Benchmarks the model in `model_dir` on [`BENCH_PROMPTS`] (or the
/// options' prompt ids). `dense` loads
/// our model with `load`; `candle-gguf` loads only the tokenizer and the GGUF.
pub(crate) fn run(
    model_dir: &Path,
    load: &LoadOptions,
    opts: &BenchOptions,
) -> Result<BenchReport> {
    if opts.new_tokens < 2 {
        bail!("bench needs at least 2 new tokens per prompt");
    }
    if opts.engine == BenchEngine::CandleGguf
        && (opts.method.is_some() || opts.vocab != Default::default() || opts.head_screen.0 > 0)
    {
        bail!("--engine candle-gguf runs the GGUF as is: it takes no --mode, --vocab or --head-screen");
    }
    let device_memory_before = crate::sys::device::memory_used_bytes(&load.device);
    let mut engine;
    let (codec, mut run_prompt, dtype): (TextCodec, RunFn, String) = match opts.engine {
        BenchEngine::Dense => {
            engine = Engine::load_with_method(model_dir, load, opts.method.clone())?;
            engine.set_vocab(opts.vocab)?;
            engine.set_head_screen(opts.head_screen.0, opts.head_screen.1)?;
            // The engine's own tokenizer; cloning it avoids reading tokenizer.json twice.
            let codec = engine.codec.clone();
            let dtype = engine.model.weights_name();
            let engine = &mut engine;
            let run = Box::new(move |ids: &[u32], n: usize| -> Result<Run> {
                let g = engine.generate_ids(
                    ids,
                    &GenerateOptions {
                        max_new_tokens: n,
                        ignore_eos: true,
                        ..Default::default()
                    },
                    |_| true,
                )?;
                Ok(Run {
                    prompt_tokens: ids.len(),
                    ttft_s: g.ttft_s,
                    decode_s: (n - 1) as f64 / g.decode_tokens_per_s.max(1e-9),
                    compact_build_s: g.compact_build_s,
                    weight_bytes: g.decode_weight_bytes,
                })
            });
            (codec, run, dtype)
        }
        BenchEngine::CandleGguf => {
            let (mut q, codec, bytes) =
                crate::tools::gguf::GgufEngine::load(model_dir)?.into_parts();
            let mut forward = move |ids: &[u32], pos: usize| q.forward(ids, pos);
            let run = Box::new(move |ids: &[u32], n: usize| timed_run(ids, n, bytes, &mut forward));
            (codec, run as RunFn, "gguf".to_string())
        }
    };
    let (peak_rss_after_load_bytes, rss_after_load_bytes) =
        (memory::peak_rss_bytes(), memory::rss_bytes());
    let prompts = match &opts.prompt_ids {
        Some(ids) => ids.clone(),
        None => BENCH_PROMPTS
            .iter()
            .map(|p| codec.chat_prompt_ids(p))
            .collect::<Result<Vec<_>>>()?,
    };
    // Warm-up: one short run (page faults, kernel repacking, thread pool).
    run_prompt(&prompts[0], 4)?;
    let runs = prompts
        .iter()
        .map(|p| run_prompt(p, opts.new_tokens))
        .collect::<Result<Vec<_>>>()?;
    let weight_bytes = runs.iter().map(|r| r.weight_bytes).sum::<u64>() / runs.len() as u64;
    let n = runs.len() as f64;
    let prompt_tokens: usize = runs.iter().map(|r| r.prompt_tokens).sum();
    let ttft: f64 = runs.iter().map(|r| r.ttft_s).sum();
    let decode_s: f64 = runs.iter().map(|r| r.decode_s).sum();
    let decode_tps = (runs.len() * (opts.new_tokens - 1)) as f64 / decode_s;
    // Read the peak RSS before the bandwidth probe allocates its buffer.
    let peak_rss_bytes = memory::peak_rss_bytes();
    let rss_after_bytes = memory::rss_bytes();
    let huge_page_bytes = memory::anon_huge_page_bytes();
    let device_memory_bytes = crate::sys::device::memory_used_bytes(&load.device)
        .zip(device_memory_before)
        .map(|(after, before)| after.saturating_sub(before));
    let mut bandwidth = None;
    let (mut paired_roofline_percents, mut paired_bandwidths_gb_s) = (Vec::new(), Vec::new());
    if opts.measure_bandwidth {
        let probe = memory::BandwidthProbe::new(1 << 30);
        bandwidth = Some(probe.best(5));
        for p in &prompts {
            let before = probe.median(3);
            let run = run_prompt(p, opts.new_tokens)?;
            let after = probe.median(3);
            let tps = (opts.new_tokens - 1) as f64 / run.decode_s;
            let bandwidth = 0.5 * (before + after);
            paired_roofline_percents
                .push(100.0 * tps * run.weight_bytes as f64 / (bandwidth * 1e9));
            paired_bandwidths_gb_s.push(bandwidth);
        }
    }
    let roofline = bandwidth.map(|b| b * 1e9 / weight_bytes as f64);
    Ok(BenchReport {
        engine: opts.engine,
        mode: opts
            .method
            .as_ref()
            .map_or(crate::method::Mode::Dense, |m| m.mode),
        dtype,
        prompts: runs.len(),
        new_tokens_per_prompt: opts.new_tokens,
        mean_prompt_tokens: prompt_tokens as f64 / n,
        prefill_tokens_per_s: prompt_tokens as f64 / ttft,
        decode_tokens_per_s: decode_tps,
        ttft_s: ttft / n,
        compact_build_s: runs.iter().map(|r| r.compact_build_s).sum::<f64>() / n,
        peak_rss_bytes,
        peak_rss_after_load_bytes,
        rss_after_load_bytes,
        rss_after_bytes,
        huge_page_bytes,
        device_memory_bytes,
        weight_bytes_per_token: weight_bytes,
        bandwidth_gb_s: bandwidth,
        roofline_tokens_per_s: roofline,
        roofline_percent: roofline.map(|r| 100.0 * decode_tps / r),
        paired_roofline_percents,
        paired_bandwidths_gb_s,
        prompt_token_ids: prompts,
        planned_peak_bytes: None,
    })
}
