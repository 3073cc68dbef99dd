//! `selectinfer tune`: finds a catalog model's preset. Candidates are
//! configurations of the knobs that exist (dtype, mode, γ, φ, score, the
//! lm_head screen and its bits, vocab, dense layers), each a set of preset
//! keys over the built-in defaults. Three stages, each kept in a state
//! file so that an interrupted tune resumes where it stopped:
//! 1. **prune**: teacher-forced top-1 agreement with the model's dense q4
//!    on a few dev prompts per task ([`fidelity`]); a candidate below
//!    `min_top1` on any task is dropped;
//! 2. **measure**: decode tok/s and peak RSS of each survivor, each in a
//!    process of its own (`selectinfer bench`, the preset's keys as its
//!    flags), so that one's peak is not another's; above the memory budget
//!    is dropped;
//! 3. **score**: task metrics on `rows` dev rows per task (EM, ROUGE-L,
//!    BLEU) for dense q4 and then the survivors, fastest first; the first
//!    that keeps `floor` of dense q4's on every task is the preset, with
//!    its paired-bootstrap interval.

use crate::engine::{CallThresholds, EngineSpec, GenerateOptions};
use crate::method::Mode;
use crate::store::preset;
use crate::tools::eval::{self, EvalOptions, ExampleOutput};
use crate::tools::fidelity::{self, FidelityOptions, Lineup};
use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One configuration: preset keys and their values (flag text; lists
/// comma-separated), over the built-in defaults.
pub type Knobs = Vec<(String, String)>;

/// The candidates searched, from dense q4 (always first: the reference and
/// the fallback) to the selective modes, with and without the lm_head
/// screen. `layers` is the model's layer count (dense layers 0 and last).
pub fn candidates(layers: usize) -> Vec<Knobs> {
    let last = layers.saturating_sub(1);
    let k = |pairs: &[(&str, String)]| -> Knobs {
        let mut v: Knobs = vec![("dtype".into(), "q4".into())];
        v.extend(pairs.iter().map(|(a, b)| (a.to_string(), b.clone())));
        v
    };
    let s = |x: &str| x.to_string();
    let ends = format!("0,{last}");
    let screen4 = [("head_screen", s("64")), ("head_screen_bits", s("4"))];
    let screen2 = [("head_screen", s("256")), ("head_screen_bits", s("2"))];
    fn with<'a>(a: &[(&'a str, String)], b: &[(&'a str, String)]) -> Vec<(&'a str, String)> {
        [a, b].concat()
    }
    let load_only = |g: &str| {
        vec![
            ("mode", s("load-only")),
            ("load_ratio", s(g)),
            ("dense_layers", ends.clone()),
        ]
    };
    let core = vec![
        ("mode", s("coreinfer")),
        ("compute_ratio", s("0.9")),
        ("score", s("wina")),
        ("dense_layers", ends.clone()),
    ];
    vec![
        k(&[("mode", s("dense"))]),
        k(&with(&[("mode", s("dense"))], &screen4)),
        k(&with(&[("mode", s("dense"))], &screen2)),
        k(&with(
            &[("mode", s("dense")), ("vocab", s("latin"))],
            &screen2,
        )),
        k(&load_only("0.9")),
        k(&with(&load_only("0.9"), &screen4)),
        k(&with(&load_only("0.8"), &screen4)),
        k(&with(&core, &screen4)),
    ]
}

/// A configuration's short name (`mode=dense,head_screen=64,...`).
pub(crate) fn name(knobs: &Knobs) -> String {
    knobs
        .iter()
        .map(|(k, v)| format!("{k}={}", v.replace(',', ":")))
        .collect::<Vec<_>>()
        .join(",")
}

/// The flags of `selectinfer bench`/`eval` that set these knobs.
pub(crate) fn flags(knobs: &Knobs) -> Vec<String> {
    knobs
        .iter()
        .flat_map(|(k, v)| [format!("--{}", k.replace('_', "-")), v.clone()])
        .collect()
}

/// What a tune does and where it keeps its state.
pub struct TuneOptions {
    /// The catalog name (`--model NAME`: the benches resolve it too).
    pub model: String,
    /// The resolved spec with the built-in defaults (folder, ranking, task).
    pub base: EngineSpec,
    /// Dev task files (one per task).
    pub data: Vec<PathBuf>,
    /// Teacher-forced prompts per task, and positions per prompt.
    pub prune_prompts: usize,
    pub prune_tokens: usize,
    /// Least top-1 agreement with dense q4 on every task to survive pruning.
    pub min_top1: f64,
    /// Rows per task scored.
    pub rows: usize,
    /// Share of dense q4's task metric kept on every task.
    pub floor: f64,
    /// Peak RSS allowed (MiB); `None`: any.
    pub memory_budget_mb: Option<u64>,
    /// Compute threads of the benches (0: the machine's).
    pub threads: usize,
    /// Folder of the state file and the eval outputs.
    pub state_dir: PathBuf,
}

/// A survivor's speed and memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measured {
    pub decode_tokens_per_s: f64,
    pub ttft_s: f64,
    pub peak_rss_mib: f64,
}

/// One task's metric for a configuration, against dense q4's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Retention {
    pub task: String,
    pub metric: String,
    pub rows: usize,
    pub value: f64,
    pub dense: f64,
    /// value / dense (1 when both are 0).
    pub retention: f64,
    /// 5th and 95th percentile of the retention over paired resamples.
    pub interval: (f64, f64),
}

/// Everything a tune found so far (the state file; also its report).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct TuneState {
    /// Per candidate name: its per-task top-1 agreement with dense q4.
    pub top1: BTreeMap<String, BTreeMap<String, f64>>,
    pub measured: BTreeMap<String, Measured>,
    pub retention: BTreeMap<String, Vec<Retention>>,
    /// The chosen configuration's name.
    pub chosen: Option<String>,
}

impl TuneState {
    fn load(path: &Path) -> Result<Self> {
        match std::fs::read(path) {
            Ok(b) => serde_json::from_slice(&b)
                .with_context(|| format!("reading the tune state {}", path.display())),
            Err(_) => Ok(Self::default()),
        }
    }

    fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("json.partial");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
    }
}

/// The task metric a preset must keep, per task.
pub(crate) fn metric_of(task: &str) -> &'static str {
    match task {
        "translation" => "bleu",
        "summarization" => "rougeL",
        // BFCL rows: the mean of the categories' pass rates.
        "tools" => "overall",
        _ => "exact_match",
    }
}

/// New tokens per row when scoring: answers are short, summaries and
/// translations a sentence or two, parallel tool calls several objects.
fn new_tokens(task: &str) -> usize {
    match task {
        "qa" => 24,
        "tools" => 128,
        _ => 64,
    }
}

/// Runs the three stages (resuming from the state file) and returns the
/// state with the chosen configuration; `progress` hears each step.
pub fn run(
    opts: &TuneOptions,
    candidates: &[Knobs],
    progress: &mut dyn FnMut(&str),
) -> Result<TuneState> {
    std::fs::create_dir_all(&opts.state_dir)
        .with_context(|| format!("creating {}", opts.state_dir.display()))?;
    let state_path = opts.state_dir.join("tune.json");
    let mut st = TuneState::load(&state_path)?;
    let names: Vec<String> = candidates.iter().map(name).collect();

    // 1. Prune by teacher-forced agreement with dense q4.
    let todo: Vec<usize> = (0..candidates.len())
        .filter(|&i| !st.top1.contains_key(&names[i]))
        .collect();
    if !todo.is_empty() {
        progress(&format!(
            "prune: {} candidates, {} prompts per task, {} positions each",
            todo.len(),
            opts.prune_prompts,
            opts.prune_tokens
        ));
        let mut reference = EngineSpec {
            dtype: crate::sys::device::WeightDtype::Q4,
            mode: Mode::Dense,
            head_screen: 0,
            head_in_file: false,
            vocab: Default::default(),
            ..opts.base.clone()
        }
        .load()?;
        // One lineup: the reference's greedy continuations are computed
        // once for all candidates (engines differing only in φ, α, score
        // share one load).
        let descs: Vec<String> = todo
            .iter()
            .map(|&i| names[i].replace("dense_layers=", "dense="))
            .collect();
        let mut lineup = Lineup::load(&opts.base, &descs, &[])?;
        let fo = FidelityOptions {
            data: opts.data.clone(),
            limit: opts.prune_prompts,
            skip: 0,
            tokens: opts.prune_tokens,
        };
        let report =
            fidelity::run_with_progress(&mut reference, &mut lineup.candidates(), &fo, &mut |p| {
                progress(&format!("prune: {p}"))
            })?;
        // Columns come in the lineup's order; a non-selecting group is one
        // column named by its members joined with " = ".
        for (column, tasks) in lineup.names.iter().zip(&report) {
            let top1: BTreeMap<String, f64> = tasks
                .iter()
                .map(|t| (t.task.clone(), t.top1_agreement))
                .collect();
            for member in column.split(" = ") {
                let i = todo[descs
                    .iter()
                    .position(|d| d == member)
                    .context("a lineup column")?];
                progress(&format!("prune: {} top-1 {top1:?}", names[i]));
                st.top1.insert(names[i].clone(), top1.clone());
            }
        }
        st.save(&state_path)?;
    }
    let survivors: Vec<usize> = (0..candidates.len())
        .filter(|&i| i == 0 || st.top1[&names[i]].values().all(|&a| a >= opts.min_top1))
        .collect();

    // 2. Speed and memory, a process each.
    for &i in &survivors {
        if st.measured.contains_key(&names[i]) {
            continue;
        }
        progress(&format!("measure: {}", names[i]));
        let m = bench_process(&opts.model, &candidates[i], opts.threads)?;
        progress(&format!(
            "measure: {}: {:.1} tok/s, peak RSS {:.0} MiB",
            names[i], m.decode_tokens_per_s, m.peak_rss_mib
        ));
        st.measured.insert(names[i].clone(), m);
        st.save(&state_path)?;
    }
    let budget = opts.memory_budget_mb.map_or(f64::INFINITY, |b| b as f64);
    let mut order: Vec<usize> = survivors
        .iter()
        .copied()
        .filter(|&i| st.measured[&names[i]].peak_rss_mib <= budget)
        .collect();
    order.sort_by(|&a, &b| {
        let speed = |i: usize| st.measured[&names[i]].decode_tokens_per_s;
        speed(b).total_cmp(&speed(a))
    });

    // 3. Task metrics: dense q4 first, then the fastest survivors until one
    // keeps the floor everywhere.
    let dense_outputs = score_outputs(opts, &candidates[0], &names[0], progress)?;
    for &i in &order {
        let retention = match st.retention.get(&names[i]) {
            Some(r) => r.clone(),
            None => {
                let outputs = score_outputs(opts, &candidates[i], &names[i], progress)?;
                let r = retentions(&dense_outputs, &outputs)?;
                st.retention.insert(names[i].clone(), r.clone());
                st.save(&state_path)?;
                r
            }
        };
        let kept = retention.iter().all(|r| r.retention >= opts.floor);
        progress(&format!(
            "score: {}: {}",
            names[i],
            retention
                .iter()
                .map(|r| format!("{} {:.0} %", r.task, 100.0 * r.retention))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        if kept {
            st.chosen = Some(names[i].clone());
            st.save(&state_path)?;
            return Ok(st);
        }
    }
    bail!(
        "no candidate within {} MiB keeps {:.0} % of dense q4 on every task (state: {})",
        budget,
        100.0 * opts.floor,
        state_path.display()
    )
}

/// Each task's outputs for one configuration (eval's own JSONL files under
/// the state folder: an interrupted run resumes them).
fn score_outputs(
    opts: &TuneOptions,
    knobs: &Knobs,
    name: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<(String, Vec<ExampleOutput>)>> {
    let spec = fidelity::candidate_spec(&opts.base, &name.replace("dense_layers=", "dense="))
        .with_context(|| format!("candidate {name} ({})", flags(knobs).join(" ")))?;
    let mut engine = spec.load()?;
    let mut out = Vec::new();
    let slug: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    for data in &opts.data {
        let stem = data
            .file_stem()
            .map_or("data".into(), |s| s.to_string_lossy());
        let task = stem.split('_').next().unwrap_or("qa").to_string();
        let eo = EvalOptions {
            data: data.clone(),
            template: None,
            limit: Some(opts.rows),
            generate: GenerateOptions {
                max_new_tokens: new_tokens(&task),
                ..Default::default()
            },
            outputs: opts.state_dir.join(format!("{slug}.{stem}.jsonl")),
            lenient_calls: false,
            call_thresholds: CallThresholds::TUNED,
        };
        progress(&format!("score: {name} on {stem}, {} rows", opts.rows));
        eval::run(&mut engine, &eo)?;
        out.push(eval::outputs(&eo)?);
    }
    Ok(out)
}

/// Per task: the configuration's metric over dense q4's, with a paired
/// bootstrap interval (rows resampled together, 400 times).
fn retentions(
    dense: &[(String, Vec<ExampleOutput>)],
    other: &[(String, Vec<ExampleOutput>)],
) -> Result<Vec<Retention>> {
    let mut out = Vec::new();
    for ((task, d), (_, o)) in dense.iter().zip(other) {
        let metric = metric_of(task);
        let value = |rows: &[ExampleOutput]| -> Result<f64> {
            Ok(eval::score(task, rows)?.get(metric).copied().unwrap_or(0.0))
        };
        let ratio = |a: f64, b: f64| {
            if b == 0.0 {
                if a == 0.0 {
                    1.0
                } else {
                    f64::INFINITY
                }
            } else {
                a / b
            }
        };
        let n = d.len().min(o.len());
        let (dv, ov) = (value(&d[..n])?, value(&o[..n])?);
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let mut samples = Vec::with_capacity(400);
        for _ in 0..400 {
            let idx: Vec<usize> = (0..n).map(|_| rng.random_range(0..n)).collect();
            let pick = |rows: &[ExampleOutput]| -> Vec<ExampleOutput> {
                idx.iter().map(|&i| rows[i].clone()).collect()
            };
            samples.push(ratio(value(&pick(o))?, value(&pick(d))?));
        }
        samples.sort_by(f64::total_cmp);
        out.push(Retention {
            task: task.clone(),
            metric: metric.into(),
            rows: n,
            value: ov,
            dense: dv,
            retention: ratio(ov, dv),
            interval: (samples[20], samples[379]),
        });
    }
    Ok(out)
}

/// `selectinfer bench --json` of the model at these knobs, in a process of
/// its own (this executable), so that its peak RSS is its own.
fn bench_process(model: &str, knobs: &Knobs, threads: usize) -> Result<Measured> {
    let mut exe = std::env::current_exe().context("finding the selectinfer executable")?;
    // Rebuilt while a long tune runs: Linux names the old file "… (deleted)";
    // the new one at the same path is the executable meant.
    if let Some(path) = exe.to_str().and_then(|p| p.strip_suffix(" (deleted)")) {
        exe = PathBuf::from(path);
    }
    let mut cmd = std::process::Command::new(&exe);
    if threads > 0 {
        cmd.args(["--threads", &threads.to_string()]);
        cmd.env("RAYON_NUM_THREADS", threads.to_string());
    }
    cmd.args(["bench", "--model", model, "--no-preset", "--json"])
        .args(flags(knobs));
    let out = cmd
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    if !out.status.success() {
        bail!(
            "{} bench {} failed: {}",
            exe.display(),
            flags(knobs).join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("bench's JSON")?;
    let num = |k: &str| {
        v[k].as_f64()
            .with_context(|| format!("bench's JSON has no {k}"))
    };
    Ok(Measured {
        decode_tokens_per_s: num("decode_tokens_per_s")?,
        ttft_s: num("ttft_s")?,
        peak_rss_mib: num("peak_rss_bytes")? / 1048576.0,
    })
}

/// Writes the chosen configuration as `path`, a preset whose header says
/// how it was found and what was measured.
pub fn write_preset(
    path: &Path,
    command: &str,
    st: &TuneState,
    candidates: &[Knobs],
    opts: &TuneOptions,
) -> Result<()> {
    let chosen = st.chosen.as_ref().context("the tune chose nothing")?;
    let knobs = candidates
        .iter()
        .find(|k| &name(k) == chosen)
        .context("the chosen candidate is not among the candidates")?;
    let m = &st.measured[chosen];
    let dense = &st.measured[&name(&candidates[0])];
    let mut header = vec![
        format!("Preset of {}, written by `selectinfer tune`.", opts.model),
        format!("command: {command}"),
        format!(
            "date: {}, machine: {}",
            today(),
            machine()
        ),
        format!(
            "measured: decode {:.1} tok/s ({:.2}x this model's dense q4, {:.1} tok/s), TTFT {:.2} s, peak RSS {:.0} MiB{}",
            m.decode_tokens_per_s,
            m.decode_tokens_per_s / dense.decode_tokens_per_s,
            dense.decode_tokens_per_s,
            m.ttft_s,
            m.peak_rss_mib,
            opts.memory_budget_mb
                .map_or(String::new(), |b| format!(" (budget {b} MiB)"))
        ),
    ];
    for r in st.retention.get(chosen).into_iter().flatten() {
        header.push(format!(
            "retention on {} ({} dev rows): {} {:.1} vs dense q4 {:.1} = {:.0} % (paired bootstrap 90 %: {:.0}-{:.0} %)",
            r.task,
            r.rows,
            r.metric,
            r.value,
            r.dense,
            100.0 * r.retention,
            100.0 * r.interval.0,
            100.0 * r.interval.1
        ));
    }
    if chosen == &name(&candidates[0]) {
        header.push(
            "dense q4 itself: no candidate was faster within the budget and the floor.".into(),
        );
    }
    let values = knobs
        .iter()
        .map(|(k, v)| Ok((k.clone(), yaml_of(k, v)?)))
        .collect::<Result<Vec<_>>>()?;
    preset::write(path, &header, &values)
}

/// A knob's flag text as the YAML value a parameters file gives it.
fn yaml_of(key: &str, text: &str) -> Result<serde_yaml::Value> {
    use serde_yaml::Value;
    if matches!(key, "dense_layers" | "layer_drop") {
        let items = text
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| serde_yaml::from_str::<Value>(s.trim()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        return Ok(Value::Sequence(items));
    }
    // head_screen_bits is an integer parameter; names stay text.
    Ok(match serde_yaml::from_str::<Value>(text)? {
        v @ (Value::Number(_) | Value::Bool(_)) => v,
        _ => Value::String(text.to_string()),
    })
}

/// Today's date (UTC), `YYYY-MM-DD`.
fn today() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%d").to_string()
}

/// The CPU's model name and core count (`/proc/cpuinfo`), for the header.
fn machine() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = info
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')))
        .map_or("unknown CPU".to_string(), |(_, v)| v.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "{cpu}, {cores} cores, {} threads used",
        crate::sys::threads::current()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every candidate is made of preset keys, is a valid fidelity
    /// candidate, and survives the trip through a preset file unchanged
    /// (what the node and the flags then read).
    #[test]
    fn candidates_are_presets_that_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let base = EngineSpec::default();
        let all = candidates(24);
        assert_eq!(name(&all[0]), "dtype=q4,mode=dense");
        for knobs in &all {
            for (k, _) in knobs {
                assert!(
                    preset::KEYS.contains(&k.as_str()),
                    "{k} is not a preset key"
                );
            }
            let spec =
                fidelity::candidate_spec(&base, &name(knobs).replace("dense_layers=", "dense="))
                    .unwrap_or_else(|e| panic!("{}: {e:#}", name(knobs)));
            assert_eq!(spec.dtype, crate::sys::device::WeightDtype::Q4);
            if knobs.iter().any(|(k, _)| k == "dense_layers") {
                assert_eq!(spec.params.dense_layers, vec![0, 23], "{}", name(knobs));
            }
            let values: Vec<_> = knobs
                .iter()
                .map(|(k, v)| (k.clone(), yaml_of(k, v).unwrap()))
                .collect();
            let path = dir.path().join("p.yaml");
            preset::write(&path, &["t".into()], &values).unwrap();
            let back = preset::Preset::load(&path).unwrap();
            for (k, v) in knobs {
                assert_eq!(back.flag_text(k).as_deref(), Some(v.as_str()), "{k}");
            }
            let f = flags(knobs);
            assert_eq!(f.len(), 2 * knobs.len());
            assert!(f
                .iter()
                .step_by(2)
                .all(|x| x.starts_with("--") && !x.contains('_')));
        }
    }
}
