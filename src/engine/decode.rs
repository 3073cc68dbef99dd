//! The decode loop shared by every engine (ours in any mode, the GGUF
//! baseline): prefill, sample (under the request's grammar, if any), step
//! token by token until a stop token or string, the token limit or the
//! caller's cancel; streaming, timing and the generation's statistics.

use super::grammar::{Grammar, Grammars};
use super::sampling::Sampling;
use super::stops::StopStrings;
use super::text::{TextCodec, TextStream};
use super::tool_calls::{self, ToolChoice};
use super::tool_offer::Offer;
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
    /// With tools offered: thresholds on whether to call and whether to
    /// call again (under the grammar; `None` = the arg-max decides).
    pub call_gate: Option<CallGate>,
}

/// Where a small model's tool-calling decisions are taken by threshold
/// instead of arg-max ([`CallGate`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallThresholds {
    /// [`CallGate::min_call_p`].
    pub call: f32,
    /// [`CallGate::min_name_p`].
    pub name: f32,
    /// [`CallGate::min_more_p`].
    pub more: f32,
    /// [`CallGate::min_more_p_later`].
    pub more_later: f32,
}

impl CallThresholds {
    /// Tuned on BFCL's dev rows (rows 20-39 of each category, and
    /// irrelevance rows 80-119 for the name; Qwen2.5-Coder-0.5B q4;
    /// EXPERIMENTS.md).
    pub const TUNED: Self = Self {
        call: 0.65,
        name: 0.5,
        more: 5e-5,
        more_later: 1e-2,
    };
}

/// A small model's tool-calling decisions, taken by threshold instead
/// of arg-max: whether its answer starts with a call (the share, among
/// the tokens the grammar allows at the first token, of those that open a
/// call: the `<tool_call>` marker, a fence's backtick, `{`, `[` or white
/// space, which text may not start with); whether that call is one of
/// those offered (the share of the model's own, unconstrained mass on the
/// offered names at the name's first token: a model that would name a
/// function nobody offered is asked for something no tool does, and its
/// call is taken back); and after a call, whether another follows (the
/// share of everything but the end of the turn). Tuned on BFCL's dev rows
/// (`selectinfer eval --task tools --min-call-p P ...`; EXPERIMENTS.md).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallGate {
    /// The call-open marker's token where it is a special token (Qwen2.5's).
    pub open: Option<u32>,
    /// At the first token, with text allowed: no call below this share
    /// (0 = never refused).
    pub min_call_p: f32,
    /// At the name of the answer's first call, text allowed: below this
    /// share the call is taken back and the answer goes on in text from
    /// where the call opened (0 = never).
    pub min_name_p: f32,
    /// After the first call, with several allowed: a second at or above
    /// this share, else the end (above 1 = never forced).
    pub min_more_p: f32,
    /// The same after the second and later calls: once a model has made
    /// two calls its next one is far likelier, even where two were asked.
    pub min_more_p_later: f32,
}

impl CallGate {
    /// The gate of a request offering `offer`, with thresholds `t`: none
    /// when no call is wanted.
    pub(crate) fn for_offer(codec: &TextCodec, offer: &Offer, t: CallThresholds) -> Option<Self> {
        let several = |p: f32| if offer.parallel { p } else { 2.0 };
        let auto = |p: f32| {
            if offer.choice == ToolChoice::Auto {
                p
            } else {
                0.0
            }
        };
        offer.calls_wanted().then_some(Self {
            open: codec.tool_call_marker_ids().map(|(open, _)| open),
            min_call_p: auto(t.call),
            min_name_p: auto(t.name),
            min_more_p: several(t.more),
            min_more_p_later: several(t.more_later),
        })
    }

    /// Whether `token` opens a call: where the answer starts, any token a
    /// call's JSON or its fence or marker may start with; after text, the
    /// marker or a token holding `<` or a backtick (text holds neither).
    fn opens(&self, token: usize, at_start: bool, vocab: &Grammars) -> bool {
        Some(token as u32) == self.open
            || if at_start {
                matches!(
                    vocab.first_bytes().get(token),
                    Some(b'<' | b'`' | b'{' | b'[' | b' ' | b'\t' | b'\n' | b'\r')
                )
            } else {
                vocab.call_bytes().get(token) == Some(&true)
            }
    }

    /// The share of the softmax of `raw` logits on the tokens `masked`
    /// keeps finite.
    fn kept_share(raw: &[f32], masked: &[f32]) -> f32 {
        let max = raw.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let (mut all, mut kept) = (0f64, 0f64);
        for (&r, &m) in raw.iter().zip(masked) {
            if r.is_finite() {
                let e = ((r - max) as f64).exp();
                all += e;
                if m.is_finite() {
                    kept += e;
                }
            }
        }
        if all > 0.0 {
            (kept / all) as f32
        } else {
            0.0
        }
    }

    /// Applies the gate to the grammar-masked `logits` of the next token:
    /// `text` is the answer so far, `vocab` tells each token's first byte
    /// and whether it holds a call's opening bytes; `no_calls` is set when
    /// the first token refused a call, and then no call may open later
    /// either (the decision is taken once). A gate never leaves no token
    /// allowed.
    fn apply(
        &self,
        logits: &mut [f32],
        text: &str,
        vocab: &Grammars,
        stop_ids: &[u32],
        no_calls: &mut bool,
    ) {
        // Sets the tokens `drop` picks to -inf, unless that leaves none.
        let forbid = |logits: &mut [f32], drop: &dyn Fn(usize) -> bool| {
            let kept = logits
                .iter()
                .enumerate()
                .any(|(i, x)| x.is_finite() && !drop(i));
            if kept {
                for (i, x) in logits.iter_mut().enumerate() {
                    if drop(i) {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
        };
        let share = |logits: &[f32], part: &dyn Fn(usize) -> bool| {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let (mut all, mut some) = (0f64, 0f64);
            for (i, &x) in logits.iter().enumerate() {
                if x.is_finite() {
                    let e = ((x - max) as f64).exp();
                    all += e;
                    if part(i) {
                        some += e;
                    }
                }
            }
            if all > 0.0 {
                (some / all) as f32
            } else {
                0.0
            }
        };
        let finite = |i: usize| logits.get(i).is_some_and(|x| x.is_finite());
        if *no_calls {
            // After text a call opens with the marker or a fence (text
            // itself holds no `<` or backtick).
            let opens = |i: usize| self.opens(i, false, vocab);
            forbid(logits, &opens);
            return;
        }
        if text.is_empty() {
            let opens = |i: usize| self.opens(i, true, vocab);
            let text_allowed = (0..logits.len()).any(|i| finite(i) && !opens(i));
            if !text_allowed {
                return;
            }
            let p = share(logits, &opens);
            log::debug!("call gate: p(call) {p:.3e} at the first token");
            if p < self.min_call_p {
                *no_calls = true;
                forbid(logits, &opens);
            }
        } else if text.ends_with(tool_calls::CALL_CLOSE) || text.ends_with("\n```") {
            let ends = |i: usize| stop_ids.contains(&(i as u32));
            let more_allowed = (0..logits.len()).any(|i| finite(i) && !ends(i));
            if !more_allowed || !stop_ids.iter().any(|&s| finite(s as usize)) {
                return;
            }
            let p = 1.0 - share(logits, &ends);
            // Closing fences: "\n```" not opening the next ("\n```json").
            let made = text.matches(tool_calls::CALL_CLOSE).count() + text.matches("\n```").count()
                - text.matches("\n```json").count();
            log::debug!("call gate: p(another call) {p:.3e} after {made} call(s)");
            let bar = if made <= 1 {
                self.min_more_p
            } else {
                self.min_more_p_later
            };
            if p >= bar {
                forbid(logits, &ends);
            }
        }
    }
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
pub(crate) trait Steps {
    /// Runs the prompt; returns the logits of its last token.
    fn prefill(&mut self, prompt: &[u32]) -> Result<Tensor>;
    /// One-time work after the first token is out (the compact weights);
    /// returns the seconds it took.
    fn after_first_token(&mut self) -> Result<f64> {
        Ok(0.0)
    }
    /// Feeds one generated token; returns the next logits.
    fn step(&mut self, token: u32) -> Result<Tensor>;
    /// Forgets every position from `len` on (the prompt and the answer's
    /// tokens before a call), so the answer can go on from there; false
    /// where these steps cannot (the answer then stands).
    fn rewind(&mut self, _len: usize) -> Result<bool> {
        Ok(false)
    }
}

/// Where the check of the first call's name ([`CallGate::min_name_p`])
/// stands.
enum NameCheck<'a> {
    /// No call yet: the next one to open is held back until its name is
    /// checked.
    Watching,
    /// A call opened: its pieces are held back until the name is checked,
    /// and `at` is where the answer goes on, in text, should it be taken
    /// back.
    Holding { held: Vec<String>, at: Resume<'a> },
    /// Checked, or not wanted.
    Done,
}

/// The answer just before a call opened: its length in tokens, the
/// logits of the call's first token, the text stream and stop strings.
struct Resume<'a> {
    len: usize,
    logits: Tensor,
    stream: TextStream<'a>,
    stops: Option<StopStrings>,
}

/// What [`decode_loop`] measured.
pub(crate) struct LoopOutput {
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
    pub(crate) fn into_generation(
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
pub(crate) fn decode_loop(
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
    // The call gate's view: each token's first byte, the answer so far.
    let gate_grammars = match (&opts.call_gate, &constraint) {
        (Some(_), Some(_)) => Some(codec.grammars()?),
        _ => None,
    };
    let mut so_far = String::new();
    let mut no_calls = false;
    let mut name_check = match (&opts.call_gate, &constraint) {
        (Some(g), Some(_)) if g.min_name_p > 0.0 => NameCheck::Watching,
        _ => NameCheck::Done,
    };
    let start = Instant::now();
    let mut logits = steps.prefill(prompt)?;
    let (mut compact_build_s, mut grammar_s) = (0.0, 0.0);
    let mut built = false;
    let mut generated = Vec::new();
    let mut first_token_at = None;
    let mut stop_reason = StopReason::Length;
    while generated.len() < opts.max_new_tokens {
        if let (NameCheck::Holding { .. }, Some(gate), Some(c)) =
            (&name_check, &opts.call_gate, &mut constraint)
        {
            if so_far.ends_with(tool_calls::NAME_OPEN) {
                let t = Instant::now();
                let masked = c.mask_values(&logits)?;
                let raw = logits.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?;
                let p = CallGate::kept_share(&raw, &masked);
                log::debug!("call gate: p(an offered name) {p:.3e}");
                let NameCheck::Holding { held, at } =
                    std::mem::replace(&mut name_check, NameCheck::Done)
                else {
                    unreachable!("matched above")
                };
                grammar_s += t.elapsed().as_secs_f64();
                if p < gate.min_name_p && steps.rewind(prompt.len() + at.len)? {
                    // Taken back: the answer goes on in text from where
                    // the call opened; no call may open again.
                    c.rollback(generated.len() - at.len)?;
                    generated.truncate(at.len);
                    so_far = codec.decode(&generated)?;
                    (logits, stream, stops) = (at.logits, at.stream, at.stops);
                    no_calls = true;
                    if generated.is_empty() {
                        // The first token the caller sees is still to come.
                        first_token_at = None;
                    }
                } else if !held.iter().all(|piece| on_text(piece)) {
                    stop_reason = StopReason::Cancelled;
                    break;
                }
            }
        }
        let next = match &mut constraint {
            Some(c) => {
                let t = Instant::now();
                let mut masked = c.mask_values(&logits)?;
                if let (Some(gate), Some(g)) = (&opts.call_gate, &gate_grammars) {
                    gate.apply(&mut masked, &so_far, g, stop_ids, &mut no_calls);
                }
                let masked = Tensor::from_vec(masked, logits.dims(), logits.device())?;
                grammar_s += t.elapsed().as_secs_f64();
                sampler.sample(&masked)?
            }
            None => sampler.sample(&logits)?,
        };
        if first_token_at.is_none() {
            first_token_at = Some(start.elapsed().as_secs_f64());
        }
        if let (NameCheck::Watching, Some(gate), Some(g)) =
            (&name_check, &opts.call_gate, &gate_grammars)
        {
            if gate.opens(next as usize, generated.is_empty(), g) {
                name_check = NameCheck::Holding {
                    held: Vec::new(),
                    at: Resume {
                        len: generated.len(),
                        logits: logits.clone(),
                        stream: stream.clone(),
                        stops: stops.clone(),
                    },
                };
            }
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
        if gate_grammars.is_some() {
            so_far = codec.decode(&generated)?;
        }
        if let Some(piece) = stream.push(next)? {
            let (shown, hit) = match &mut stops {
                Some(s) => s.push(&piece),
                None => (piece, false),
            };
            // Held back while a call's name is unchecked.
            let mut send = |s: &str| match &mut name_check {
                NameCheck::Holding { held, .. } => {
                    held.push(s.to_string());
                    true
                }
                _ => on_text(s),
            };
            if hit {
                if !shown.is_empty() {
                    send(&shown);
                }
                stop_reason = StopReason::Stop;
                break;
            }
            if !shown.is_empty() && !send(&shown) {
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
        if !built {
            // Done after the first token is out, so it does not delay it.
            compact_build_s = steps.after_first_token()?;
            built = true;
        }
        logits = steps.step(next)?;
    }
    // Pieces still held (the answer ended before the name): they stand.
    if let NameCheck::Holding { held, .. } = &mut name_check {
        for piece in held.drain(..) {
            on_text(&piece);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The gate on Qwen2.5's vocabulary: a call below `min_call_p` is
    /// refused at the first token and for the rest of the answer (neither
    /// the marker nor a token holding a backtick later); after a call, the
    /// end of the turn is refused at or above `min_more_p`; and a gate never
    /// leaves no token allowed.
    #[test]
    fn the_call_gate_refuses_and_forces_by_threshold() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/qwen2.5-coder-0.5b-instruct");
        let codec = TextCodec::from_model_dir(&dir).unwrap();
        let vocab = codec.grammars().unwrap();
        let (open, _) = codec.tool_call_marker_ids().unwrap();
        let stop = codec.stop_ids().to_vec();
        let id = |s: &str| {
            let ids = codec.encode(s).unwrap();
            assert_eq!(ids.len(), 1, "{s:?} is one token");
            ids[0] as usize
        };
        let (word, fence, space_tick) = (id("Hello"), id("```"), id(" `"));
        let n = vocab.first_bytes().len();
        let gate = CallGate {
            open: Some(open),
            min_call_p: 0.65,
            min_name_p: 0.0,
            min_more_p: 1e-4,
            min_more_p_later: 1e-2,
        };
        // First token: the marker at p = e^0.5 / (e^0.5 + e^0) = 0.62.
        let mut logits = vec![f32::NEG_INFINITY; n];
        logits[open as usize] = 0.5;
        logits[fence] = -30.0;
        logits[word] = 0.0;
        let mut no_calls = false;
        gate.apply(&mut logits, "", &vocab, &stop, &mut no_calls);
        assert!(no_calls && logits[open as usize] == f32::NEG_INFINITY);
        assert!(logits[fence].is_infinite() && logits[word] == 0.0);
        // Later, text may not open a call either: " `" would start a fence.
        let mut later = vec![f32::NEG_INFINITY; n];
        later[space_tick] = 2.0;
        later[word] = 0.0;
        gate.apply(&mut later, "Hi", &vocab, &stop, &mut no_calls);
        assert!(later[space_tick].is_infinite() && later[word] == 0.0);
        // Above the threshold the call stays.
        let mut logits = vec![f32::NEG_INFINITY; n];
        logits[open as usize] = 3.0;
        logits[word] = 0.0;
        let mut no_calls = false;
        gate.apply(&mut logits, "", &vocab, &stop, &mut no_calls);
        assert!(!no_calls && logits[open as usize] == 3.0);
        // After a call: another at p(more) = 1e-3 >= 1e-4, so no end.
        let after = "<tool_call>\n{}\n</tool_call>";
        let mut logits = vec![f32::NEG_INFINITY; n];
        logits[stop[0] as usize] = 0.0;
        logits[id("\n")] = (1e-3f32 / (1.0 - 1e-3)).ln();
        gate.apply(&mut logits, after, &vocab, &stop, &mut false);
        assert!(logits[stop[0] as usize].is_infinite());
        // Below it the end stays; and where only the end is allowed it stays.
        let mut logits = vec![f32::NEG_INFINITY; n];
        logits[stop[0] as usize] = 0.0;
        logits[id("\n")] = -20.0;
        gate.apply(&mut logits, after, &vocab, &stop, &mut false);
        assert_eq!(logits[stop[0] as usize], 0.0);
        let mut logits = vec![f32::NEG_INFINITY; n];
        logits[stop[0] as usize] = 0.0;
        gate.apply(&mut logits, after, &vocab, &stop, &mut false);
        assert_eq!(logits[stop[0] as usize], 0.0);
    }
}
