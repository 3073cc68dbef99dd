//! Our tokenizer.json (built from the GGUF vocabulary and merges) must give
//! the same token ids as llama.cpp on the same GGUF, for both models. The
//! reference ids come from `scripts/reference/make_llamacpp_fixtures.py`.

mod common;

use selectinfer::text::TextCodec;

fn check(model: &str) {
    let codec = TextCodec::from_dir(&common::model_dir(model), &[]).unwrap();
    let fixture = common::fixture(&format!("llamacpp_tokens_{model}.json"));
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 200, "fixture has only {} texts", cases.len());
    let mut mismatches = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = common::ids(&case["ids"]);
        let got = codec.encode(text).unwrap();
        if got != want {
            mismatches.push(format!(
                "{text:?}\n  llama.cpp {want:?}\n  ours      {got:?}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{model}: {} of {} texts tokenize differently:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches.join("\n")
    );
}

#[test]
fn smollm2_token_ids_match_llama_cpp() {
    check("smollm2-135m-instruct");
}

#[test]
fn qwen25_coder_token_ids_match_llama_cpp() {
    check("qwen2.5-coder-0.5b-instruct");
}
