//! Task evaluation: runs a task's JSONL (`../shared/data/*.jsonl`) through
//! an engine (any mode) with the task's prompt template and scores the
//! outputs — translation BLEU/chrF, summarization ROUGE-1/2/L F1, QA exact
//! match/F1, tool calls BFCL's AST check per category (rows with
//! `messages` and `functions`; calls held to the functions' schemas while
//! generated) — with mean TTFT, decode speed and peak RSS.
//!
//! Every example's output is appended to a JSONL file as soon as it is
//! generated, so a run can be inspected while it goes and resumed after an
//! interruption (examples already in the file are not generated again).

use crate::engine::tool_calls::{self, Tool, ToolChoice};
use crate::engine::tool_offer::Offer;
use crate::engine::{CallGate, CallThresholds};
use crate::engine::{GenerateOptions, Generation, Generator};
use crate::tools::bfcl;
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
pub(crate) fn default_template(task: &str) -> Option<&'static str> {
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
    /// Tool-call rows: calls read anywhere in the text
    /// ([`tool_calls::read_calls`]'s `lenient`).
    pub lenient_calls: bool,
    /// Tool-call rows: the [`CallGate`]'s thresholds.
    pub call_thresholds: CallThresholds,
}

/// One example's result, as stored in the outputs file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ExampleOutput {
    pub id: String,
    pub prediction: String,
    pub raw_text: String,
    pub references: Vec<String>,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub ttft_s: f64,
    pub decode_tokens_per_s: f64,
    pub compute_ratio: f64,
    /// Tool-call rows: the BFCL category, whether the calls read from
    /// `raw_text` pass its AST check, and the call blocks that did not
    /// parse or named no offered function (judged again on every run, so
    /// outputs written by another engine are judged the same way).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub category: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed: Option<bool>,
    #[serde(default)]
    pub invalid_calls: usize,
}

/// What an example asks the model: a user prompt from the task's
/// template, or (task `tools`) a conversation offering functions.
enum Prompt {
    User(String),
    Tools {
        turns: Vec<crate::engine::Message>,
        tools: Vec<Tool>,
    },
}

impl Prompt {
    fn ids(&self, codec: &crate::engine::TextCodec) -> Result<Vec<u32>> {
        match self {
            Prompt::User(p) => codec.chat_prompt_ids(p),
            Prompt::Tools { turns, tools } => {
                codec.encode(&codec.render_chat_with_tools(turns, tools)?)
            }
        }
    }

    /// The generation options of this prompt: a tools prompt's calls are
    /// held to the offered functions' schemas (`tool_choice` auto,
    /// parallel calls allowed).
    fn options(
        &self,
        base: &GenerateOptions,
        codec: &crate::engine::TextCodec,
        thresholds: CallThresholds,
    ) -> Result<GenerateOptions> {
        let mut o = base.clone();
        if let Prompt::Tools { tools, .. } = self {
            let offer = Offer {
                tools: tools.clone(),
                choice: ToolChoice::Auto,
                parallel: true,
            };
            let (open, close) = codec.tool_call_markers();
            o.grammar = tool_calls::grammar(&offer.tools, &offer.choice, true, (&open, &close))?;
            o.call_gate = CallGate::for_offer(codec, &offer, thresholds);
        }
        Ok(o)
    }
}

/// The prompt tokens of a tools row (its `messages` offering its
/// `functions`), as eval renders them: what profiling a `tools` task reads.
pub fn tools_prompt_ids(codec: &crate::engine::TextCodec, ex: &Example) -> Result<Vec<u32>> {
    tools_prompt(ex)?.ids(codec)
}

/// `rows` taken one per category in turn (categories in first-seen
/// order), `limit` of them.
fn interleaved_by_category(rows: Vec<Example>, limit: usize) -> Vec<Example> {
    let mut groups: Vec<(String, std::collections::VecDeque<Example>)> = Vec::new();
    for r in rows {
        let c = r
            .fields
            .get("category")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        match groups.iter_mut().find(|(k, _)| *k == c) {
            Some((_, g)) => g.push_back(r),
            None => groups.push((c, [r].into())),
        }
    }
    let mut out = Vec::new();
    while out.len() < limit && groups.iter().any(|(_, g)| !g.is_empty()) {
        for (_, g) in groups.iter_mut() {
            if out.len() < limit {
                out.extend(g.pop_front());
            }
        }
    }
    out
}

/// A tools row's prompt: its `messages` and `functions`.
fn tools_prompt(ex: &Example) -> Result<Prompt> {
    let turns = serde_json::from_value(ex.fields.get("messages").cloned().unwrap_or_default())
        .context("`messages` must be a list of {role, content}")?;
    let functions = ex.fields.get("functions").context("no `functions`")?;
    let tools = tool_calls::parse_tools(&functions.to_string())?;
    Ok(Prompt::Tools { turns, tools })
}

/// Judges a tools row's output by BFCL's AST check.
fn judge_tools(ex: &Example, tools: &[Tool], lenient: bool, out: &mut ExampleOutput) {
    let calls = tool_calls::read_calls(&out.raw_text, tools, lenient);
    let parsed: Vec<(String, serde_json::Value)> = calls
        .calls
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                serde_json::from_str(&c.arguments).unwrap_or_default(),
            )
        })
        .collect();
    let empty = Vec::new();
    let arr = |k: &str| {
        ex.fields
            .get(k)
            .and_then(|v| v.as_array())
            .unwrap_or(&empty)
    };
    out.category = ex
        .fields
        .get("category")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string();
    out.passed = Some(bfcl::check(
        &out.category,
        arr("functions"),
        arr("references"),
        &parsed,
    ));
    out.invalid_calls = calls.invalid;
    out.prediction = serde_json::to_string(&calls.calls).unwrap_or_default();
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
pub(crate) fn prediction(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string()
}

/// The task of `opts.data` and the outputs [`run`] wrote to `opts.outputs`
/// for its examples, in the file's order (examples not run are left out).
pub(crate) fn outputs(opts: &EvalOptions) -> Result<(String, Vec<ExampleOutput>)> {
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
pub(crate) fn score(task: &str, outputs: &[ExampleOutput]) -> Result<BTreeMap<String, f64>> {
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
        "tools" => return Ok(tools_metrics(outputs)),
        other => bail!("no metrics for task '{other}' (translation, summarization, qa, tools)"),
    }
    Ok(m)
}

/// The examples of `opts.data`, their task and their rendered prompts
/// (every prompt rendered first: a bad template fails before any generation).
/// Tool-call rows come grouped by category: with a limit they are taken in
/// turn from each category (`--limit 100` is 20 of each of five).
fn load_task(opts: &EvalOptions) -> Result<(Vec<Example>, String, Vec<Prompt>)> {
    let mut examples = data::load_jsonl(&opts.data, opts.limit)?;
    let mut task = task_of(&examples, &opts.data)?;
    if let (Some(limit), "tools") = (opts.limit, task.as_str()) {
        let all = data::load_jsonl(&opts.data, None)?;
        examples = interleaved_by_category(all, limit);
        task = task_of(&examples, &opts.data)?;
    }
    if task == "tools" {
        let prompts = examples
            .iter()
            .map(|e| {
                tools_prompt(e)
                    .with_context(|| format!("{}: example {}", opts.data.display(), e.id))
            })
            .collect::<Result<Vec<_>>>()?;
        return Ok((examples, task, prompts));
    }
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
        .map(|e| data::render_template(&template, e).map(Prompt::User))
        .collect::<Result<Vec<_>>>()?;
    Ok((examples, task, prompts))
}

/// One example's chat-formatted prompt as token ids, for running the same
/// evaluation through another engine (llama.cpp: `scripts/compare.py`),
/// whose outputs `eval` then scores from the outputs file.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PromptRecord {
    pub id: String,
    pub task: String,
    pub prompt_token_ids: Vec<u32>,
    pub references: Vec<String>,
}

/// The prompts `run` would generate from (same template, chat format and
/// context check), without generating.
pub(crate) fn prompts(
    codec: &crate::engine::TextCodec,
    max_context: usize,
    opts: &EvalOptions,
) -> Result<Vec<PromptRecord>> {
    let (examples, task, prompts) = load_task(opts)?;
    let mut out = Vec::new();
    for (ex, prompt) in examples.iter().zip(&prompts) {
        let ids = prompt
            .ids(codec)
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
        let ids = prompt
            .ids(engine.codec())
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
        let mut out = match done.remove(&ex.id) {
            Some(previous) => previous,
            None => {
                let g = engine
                    .generate(
                        &ids,
                        &prompt.options(&opts.generate, engine.codec(), opts.call_thresholds)?,
                    )
                    .with_context(|| format!("example {}", ex.id))?;
                let mut out = example_output(ex, &g);
                if let Prompt::Tools { tools, .. } = prompt {
                    judge_tools(ex, tools, opts.lenient_calls, &mut out);
                }
                writeln!(file, "{}", serde_json::to_string(&out)?)?;
                file.flush()?;
                out
            }
        };
        // Judged again: the file may hold another engine's answers.
        if let Prompt::Tools { tools, .. } = prompt {
            judge_tools(ex, tools, opts.lenient_calls, &mut out);
        }
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
        ..Default::default()
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
        // A tools row's references are calls (objects), `[]` for none.
        if e.references.is_empty() && t != "tools" {
            bail!("{}: example {} has no references", path.display(), e.id);
        }
    }
    task.with_context(|| format!("{} has no examples", path.display()))
}

/// The tools task's metrics, as fractions (0–1): each category's share of
/// rows that pass BFCL's AST check, `overall` their unweighted mean (as
/// BFCL averages its categories), and `invalid_calls` (a count).
fn tools_metrics(outputs: &[ExampleOutput]) -> BTreeMap<String, f64> {
    let mut by: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for o in outputs {
        let e = by.entry(o.category.clone()).or_default();
        e.0 += f64::from(u8::from(o.passed == Some(true)));
        e.1 += 1.0;
    }
    let mut m: BTreeMap<String, f64> = by.iter().map(|(c, (p, n))| (c.clone(), p / n)).collect();
    let overall = m.values().sum::<f64>() / m.len().max(1) as f64;
    m.insert("overall".into(), overall);
    m.insert(
        "invalid_calls".into(),
        outputs.iter().map(|o| o.invalid_calls as f64).sum(),
    );
    m
}
