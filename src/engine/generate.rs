//! Our engine: a model with its tokenizer and, for selective modes, the
//! per-prompt selection rules — prefill with selection, the per-prompt
//! arrangement of the chosen rows, then decode on them.

use super::decode::{decode_loop, GenerateOptions, Generation, Generator, Steps};
use super::prefix::{PrefixCache, Reuse, Snapshot};
use super::text::{Message, TextCodec};
use super::tool_calls::Tool;
use crate::method::budget::MemoryPlan;
use crate::method::{LayerSelector, Method, PromptCounts, SelectionParams};
use crate::model::vocab::OutputVocab;
use crate::model::{KvCache, LoadOptions, Mlp, Model};
use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use std::path::Path;
use std::time::Instant;

/// A model with its tokenizer (and, for selective modes, the per-prompt
/// selection rules): what `generate`, `bench` and the node drive.
pub struct Engine {
    pub model: Model,
    pub codec: TextCodec,
    pub method: Option<Method>,
    selectors: Option<Vec<Option<LayerSelector>>>,
    /// The plan a memory budget gave the load, if one was set.
    pub memory_plan: Option<MemoryPlan>,
    /// Reuse the last prompt's cache for a prompt that starts the same
    /// ([`crate::engine::prefix`]); on by default.
    pub prefix_cache: bool,
    prefix: Option<PrefixCache>,
    /// The output vocabulary of [`Engine::set_vocab`], put in force per
    /// request where it serves ([`Engine::vocab_for`]).
    pub(super) vocab: Option<std::sync::Arc<OutputVocab>>,
    /// Per token, whether the rule keeps it (the prompt check: the
    /// vocabulary's prefix also computes some tokens the rule dropped).
    pub(super) vocab_keep: Option<std::sync::Arc<Vec<bool>>>,
    /// The lm_head's screen of [`Engine::set_head_screen`], put in force
    /// per request where it serves ([`Engine::vocab_for`]).
    pub(super) head_screen: Option<crate::model::head_screen::HeadScreen>,
}

/// Per-layer MLPs decode runs on for one prompt: views of the chosen rows
/// (`None`: the layer's own MLP).
type DecodeMlps = Vec<Option<Mlp>>;
/// Per-layer rows chosen for a prompt (`None`: the layer computes all it holds).
pub(crate) type Chosen = Vec<Option<Vec<usize>>>;

impl Engine {
    /// Loads a dense engine.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Self> {
        Self::load_with_method(dir, opts, None)
    }

    /// Loads an engine running `method` (selective loading per its plan,
    /// selective computation per prompt).
    pub(crate) fn load_with_method(
        dir: &Path,
        opts: &LoadOptions,
        method: Option<Method>,
    ) -> Result<Self> {
        let codec = TextCodec::from_model_dir(dir)?;
        Self::load_with_codec(dir, opts, method, codec)
    }

    /// [`Engine::load_with_method`] with the tokenizer already loaded (a
    /// memory plan measures the process with it).
    pub(crate) fn load_with_codec(
        dir: &Path,
        opts: &LoadOptions,
        method: Option<Method>,
        codec: TextCodec,
    ) -> Result<Self> {
        let mut opts = opts.clone();
        if let Some(m) = &method {
            opts.ffn = m.ffn_rows();
            opts.ffn_coarse = m.ffn_coarse();
            // On the CPU a quantized MLP is bundles (a device gets f16 rows).
            if let (Some(q), Some(_), true) =
                (opts.quant, m.params.gate_keep_count(), opts.device.is_cpu())
            {
                bail!(
                    "{}: dtype {} needs gate_keep 1",
                    crate::model::mlp::QUANTIZED_NOT_GATED,
                    q.name()
                );
            }
        }
        let model = Model::from_dir(dir, &opts)?;
        // After the load: the weights' buffers were placed as before (the
        // smaller ones on the heap's huge pages, not in mappings of their
        // own, which cost f16 decode ~5-10 %).
        crate::sys::memory::bound_allocator_retention(
            crate::engine::defaults::MALLOC_MMAP_THRESHOLD,
            crate::engine::defaults::MALLOC_ARENAS,
        );
        let mlps: Vec<&Mlp> = model.blocks.iter().map(|b| &b.mlp).collect();
        let selectors = match &method {
            Some(m) => m.selector(&mlps, model.config().intermediate_size)?,
            None => None,
        };
        let mut engine = Self {
            model,
            codec,
            method,
            selectors,
            memory_plan: None,
            prefix_cache: crate::engine::defaults::PREFIX_CACHE,
            prefix: None,
            vocab: None,
            vocab_keep: None,
            head_screen: None,
        };
        engine.warm_up()?;
        Ok(engine)
    }

    /// One short reply, discarded, as the last step of the load: the
    /// first request then finds the code it runs paged in, the threads and
    /// their allocator state made, and (in selective modes) the
    /// arrangement run once, so that it is as fast as the next, and the
    /// memory after the load is the memory the engine serves with. Decode
    /// kernels alone are ~3.5 MiB of the binary's pages.
    fn warm_up(&mut self) -> Result<()> {
        let prompt = self.codec.chat_prompt_ids("Hi")?;
        let opts = GenerateOptions {
            max_new_tokens: 2,
            ignore_eos: true,
            ..Default::default()
        };
        self.generate_ids(&prompt, &opts, |_| true)
            .context("warming up the engine with a two-token reply")?;
        // Back to the order of the load: a reply's selective computation
        // arranges the neurons it chose first, and prefill sums the neurons
        // in the order they are stored, so an engine just loaded computes
        // as one that never warmed up (to the last bit).
        for b in self.model.blocks.iter_mut() {
            b.mlp.unarrange()?;
        }
        Ok(())
    }

    /// φ and α the engine selects with per prompt, `None` when the mode
    /// computes every loaded neuron (dense, load-only).
    pub(crate) fn selection(&self) -> Option<(f64, f64)> {
        self.selectors.as_ref()?;
        let p = &self.method.as_ref()?.params;
        Some((p.compute_ratio, p.token_ratio))
    }

    /// The method's parameters, `None` for dense.
    pub(crate) fn params(&self) -> Option<&SelectionParams> {
        self.method.as_ref().map(|m| &m.params)
    }

    /// Changes φ (`compute_ratio`) and α (`token_ratio`) for the next prompts,
    /// validated against the load-time γ and δ. Only modes that select per
    /// prompt (selectinfer, coreinfer, random-load) accept it.
    pub(crate) fn set_selection(&mut self, compute_ratio: f64, token_ratio: f64) -> Result<()> {
        let layers = self.model.config().num_hidden_layers;
        self.reselect(|p| p.with_selection(compute_ratio, token_ratio, layers))
    }

    /// Rebuilds the selection rules from changed parameters.
    fn reselect(
        &mut self,
        change: impl FnOnce(&SelectionParams) -> Result<SelectionParams>,
    ) -> Result<()> {
        let method = match (&self.method, &self.selectors) {
            (Some(m), Some(_)) => m,
            (m, _) => bail!(
                "mode {} computes every loaded neuron; compute_ratio, token_ratio and score apply to selectinfer, coreinfer and random-load",
                m.as_ref().map_or("dense", |m| m.mode.name())
            ),
        };
        let mut method = method.clone();
        method.params = change(&method.params)?;
        // Cached statistics were counted under the old α.
        self.prefix = None;
        let mlps: Vec<&Mlp> = self.model.blocks.iter().map(|b| &b.mlp).collect();
        self.selectors = method.selector(&mlps, self.model.config().intermediate_size)?;
        self.method = Some(method);
        Ok(())
    }

    /// Runs on `method` from now on, a plan of the same mode and size
    /// (another task's base set): the model reads only the neurons the new
    /// plan adds and frees those it drops ([`Model::swap_ffn`]), and the
    /// selection rules are rebuilt. Returns the neurons read.
    pub(crate) fn swap_method(&mut self, method: Method) -> Result<usize> {
        let mode = self.method.as_ref().map(|m| m.mode);
        if mode != Some(method.mode) {
            bail!(
                "a swap keeps the mode ({} loaded, {} given)",
                mode.map_or("dense", |m| m.name()),
                method.mode.name()
            );
        }
        // The cached keys and values were computed on the old neurons.
        self.prefix = None;
        let read = match &method.plan {
            Some(_) => self.model.swap_ffn(&method.ffn_rows())?,
            None => 0,
        };
        let mlps: Vec<&Mlp> = self.model.blocks.iter().map(|b| &b.mlp).collect();
        self.selectors = method.selector(&mlps, self.model.config().intermediate_size)?;
        self.method = Some(method);
        Ok(read)
    }

    /// Runs the prompt; for selective modes also picks each layer's neurons
    /// (rows of the loaded MLP) from the prompt's activations.
    fn prefill(&self, prompt: &[u32], cache: &mut KvCache) -> Result<(Tensor, Option<Chosen>)> {
        let (logits, chosen, _) = self.prefill_from(prompt, cache, None, &[])?;
        Ok((logits, chosen))
    }

    /// [`Engine::prefill`] of the prompt's tokens after the `cache.len()`
    /// already cached, whose statistics `base` holds (selective modes);
    /// also returns the statistics at each of `checkpoints` (prompt
    /// positions past the cached ones, ascending).
    fn prefill_from(
        &self,
        prompt: &[u32],
        cache: &mut KvCache,
        base: Option<Vec<PromptCounts>>,
        checkpoints: &[usize],
    ) -> Result<(Tensor, Option<Chosen>, Vec<Snapshot>)> {
        let start = cache.len();
        let Some(selectors) = &self.selectors else {
            return Ok((
                self.model.forward(&prompt[start..], cache)?,
                None,
                Vec::new(),
            ));
        };
        let layers = selectors.len();
        let mut counts = base.unwrap_or_else(|| vec![PromptCounts::default(); layers]);
        // A checkpoint at the reused prefix's end keeps its statistics, so
        // the next request can reuse the same prefix again.
        let mut snapshots: Vec<Snapshot> = checkpoints
            .iter()
            .filter(|&&at| at > 0 && at >= start && at <= prompt.len())
            .map(|&at| Snapshot {
                at,
                counts: match at == start {
                    true => counts.clone(),
                    false => vec![PromptCounts::default(); layers],
                },
            })
            .collect();
        let mut pos = vec![start; layers];
        let blocks = &self.model.blocks;
        // Called once per layer and prefill chunk: counts add up over
        // chunks, and a chunk is split at the checkpoints inside it.
        let mut observe = |layer: usize, a: &Tensor| -> Result<()> {
            let rows = a.dim(1)?;
            let (p0, mut done) = (pos[layer], 0);
            pos[layer] += rows;
            let Some(sel) = &selectors[layer] else {
                return Ok(());
            };
            let stored = blocks[layer].mlp.stored_order();
            let stored = stored.as_deref();
            for snap in snapshots.iter_mut() {
                if snap.at > p0 + done && snap.at <= p0 + rows {
                    let upto = snap.at - p0;
                    counts[layer].add(sel.counts_in(&a.narrow(1, done, upto - done)?, stored)?)?;
                    done = upto;
                    snap.counts[layer] = counts[layer].clone();
                }
            }
            if done < rows {
                counts[layer].add(sel.counts_in(&a.narrow(1, done, rows - done)?, stored)?)?;
            }
            Ok(())
        };
        let logits = self
            .model
            .forward_observed(&prompt[start..], cache, &mut observe)?;
        let chosen: Chosen = selectors
            .iter()
            .zip(&counts)
            .map(|(sel, c)| sel.as_ref().map(|s| s.pick(c)).transpose())
            .collect::<Result<_>>()?;
        Ok((logits, Some(chosen), snapshots))
    }

    /// Contiguous weights of the chosen rows, built once per prompt: each
    /// layer's held rows are rearranged with the chosen ones in front (in
    /// place on the CPU, layer by layer elsewhere, so no second copy of the
    /// chosen neurons stays in memory), and decode runs on views of the fronts.
    /// `keep`: per-token gating of the fronts ([`Mlp::gated`]).
    fn arrange(&mut self, chosen: &Chosen, keep: Option<usize>) -> Result<DecodeMlps> {
        if chosen.len() != self.model.blocks.len() {
            bail!(
                "{} layers of chosen rows for a model of {} layers",
                chosen.len(),
                self.model.blocks.len()
            );
        }
        let one = |(layer, (c, b)): (usize, (&Option<Vec<usize>>, &mut crate::model::Block))| {
            let Some(rows) = c else { return Ok(None) };
            b.mlp
                .arrange(rows)
                .with_context(|| format!("layer {layer}: arranging the chosen neurons"))?;
            Ok(Some(b.mlp.front()?.gated(keep)?))
        };
        // When every layer moves its neurons in place (the CPU), layers are
        // arranged on rayon's threads, several at once: no copy of a layer
        // is made, so the memory plan's one-layer transient still holds.
        // Elsewhere each layer gathers copies: one layer at a time.
        let in_place = self.model.blocks.iter().all(|b| b.mlp.arranges_in_place());
        if !in_place {
            let layers = chosen.iter().zip(self.model.blocks.iter_mut());
            return layers.enumerate().map(one).collect();
        }
        use rayon::prelude::*;
        let layers = chosen.par_iter().zip(self.model.blocks.par_iter_mut());
        layers.enumerate().map(one).collect()
    }

    /// FFN work per decode token / all FFN neurons' (a gated neuron that
    /// reads only its gate row counts a third), and weight bytes read per
    /// decode token, given the prompt's chosen rows and the gating `keep`.
    fn decode_cost(&self, chosen: Option<&Chosen>, keep: Option<usize>) -> (f64, u64) {
        let cfg = self.model.config();
        let mut neurons3 = 0usize;
        let mut bytes = self.model.decode_weight_bytes();
        for (i, b) in self.model.blocks.iter().enumerate() {
            match chosen.and_then(|c| c[i].as_ref()) {
                Some(rows) => {
                    // Every neuron of a layer has the same bytes (gate, up, down).
                    let per_neuron = b.mlp.weight_bytes() / b.mlp.width().max(1);
                    let thirds = match keep {
                        Some(k) => rows.len() + 2 * crate::kernels::gated_neurons(rows.len(), k),
                        None => 3 * rows.len(),
                    };
                    neurons3 += thirds;
                    bytes = bytes - b.mlp.weight_bytes() + per_neuron * thirds / 3;
                }
                None if self.model.ffn_streamed() => neurons3 += 3 * cfg.intermediate_size,
                None => neurons3 += 3 * b.mlp.width(),
            }
        }
        (
            neurons3 as f64 / (3 * cfg.num_hidden_layers * cfg.intermediate_size) as f64,
            bytes as u64,
        )
    }

    /// The gating of decode's fronts (`None`: none).
    fn gate_keep(&self) -> Option<usize> {
        self.method.as_ref()?.params.gate_keep_count()
    }

    /// Checks a request against the model before any work is done.
    pub(crate) fn validate(&self, prompt_tokens: usize, opts: &GenerateOptions) -> Result<()> {
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
    pub(crate) fn forced_logits(
        &mut self,
        prompt: &[u32],
        forced: &[u32],
        rows: Option<&Chosen>,
    ) -> Result<(Vec<Vec<f32>>, Option<Chosen>)> {
        if prompt.is_empty() {
            bail!("the prompt is empty");
        }
        self.vocab_for(prompt, false)?;
        let mut cache = self.model.new_cache();
        cache.reserve(prompt.len() + forced.len());
        let (logits, chosen) = match rows {
            Some(r) => (self.model.forward(prompt, &mut cache)?, Some(r.clone())),
            None => self.prefill(prompt, &mut cache)?,
        };
        let keep = self.gate_keep();
        let compact = chosen.as_ref().map(|c| self.arrange(c, keep)).transpose()?;
        let mut out = vec![logits.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?];
        for &t in forced {
            let logits = match &compact {
                Some(mlps) => self.model.forward_with_mlps(&[t], &mut cache, mlps)?,
                None => self.model.forward(&[t], &mut cache)?,
            };
            out.push(logits.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?);
        }
        self.model.set_output_vocab(None)?;
        Ok((out, chosen))
    }

    /// Teacher forcing of several selections of one prompt (the fidelity
    /// instrument's loop): the prompt is prefilled once, observed by the
    /// rules of every entry of `selections` (φ, α, score changed; `[]`: the
    /// engine's own rules, or none for a mode that does not select); then
    /// for each, its rows are arranged and `forced` runs from a copy of the
    /// prompt's cache — one decode step per token, or with `batched` in one
    /// pass through the prefill path on the same rows. Returns per
    /// selection the logits after the prompt and after each forced token,
    /// and the weight bytes each decode token reads.
    pub(crate) fn forced_logits_for(
        &mut self,
        prompt: &[u32],
        forced: &[u32],
        selections: &[SelectionParams],
        batched: bool,
    ) -> Result<Vec<(Vec<Vec<f32>>, u64)>> {
        if prompt.is_empty() {
            bail!("the prompt is empty");
        }
        self.vocab_for(prompt, false)?;
        let rules: Vec<Option<Vec<Option<LayerSelector>>>> = match (&self.method, selections) {
            (_, []) => vec![self.selectors.clone()],
            (Some(m), _) if self.selectors.is_some() => {
                let mlps: Vec<&Mlp> = self.model.blocks.iter().map(|b| &b.mlp).collect();
                let width = self.model.config().intermediate_size;
                selections
                    .iter()
                    .map(|p| {
                        let method = Method {
                            params: p.clone(),
                            ..m.clone()
                        };
                        method.selector(&mlps, width)
                    })
                    .collect::<Result<_>>()?
            }
            _ => bail!(
                "this engine's mode does not select per prompt: it has no selections to compare"
            ),
        };
        let layers = self.model.blocks.len();
        let mut counts = vec![vec![PromptCounts::default(); layers]; rules.len()];
        let mut cache = self.model.new_cache();
        cache.reserve(prompt.len() + forced.len());
        let logits = {
            let (model, blocks) = (&self.model, &self.model.blocks);
            let mut observe = |layer: usize, a: &Tensor| -> Result<()> {
                let stored = blocks[layer].mlp.stored_order();
                for (r, c) in rules.iter().zip(&mut counts) {
                    if let Some(sel) = r.as_ref().and_then(|r| r[layer].as_ref()) {
                        c[layer].add(sel.counts_in(a, stored.as_deref())?)?;
                    }
                }
                Ok(())
            };
            rayon::scope(|_| model.forward_observed(prompt, &mut cache, &mut observe))?
        };
        let first = logits.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?;
        let keeps: Vec<Option<usize>> = match selections {
            [] => vec![self.gate_keep()],
            _ => selections
                .iter()
                .map(SelectionParams::gate_keep_count)
                .collect(),
        };
        let mut out = Vec::new();
        for ((r, c), &keep) in rules.iter().zip(&counts).zip(&keeps) {
            let chosen: Option<Chosen> = r
                .as_ref()
                .map(|r| {
                    r.iter()
                        .zip(c)
                        .map(|(sel, c)| sel.as_ref().map(|s| s.pick(c)).transpose())
                        .collect::<Result<_>>()
                })
                .transpose()?;
            let compact = chosen.as_ref().map(|c| self.arrange(c, keep)).transpose()?;
            let mut cache = cache.fork()?;
            let mut rows = vec![first.clone()];
            if !forced.is_empty() {
                if batched {
                    let all = self
                        .model
                        .forward_all(forced, &mut cache, compact.as_deref())?;
                    rows.extend(all.to_vec2::<f32>()?);
                } else {
                    for &t in forced {
                        let l = match &compact {
                            Some(mlps) => self.model.forward_with_mlps(&[t], &mut cache, mlps)?,
                            None => self.model.forward(&[t], &mut cache)?,
                        };
                        rows.push(l.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?);
                    }
                }
            }
            drop(compact);
            out.push((rows, self.decode_cost(chosen.as_ref(), keep).1));
        }
        self.model.set_output_vocab(None)?;
        Ok(out)
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

    /// Generates the assistant's next turn of a conversation (see
    /// [`crate::engine::text::conversation`]) offering `tools` (may be
    /// none), rendered with the model's chat template. The calls are the
    /// caller's to constrain (`opts.grammar`) and read back.
    pub fn generate_turns(
        &mut self,
        turns: &[Message],
        tools: &[Tool],
        opts: &GenerateOptions,
        on_text: impl FnMut(&str) -> bool,
    ) -> Result<Generation> {
        let ids = self
            .codec
            .encode(&self.codec.render_chat_with_tools(turns, tools)?)?;
        // Where turns start: what the next request of the same conversation
        // (or with the same system prompt) shares.
        let starts = match self.prefix_cache {
            true => Some(self.codec.turn_starts(turns, tools, &ids)),
            false => None,
        };
        self.generate_at(&ids, starts.as_deref(), opts, on_text)
    }

    /// Generates from prompt token ids. `on_text` receives each completed
    /// piece of text; returning `false` stops generation (cancel).
    pub fn generate_ids(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_text: impl FnMut(&str) -> bool,
    ) -> Result<Generation> {
        self.generate_at(prompt, None, opts, on_text)
    }

    /// [`Engine::generate_ids`]; with `checkpoints` (prompt positions to
    /// keep selection statistics at) through the prefix cache. Benchmarks
    /// and evaluations go without: every prompt is prefilled whole.
    fn generate_at(
        &mut self,
        prompt: &[u32],
        checkpoints: Option<&[usize]>,
        opts: &GenerateOptions,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<Generation> {
        if prompt.is_empty() {
            bail!("the prompt is empty");
        }
        self.validate(prompt.len(), opts)?;
        self.vocab_for(prompt, opts.grammar.is_some())?;
        let codec = self.codec.clone();
        let selective = self.selectors.is_some();
        // Without checkpoints the cache is neither used nor replaced.
        let reuse = match checkpoints.and_then(|_| self.prefix.take()) {
            Some(p) => p.reuse(prompt, selective),
            None => Reuse::none(self.model.new_cache()),
        };
        let cached = reuse.tokens;
        let mut cache = reuse.cache;
        // The request's whole KV room at once: its memory is known at
        // admission and the cache never grows (nor copies) mid-reply.
        cache.reserve(prompt.len() + opts.max_new_tokens);
        let keep = checkpoints.is_some();
        let mut checkpoints = checkpoints.unwrap_or_default().to_vec();
        checkpoints.push(prompt.len());
        let mut steps = EngineSteps {
            cache,
            base: reuse.counts,
            checkpoints,
            snapshots: Vec::new(),
            engine: self,
            chosen: None,
            compact: None,
        };
        let out = decode_loop(&codec, prompt, opts, &mut steps, &mut on_text)?;
        let chosen = steps.chosen.take();
        let (cache, mut snapshots) = (steps.cache, reuse.earlier);
        snapshots.extend(steps.snapshots);
        if keep {
            self.prefix = Some(PrefixCache {
                tokens: prompt.to_vec(),
                cache,
                snapshots,
            });
        }
        let (compute_ratio, decode_weight_bytes) =
            self.decode_cost(chosen.as_ref(), self.gate_keep());
        // The restriction is the request's: direct forward calls get every token.
        self.model.set_output_vocab(None)?;
        let mut g = out.into_generation(prompt.len(), compute_ratio, decode_weight_bytes);
        g.cached_prompt_tokens = cached;
        Ok(g)
    }
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

/// Our engine's steps: selection at prefill, compact weights at the first token; rewinds keep both.
struct EngineSteps<'a> {
    engine: &'a mut Engine,
    /// Holds the reused prefix's positions at the start.
    cache: KvCache,
    /// The reused prefix's selection statistics.
    base: Option<Vec<PromptCounts>>,
    /// Prompt positions to keep statistics at, and what prefill kept.
    checkpoints: Vec<usize>,
    snapshots: Vec<Snapshot>,
    chosen: Option<Chosen>,
    compact: Option<DecodeMlps>,
}

impl Steps for EngineSteps<'_> {
    fn prefill(&mut self, prompt: &[u32]) -> Result<Tensor> {
        let (engine, cache) = (&*self.engine, &mut self.cache);
        let (base, checkpoints) = (self.base.take(), &self.checkpoints);
        // On a rayon worker: candle's prefill matmuls split over rayon's
        // threads, and this one then works on them instead of sleeping.
        let (logits, chosen, snapshots) =
            rayon::scope(|_| engine.prefill_from(prompt, cache, base, checkpoints))?;
        self.chosen = chosen;
        self.snapshots = snapshots;
        Ok(logits)
    }

    fn after_first_token(&mut self) -> Result<f64> {
        let Some(c) = &self.chosen else {
            return Ok(0.0);
        };
        let t = Instant::now();
        // The last prompt's views go first, so the rows move in place.
        self.compact = None;
        let keep = self.engine.gate_keep();
        self.compact = Some(self.engine.arrange(c, keep)?);
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
    fn rewind(&mut self, len: usize) -> Result<bool> {
        self.cache.rewind(len);
        Ok(true)
    }
}
