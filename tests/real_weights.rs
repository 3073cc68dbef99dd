//! Sanity of the converted real SmolLM2 weights against llama.cpp on the same
//! GGUF (fixture from `scripts/reference/make_llamacpp_fixtures.py`).
//!
//! Our weights are the GGUF's Q4_1 values dequantized to f32, while llama.cpp
//! (and candle's quantized model) also quantize activations to 8 bits inside
//! each matmul, so logits differ slightly and greedy decoding can flip at
//! near-ties. Measured (`cargo run --release --example greedy_divergence`):
//! 46 of 48 teacher-forced positions pick llama.cpp's token; the two others
//! are ties within 0.05 and 0.2 logits where candle's quantized GGUF model
//! makes the same choice as we do. The test therefore follows llama.cpp's
//! tokens (teacher forcing) and requires at every position that llama.cpp's
//! token is our argmax or within `MARGIN` logits of it, plus ≥ 45/48 exact.

mod common;

use selectinfer::engine::{Engine, GenerateOptions};
use selectinfer::model::LoadOptions;

const MARGIN: f32 = 0.25;

#[test]
fn smollm2_follows_llama_cpp_greedy_tokens() {
    let engine = Engine::load(
        &common::model_dir("smollm2-135m-instruct"),
        &LoadOptions::default(),
    )
    .unwrap();
    let fixture = common::fixture("llamacpp_greedy_smollm2-135m-instruct.json");
    let mut exact = 0;
    let mut total = 0;
    for case in fixture["cases"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let prompt_ids = common::ids(&case["prompt_ids"]);
        assert_eq!(
            engine.codec.encode(prompt).unwrap(),
            prompt_ids,
            "prompt ids for {prompt:?}"
        );
        let want = common::ids(&case["generated_ids_no_stop"]);
        let mut cache = engine.model.new_cache();
        let mut input = prompt_ids.clone();
        for (step, &w) in want.iter().take(16).enumerate() {
            let logits = engine
                .model
                .forward(&input, &mut cache)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let (best, best_logit) = logits
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, l)| (i as u32, *l))
                .unwrap();
            let gap = best_logit - logits[w as usize];
            assert!(
                gap <= MARGIN,
                "{prompt:?} step {step}: llama.cpp's token {w} is {gap} logits below our {best}"
            );
            exact += usize::from(best == w);
            total += 1;
            input = vec![w];
        }
    }
    assert!(
        exact >= 45,
        "only {exact}/{total} positions pick llama.cpp's greedy token"
    );
}

#[test]
fn smollm2_free_running_greedy_matches_llama_cpp_on_clear_prompt() {
    let mut engine = Engine::load(
        &common::model_dir("smollm2-135m-instruct"),
        &LoadOptions::default(),
    )
    .unwrap();
    let fixture = common::fixture("llamacpp_greedy_smollm2-135m-instruct.json");
    let case = &fixture["cases"][0];
    let prompt_ids = common::ids(&case["prompt_ids"]);
    let want = common::ids(&case["generated_ids_no_stop"]);
    let opts = GenerateOptions {
        max_new_tokens: 16,
        ignore_eos: true,
        ..Default::default()
    };
    let out = engine.generate_ids(&prompt_ids, &opts, |_| true).unwrap();
    assert_eq!(out.token_ids, want[..16], "ours: {:?}", out.text);
}

#[test]
fn chat_prompt_answers_sensibly() {
    let mut engine = Engine::load(
        &common::model_dir("smollm2-135m-instruct"),
        &LoadOptions::default(),
    )
    .unwrap();
    let out = engine
        .generate_chat(
            "What is the capital of France?",
            &GenerateOptions {
                max_new_tokens: 24,
                ..Default::default()
            },
            |_| true,
        )
        .unwrap();
    assert!(
        out.text.contains("Paris"),
        "unexpected answer: {:?}",
        out.text
    );
    assert_eq!(out.stop_reason, selectinfer::engine::StopReason::Eos);
}

/// The CPU decode step runs a token on plain buffers (`Model::decode_cpu`,
/// the kernels with no candle op between them); a forward pass with an
/// observer takes the general path through candle's ops. On the real
/// weights both give the same logits step after step through their own KV
/// caches: up to summation order in f32; in f16 the general path also rounds
/// the activations to f16 inside each matmul (seen: 0.16 logits apart).
#[test]
fn decode_on_plain_buffers_matches_the_tensor_path() {
    use selectinfer::model::Model;
    let dir = common::model_dir("smollm2-135m-instruct");
    for (dtype, tolerance) in [
        (candle_core::DType::F32, 2e-3),
        (candle_core::DType::F16, 0.5),
    ] {
        let model = Model::from_dir(
            &dir,
            &LoadOptions {
                dtype,
                ..Default::default()
            },
        )
        .unwrap();
        let vocab = model.config().vocab_size as u32;
        let prompt: Vec<u32> = (0..12).map(|i| (i * 977 + 31) % vocab).collect();
        let (mut plain, mut general) = (model.new_cache(), model.new_cache());
        let mut logits = model.forward(&prompt, &mut plain).unwrap();
        model.forward(&prompt, &mut general).unwrap();
        for step in 0..8 {
            let next = logits.argmax(0).unwrap().to_scalar::<u32>().unwrap();
            logits = model.forward(&[next], &mut plain).unwrap();
            let reference = model
                .forward_observed(&[next], &mut general, &mut |_, _| Ok(()))
                .unwrap();
            let (a, b) = (
                logits.to_vec1::<f32>().unwrap(),
                reference.to_vec1::<f32>().unwrap(),
            );
            let diff = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(
                diff <= tolerance,
                "{dtype:?} step {step}: plain-buffer logits differ by {diff} (> {tolerance})"
            );
            if dtype == candle_core::DType::F32 {
                assert_eq!(
                    logits.argmax(0).unwrap().to_scalar::<u32>().unwrap(),
                    reference.argmax(0).unwrap().to_scalar::<u32>().unwrap(),
                    "step {step}: different next token"
                );
            }
        }
    }
}
