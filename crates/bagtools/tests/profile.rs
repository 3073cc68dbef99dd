//! The profiler and its ranking files, on the real SmolLM2 weights with a
//! few examples per task.

#[path = "../../../tests/common/mod.rs"]
mod common;

use selectinfer::engine::Engine;
use selectinfer::method::ranking::{Ranking, MODEL_WIDE};
use selectinfer::model::{weights_sha256, Config, LoadOptions};
use selectinfer_bagtools::profile::{self, DatasetSpec, ProfileConfig};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const MODEL: &str = "smollm2-135m-instruct";

fn data(file: &str) -> PathBuf {
    common::repo_root().join("../shared/data").join(file)
}

fn config(output: &Path, examples: usize) -> ProfileConfig {
    let spec = |task: &str, file: &str, template: &str| DatasetSpec {
        task: task.into(),
        path: data(file),
        template: template.into(),
        examples,
        skip: 0,
        stride: 1,
        topic: None,
    };
    ProfileConfig {
        model: common::model_dir(MODEL),
        output: output.to_path_buf(),
        generated_tokens: 2,
        max_prompt_tokens: 2048,
        datasets: vec![
            spec(
                "translation",
                "translation_wmt22_deen.dev.jsonl",
                "Translate to English:\n\n{source}",
            ),
            spec(
                "summarization",
                "summarization_xsum.dev.jsonl",
                "Summarize in one sentence:\n\n{document}",
            ),
            spec(
                "qa",
                "qa_squad11.dev.jsonl",
                "Context: {context}\n\nQuestion: {question}",
            ),
        ],
    }
}

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine::load(&common::model_dir(MODEL), &LoadOptions::default()).unwrap())
}

/// A ranking profiled once (2 examples per task) and saved; shared by tests.
fn ranking_file() -> &'static (tempfile::TempDir, PathBuf) {
    static FILE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.safetensors");
        let cfg = config(&path, 2);
        let run = profile::run(engine(), &cfg.model, &cfg, true).unwrap();
        run.ranking.save(&path).unwrap();
        (dir, path)
    })
}

/// The profiler's error for `cfg`, with its context chain.
fn run_err(cfg: &ProfileConfig) -> String {
    format!(
        "{:#}",
        profile::run(engine(), &cfg.model, cfg, true).err().unwrap()
    )
}

fn load_err(r: &Ranking) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.safetensors");
    r.save(&path).unwrap();
    format!("{:#}", Ranking::load(&path).unwrap_err())
}

#[test]
fn ranking_file_has_the_documented_shape_and_metadata() {
    let r = Ranking::load(&ranking_file().1).unwrap();
    let cfg = Config::from_file(&common::model_dir(MODEL).join("config.json")).unwrap();
    assert_eq!(r.task_names(), ["qa", "summarization", "translation"]);
    assert_eq!(r.meta.format, "selectinfer-neuron-ranking");
    assert_eq!(r.meta.version, 1);
    assert_eq!(r.meta.model.architecture, "llama");
    assert_eq!(r.meta.model.intermediate_size, 1536);
    r.check_model(&cfg, &weights_sha256(&common::model_dir(MODEL)).unwrap())
        .unwrap();
    for t in &r.meta.tasks {
        assert_eq!(t.examples, 2);
        assert!(
            t.tokens > 20,
            "task {} scored only {} tokens",
            t.name,
            t.tokens
        );
        assert_eq!(t.dataset_sha256.len(), 64);
        assert!(t.prompt_template.contains('{'));
    }
    for ranking in r.tasks.values().chain([&r.model_wide]) {
        assert_eq!(ranking.scores.len(), 30);
        for (scores, order) in ranking.scores.iter().zip(&ranking.order) {
            assert_eq!(scores.len(), 1536);
            assert!(scores.iter().all(|s| s.is_finite() && *s >= 0.0));
            assert!(
                scores[order[0] as usize] > scores[order[1535] as usize],
                "scores must vary"
            );
        }
    }
    // model_wide is the mean of the tasks' normalised scores.
    let mean = r.tasks.values().map(|t| t.scores[7][100]).sum::<f32>() / 3.0;
    assert!((r.model_wide.scores[7][100] - mean).abs() <= 1e-6 * mean.max(1.0));
}

/// `skip` moves the profiled rows past the ones an evaluation scores: the
/// file records it, and the translation scores are those of other rows
/// (the tasks left at row 0 keep theirs).
#[test]
fn skipped_rows_are_not_profiled_and_the_skip_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir.path().join("skip.safetensors"), 2);
    cfg.datasets[0].skip = 200;
    let skipped = profile::run(engine(), &cfg.model, &cfg, true)
        .unwrap()
        .ranking;
    let first = Ranking::load(&ranking_file().1).unwrap();
    let skips: Vec<(&str, usize)> = skipped
        .meta
        .tasks
        .iter()
        .map(|t| (t.name.as_str(), t.skip))
        .collect();
    assert_eq!(
        skips,
        [("translation", 200), ("summarization", 0), ("qa", 0)]
    );
    assert_ne!(
        skipped.task("translation").unwrap().scores,
        first.task("translation").unwrap().scores
    );
    assert_eq!(
        skipped.task("qa").unwrap().scores,
        first.task("qa").unwrap().scores
    );
}

/// A `tools` task needs no template: its BFCL rows are rendered as eval
/// renders them (the functions shown), and `stride` spreads the examples
/// over the file's categories (rows 0 and 250: simple_python, multiple).
#[test]
fn a_tools_task_profiles_bfcl_rows_with_a_stride() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir.path().join("tools.safetensors"), 2);
    cfg.datasets = vec![DatasetSpec {
        task: "tools".into(),
        path: data("tools_bfcl.dev.jsonl"),
        template: String::new(),
        examples: 2,
        skip: 0,
        stride: 250,
        topic: None,
    }];
    let r = profile::run(engine(), &cfg.model, &cfg, true)
        .unwrap()
        .ranking;
    let t = &r.meta.tasks[0];
    assert_eq!((t.name.as_str(), t.stride, t.examples), ("tools", 250, 2));
    // The functions were in the prompts: far more tokens than the questions.
    assert!(t.tokens > 2 * 150, "{} tokens", t.tokens);
    // Any other task still needs its template.
    cfg.datasets[0].task = "qa".into();
    assert!(run_err(&cfg).contains("no template"));
    cfg.datasets[0].task = "tools".into();
    cfg.datasets[0].stride = 0;
    assert!(run_err(&cfg).contains("stride 0"));
}

#[test]
fn same_inputs_give_a_byte_identical_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("again.safetensors");
    let cfg = config(&path, 2);
    profile::run(engine(), &cfg.model, &cfg, true)
        .unwrap()
        .ranking
        .save(&path)
        .unwrap();
    let a = std::fs::read(&ranking_file().1).unwrap();
    let b = std::fs::read(&path).unwrap();
    assert!(a == b, "two profiling runs wrote different files");
}

#[test]
fn ranking_for_another_model_is_refused() {
    let r = Ranking::load(&ranking_file().1).unwrap();
    let qwen = common::model_dir("qwen2.5-coder-0.5b-instruct");
    let cfg = Config::from_file(&qwen.join("config.json")).unwrap();
    let e = format!(
        "{:#}",
        r.check_model(&cfg, &weights_sha256(&qwen).unwrap())
            .unwrap_err()
    );
    assert!(e.contains("another model") && e.contains("qwen2"), "{e}");
    // Same shapes, different weights: still refused.
    let own = Config::from_file(&common::model_dir(MODEL).join("config.json")).unwrap();
    let e = format!("{:#}", r.check_model(&own, &"0".repeat(64)).unwrap_err());
    assert!(e.contains("weights sha256"), "{e}");
}

#[test]
fn malformed_files_are_refused() {
    let good = Ranking::load(&ranking_file().1).unwrap();

    let bytes = std::fs::read(&ranking_file().1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let truncated = dir.path().join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let e = format!("{:#}", Ranking::load(&truncated).unwrap_err());
    assert!(e.contains("truncated or corrupt"), "{e}");

    let mut r = good.clone();
    r.meta.version = 2;
    assert!(load_err(&r).contains("version 2 is not supported"));

    let mut r = good.clone();
    r.tasks.get_mut("qa").unwrap().scores[3][5] = f32::NAN;
    assert!(
        load_err(&r).contains("invalid score NaN"),
        "{}",
        load_err(&r)
    );

    let mut r = good.clone();
    let order = &mut r.model_wide.order[4];
    order[1] = order[0];
    assert!(load_err(&r).contains("twice"), "{}", load_err(&r));

    let mut r = good.clone();
    r.tasks.get_mut("translation").unwrap().order[0][0] = 99_999;
    assert!(
        load_err(&r).contains("out-of-range neuron index 99999"),
        "{}",
        load_err(&r)
    );

    let mut r = good.clone();
    r.tasks.get_mut("summarization").unwrap().order[2].swap(0, 1535);
    assert!(
        load_err(&r).contains("not by descending score"),
        "{}",
        load_err(&r)
    );

    let missing = dir.path().join("nope.safetensors");
    assert!(format!("{:#}", Ranking::load(&missing).unwrap_err()).contains("nope.safetensors"));
    assert!(good
        .task("navigation")
        .unwrap_err()
        .to_string()
        .contains("qa, summarization, translation"));
    assert!(good.tasks.contains_key("qa") && !good.tasks.contains_key(MODEL_WIDE));
}

#[test]
fn empty_or_missing_datasets_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir.path().join("x.safetensors"), 1);
    cfg.datasets[1].path = dir.path().join("missing.jsonl");
    let e = run_err(&cfg);
    assert!(
        e.contains("missing.jsonl") && e.contains("summarization"),
        "{e}"
    );

    std::fs::write(dir.path().join("empty.jsonl"), "\n").unwrap();
    cfg.datasets[1].path = dir.path().join("empty.jsonl");
    let e = run_err(&cfg);
    assert!(e.contains("has no examples"), "{e}");

    let mut cfg = config(&dir.path().join("x.safetensors"), 1);
    cfg.datasets[0].template = "{nonexistent_field}".into();
    let e = run_err(&cfg);
    assert!(e.contains("'nonexistent_field'"), "{e}");

    let mut cfg = config(&dir.path().join("x.safetensors"), 1);
    cfg.datasets[1].skip = 500;
    let e = run_err(&cfg);
    assert!(
        e.contains("skip 500 leaves none of the 500 rows") && e.contains("summarization"),
        "{e}"
    );

    let mut cfg = config(&dir.path().join("x.safetensors"), 1);
    cfg.datasets.clear();
    assert!(run_err(&cfg).contains("no datasets"));
}

#[test]
fn profiler_binary_writes_a_ranking_and_rejects_bad_config() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cli.safetensors");
    let cfg_path = dir.path().join("profile.yaml");
    std::fs::write(&cfg_path, serde_yaml::to_string(&config(&out, 1)).unwrap()).unwrap();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_selectinfer_profile"))
        .args([
            "--config",
            cfg_path.to_str().unwrap(),
            "--generated-tokens",
            "0",
        ])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(Ranking::load(&out).unwrap().meta.generated_tokens, 0);

    std::fs::write(&cfg_path, "model: x\noutput: y\ndatasets: []\nbogus: 1\n").unwrap();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_selectinfer_profile"))
        .args(["--config", cfg_path.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        !run.status.success()
            && stderr.contains("not a valid profile config")
            && !stderr.contains("panicked"),
        "{stderr}"
    );
}
