//! The offline profiler (SelectInfer phase 1): scores every FFN neuron of
//! every layer on prompts of several tasks and turns the scores into
//! rankings (see [`selectinfer::method::ranking`] for the file).
//!
//! Score of neuron n: s_n = Σ_t |a_n(t)|, with a = the input of `down_proj`
//! (silu(gate)·up), summed over the prompt tokens of a task plus up to
//! `generated_tokens` greedily generated tokens per example. Per task the sums
//! are divided by the task's token count; the base ranking of a task orders
//! its neurons by that; the model-wide (secondary) ranking orders them by the
//! mean of the tasks' normalised scores. Sums are accumulated in f64 per layer
//! straight from each forward pass (`Σ_t` over the batch first), so no
//! per-token activations are kept.
//!
//! A task's dataset is a JSONL file with a prompt template, or the prompts
//! recorded on one topic of a rosbag2 bag ([`DatasetSpec::topic`]), each
//! used as recorded (a conversation's earlier turns included).
//!
//! Each task's examples are also accumulated in two disjoint halves (even and
//! odd examples) so that [`ProfileRun::report`] can tell how stable the
//! rankings are.

use crate::bag::{self, RecordedPrompt};
use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use indicatif::{ProgressBar, ProgressStyle};
use selectinfer::engine::Engine;
use selectinfer::engine::{conversation, Message};
use selectinfer::method::ranking::{
    jaccard, LayerRanking, ModelIdentity, Ranking, RankingMeta, TaskMeta,
};
use selectinfer::tools::data;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One dataset to profile on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSpec {
    /// Task name (`translation`, `summarization`, `qa`, ...).
    pub task: String,
    /// JSONL file, or with `topic` a rosbag2 bag (a folder, `.mcap` or
    /// `.db3`); relative paths are relative to the working directory.
    pub path: PathBuf,
    /// Prompt template with `{field}` placeholders; chat-formatted
    /// afterwards. A bag's prompts are used as recorded: empty or
    /// `{prompt}` there. Empty for task `tools`: its rows (BFCL's form)
    /// carry `messages` and `functions`, rendered as eval renders them.
    #[serde(default)]
    pub template: String,
    /// Number of examples (the first N rows after `skip`; default: all).
    #[serde(default = "all_examples")]
    pub examples: usize,
    /// Rows passed over before the first profiled one, so that profiling
    /// can use rows an evaluation does not (`eval --limit N` scores the
    /// first N rows of the same files).
    #[serde(default)]
    pub skip: usize,
    /// Every how many rows one is taken after `skip` (default 1: each):
    /// spreads the examples over a file grouped by kind (BFCL's tools rows
    /// come grouped by category).
    #[serde(default = "one")]
    pub stride: usize,
    /// The bag topic whose prompts (`selectinfer_msgs/msg/Prompt` or
    /// `std_msgs/msg/String`) are the examples, in time order; `path` is
    /// then the bag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
}

/// `examples` meaning every row.
pub const ALL_EXAMPLES: usize = usize::MAX;

fn all_examples() -> usize {
    ALL_EXAMPLES
}

fn one() -> usize {
    1
}

/// The template recorded for a bag's prompts (used as recorded).
pub const BAG_TEMPLATE: &str = "{prompt}";

impl DatasetSpec {
    /// A bag's prompts on `topic` as the dataset of `task` (every prompt).
    pub fn bag(task: &str, bag: &Path, topic: &str) -> Self {
        Self {
            task: task.into(),
            path: bag.to_path_buf(),
            template: BAG_TEMPLATE.into(),
            examples: ALL_EXAMPLES,
            skip: 0,
            stride: 1,
            topic: Some(topic.into()),
        }
    }

    /// The dataset as recorded in the ranking file: the path, and a bag's topic.
    fn source(&self) -> String {
        match &self.topic {
            Some(topic) => format!("{} topic {topic}", self.path.display()),
            None => self.path.display().to_string(),
        }
    }
}

/// The profiler's configuration (`config/profile.yaml`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileConfig {
    pub model: PathBuf,
    pub output: PathBuf,
    /// Generated tokens scored per example after the prompt (greedy, stops at EOS).
    #[serde(default)]
    pub generated_tokens: usize,
    /// Prompts with more tokens than this are refused with an error.
    #[serde(default = "default_max_prompt_tokens")]
    pub max_prompt_tokens: usize,
    pub datasets: Vec<DatasetSpec>,
}

fn default_max_prompt_tokens() -> usize {
    2048
}

impl ProfileConfig {
    pub fn from_yaml(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading profile config {}", path.display()))?;
        serde_yaml::from_str(&text)
            .with_context(|| format!("{} is not a valid profile config", path.display()))
    }

    pub fn validate(&self) -> Result<()> {
        if self.datasets.is_empty() {
            bail!("the profile config lists no datasets");
        }
        let mut names: Vec<&str> = self.datasets.iter().map(|d| d.task.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            bail!("task '{}' is listed twice", w[0]);
        }
        for d in &self.datasets {
            if d.examples == 0 {
                bail!("dataset for task '{}' asks for 0 examples", d.task);
            }
            if d.stride == 0 {
                bail!(
                    "dataset for task '{}' has stride 0 (1 takes every row)",
                    d.task
                );
            }
            if d.task.is_empty() || d.task == selectinfer::method::ranking::MODEL_WIDE {
                bail!("invalid task name '{}'", d.task);
            }
            match &d.topic {
                None if d.template.is_empty() && d.task != "tools" => {
                    bail!("dataset for task '{}' has no template (only task tools, whose rows carry messages and functions, goes without)", d.task)
                }
                Some(t) if t.trim().is_empty() => {
                    bail!("dataset for task '{}' names an empty topic", d.task)
                }
                Some(_) if !d.template.is_empty() && d.template != BAG_TEMPLATE => bail!(
                    "dataset for task '{}' is a bag: its prompts are used as recorded, so its template must be empty or {BAG_TEMPLATE}",
                    d.task
                ),
                _ => {}
            }
        }
        Ok(())
    }
}

/// Σ|a| per layer and neuron, plus the number of tokens summed.
#[derive(Debug, Clone)]
struct Sums {
    per_layer: Vec<Vec<f64>>,
    tokens: u64,
}

impl Sums {
    fn new(layers: usize, width: usize) -> Self {
        Self {
            per_layer: vec![vec![0.0; width]; layers],
            tokens: 0,
        }
    }

    /// Adds Σ_t |a(t)| of activations `a [1, seq, N]` to `layer`.
    fn add(&mut self, layer: usize, a: &Tensor) -> Result<()> {
        let col = a.abs()?.sum_keepdim(1)?.flatten_all()?.to_vec1::<f32>()?;
        for (s, v) in self.per_layer[layer].iter_mut().zip(col) {
            *s += f64::from(v);
        }
        Ok(())
    }

    fn merged(&self, other: &Sums) -> Sums {
        Sums {
            per_layer: self
                .per_layer
                .iter()
                .zip(&other.per_layer)
                .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x + y).collect())
                .collect(),
            tokens: self.tokens + other.tokens,
        }
    }

    /// Scores normalised by the token count.
    fn normalised(&self) -> Vec<Vec<f64>> {
        let t = self.tokens.max(1) as f64;
        self.per_layer
            .iter()
            .map(|l| l.iter().map(|s| s / t).collect())
            .collect()
    }
}

fn to_f32(v: &[Vec<f64>]) -> Vec<Vec<f32>> {
    v.iter()
        .map(|l| l.iter().map(|&x| x as f32).collect())
        .collect()
}

/// One task's accumulated result.
pub struct TaskResult {
    pub meta: TaskMeta,
    /// Even- and odd-indexed examples, kept apart for the stability check.
    halves: [Sums; 2],
}

/// Everything a profiling run produced.
pub struct ProfileRun {
    pub ranking: Ranking,
    pub tasks: Vec<TaskResult>,
    pub seconds: f64,
    pub tokens: u64,
}

impl ProfileRun {
    pub fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.seconds.max(1e-9)
    }

    /// Half-split rankings of a task (examples 0, 2, 4, ... vs 1, 3, 5, ...).
    pub fn half_rankings(&self, task: &str) -> Option<[LayerRanking; 2]> {
        let t = self.tasks.iter().find(|t| t.meta.name == task)?;
        Some([0, 1].map(|h| LayerRanking::from_scores(to_f32(&t.halves[h].normalised()))))
    }
}

/// A task's prompts, ready to run.
struct TaskJob<'a> {
    spec: &'a DatasetSpec,
    prompts: Vec<Vec<u32>>,
    dataset_sha256: String,
    skipped_too_long: usize,
}

/// A dataset's rows: JSONL examples, or the prompts of a bag topic.
enum Rows {
    Jsonl(Vec<data::Example>),
    Bag(Vec<RecordedPrompt>),
}

/// Reads a dataset and tokenizes the chat-formatted prompts of its first
/// `spec.examples` rows (after `skip`) that fit in `max_prompt_tokens`;
/// longer ones are skipped (and counted, and logged), and so are a bag's
/// prompts the node refuses (empty, or a conversation that does not end
/// with the user's turn: logged).
fn task_job<'a>(
    engine: &Engine,
    spec: &'a DatasetSpec,
    max_prompt_tokens: usize,
) -> Result<TaskJob<'a>> {
    let (rows, dataset_sha256) = match &spec.topic {
        None => {
            let examples = data::load_jsonl(&spec.path, None)
                .with_context(|| format!("loading the '{}' dataset", spec.task))?;
            let (_, sha) = selectinfer::model::sha256_file(&spec.path)?;
            (Rows::Jsonl(examples), sha)
        }
        Some(topic) => {
            let recorded = bag::read_prompts(&spec.path, topic)
                .with_context(|| format!("loading the '{}' dataset", spec.task))?;
            (Rows::Bag(recorded.prompts), recorded.sha256)
        }
    };
    let len = match &rows {
        Rows::Jsonl(e) => e.len(),
        Rows::Bag(p) => p.len(),
    };
    if spec.skip >= len {
        bail!(
            "task '{}': skip {} leaves none of the {len} rows of {}",
            spec.task,
            spec.skip,
            spec.source()
        );
    }
    let mut prompts = Vec::with_capacity(spec.examples.min(len));
    let (mut skipped, mut refused) = (0, 0);
    for i in (spec.skip..len).step_by(spec.stride.max(1)) {
        if prompts.len() == spec.examples {
            break;
        }
        let (label, ids) = match &rows {
            // Tool-call rows (BFCL's `messages` and `functions`) as eval
            // renders them, the functions shown; others through the template.
            Rows::Jsonl(examples) if spec.template.is_empty() => {
                let e = &examples[i];
                let label = format!("example {}", e.id);
                let ids = selectinfer::tools::eval::tools_prompt_ids(&engine.codec, e)
                    .with_context(|| {
                        format!("task '{}' {label} (no template: a tools row)", spec.task)
                    })?;
                (label, ids)
            }
            Rows::Jsonl(examples) => {
                let e = &examples[i];
                let text = data::render_template(&spec.template, e)
                    .with_context(|| format!("rendering prompts of task '{}'", spec.task))?;
                let label = format!("example {}", e.id);
                let ids = engine
                    .codec
                    .chat_prompt_ids(&text)
                    .with_context(|| format!("task '{}' {label}", spec.task))?;
                (label, ids)
            }
            Rows::Bag(recorded) => {
                let p = &recorded[i];
                let label = format!("message {i}");
                let earlier: Vec<Message> = p
                    .messages
                    .iter()
                    .map(|(role, content)| Message::new(role, content))
                    .collect();
                let turns = match conversation("", &earlier, &p.prompt) {
                    Ok(turns) => turns,
                    Err(e) => {
                        log::warn!(
                            "task '{}': skipping {label} of {}: {e:#} (the node refuses it too)",
                            spec.task,
                            spec.source()
                        );
                        refused += 1;
                        continue;
                    }
                };
                let ids = engine
                    .codec
                    .chat_ids(&turns)
                    .with_context(|| format!("task '{}' {label}", spec.task))?;
                (label, ids)
            }
        };
        if ids.len() > max_prompt_tokens {
            log::warn!(
                "task '{}': skipping {label} ({} prompt tokens > max_prompt_tokens {max_prompt_tokens})",
                spec.task,
                ids.len()
            );
            skipped += 1;
            continue;
        }
        prompts.push(ids);
    }
    if prompts.is_empty() {
        bail!(
            "task '{}': no example of {} fits in {max_prompt_tokens} prompt tokens{}",
            spec.task,
            spec.source(),
            if refused > 0 {
                format!(" ({refused} empty or invalid prompts skipped)")
            } else {
                String::new()
            }
        );
    }
    if prompts.len() < spec.examples && spec.examples != ALL_EXAMPLES {
        log::warn!(
            "task '{}': only {} usable examples (asked for {})",
            spec.task,
            prompts.len(),
            spec.examples
        );
    }
    Ok(TaskJob {
        spec,
        prompts,
        dataset_sha256,
        skipped_too_long: skipped,
    })
}

/// Runs the profiler. With `score == false` the same forward passes run
/// without any accounting (the baseline for the profiler's overhead) and the
/// returned ranking holds zeros.
pub fn run(
    engine: &Engine,
    model_dir: &Path,
    cfg: &ProfileConfig,
    score: bool,
) -> Result<ProfileRun> {
    cfg.validate()?;
    let mcfg = engine.model.config().clone();
    let (layers, width) = (mcfg.num_hidden_layers, mcfg.intermediate_size);
    // Load and tokenize everything first: bad datasets fail before any work.
    let jobs = cfg
        .datasets
        .iter()
        .map(|spec| {
            task_job(
                engine,
                spec,
                cfg.max_prompt_tokens.min(engine.model.max_context() - 1),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let total: u64 = jobs.iter().map(|j| j.prompts.len() as u64).sum();
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "{msg:14} [{bar:30}] {pos}/{len} examples, {per_sec} ({eta} left)",
        )
        .expect("static progress template")
        .progress_chars("=> "),
    );
    let start = Instant::now();
    let mut all_tokens = 0u64;
    let mut tasks = Vec::new();
    for job in jobs {
        let (spec, prompt_ids) = (job.spec, &job.prompts);
        bar.set_message(spec.task.clone());
        let mut halves = [Sums::new(layers, width), Sums::new(layers, width)];
        for (i, ids) in prompt_ids.iter().enumerate() {
            let sums = &mut halves[i % 2];
            let tokens = profile_example(engine, ids, cfg.generated_tokens, score.then_some(sums))?;
            halves[i % 2].tokens += tokens;
            all_tokens += tokens;
            bar.inc(1);
            let secs = start.elapsed().as_secs_f64();
            bar.set_message(format!(
                "{} {:.0} tok/s",
                spec.task,
                all_tokens as f64 / secs.max(1e-9)
            ));
        }
        let tokens = halves[0].tokens + halves[1].tokens;
        tasks.push(TaskResult {
            meta: TaskMeta {
                name: spec.task.clone(),
                dataset: spec.source(),
                dataset_sha256: job.dataset_sha256,
                skip: spec.skip,
                stride: spec.stride,
                examples: prompt_ids.len(),
                skipped_too_long: job.skipped_too_long,
                tokens,
                prompt_template: if spec.topic.is_some() {
                    BAG_TEMPLATE.to_string()
                } else {
                    spec.template.clone()
                },
            },
            halves,
        });
    }
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    let ranking = build_ranking(&mcfg, model_dir, cfg, &tasks)?;
    Ok(ProfileRun {
        ranking,
        tasks,
        seconds,
        tokens: all_tokens,
    })
}

/// Prefill (and optional greedy generation) of one prompt; adds Σ|a| to
/// `sums` when given. Returns the number of tokens run.
fn profile_example(
    engine: &Engine,
    prompt: &[u32],
    generated: usize,
    mut sums: Option<&mut Sums>,
) -> Result<u64> {
    let model = &engine.model;
    let mut cache = model.new_cache();
    let mut observe = |layer: usize, a: &Tensor| -> Result<()> {
        if let Some(s) = sums.as_deref_mut() {
            s.add(layer, a)?;
        }
        Ok(())
    };
    let limit = generated.min(model.max_context().saturating_sub(prompt.len() + 1));
    let mut logits = model.forward_observed(prompt, &mut cache, &mut observe)?;
    let mut tokens = prompt.len() as u64;
    let stop = engine.codec.stop_ids();
    for _ in 0..limit {
        let next = logits.argmax(0)?.to_scalar::<u32>()?;
        if stop.contains(&next) {
            break;
        }
        logits = model.forward_observed(&[next], &mut cache, &mut observe)?;
        tokens += 1;
    }
    Ok(tokens)
}

fn build_ranking(
    mcfg: &selectinfer::model::Config,
    model_dir: &Path,
    cfg: &ProfileConfig,
    tasks: &[TaskResult],
) -> Result<Ranking> {
    let normalised: Vec<Vec<Vec<f64>>> = tasks
        .iter()
        .map(|t| t.halves[0].merged(&t.halves[1]).normalised())
        .collect();
    let n_tasks = normalised.len() as f64;
    let mean: Vec<Vec<f64>> = (0..mcfg.num_hidden_layers)
        .map(|l| {
            (0..mcfg.intermediate_size)
                .map(|i| normalised.iter().map(|t| t[l][i]).sum::<f64>() / n_tasks)
                .collect()
        })
        .collect();
    Ok(Ranking {
        meta: RankingMeta {
            format: selectinfer::method::ranking::FORMAT.to_string(),
            version: selectinfer::method::ranking::VERSION,
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            model: ModelIdentity::new(mcfg, selectinfer::model::weights_sha256(model_dir)?),
            tasks: tasks.iter().map(|t| t.meta.clone()).collect(),
            generated_tokens: cfg.generated_tokens,
            score: "sum over tokens of |silu(gate)*up| (down_proj input), divided by the task's token count; model_wide = mean over tasks".to_string(),
        },
        tasks: tasks
            .iter()
            .zip(&normalised)
            .map(|(t, n)| (t.meta.name.clone(), LayerRanking::from_scores(to_f32(n))))
            .collect(),
        model_wide: LayerRanking::from_scores(to_f32(&mean)),
    })
}

/// Share of a layer's total score held by its top `frac` neurons.
pub fn mass_share(r: &LayerRanking, layer: usize, frac: f64) -> f64 {
    let scores = &r.scores[layer];
    let total: f64 = scores.iter().map(|&s| f64::from(s)).sum();
    let k = (frac * scores.len() as f64).round() as usize;
    let top: f64 = r
        .top(layer, k)
        .iter()
        .map(|&i| f64::from(scores[i as usize]))
        .sum();
    if total > 0.0 {
        top / total
    } else {
        0.0
    }
}

impl ProfileRun {
    /// Markdown analysis of the "dual structure": per layer, overlap of the
    /// top-30% sets between tasks and with the model-wide set, concentration
    /// of the score mass, and split-half stability of each task's ranking.
    pub fn report(&self, title: &str) -> String {
        const TOP: f64 = 0.3;
        let r = &self.ranking;
        let names = r.task_names();
        let (layers, width) = (
            r.meta.model.num_hidden_layers,
            r.meta.model.intermediate_size,
        );
        let k = (TOP * width as f64).round() as usize;
        let halves: Vec<[LayerRanking; 2]> =
            names.iter().filter_map(|t| self.half_rankings(t)).collect();
        let pairs: Vec<(usize, usize)> = (0..names.len())
            .flat_map(|a| (a + 1..names.len()).map(move |b| (a, b)))
            .collect();
        let mut s = format!("### {title}\n\n");
        s += &format!(
            "{} layers × {width} neurons; tasks: {}. Top set = top 30% ({k} neurons) by normalised score. \
             Two random 30% sets overlap with Jaccard ≈ 0.18.\n\n",
            layers,
            r.meta.tasks.iter().map(|t| format!("{} ({} examples, {} tokens)", t.name, t.examples, t.tokens)).collect::<Vec<_>>().join(", ")
        );
        let mut header = "| layer |".to_string();
        for &(a, b) in &pairs {
            header += &format!(" J({},{}) |", names[a], names[b]);
        }
        for n in &names {
            header += &format!(" J({n},all) |");
        }
        header += " mass top10% | top30% | top50% |";
        for n in &names {
            header += &format!(" split-half J({n}) |");
        }
        s += &header;
        s += "\n|";
        s += &"---|".repeat(header.matches('|').count() - 1);
        s += "\n";
        let cols = pairs.len() + 2 * names.len() + 3;
        let mut sums = vec![0f64; cols];
        for l in 0..layers {
            let mut row = Vec::with_capacity(cols);
            for &(a, b) in &pairs {
                row.push(jaccard(
                    r.tasks[names[a]].top(l, k),
                    r.tasks[names[b]].top(l, k),
                ));
            }
            for n in &names {
                row.push(jaccard(r.tasks[*n].top(l, k), r.model_wide.top(l, k)));
            }
            for frac in [0.1, 0.3, 0.5] {
                row.push(
                    names
                        .iter()
                        .map(|n| mass_share(&r.tasks[*n], l, frac))
                        .sum::<f64>()
                        / names.len() as f64,
                );
            }
            for h in &halves {
                row.push(jaccard(h[0].top(l, k), h[1].top(l, k)));
            }
            for (acc, v) in sums.iter_mut().zip(&row) {
                *acc += v;
            }
            s += &format!(
                "| {l} |{}\n",
                row.iter().map(|v| format!(" {v:.3} |")).collect::<String>()
            );
        }
        s += &format!(
            "| **mean** |{}\n",
            sums.iter()
                .map(|v| format!(" **{:.3}** |", v / layers as f64))
                .collect::<String>()
        );
        s += "\nMass columns: share of the layer's Σ|a| held by its top 10/30/50% neurons (mean over tasks).\n";
        s
    }
}
