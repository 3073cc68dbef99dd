//! `selectinfer eval` on the real SmolLM2 weights, a few examples per task.

mod common;

use std::process::{Command, Output};

fn eval(args: &[&str]) -> Output {
    let model = common::model_dir("smollm2-135m-instruct");
    Command::new(env!("CARGO_BIN_EXE_selectinfer"))
        .args(["eval", "--model", model.to_str().unwrap(), "--json"])
        .args(args)
        .output()
        .expect("running selectinfer eval")
}

fn data(file: &str) -> String {
    common::repo_root()
        .join("../shared/data")
        .join(file)
        .to_str()
        .unwrap()
        .to_string()
}

fn report(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn each_task_is_scored_and_outputs_are_saved_and_resumed() {
    let dir = tempfile::tempdir().unwrap();
    for (file, metrics) in [
        ("translation_wmt22_deen.dev.jsonl", &["bleu", "chrf"][..]),
        (
            "summarization_xsum.dev.jsonl",
            &["rouge1", "rouge2", "rougeL"][..],
        ),
        ("qa_squad11.dev.jsonl", &["exact_match", "f1"][..]),
    ] {
        let out = dir.path().join(format!("{file}.out.jsonl"));
        let args = [
            "--data",
            &data(file),
            "--limit",
            "3",
            "--max-new-tokens",
            "24",
            "--out",
            out.to_str().unwrap(),
        ];
        let r = report(&eval(&args));
        assert_eq!(r["examples"], 3);
        for m in metrics {
            let v = r["metrics"][m]
                .as_f64()
                .unwrap_or_else(|| panic!("{file}: no {m}"));
            assert!((0.0..=100.0).contains(&v), "{file}: {m} = {v}");
        }
        assert!(r["mean_decode_tokens_per_s"].as_f64().unwrap() > 0.0);
        let saved = std::fs::read_to_string(&out).unwrap();
        assert_eq!(saved.lines().count(), 3, "{file}: one line per example");
        // Resume: nothing is generated again, the same scores come back.
        let again = report(&eval(&args));
        assert_eq!(again["metrics"], r["metrics"]);
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            saved,
            "{file}: resumed run rewrote outputs"
        );
    }
}

#[test]
fn bad_eval_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.jsonl");
    let o = eval(&[
        "--data",
        "/nonexistent.jsonl",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && stderr.contains("/nonexistent.jsonl")
            && !stderr.contains("panicked"),
        "{stderr}"
    );
    let o = eval(&[
        "--data",
        &data("qa_squad11.dev.jsonl"),
        "--template",
        "{nope}",
        "--limit",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && stderr.contains("'nope'"), "{stderr}");
    std::fs::write(&out, "not json\n").unwrap();
    let o = eval(&[
        "--data",
        &data("qa_squad11.dev.jsonl"),
        "--limit",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && stderr.contains("not an eval output"),
        "{stderr}"
    );
}

#[test]
fn gguf_engine_and_prompt_export_feed_the_same_scoring() {
    let dir = tempfile::tempdir().unwrap();
    let qa = data("qa_squad11.dev.jsonl");
    // The quantized GGUF baseline through the same template, loop and metrics.
    let out = dir.path().join("gguf.jsonl");
    let r = report(&eval(&[
        "--engine",
        "candle-gguf",
        "--data",
        &qa,
        "--limit",
        "2",
        "--max-new-tokens",
        "8",
        "--out",
        out.to_str().unwrap(),
    ]));
    assert_eq!(r["examples"], 2);
    assert!(r["metrics"]["f1"].is_number());
    assert_eq!(
        std::fs::read_to_string(&out).unwrap().lines().count(),
        2,
        "one output line per example"
    );
    // --prompts-only: the prompts as token ids, the same examples, no generation.
    let prompts = dir.path().join("prompts.jsonl");
    let p = eval(&[
        "--data",
        &qa,
        "--limit",
        "2",
        "--max-new-tokens",
        "8",
        "--out",
        prompts.to_str().unwrap(),
        "--prompts-only",
    ]);
    assert!(p.status.success(), "{}", String::from_utf8_lossy(&p.stderr));
    let records: Vec<serde_json::Value> = std::fs::read_to_string(&prompts)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let gguf_ids: Vec<String> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(records.len(), 2);
    for (rec, id) in records.iter().zip(&gguf_ids) {
        assert_eq!(rec["id"].as_str().unwrap(), id);
        assert_eq!(rec["task"], "qa");
        assert!(rec["prompt_token_ids"].as_array().unwrap().len() > 20);
    }
    // A mode with the GGUF engine is refused by name.
    let bad = eval(&[
        "--engine",
        "candle-gguf",
        "--mode",
        "selectinfer",
        "--data",
        &qa,
        "--limit",
        "1",
        "--out",
        dir.path().join("x.jsonl").to_str().unwrap(),
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("takes no --mode"));
}

/// Tool-call rows (BFCL): one row of each category, calls held to the
/// offered functions while generated, so none is invalid; each category
/// and `overall` scored as a fraction; every call in the outputs names an
/// offered function with an arguments object. An unconstrained answer
/// written in the file (as another engine's) is read leniently on request.
#[test]
fn tool_call_rows_are_scored_per_category_with_no_invalid_call() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<String> = std::fs::read_to_string(data("tools_bfcl.dev.jsonl"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let mut picked = Vec::new();
    for cat in [
        "simple_python",
        "multiple",
        "parallel",
        "parallel_multiple",
        "irrelevance",
    ] {
        let row = rows
            .iter()
            .find(|l| l.contains(&format!("\"category\": \"{cat}\"")))
            .unwrap_or_else(|| panic!("no {cat} row"));
        picked.push(row.clone());
    }
    let file = dir.path().join("tools.jsonl");
    std::fs::write(&file, picked.join("\n")).unwrap();
    // The whole file with --limit 5 takes one row of each category in turn
    // (it is grouped by category): the same five prompts.
    let prompts = dir.path().join("prompts.jsonl");
    let run = Command::new(env!("CARGO_BIN_EXE_selectinfer"))
        .args(["eval", "--model"])
        .arg(common::model_dir("smollm2-135m-instruct"))
        .args([
            "--data",
            &data("tools_bfcl.dev.jsonl"),
            "--limit",
            "5",
            "--prompts-only",
            "--out",
        ])
        .arg(&prompts)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let ids: Vec<String> = std::fs::read_to_string(&prompts)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].to_string())
        .collect();
    let picked_ids: Vec<String> = picked
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].to_string())
        .collect();
    assert_eq!(ids, picked_ids);
    let out = dir.path().join("tools.out.jsonl");
    let args = [
        "--data",
        file.to_str().unwrap(),
        "--max-new-tokens",
        "64",
        "--out",
        out.to_str().unwrap(),
    ];
    let r = report(&eval(&args));
    assert_eq!(r["task"], "tools");
    assert_eq!(r["examples"], 5);
    assert_eq!(r["metrics"]["invalid_calls"], 0.0, "{r}");
    for m in [
        "overall",
        "simple_python",
        "multiple",
        "parallel",
        "parallel_multiple",
        "irrelevance",
    ] {
        let v = r["metrics"][m]
            .as_f64()
            .unwrap_or_else(|| panic!("no {m}: {r}"));
        assert!((0.0..=1.0).contains(&v), "{m} = {v}");
    }
    let text = std::fs::read_to_string(&out).unwrap();
    for line in text.lines() {
        let o: serde_json::Value = serde_json::from_str(line).unwrap();
        let row: serde_json::Value = serde_json::from_str(
            picked
                .iter()
                .find(|l| l.contains(&format!("\"id\": {}", o["id"])))
                .unwrap(),
        )
        .unwrap();
        let names: Vec<&str> = row["functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        let calls: Vec<serde_json::Value> =
            serde_json::from_str(o["prediction"].as_str().unwrap()).unwrap();
        for c in &calls {
            assert!(
                names.contains(&c["name"].as_str().unwrap()),
                "{c} not offered: {names:?}"
            );
            let args: serde_json::Value =
                serde_json::from_str(c["arguments"].as_str().unwrap()).unwrap();
            assert!(args.is_object(), "{c}");
        }
    }
    // Another engine's unconstrained answer, read leniently: a call line
    // inside prose counts; strictly it is text.
    // The right call (the reference's first accepted values), in prose.
    let first: serde_json::Value = serde_json::from_str(&picked[0]).unwrap();
    let (name, accepted) = first["references"][0]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    let args: serde_json::Map<String, serde_json::Value> = accepted
        .as_object()
        .unwrap()
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_array()?.iter().find(|x| *x != "")?.clone())))
        .collect();
    let call = serde_json::json!({"name": name, "arguments": args});
    let foreign = dir.path().join("foreign.out.jsonl");
    let raw = format!("Sure, call it:\n{call}");
    let line = serde_json::json!({"id": first["id"], "prediction": "", "raw_text": raw,
        "references": [], "prompt_tokens": 1, "generated_tokens": 1, "ttft_s": 0.1,
        "decode_tokens_per_s": 1.0, "compute_ratio": 1.0});
    std::fs::write(&foreign, format!("{line}\n")).unwrap();
    let one = dir.path().join("one.jsonl");
    std::fs::write(&one, &picked[0]).unwrap();
    let base = [
        "--data",
        one.to_str().unwrap(),
        "--out",
        foreign.to_str().unwrap(),
    ];
    let strict = report(&eval(&base));
    let lenient = report(&eval(&[&base[..], &["--lenient-calls"]].concat()));
    let overall = |r: &serde_json::Value| r["metrics"]["overall"].as_f64().unwrap();
    assert_eq!(
        (overall(&strict), overall(&lenient)),
        (0.0, 1.0),
        "{strict} {lenient}"
    );
    let text = std::fs::read_to_string(&foreign).unwrap();
    assert_eq!(
        text.lines().count(),
        1,
        "the foreign answer was resumed, not generated again"
    );
}
