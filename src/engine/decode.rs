//! The decode loop shared by every engine (ours in any mode, the GGUF
//! baseline): prefill, sample (under the request's grammar, if any), step
//! token by token until a stop token or string, the token limit or the
//! caller's cancel; streaming, timing and the generation's statistics.

use super::grammar::Grammar;
use super::sampling::Sampling;
use super::stops::StopStrings;
use super::text::{TextCodec, TextStream};
use crate::sys::memory;
use anyhow::Result;
use candle_core::Tensor;
use serde::Serialize;
use std::time::Instant;

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
    /// The text reached one of the request's stop strings.
    Stop,
}

impl StopReason {
    /// The name replies carry.
    pub fn name(self) -> &'static str {
        match self {
            Self::Eos => "eos",
            Self::Length => "length",
            Self::Cancelled => "cancelled",
            Self::Stop => "stop",
        }
    }
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
    /// Seconds spent masking logits and advancing the grammar (structured
    /// output; 0 without one).
    pub grammar_s: f64,
    /// Prompt tokens taken from the prefix cache (not prefilled again).
    pub cached_prompt_tokens: usize,
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
    /// Text at which to stop ([`StopStrings`]); not part of the answer.
    pub stop: Vec<String>,
    /// Output constrained to a JSON schema or grammar.
    pub grammar: Option<Grammar>,
}

/// Anything `eval` runs prompts through: our engine in any mode, or the
/// quantized GGUF baseline (`tools::gguf::GgufEngine`).
pub trait Generator {
    fn codec(&self) -> &TextCodec;
    /// Longest prompt + generation served.
    fn max_context(&self) -> usize;
    fn generate(&mut self, prompt: &[u32], opts: &GenerateOptions) -> Result<Generation>;
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

/// What [`decode_loop`] measured.
pub struct LoopOutput {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub ttft_s: f64,
    pub total_s: f64,
    pub compact_build_s: f64,
    pub grammar_s: f64,
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
            peak_rss_bytes: memory::peak_rss_bytes(),
            compute_ratio,
            decode_weight_bytes,
            compact_build_s: self.compact_build_s,
            grammar_s: self.grammar_s,
            cached_prompt_tokens: 0,
            token_ids: self.token_ids,
        }
    }
}

/// Sampling, stop tokens and strings, the grammar, streaming and timing
/// around any model's `steps`: prefill, sample, then step token by token
/// until a stop token or string, the grammar's end, `max_new_tokens` or
/// `on_text` returning false.
pub fn decode_loop(
    codec: &TextCodec,
    prompt: &[u32],
    opts: &GenerateOptions,
    steps: &mut dyn Steps,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<LoopOutput> {
    let mut sampler = opts.sampling.sampler();
    let mut stream = TextStream::new(codec);
    let mut stops = (!opts.stop.is_empty())
        .then(|| StopStrings::new(&opts.stop))
        .transpose()?;
    let mut constraint = match &opts.grammar {
        Some(g) => Some(codec.grammars()?.compile(g)?),
        None => None,
    };
    let stop_ids = codec.stop_ids();
    let start = Instant::now();
    let mut logits = steps.prefill(prompt)?;
    let (mut compact_build_s, mut grammar_s) = (0.0, 0.0);
    let mut generated = Vec::new();
    let mut first_token_at = None;
    let mut stop_reason = StopReason::Length;
    while generated.len() < opts.max_new_tokens {
        let next = match &mut constraint {
            Some(c) => {
                let t = Instant::now();
                let masked = c.mask(&logits)?;
                grammar_s += t.elapsed().as_secs_f64();
                sampler.sample(&masked)?
            }
            None => sampler.sample(&logits)?,
        };
        if first_token_at.is_none() {
            first_token_at = Some(start.elapsed().as_secs_f64());
        }
        if !opts.ignore_eos && stop_ids.contains(&next) {
            stop_reason = StopReason::Eos;
            break;
        }
        if let Some(c) = &mut constraint {
            let t = Instant::now();
            c.accept(next)?;
            grammar_s += t.elapsed().as_secs_f64();
        }
        generated.push(next);
        if let Some(piece) = stream.push(next)? {
            let (shown, hit) = match &mut stops {
                Some(s) => s.push(&piece),
                None => (piece, false),
            };
            if hit {
                if !shown.is_empty() {
                    on_text(&shown);
                }
                stop_reason = StopReason::Stop;
                break;
            }
            if !shown.is_empty() && !on_text(&shown) {
                stop_reason = StopReason::Cancelled;
                break;
            }
        }
        if constraint.as_ref().is_some_and(|c| c.finished()) {
            // Nothing but the end of the turn may follow.
            stop_reason = StopReason::Eos;
            break;
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
    let text = match &mut stops {
        Some(s) => {
            if stop_reason != StopReason::Stop {
                let rest = s.finish();
                if !rest.is_empty() {
                    on_text(&rest);
                }
            }
            s.text().to_string()
        }
        None => stream.text()?,
    };
    let total_s = start.elapsed().as_secs_f64();
    Ok(LoopOutput {
        text,
        token_ids: generated,
        ttft_s: first_token_at.unwrap_or(total_s),
        total_s,
        compact_build_s,
        grammar_s,
        stop_reason,
    })
}
