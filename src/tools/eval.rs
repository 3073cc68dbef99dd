//! Task evaluation: runs a task's JSONL (`../shared/data/*.jsonl`) through
//! an engine (any mode) with the task's prompt template and scores the
//! outputs — translation BLEU/chrF, summarization ROUGE-1/2/L F1, QA exact
//! match/F1 — with mean TTFT, decode speed and peak RSS.
//!
//! Every example's output is appended to a JSONL file as soon as it is
//! generated, so a run can be inspected while it goes and resumed after an
//! interruption (examples already in the file are not generated again).

use crate::engine::{GenerateOptions, Generation, Generator};
use crate::tools::data::{self, Example};
use crate::tools::metrics;
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The prompt template of each task (`{field}` placeholders, see
/// [`data::render_template`]); `config/profile.yaml` uses the same ones.
pub fn default_template(task: &str) -> Option<&'static str> {
    Some(match task {
        "translation" => "Translate the following German text into English. Reply with the translation only.\n\n{source}",
        "summarization" => "Summarize the following article in one sentence.\n\n{document}",
        "qa" => "Answer the question with a short span copied from the context.\n\nContext: {context}\n\nQuestion: {question}",
        _ => return None,
    })
}

pub struct EvalOptions {
    pub data: PathBuf,
    /// Overrides the task's default template.
    pub template: Option<String>,
    pub limit: Option<usize>,
    pub generate: GenerateOptions,
    /// Per-example outputs (JSONL), appended and resumed.
    pub outputs: PathBuf,
}

/// One example's result, as stored in the outputs file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExampleOutput {
    pub id: String,
    pub prediction: String,
    pub raw_text: String,
    pub references: Vec<String>,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub ttft_s: f64,
    pub decode_tokens_per_s: f64,
    pub compute_ratio: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    pub task: String,
    pub data: String,
    pub examples: usize,
    /// Metric name → score (0–100).
    pub metrics: BTreeMap<String, f64>,
    pub mean_ttft_s: f64,
    pub mean_decode_tokens_per_s: f64,
    pub mean_compute_ratio: f64,
    pub peak_rss_bytes: u64,
    pub outputs: String,
    /// Examples whose prompt plus `max_new_tokens` exceed the model's
    /// context: logged, counted here, not scored (the same ones for every
    /// mode of a model).
    pub skipped_too_long: Vec<String>,
}

impl std::fmt::Display for EvalReport {
    /// One line: the task's metrics, then speed, φ used and peak RSS.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let metrics: Vec<String> = self
            .metrics
            .iter()
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect();
        write!(
            f,
            "{} ({} examples): {}; TTFT {:.3} s, decode {:.1} tok/s, φ used {:.3}, peak RSS {:.0} MiB",
            self.task,
            self.examples,
            metrics.join(", "),
            self.mean_ttft_s,
            self.mean_decode_tokens_per_s,
            self.mean_compute_ratio,
            self.peak_rss_bytes as f64 / 1048576.0
        )
    }
}

/// The answer part of a generation: its first non-empty line, trimmed
/// (prompts ask for a single sentence / span / translation).
pub fn prediction(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string()
}

/// The task of `opts.data` and the outputs [`run`] wrote to `opts.outputs`
/// for its examples, in the file's order (examples not run are left out).
pub fn outputs(opts: &EvalOptions) -> Result<(String, Vec<ExampleOutput>)> {
    let examples = data::load_jsonl(&opts.data, opts.limit)?;
    let task = task_of(&examples, &opts.data)?;
    let mut done = read_outputs(&opts.outputs)?;
    let rows = examples.iter().filter_map(|e| done.remove(&e.id)).collect();
    Ok((task, rows))
}

fn read_outputs(path: &Path) -> Result<HashMap<String, ExampleOutput>> {
    let mut done = HashMap::new();
    if !path.exists() {
        return Ok(done);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let out: ExampleOutput = serde_json::from_str(line).with_context(|| {
            format!(
                "{} line {}: not an eval output (delete the file to start over)",
                path.display(),
                i + 1
            )
        })?;
        done.insert(out.id.clone(), out);
    }
    Ok(done)
}

/// Scores predictions for `task`.
pub fn score(task: &str, outputs: &[ExampleOutput]) -> Result<BTreeMap<String, f64>> {
    let hyps: Vec<String> = outputs.iter().map(|o| o.prediction.clone()).collect();
    let refs: Vec<Vec<String>> = outputs.iter().map(|o| o.references.clone()).collect();
    let mut m = BTreeMap::new();
    match task {
        "translation" => {
            m.insert("bleu".to_string(), metrics::bleu(&hyps, &refs));
            m.insert("chrf".to_string(), metrics::chrf(&hyps, &refs));
        }
        "summarization" => {
            let r = metrics::rouge(&hyps, &refs);
            m.insert("rouge1".to_string(), r.r1);
            m.insert("rouge2".to_string(), r.r2);
            m.insert("rougeL".to_string(), r.rl);
        }
        "qa" => {
            let (em, f1) = metrics::squad_em_f1(&hyps, &refs);
            m.insert("exact_match".to_string(), em);
            m.insert("f1".to_string(), f1);
        }
        other => bail!("no metrics for task '{other}' (translation, summarization, qa)"),
    }
    Ok(m)
}

/// The examples of `opts.data`, their task and their rendered prompts
/// (every prompt rendered first: a bad template fails before any generation).
fn load_task(opts: &EvalOptions) -> Result<(Vec<Example>, String, Vec<String>)> {
    let examples = data::load_jsonl(&opts.data, opts.limit)?;
    let task = task_of(&examples, &opts.data)?;
    let template = match &opts.template {
        Some(t) => t.clone(),
        None => default_template(&task)
            .with_context(|| {
                format!("no default prompt template for task '{task}': pass --template")
            })?
            .to_string(),
    };
    let prompts = examples
        .iter()
        .map(|e| data::render_template(&template, e))
        .collect::<Result<Vec<_>>>()?;
    Ok((examples, task, prompts))
}

/// One example's chat-formatted prompt as token ids, for running the same
/// evaluation through another engine (llama.cpp: `scripts/compare.py`),
/// whose outputs `eval` then scores from the outputs file.
#[derive(Debug, Clone, Serialize)]
pub struct PromptRecord {
    pub id: String,
    pub task: String,
    pub prompt_token_ids: Vec<u32>,
    pub references: Vec<String>,
}

/// The prompts `run` would generate from (same template, chat format and
/// context check), without generating.
pub fn prompts(
    codec: &crate::engine::text::TextCodec,
    max_context: usize,
    opts: &EvalOptions,
) -> Result<Vec<PromptRecord>> {
    let (examples, task, prompts) = load_task(opts)?;
    let mut out = Vec::new();
    for (ex, prompt) in examples.iter().zip(&prompts) {
        let ids = codec
            .chat_prompt_ids(prompt)
            .with_context(|| format!("example {}", ex.id))?;
        if ids.len() + opts.generate.max_new_tokens <= max_context {
            out.push(PromptRecord {
                id: ex.id.clone(),
                task: task.clone(),
                prompt_token_ids: ids,
                references: ex.references.clone(),
            });
        }
    }
    Ok(out)
}

/// Writes [`prompts`] as JSONL to `out` (for running another engine on
/// exactly these prompts); returns how many.
pub fn write_prompts(engine: &dyn Generator, opts: &EvalOptions, out: &Path) -> Result<usize> {
    let records = prompts(engine.codec(), engine.max_context(), opts)?;
    let mut text = String::new();
    for r in &records {
        text.push_str(&serde_json::to_string(r)?);
        text.push('\n');
    }
    std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    Ok(records.len())
}

/// Runs the evaluation (see the module docs).
pub fn run(engine: &mut dyn Generator, opts: &EvalOptions) -> Result<EvalReport> {
    let (examples, task, prompts) = load_task(opts)?;
    let mut done = read_outputs(&opts.outputs)?;
    if let Some(dir) = opts.outputs.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&opts.outputs)
        .with_context(|| format!("opening {}", opts.outputs.display()))?;
    let bar = ProgressBar::new(examples.len() as u64).with_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({eta} left)")
            .expect("static progress template")
            .progress_chars("=> "),
    );
    bar.set_message(task.clone());
    let mut results = Vec::with_capacity(examples.len());
    let mut skipped = Vec::new();
    for (ex, prompt) in examples.iter().zip(&prompts) {
        let ids = engine
            .codec()
            .chat_prompt_ids(prompt)
            .with_context(|| format!("example {}", ex.id))?;
        let tokens = ids.len();
        if tokens + opts.generate.max_new_tokens > engine.max_context() {
            log::warn!(
                "skipping example {}: {tokens} prompt tokens + {} new exceed the context of {}",
                ex.id,
                opts.generate.max_new_tokens,
                engine.max_context()
            );
            skipped.push(ex.id.clone());
            bar.inc(1);
            continue;
        }
        let out = match done.remove(&ex.id) {
            Some(previous) => previous,
            None => {
                let g = engine
                    .generate(&ids, &opts.generate)
                    .with_context(|| format!("example {}", ex.id))?;
                let out = example_output(ex, &g);
                writeln!(file, "{}", serde_json::to_string(&out)?)?;
                file.flush()?;
                out
            }
        };
        results.push(out);
        bar.inc(1);
    }
    bar.finish_and_clear();
    if results.is_empty() {
        bail!(
            "no example of {} fits in the model's context",
            opts.data.display()
        );
    }
    let n = results.len() as f64;
    let mean = |f: &dyn Fn(&ExampleOutput) -> f64| results.iter().map(f).sum::<f64>() / n;
    Ok(EvalReport {
        metrics: score(&task, &results)?,
        task,
        data: opts.data.display().to_string(),
        examples: results.len(),
        mean_ttft_s: mean(&|o| o.ttft_s),
        mean_decode_tokens_per_s: mean(&|o| o.decode_tokens_per_s),
        mean_compute_ratio: mean(&|o| o.compute_ratio),
        peak_rss_bytes: crate::sys::memory::peak_rss_bytes(),
        outputs: opts.outputs.display().to_string(),
        skipped_too_long: skipped,
    })
}

fn example_output(ex: &Example, g: &Generation) -> ExampleOutput {
    ExampleOutput {
        id: ex.id.clone(),
        prediction: prediction(&g.text),
        raw_text: g.text.clone(),
        references: ex.references.clone(),
        prompt_tokens: g.prompt_tokens,
        generated_tokens: g.generated_tokens,
        ttft_s: g.ttft_s,
        decode_tokens_per_s: g.decode_tokens_per_s,
        compute_ratio: g.compute_ratio,
    }
}

/// The task named by the rows' `task` field (all rows must agree).
fn task_of(examples: &[Example], path: &Path) -> Result<String> {
    let mut task: Option<String> = None;
    for e in examples {
        let t = e
            .fields
            .get("task")
            .and_then(|v| v.as_str())
            .with_context(|| {
                format!("{}: example {} has no \"task\" field", path.display(), e.id)
            })?;
        match &task {
            None => task = Some(t.to_string()),
            Some(prev) if prev != t => bail!("{}: mixes tasks '{prev}' and '{t}'", path.display()),
            _ => {}
        }
        if e.references.is_empty() {
            bail!("{}: example {} has no references", path.display(), e.id);
        }
    }
    task.with_context(|| format!("{} has no examples", path.display()))
}
