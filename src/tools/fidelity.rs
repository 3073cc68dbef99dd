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
//! the time taken. Several candidates share one pass of the reference.

use crate::engine::{Engine, GenerateOptions};
use crate::tools::eval::{self, EvalOptions};
use anyhow::{bail, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// What the candidate is.
pub enum Candidate<'a> {
    Ours(&'a mut Engine),
    /// candle-transformers' quantized model on the folder's GGUF.
    Gguf(&'a mut crate::tools::gguf::QuantizedModel, u64),
}

impl Candidate<'_> {
    /// Teacher-forced logits over `continuation` (row `i` predicts token
    /// `i`), and the bytes each decode token reads.
    fn logits(&mut self, prompt: &[u32], continuation: &[u32]) -> Result<(Vec<Vec<f32>>, u64)> {
        let feed = &continuation[..continuation.len() - 1];
        match self {
            Self::Ours(e) => {
                let (logits, chosen) = e.forced_logits(prompt, feed, None)?;
                Ok((logits, e.decode_bytes(chosen.as_ref())))
            }
            Self::Gguf(m, bytes) => {
                let mut out = vec![m.forward(prompt, 0)?.to_vec1::<f32>()?];
                for (i, &t) in feed.iter().enumerate() {
                    out.push(m.forward(&[t], prompt.len() + i)?.to_vec1::<f32>()?);
                }
                Ok((out, *bytes))
            }
        }
    }
}

pub struct FidelityOptions {
    /// Task files (`../shared/data/*.dev.jsonl`).
    pub data: Vec<PathBuf>,
    /// Prompts per task.
    pub limit: usize,
    /// Positions compared per prompt (the reference's greedy continuation).
    pub tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct TaskFidelity {
    pub task: String,
    pub prompts: usize,
    pub positions: usize,
    pub mean_kl: f64,
    pub top1_agreement: f64,
    pub mean_first_divergence: f64,
    pub decode_bytes_per_token: f64,
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
        )
    }
}

/// `KL(p ‖ q)` of two logit rows (softmax in f64).
pub fn kl(p: &[f32], q: &[f32]) -> f64 {
    fn log_softmax(l: &[f32]) -> Vec<f64> {
        let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let z = l.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
        l.iter().map(|&v| v as f64 - z).collect()
    }
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter()
        .zip(&lq)
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
/// candidate's per-task figures.
pub fn run(
    reference: &mut Engine,
    candidates: &mut [Candidate],
    opts: &FidelityOptions,
) -> Result<Vec<Vec<TaskFidelity>>> {
    if opts.tokens < 1 || opts.limit < 1 {
        bail!("fidelity needs at least one prompt and one token per prompt");
    }
    let generate = GenerateOptions {
        max_new_tokens: opts.tokens,
        ignore_eos: true,
        ..Default::default()
    };
    let mut out: Vec<Vec<TaskFidelity>> = candidates.iter().map(|_| Vec::new()).collect();
    for data in &opts.data {
        let eval_opts = EvalOptions {
            data: data.clone(),
            template: None,
            limit: Some(opts.limit),
            generate: generate.clone(),
            outputs: PathBuf::new(),
        };
        let records = eval::prompts(&reference.codec, reference.model.max_context(), &eval_opts)?;
        #[derive(Default)]
        struct Sums {
            kl: f64,
            agree: usize,
            first: usize,
            bytes: f64,
            n: usize,
            seconds: f64,
        }
        let mut sums: Vec<Sums> = candidates.iter().map(|_| Sums::default()).collect();
        let mut reference_s = 0.0;
        for r in &records {
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
            for (candidate, s) in candidates.iter_mut().zip(&mut sums) {
                let t0 = Instant::now();
                let (got, b) = candidate.logits(ids, &want)?;
                let mut diverged = None;
                for (i, ((w, g), &t)) in ref_logits.iter().zip(&got).zip(&want).enumerate() {
                    s.kl += kl(w, g);
                    let same = argmax(g) == t;
                    s.agree += usize::from(same);
                    if !same && diverged.is_none() {
                        diverged = Some(i);
                    }
                }
                s.first += diverged.unwrap_or(want.len());
                s.bytes += b as f64;
                s.n += want.len();
                s.seconds += t0.elapsed().as_secs_f64();
            }
        }
        let prompts = records.len().max(1) as f64;
        for (o, s) in out.iter_mut().zip(&sums) {
            o.push(TaskFidelity {
                task: records.first().map_or_else(String::new, |r| r.task.clone()),
                prompts: records.len(),
                positions: s.n,
                mean_kl: s.kl / s.n.max(1) as f64,
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
    }
}
