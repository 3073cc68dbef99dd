//! Text generation on a loaded model: request validation, prefill, the
//! decode loop with sampling and stop tokens, streaming and statistics.

use crate::model::{KvCache, LoadOptions, Mlp, Model};
use crate::selective::{LayerSelector, Method, PromptCounts};
use crate::sysinfo;
use crate::text::{TextCodec, TextStream};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor};
use candle_transformers::generation::{LogitsProcessor, Sampling as CandleSampling};
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// Sampling settings. `temperature == 0` means greedy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sampling {
    pub temperature: f64,
    pub top_p: f64,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            seed: 299792458,
        }
    }
}

impl Sampling {
    pub fn validate(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            bail!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!("top_p must be in (0, 1], got {}", self.top_p);
        }
        Ok(())
    }

    fn processor(&self) -> LogitsProcessor {
        let sampling = if self.temperature == 0.0 {
            CandleSampling::ArgMax
        } else if self.top_p < 1.0 {
            CandleSampling::TopP {
                p: self.top_p,
                temperature: self.temperature,
            }
        } else {
            CandleSampling::All {
                temperature: self.temperature,
            }
        };
        LogitsProcessor::from_sampling(self.seed, sampling)
    }

    fn sampler(&self) -> Sampler {
        Sampler {
            greedy: self.temperature == 0.0,
            processor: self.processor(),
        }
    }
}

/// Picks each next token: greedy decoding on the CPU reads the logits where
/// they lie, anything else goes through candle's `LogitsProcessor`.
struct Sampler {
    greedy: bool,
    processor: LogitsProcessor,
}

impl Sampler {
    fn sample(&mut self, logits: &Tensor) -> Result<u32> {
        if self.greedy && logits.device().is_cpu() && logits.dtype() == DType::F32 {
            let found = crate::kernels::with_f32(logits, |v| Ok(first_max_index(v)))?;
            if let Some(i) = found {
                return Ok(i);
            }
        }
        Ok(self.processor.sample(logits)?)
    }
}

/// The index of the largest value (the first of equal ones, as candle's
/// arg-max picks); `None` for no values or NaNs, left to candle. The maximum
/// is taken over 16 lanes, a loop that vectorises (candle's one
/// compare-and-branch pass does not): ~9 µs instead of ~30 for 49k logits,
/// a quarter of a percent of a SmolLM2 decode step.
fn first_max_index(v: &[f32]) -> Option<u32> {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut nan = false;
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            nan |= x.is_nan();
            *m = if x > *m { x } else { *m };
        }
    }
    if nan || tail.iter().any(|x| x.is_nan()) {
        return None;
    }
    let max = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    v.iter().position(|&x| x == max).map(|i| i as u32)
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model produced an end-of-turn / end-of-sequence token.
    Eos,
    /// `max_new_tokens` were generated.
    Length,
    /// The caller asked to stop (streaming callback returned false).
    Cancelled,
}

/// Result and statistics of one generation.
#[derive(Debug, Clone, Serialize)]
pub struct Generation {
    pub text: String,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Seconds from the start of prefill to the first generated token.
    pub ttft_s: f64,
    pub prefill_tokens_per_s: f64,
    /// Tokens/s over the decode steps (the tokens after the first), not
    /// counting the one-time build of the compact weights.
    pub decode_tokens_per_s: f64,
    /// Seconds spent once per prompt building the compact weights of the
    /// selected neurons (after the first token is out; 0 for modes that do
    /// not select).
    pub compact_build_s: f64,
    pub stop_reason: StopReason,
    pub peak_rss_bytes: u64,
    /// Fraction of the model's FFN neurons computed per decode token (φ
    /// actually used, over all layers; 1 for dense).
    pub compute_ratio: f64,
    /// Bytes of weights read per decode token.
    pub decode_weight_bytes: u64,
    #[serde(skip)]
    pub token_ids: Vec<u32>,
}

/// Options of one generation call.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// Keep going past stop tokens (benchmarks decode a fixed count).
    pub ignore_eos: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_new_tokens: 128,
            sampling: Sampling::default(),
            ignore_eos: false,
        }
    }
}

/// A model with its tokenizer (and, for selective modes, the per-prompt
/// selection rules): what `generate`, `bench` and the node drive.
pub struct Engine {
    pub model: Model,
    pub codec: TextCodec,
    pub method: Option<Method>,
    selectors: Option<Vec<Option<LayerSelector>>>,
}

/// Per-layer MLPs decode runs on for one prompt: views of the chosen rows
/// (`None`: the layer's own MLP).
type DecodeMlps = Vec<Option<Mlp>>;
/// Per-layer rows chosen for a prompt (`None`: the layer computes all it holds).
pub type Chosen = Vec<Option<Vec<usize>>>;

impl Engine {
    /// Loads a dense engine.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Self> {
        Self::load_with_method(dir, opts, None)
    }

    /// Loads an engine running `method` (selective loading per its plan,
    /// selective computation per prompt).
    pub fn load_with_method(
        dir: &Path,
        opts: &LoadOptions,
        method: Option<Method>,
    ) -> Result<Self> {
        let mut opts = opts.clone();
        if let Some(m) = &method {
            opts.plan = m.plan.clone();
            opts.offload_ffn = m.mode == crate::selective::Mode::DiskOffload;
        }
        let model = Model::from_dir(dir, &opts)?;
        let codec = TextCodec::from_dir(dir, &model.config().eos_token_ids())?;
        let mlps: Vec<&Mlp> = model.blocks.iter().map(|b| &b.mlp).collect();
        let selectors = method
            .as_ref()
            .and_then(|m| m.selector(&mlps, model.config().intermediate_size));
        Ok(Self {
            model,
            codec,
            method,
            selectors,
        })
    }

    /// φ and α the engine selects with per prompt, `None` when the mode
    /// computes every loaded neuron (dense, load-only).
    pub fn selection(&self) -> Option<(f64, f64)> {
        self.selectors.as_ref()?;
        let p = &self.method.as_ref()?.params;
        Some((p.compute_ratio, p.token_ratio))
    }

    /// Changes φ (`compute_ratio`) and α (`token_ratio`) for the next prompts,
    /// validated against the load-time γ and δ. Only modes that select per
    /// prompt (selectinfer, coreinfer, random-load) accept it.
    pub fn set_selection(&mut self, compute_ratio: f64, token_ratio: f64) -> Result<()> {
        let method = match (&self.method, &self.selectors) {
            (Some(m), Some(_)) => m,
            (m, _) => bail!(
                "mode {} computes every loaded neuron; compute_ratio and token_ratio apply to selectinfer, coreinfer and random-load",
                m.as_ref().map_or("dense", |m| m.mode.name())
            ),
        };
        let mut method = method.clone();
        method.params.compute_ratio = compute_ratio;
        method.params.token_ratio = token_ratio;
        let cfg = self.model.config();
        method.params.validate(cfg.num_hidden_layers)?;
        let mlps: Vec<&Mlp> = self.model.blocks.iter().map(|b| &b.mlp).collect();
        self.selectors = method.selector(&mlps, cfg.intermediate_size);
        self.method = Some(method);
        Ok(())
    }

    /// Runs the prompt; for selective modes also picks each layer's neurons
    /// (rows of the loaded MLP) from the prompt's activations.
    fn prefill(&self, prompt: &[u32], cache: &mut KvCache) -> Result<(Tensor, Option<Chosen>)> {
        let Some(selectors) = &self.selectors else {
            return Ok((self.model.forward(prompt, cache)?, None));
        };
        let mut counts = vec![PromptCounts::default(); selectors.len()];
        let blocks = &self.model.blocks;
        // Called once per layer and prefill chunk: counts add up over chunks.
        let mut observe = |layer: usize, a: &Tensor| -> Result<()> {
            if let Some(sel) = &selectors[layer] {
                counts[layer].add(sel.counts(&blocks[layer].mlp.to_canonical(a)?)?)?;
            }
            Ok(())
        };
        let logits = self.model.forward_observed(prompt, cache, &mut observe)?;
        let chosen: Chosen = selectors
            .iter()
            .zip(&counts)
            .map(|(sel, c)| sel.as_ref().map(|s| s.pick(c)).transpose())
            .collect::<Result<_>>()?;
        Ok((logits, Some(chosen)))
    }

    /// Contiguous weights of the chosen rows, built once per prompt: each
    /// layer's held rows are rearranged with the chosen ones in front (in
    /// place on the CPU, layer by layer elsewhere, so no second copy of the
    /// chosen neurons stays in memory), and decode runs on views of the fronts.
    fn arrange(&mut self, chosen: &Chosen) -> Result<DecodeMlps> {
        if chosen.len() != self.model.blocks.len() {
            bail!(
                "{} layers of chosen rows for a model of {} layers",
                chosen.len(),
                self.model.blocks.len()
            );
        }
        chosen
            .iter()
            .zip(self.model.blocks.iter_mut())
            .enumerate()
            .map(|(layer, (c, b))| {
                let Some(rows) = c else { return Ok(None) };
                b.mlp
                    .arrange(rows)
                    .with_context(|| format!("layer {layer}: arranging the chosen neurons"))?;
                Ok(Some(b.mlp.front()?))
            })
            .collect()
    }

    /// FFN neurons computed per decode token / all FFN neurons, and weight
    /// bytes read per decode token, given the prompt's chosen rows.
    fn decode_cost(&self, chosen: Option<&Chosen>) -> (f64, u64) {
        let cfg = self.model.config();
        let mut neurons = 0usize;
        let mut bytes = self.model.decode_weight_bytes();
        for (i, b) in self.model.blocks.iter().enumerate() {
            match chosen.and_then(|c| c[i].as_ref()) {
                Some(rows) => {
                    neurons += rows.len();
                    // Every neuron of a layer has the same bytes (gate, up, down).
                    let per_neuron = b.mlp.weight_bytes() / b.mlp.width().max(1);
                    bytes = bytes - b.mlp.weight_bytes() + per_neuron * rows.len();
                }
                None if self.model.ffn_offloaded() => neurons += cfg.intermediate_size,
                None => neurons += b.mlp.width(),
            }
        }
        (
            neurons as f64 / (cfg.num_hidden_layers * cfg.intermediate_size) as f64,
            bytes as u64,
        )
    }

    /// Checks a request against the model before any work is done.
    pub fn validate(&self, prompt_tokens: usize, opts: &GenerateOptions) -> Result<()> {
        opts.sampling.validate()?;
        let ctx = self.model.max_context();
        if opts.max_new_tokens == 0 {
            bail!("max_new_tokens must be at least 1");
        }
        if opts.max_new_tokens >= ctx {
            bail!(
                "max_new_tokens {} exceeds the context of {ctx} tokens",
                opts.max_new_tokens
            );
        }
        if prompt_tokens + opts.max_new_tokens > ctx {
            bail!(
                "the prompt has {prompt_tokens} tokens; with max_new_tokens {} it exceeds the context of {ctx} tokens",
                opts.max_new_tokens
            );
        }
        Ok(())
    }

    /// Logits after the prompt and after each of the `forced` tokens fed in
    /// turn (teacher forcing), through the same prefill, selection and
    /// compact-weight path as generation; also the rows chosen per layer.
    /// For comparing devices on identical inputs.
    /// With `rows`, those rows are used instead of the engine's own choice
    /// (to compare devices on the same selection).
    pub fn forced_logits(
        &mut self,
        prompt: &[u32],
        forced: &[u32],
        rows: Option<&Chosen>,
    ) -> Result<(Vec<Vec<f32>>, Option<Chosen>)> {
        if prompt.is_empty() {
            bail!("the prompt is empty");
        }
        let mut cache = self.model.new_cache();
        let (logits, chosen) = match rows {
            Some(r) => (self.model.forward(prompt, &mut cache)?, Some(r.clone())),
            None => self.prefill(prompt, &mut cache)?,
        };
        let compact = chosen.as_ref().map(|c| self.arrange(c)).transpose()?;
        let mut out = vec![logits.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?];
        for &t in forced {
            let logits = match &compact {
                Some(mlps) => self.model.forward_with_mlps(&[t], &mut cache, mlps)?,
                None => self.model.forward(&[t], &mut cache)?,
            };
            out.push(logits.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?);
        }
        Ok((out, chosen))
    }

    /// Chat-formats `prompt` and generates a reply.
    pub fn generate_chat(
        &mut self,
        prompt: &str,
        opts: &GenerateOptions,
        on_text: impl FnMut(&str) -> bool,
    ) -> Result<Generation> {
        let ids = self.codec.chat_prompt_ids(prompt)?;
        self.generate_ids(&ids, opts, on_text)
    }

    /// Generates from prompt token ids. `on_text` receives each completed
    /// piece of text; returning `false` stops generation (cancel).
    pub fn generate_ids(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<Generation> {
        if prompt.is_empty() {
            bail!("the prompt is empty");
        }
        self.validate(prompt.len(), opts)?;
        let codec = self.codec.clone();
        let mut steps = EngineSteps {
            cache: self.model.new_cache(),
            engine: self,
            chosen: None,
            compact: None,
        };
        let out = decode_loop(&codec, prompt, opts, &mut steps, &mut on_text)?;
        let chosen = steps.chosen.take();
        let (compute_ratio, decode_weight_bytes) = self.decode_cost(chosen.as_ref());
        Ok(out.into_generation(prompt.len(), compute_ratio, decode_weight_bytes))
    }
}

/// Anything `eval` runs prompts through: our engine in any mode, or the
/// quantized GGUF baseline ([`crate::gguf::GgufEngine`]).
pub trait Generator {
    fn codec(&self) -> &TextCodec;
    /// Longest prompt + generation served.
    fn max_context(&self) -> usize;
    fn generate(&mut self, prompt: &[u32], opts: &GenerateOptions) -> Result<Generation>;
}

impl Generator for Engine {
    fn codec(&self) -> &TextCodec {
        &self.codec
    }
    fn max_context(&self) -> usize {
        self.model.max_context()
    }
    fn generate(&mut self, prompt: &[u32], opts: &GenerateOptions) -> Result<Generation> {
        self.generate_ids(prompt, opts, |_| true)
    }
}

/// The forward passes of one generation, as [`decode_loop`] drives them.
pub trait Steps {
    /// Runs the prompt; returns the logits of its last token.
    fn prefill(&mut self, prompt: &[u32]) -> Result<Tensor>;
    /// One-time work after the first token is out (the compact weights);
    /// returns the seconds it took.
    fn after_first_token(&mut self) -> Result<f64> {
        Ok(0.0)
    }
    /// Feeds one generated token; returns the next logits.
    fn step(&mut self, token: u32) -> Result<Tensor>;
}

/// Our engine's steps: selection at prefill, compact weights after the first token.
struct EngineSteps<'a> {
    engine: &'a mut Engine,
    cache: KvCache,
    chosen: Option<Chosen>,
    compact: Option<DecodeMlps>,
}

impl Steps for EngineSteps<'_> {
    fn prefill(&mut self, prompt: &[u32]) -> Result<Tensor> {
        let (engine, cache) = (&*self.engine, &mut self.cache);
        // On a rayon worker: candle's prefill matmuls split over rayon's
        // threads, and this one then works on them instead of sleeping.
        let (logits, chosen) = rayon::scope(|_| engine.prefill(prompt, cache))?;
        self.chosen = chosen;
        Ok(logits)
    }

    fn after_first_token(&mut self) -> Result<f64> {
        let Some(c) = &self.chosen else {
            return Ok(0.0);
        };
        let t = Instant::now();
        self.compact = Some(self.engine.arrange(c)?);
        // GPU work is queued: wait for it so the build is timed, not the next step.
        self.engine.model.device().synchronize()?;
        Ok(t.elapsed().as_secs_f64())
    }

    fn step(&mut self, token: u32) -> Result<Tensor> {
        let (model, cache, mlps) = (&self.engine.model, &mut self.cache, &self.compact);
        // The step's parallel kernels run on `spin_pool`'s threads and this one.
        match mlps {
            Some(mlps) => model.forward_with_mlps(&[token], cache, mlps),
            None => model.forward(&[token], cache),
        }
    }
}

/// What [`decode_loop`] measured.
pub struct LoopOutput {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub ttft_s: f64,
    pub total_s: f64,
    pub compact_build_s: f64,
    pub stop_reason: StopReason,
}

impl LoopOutput {
    /// The statistics of a generation of `prompt_tokens` prompt tokens.
    pub fn into_generation(
        self,
        prompt_tokens: usize,
        compute_ratio: f64,
        decode_weight_bytes: u64,
    ) -> Generation {
        let decode_steps = self.token_ids.len().saturating_sub(1);
        Generation {
            text: self.text,
            prompt_tokens,
            generated_tokens: self.token_ids.len(),
            ttft_s: self.ttft_s,
            prefill_tokens_per_s: prompt_tokens as f64 / self.ttft_s.max(1e-9),
            decode_tokens_per_s: if decode_steps > 0 {
                decode_steps as f64 / (self.total_s - self.ttft_s - self.compact_build_s).max(1e-9)
            } else {
                0.0
            },
            stop_reason: self.stop_reason,
            peak_rss_bytes: sysinfo::peak_rss_bytes(),
            compute_ratio,
            decode_weight_bytes,
            compact_build_s: self.compact_build_s,
            token_ids: self.token_ids,
        }
    }
}

/// Sampling, stop tokens, streaming and timing around any model's `steps`:
/// prefill, sample, then step token by token until a stop token,
/// `max_new_tokens` or `on_text` returning false.
pub fn decode_loop(
    codec: &TextCodec,
    prompt: &[u32],
    opts: &GenerateOptions,
    steps: &mut dyn Steps,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<LoopOutput> {
    let mut sampler = opts.sampling.sampler();
    let mut stream = TextStream::new(codec);
    let stop_ids = codec.stop_ids();
    let start = Instant::now();
    let mut logits = steps.prefill(prompt)?;
    let mut compact_build_s = 0.0;
    let mut generated = Vec::new();
    let mut first_token_at = None;
    let mut stop_reason = StopReason::Length;
    while generated.len() < opts.max_new_tokens {
        let next = sampler.sample(&logits)?;
        if first_token_at.is_none() {
            first_token_at = Some(start.elapsed().as_secs_f64());
        }
        if !opts.ignore_eos && stop_ids.contains(&next) {
            stop_reason = StopReason::Eos;
            break;
        }
        generated.push(next);
        if let Some(piece) = stream.push(next)? {
            if !on_text(&piece) {
                stop_reason = StopReason::Cancelled;
                break;
            }
        }
        if generated.len() == opts.max_new_tokens {
            break;
        }
        if generated.len() == 1 {
            // Done after the first token is out, so it does not delay it.
            compact_build_s = steps.after_first_token()?;
        }
        logits = steps.step(next)?;
    }
    let total_s = start.elapsed().as_secs_f64();
    Ok(LoopOutput {
        text: stream.text()?,
        token_ids: generated,
        ttft_s: first_token_at.unwrap_or(total_s),
        total_s,
        compact_build_s,
        stop_reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Greedy picks on the logits buffer are the token candle's arg-max
    /// picks, ties and odd values included; NaNs go to candle (which
    /// decides) instead of being guessed here.
    #[test]
    fn greedy_sampling_picks_what_candles_argmax_picks() {
        let mut greedy = Sampling::default().sampler();
        let mut candle = Sampling::default().processor();
        let cases: Vec<Vec<f32>> = vec![
            (0..49152)
                .map(|i| ((i * 7919) % 10007) as f32 * 1e-3)
                .collect(),
            vec![1.0, 3.0, -2.0, 3.0, 0.5],
            vec![f32::NEG_INFINITY, -1e30, f32::NEG_INFINITY],
            vec![f32::NEG_INFINITY; 4],
            vec![2.0, f32::INFINITY, 7.0],
            vec![-0.0, 0.0],
            (0..37).map(|i| (i % 5) as f32).collect(),
            (0..37)
                .map(|i| if i == 36 { 9.0 } else { (i % 5) as f32 })
                .collect(),
        ];
        for v in cases {
            let t = Tensor::from_slice(&v, v.len(), &candle_core::Device::Cpu).unwrap();
            assert!(first_max_index(&v).is_some(), "{} logits", v.len());
            let (ours, theirs) = (greedy.sample(&t).unwrap(), candle.sample(&t).unwrap());
            assert_eq!(ours, theirs, "{} logits", v.len());
        }
        assert_eq!(first_max_index(&[1.0, 3.0, -2.0, 3.0, 0.5]), Some(1));
        assert_eq!(first_max_index(&[]), None);
        for at in [1, 20, 38] {
            let mut v = vec![0f32; 40];
            v[at] = f32::NAN;
            assert_eq!(first_max_index(&v), None, "NaN at {at}");
        }
        let nan = Tensor::new(&[1.0f32, f32::NAN, 2.0], &candle_core::Device::Cpu).unwrap();
        assert_eq!(greedy.sample(&nan).unwrap(), candle.sample(&nan).unwrap());
    }
}
