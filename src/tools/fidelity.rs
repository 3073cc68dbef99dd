//! The fidelity instrument (`selectinfer fidelity`): how closely an engine
//! (a dtype, a selective mode, or candle's quantized GGUF model) follows a
//! reference (dense, f32 by default) on the dev prompts of each task.
//!
//! For each prompt, the reference's greedy continuation of `tokens` tokens
//! is computed once; the candidate is then teacher-forced over it, through
//! exactly the computation its decode uses (prefill with its selection, the
//! arrangement, then one decode step per token: [`Engine::forced_logits`]),
//! and compared position by position with the reference's logits.
//! Reported per task: mean KL(reference ‖ candidate), top-1 agreement with
//! the reference's tokens, mean position of the first disagreement (the
//! continuation's length when there is none), bytes per decode token, and
//! the time taken. Several candidates share one pass of the reference, and
//! candidates that differ only in what may change between prompts (φ, α,
//! score: [`SelectionParams::with_selection`]) share one loaded engine
//! ([`Candidate::Ours`] with `selection`); [`candidate_spec`] reads the
//! command line's `--candidate` descriptions.

use crate::engine::{CallThresholds, Engine, EngineSpec, GenerateOptions};
use crate::method::params::Score;
use crate::method::SelectionParams;
use crate::sys::device::WeightDtype;
use crate::tools::eval::{self, EvalOptions};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// What the candidates are: our engine under one or more selections, or
/// candle's quantized GGUF model.
pub enum Candidate<'a> {
    /// Our engine; with `selections`, one candidate per entry (φ, α, score
    /// changed; [`Engine::forced_logits_for`] prefills once for all), else
    /// the engine as loaded. `batched`: the forced tokens run in one pass
    /// through the prefill path on the decode's rows, rather than one decode
    /// step each (keep it off where decode's kernels differ in numerics
    /// from prefill's, as the quantized dtypes' 8-bit activations do).
    Ours {
        engine: &'a mut Engine,
        selections: Vec<SelectionParams>,
        batched: bool,
    },
    /// candle-transformers' quantized model on the folder's GGUF.
    Gguf(&'a mut crate::tools::gguf::QuantizedModel, u64),
}

/// The engine `spec` describes, with the `key=value` pairs of `candidate`
/// (comma-separated) changed: `mode`, `dtype`, `gamma`, `delta`, `phi`,
/// `alpha`, `score`, `keep` (or the long names `load_ratio` … `gate_keep`),
/// `vocab`, `screen` (`head_screen`: lm_head rows computed exactly behind
/// its screen), `sbits` (`head_screen_bits`: 4 or 2), `infile`
/// (`head_in_file`: true or false), `dense` (layers kept whole, `:`-separated), `drop`
/// (the per-layer weights of `layer_drop`, `:`-separated), `coarse`
/// (`coarse_ratio`), `cbits` (`coarse_bits`) and `kv` (`kv_dtype`: f32 or q8).
pub fn candidate_spec(spec: &EngineSpec, candidate: &str) -> Result<EngineSpec> {
    let mut s = spec.clone();
    for pair in candidate
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let (key, value) = pair
            .split_once('=')
            .with_context(|| format!("candidate `{candidate}`: `{pair}` is not key=value"))?;
        let (key, value) = (key.trim(), value.trim());
        let ratio = || -> Result<f64> {
            value.parse().with_context(|| {
                format!("candidate `{candidate}`: {key} = `{value}` is not a number")
            })
        };
        let named = || format!("candidate `{candidate}`");
        fn parse_list<T: std::str::FromStr>(value: &str) -> Result<Vec<T>> {
            value
                .split(':')
                .filter(|v| !v.trim().is_empty())
                .map(|v| {
                    v.trim()
                        .parse()
                        .map_err(|_| anyhow::anyhow!("`{v}` is not a number"))
                })
                .collect()
        }
        let p = &mut s.params;
        match key {
            "mode" => s.mode = value.parse().with_context(named)?,
            "dtype" => s.dtype = value.parse().with_context(named)?,
            "gamma" | "load_ratio" => p.load_ratio = ratio()?,
            "delta" | "static_ratio" => p.static_ratio = ratio()?,
            "phi" | "compute_ratio" => p.compute_ratio = ratio()?,
            "alpha" | "token_ratio" => p.token_ratio = ratio()?,
            "score" => p.score = value.parse().with_context(named)?,
            "keep" | "gate_keep" => p.gate_keep = ratio()?,
            "vocab" => s.vocab = value.parse().with_context(named)?,
            "screen" | "head_screen" => {
                s.head_screen = value.parse().with_context(|| {
                    format!("candidate `{candidate}`: {key} = `{value}` is not a row count")
                })?;
                // No screen, no head left in the file (unless `infile` follows).
                s.head_in_file &= s.head_screen > 0;
            }
            "sbits" | "head_screen_bits" => {
                s.head_screen_bits = value.parse().with_context(named)?
            }
            "infile" | "head_in_file" => s.head_in_file = value.parse().with_context(named)?,
            "dense" | "dense_layers" => p.dense_layers = parse_list(value).with_context(named)?,
            "drop" | "layer_drop" => p.layer_drop = parse_list(value).with_context(named)?,
            "coarse" | "coarse_ratio" => p.coarse_ratio = ratio()?,
            "cbits" | "coarse_bits" => p.coarse_bits = value.parse().with_context(named)?,
            "kv" | "kv_dtype" => s.kv_dtype = value.parse().with_context(named)?,
            _ => bail!(
                "candidate `{candidate}`: unknown key `{key}` (mode, dtype, gamma, delta, phi, alpha, score, keep, vocab, screen, sbits, infile, dense, drop, coarse, cbits, kv)"
            ),
        }
    }
    s.effective_params()
        .validate(usize::MAX)
        .with_context(|| format!("candidate `{candidate}`"))?;
    Ok(s)
}

/// Whether two specs load the same engine (they may differ in φ, α, score).
pub(crate) fn same_load(a: &EngineSpec, b: &EngineSpec) -> bool {
    let strip = |s: &EngineSpec| EngineSpec {
        params: SelectionParams {
            compute_ratio: 0.0,
            token_ratio: 0.0,
            score: Score::Counts,
            gate_keep: 1.0,
            layer_drop: Vec::new(),
            ..s.params.clone()
        },
        ..s.clone()
    };
    strip(a) == strip(b)
}

/// Our engines for a run: one per distinct load among the candidates
/// (those differing only in φ, α, score and κ share one, and its prefill).
pub struct Lineup {
    /// Result column names, in the order [`Lineup::candidates`] reports them.
    pub names: Vec<String>,
    groups: Vec<(EngineSpec, Engine, Vec<SelectionParams>)>,
}

impl Lineup {
    /// Loads the engines of `candidates` (descriptions for
    /// [`candidate_spec`]), or when there are none, of `spec` at each of
    /// `dtypes` (`spec`'s own dtype when that is empty too).
    pub fn load(spec: &EngineSpec, candidates: &[String], dtypes: &[WeightDtype]) -> Result<Self> {
        let specs: Vec<(String, EngineSpec)> = match (candidates, dtypes) {
            ([], []) => vec![(format!("{} {}", spec.dtype, spec.mode), spec.clone())],
            ([], _) => dtypes
                .iter()
                .map(|&dtype| {
                    (
                        format!("{dtype} {}", spec.mode),
                        EngineSpec {
                            dtype,
                            ..spec.clone()
                        },
                    )
                })
                .collect(),
            _ => candidates
                .iter()
                .map(|c| Ok((c.clone(), candidate_spec(spec, c)?)))
                .collect::<Result<_>>()?,
        };
        let mut members: Vec<(EngineSpec, Vec<usize>)> = Vec::new();
        for (i, (_, s)) in specs.iter().enumerate() {
            match members.iter_mut().find(|(l, _)| same_load(l, s)) {
                Some((_, m)) => m.push(i),
                None => members.push((s.clone(), vec![i])),
            }
        }
        let (mut names, mut groups) = (Vec::new(), Vec::new());
        for (lead, m) in members {
            // A mode that does not select is one column whatever φ says.
            let selections = match lead.mode.selects() {
                true => {
                    names.extend(m.iter().map(|&i| specs[i].0.clone()));
                    m.iter().map(|&i| specs[i].1.effective_params()).collect()
                }
                false => {
                    let same: Vec<&str> = m.iter().map(|&i| specs[i].0.as_str()).collect();
                    names.push(same.join(" = "));
                    Vec::new()
                }
            };
            let engine = lead
                .load()
                .with_context(|| format!("loading {}", names.last().map_or("", String::as_str)))?;
            groups.push((lead, engine, selections));
        }
        Ok(Self { names, groups })
    }

    /// The candidates for [`run`].
    pub fn candidates(&mut self) -> Vec<Candidate<'_>> {
        self.groups
            .iter_mut()
            .map(|(lead, engine, selections)| Candidate::Ours {
                engine,
                selections: selections.clone(),
                // Quantized decode uses 8-bit activations: step by step.
                batched: lead.dtype.quant().is_none(),
            })
            .collect()
    }
}

impl Candidate<'_> {
    /// How many result columns this candidate gives.
    fn columns(&self) -> usize {
        match self {
            Self::Ours { selections, .. } => selections.len().max(1),
            Self::Gguf(..) => 1,
        }
    }

    /// Per column: teacher-forced logits over `continuation` (row `i`
    /// predicts token `i`), and the bytes each decode token reads.
    fn logits(
        &mut self,
        prompt: &[u32],
        continuation: &[u32],
    ) -> Result<Vec<(Vec<Vec<f32>>, u64)>> {
        let feed = &continuation[..continuation.len() - 1];
        match self {
            Self::Ours {
                engine,
                selections,
                batched,
            } => engine.forced_logits_for(prompt, feed, selections, *batched),
            Self::Gguf(m, bytes) => {
                let mut out = vec![m.forward(prompt, 0)?.to_vec1::<f32>()?];
                for (i, &t) in feed.iter().enumerate() {
                    out.push(m.forward(&[t], prompt.len() + i)?.to_vec1::<f32>()?);
                }
                Ok(vec![(out, *bytes)])
            }
        }
    }
}

pub struct FidelityOptions {
    /// Task files (`../shared/data/*.dev.jsonl`).
    pub data: Vec<PathBuf>,
    /// Prompts per task.
    pub limit: usize,
    /// Prompts of each task passed over first (calibrate on some rows,
    /// compare on others).
    pub skip: usize,
    /// Positions compared per prompt (the reference's greedy continuation).
    pub tokens: usize,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct TaskFidelity {
    pub task: String,
    pub prompts: usize,
    pub positions: usize,
    pub mean_kl: f64,
    pub top1_agreement: f64,
    pub mean_first_divergence: f64,
    pub decode_bytes_per_token: f64,
    /// Mean probability the reference gives tokens the candidate does not
    /// compute (an output vocabulary); its KL is taken on the rest.
    #[serde(default)]
    pub mean_outside_mass: f64,
    /// The candidate's time plus the reference's (shared by every candidate of a run).
    pub seconds: f64,
}

impl std::fmt::Display for TaskFidelity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} prompts, {} positions: KL {:.4}, top-1 {:.3}, first divergence at {:.1}, {:.1} MB/token, {:.0} s",
            self.task,
            self.prompts,
            self.positions,
            self.mean_kl,
            self.top1_agreement,
            self.mean_first_divergence,
            self.decode_bytes_per_token / 1e6,
            self.seconds
        )?;
        if self.mean_outside_mass > 0.0 {
            write!(
                f,
                ", reference mass outside the output vocabulary {:.2e}",
                self.mean_outside_mass
            )?;
        }
        Ok(())
    }
}

/// `KL(p ‖ q)` of two logit rows (softmax in f64). Where `q` computes only
/// some tokens (an output vocabulary: the others are −∞), `p` is taken on
/// the same tokens, renormalised: the mass it loses is [`outside_mass`].
pub(crate) fn kl(p: &[f32], q: &[f32]) -> f64 {
    if q.contains(&f32::NEG_INFINITY) {
        let p: Vec<f32> = p
            .iter()
            .zip(q)
            .map(|(&a, &b)| if b == f32::NEG_INFINITY { b } else { a })
            .collect();
        return kl_full(&p, q);
    }
    kl_full(p, q)
}

/// The probability `p` gives the tokens `q` does not compute (−∞).
pub(crate) fn outside_mass(p: &[f32], q: &[f32]) -> f64 {
    let m = p.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let (mut all, mut out) = (0.0, 0.0);
    for (&a, &b) in p.iter().zip(q) {
        let e = (a as f64 - m).exp();
        all += e;
        if b == f32::NEG_INFINITY {
            out += e;
        }
    }
    out / all
}

fn kl_full(p: &[f32], q: &[f32]) -> f64 {
    fn log_softmax(l: &[f32]) -> Vec<f64> {
        let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let z = l.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
        l.iter().map(|&v| v as f64 - z).collect()
    }
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter()
        .zip(&lq)
        .filter(|(a, _)| a.is_finite())
        .map(|(a, b)| a.exp() * (a - b))
        .sum::<f64>()
        .max(0.0)
}

fn argmax(l: &[f32]) -> u32 {
    l.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i as u32)
}

/// Runs the instrument (see the module docs) for each candidate against
/// one pass of the reference (`reference` must be dense); returns each
/// result column's per-task figures (candidates in order, a candidate's
/// selections in order).
pub fn run(
    reference: &mut Engine,
    candidates: &mut [Candidate],
    opts: &FidelityOptions,
) -> Result<Vec<Vec<TaskFidelity>>> {
    run_with_progress(reference, candidates, opts, &mut |_| {})
}

/// [`run`], telling `progress` after each prompt how far it is.
pub fn run_with_progress(
    reference: &mut Engine,
    candidates: &mut [Candidate],
    opts: &FidelityOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<Vec<TaskFidelity>>> {
    let started = Instant::now();
    if opts.tokens < 1 || opts.limit < 1 {
        bail!("fidelity needs at least one prompt and one token per prompt");
    }
    let generate = GenerateOptions {
        max_new_tokens: opts.tokens,
        ignore_eos: true,
        ..Default::default()
    };
    let columns: usize = candidates.iter().map(Candidate::columns).sum();
    let mut out: Vec<Vec<TaskFidelity>> = (0..columns).map(|_| Vec::new()).collect();
    for data in &opts.data {
        let eval_opts = EvalOptions {
            data: data.clone(),
            template: None,
            limit: Some(opts.skip + opts.limit),
            generate: generate.clone(),
            outputs: PathBuf::new(),
            lenient_calls: false,
            call_thresholds: CallThresholds::TUNED,
        };
        let records: Vec<_> =
            eval::prompts(&reference.codec, reference.model.max_context(), &eval_opts)?
                .into_iter()
                .skip(opts.skip)
                .collect();
        if records.is_empty() {
            bail!(
                "{}: no prompt left to compare after skipping {} (limit {})",
                data.display(),
                opts.skip,
                opts.limit
            );
        }
        #[derive(Default)]
        struct Sums {
            kl: f64,
            outside: f64,
            agree: usize,
            first: usize,
            bytes: f64,
            n: usize,
            seconds: f64,
        }
        let mut sums: Vec<Sums> = (0..columns).map(|_| Sums::default()).collect();
        let mut reference_s = 0.0;
        for (done, r) in records.iter().enumerate() {
            let t0 = Instant::now();
            let ids = &r.prompt_token_ids;
            // The reference is dense: its greedy decode is the model's forward.
            let mut cache = reference.model.new_cache();
            let mut logits: Vec<f32> = reference.model.forward(ids, &mut cache)?.to_vec1()?;
            let (mut want, mut ref_logits) = (Vec::new(), Vec::new());
            for i in 0..opts.tokens {
                let t = argmax(&logits);
                want.push(t);
                ref_logits.push(std::mem::take(&mut logits));
                if i + 1 < opts.tokens {
                    logits = reference.model.forward(&[t], &mut cache)?.to_vec1()?;
                }
            }
            reference_s += t0.elapsed().as_secs_f64();
            let mut column = 0;
            for candidate in candidates.iter_mut() {
                let t0 = Instant::now();
                let results = candidate.logits(ids, &want)?;
                // A candidate's time is shared by its columns.
                let seconds = t0.elapsed().as_secs_f64() / results.len().max(1) as f64;
                for (got, b) in results {
                    let s = &mut sums[column];
                    column += 1;
                    let mut diverged = None;
                    for (i, ((w, g), &t)) in ref_logits.iter().zip(&got).zip(&want).enumerate() {
                        s.kl += kl(w, g);
                        s.outside += outside_mass(w, g);
                        let same = argmax(g) == t;
                        s.agree += usize::from(same);
                        if !same && diverged.is_none() {
                            diverged = Some(i);
                        }
                    }
                    s.first += diverged.unwrap_or(want.len());
                    s.bytes += b as f64;
                    s.n += want.len();
                    s.seconds += seconds;
                }
            }
            progress(&format!(
                "{}: prompt {}/{} done, {:.0} s",
                r.task,
                done + 1,
                records.len(),
                started.elapsed().as_secs_f64()
            ));
        }
        let prompts = records.len().max(1) as f64;
        for (o, s) in out.iter_mut().zip(&sums) {
            o.push(TaskFidelity {
                task: records.first().map_or_else(String::new, |r| r.task.clone()),
                prompts: records.len(),
                positions: s.n,
                mean_kl: s.kl / s.n.max(1) as f64,
                mean_outside_mass: s.outside / s.n.max(1) as f64,
                top1_agreement: s.agree as f64 / s.n.max(1) as f64,
                mean_first_divergence: s.first as f64 / prompts,
                decode_bytes_per_token: s.bytes / prompts,
                seconds: s.seconds + reference_s,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn kl_is_zero_for_equal_rows_and_positive_otherwise() {
        let p = [1.0f32, 2.0, -3.0];
        assert!(super::kl(&p, &p).abs() < 1e-12);
        assert!(super::kl(&p, &[1.0, 2.5, -3.0]) > 0.0);
        // A token the candidate does not compute: KL on the others, and
        // the reference's mass there reported apart.
        let q = [1.0f32, 2.0, f32::NEG_INFINITY];
        assert!(super::kl(&p, &q).abs() < 1e-12);
        let out = super::outside_mass(&p, &q);
        let want = (-3f64).exp() / (1f64.exp() + 2f64.exp() + (-3f64).exp());
        assert!((out - want).abs() < 1e-12 && super::outside_mass(&p, &p) == 0.0);
    }
}
