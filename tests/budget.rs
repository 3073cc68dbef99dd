//! The memory budget (`--memory-budget-mb`) on the real models: for three
//! budgets per model the chosen γ grows with the budget and the measured
//! peak RSS of a generation with a long prompt stays within it; budgets it
//! cannot meet are refused at start-up naming the floor. (The capped-memory
//! demonstration under a real cgroup limit is `scripts/fit_demo.sh`.)

mod common;

use std::process::{Command, Output};

fn selectinfer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_selectinfer"))
        .args(args)
        .output()
        .expect("running selectinfer")
}

/// `generate` of `model` (a folder under models/) with `extra` flags at a
/// 512-token context, prefilled 128 tokens at a time.
fn generate(model: &str, prompt: &str, extra: &[&str]) -> Output {
    let dir = common::model_dir(model);
    let mut args = vec![
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--max-context",
        "512",
        "--prefill-chunk",
        "128",
        "--max-new-tokens",
        "16",
        "--json",
        "--prompt",
        prompt,
    ];
    args.extend_from_slice(extra);
    selectinfer(&args)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// γ the logged plan chose.
fn planned_gamma(log: &str) -> f64 {
    let at = log.find("load_ratio ").expect("a memory plan in the log") + "load_ratio ".len();
    log[at..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// About 400 tokens: prefill runs several chunks and the KV cache grows.
fn long_prompt() -> String {
    "The robot drove along the corridor and checked each door of the lab. ".repeat(25)
        + "Which doors did the robot check?"
}

fn budgets_are_honoured(model: &str, dtype: &str, budgets: [u64; 3]) {
    let prompt = long_prompt();
    let mut last = 0.0;
    for mb in budgets {
        let b = mb.to_string();
        let out = generate(
            model,
            &prompt,
            &[
                "--dtype",
                dtype,
                "--mode",
                "load-only",
                "--memory-budget-mb",
                &b,
            ],
        );
        let log = stderr(&out);
        assert!(out.status.success(), "{model} {dtype} at {mb} MiB: {log}");
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(r["prompt_tokens"].as_u64().unwrap() > 300, "{r}");
        let peak = r["peak_rss_bytes"].as_u64().unwrap();
        assert!(
            peak > 0 && peak <= mb << 20,
            "{model} {dtype}: peak RSS {peak} B over the budget of {mb} MiB"
        );
        let gamma = planned_gamma(&log);
        assert!(
            gamma > last && gamma <= 1.0,
            "γ {gamma} at {mb} MiB after {last}"
        );
        last = gamma;
    }
}

#[test]
fn smollm2_f16_stays_within_three_budgets() {
    budgets_are_honoured("smollm2-135m-instruct", "f16", [250, 290, 330]);
}

#[test]
fn qwen_q4_stays_within_three_budgets() {
    budgets_are_honoured("qwen2.5-coder-0.5b-instruct", "q4", [400, 440, 480]);
}

#[test]
fn a_budget_below_the_floor_is_refused_naming_it() {
    let m = "smollm2-135m-instruct";
    let out = generate(
        m,
        "hi",
        &[
            "--dtype",
            "f32",
            "--mode",
            "selectinfer",
            "--memory-budget-mb",
            "100",
        ],
    );
    let log = stderr(&out);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains("memory budget 100 MiB is below the floor of "),
        "{log}"
    );
    assert!(
        log.contains("load_ratio 0.4"),
        "names the φ it keeps: {log}"
    );
    // Dense has no γ to give up: the budget must hold every neuron.
    let out = generate(
        m,
        "hi",
        &[
            "--dtype",
            "f32",
            "--mode",
            "dense",
            "--memory-budget-mb",
            "200",
        ],
    );
    assert!(
        stderr(&out).contains("holds every FFN neuron"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("panicked"));
}

#[test]
fn zero_and_negative_budgets_are_refused() {
    let m = "smollm2-135m-instruct";
    let out = generate(m, "hi", &["--mode", "load-only", "--memory-budget-mb", "0"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("memory_budget_mb must be a positive number of MiB"),
        "{}",
        stderr(&out)
    );
    let out = generate(m, "hi", &["--mode", "load-only", "--memory-budget-mb=-5"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--memory-budget-mb"),
        "{}",
        stderr(&out)
    );
}
