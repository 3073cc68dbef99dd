//! Our tokenizer.json (built from the GGUF vocabulary and merges) must give
//! the same token ids as llama.cpp on the same GGUF, for both models. The
//! reference ids come from `scripts/reference/make_llamacpp_fixtures.py`.

use super::common;

use crate::engine::text::TextCodec;

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

/// Streaming the fixture texts token by token (as generation does) gives
/// pieces that add up to the whole decoded text, none ending inside a
/// character split over tokens (German, emoji and CJK texts split them).
/// A text that ends in U+FFFD itself is held back from the stream (it looks
/// like a split character); the final text has it.
fn check_stream(model: &str) {
    let codec = TextCodec::from_dir(&common::model_dir(model), &[]).unwrap();
    let fixture = common::fixture(&format!("llamacpp_tokens_{model}.json"));
    let mut split_chars = 0;
    for case in fixture["cases"].as_array().unwrap() {
        let ids = common::ids(&case["ids"]);
        let mut stream = crate::engine::text::TextStream::new(&codec);
        let mut streamed = String::new();
        for &id in &ids {
            match stream.push(id).unwrap() {
                Some(piece) => {
                    assert!(!piece.ends_with('\u{FFFD}'), "piece {piece:?}");
                    streamed.push_str(&piece);
                }
                None => split_chars += 1,
            }
        }
        let whole = codec.decode(&ids).unwrap();
        let held_back = whole.strip_prefix(&streamed);
        assert!(
            held_back.is_some_and(|rest| rest.is_empty() || rest.ends_with('\u{FFFD}')),
            "{:?}: streamed {streamed:?}, decoded {whole:?}",
            case["text"]
        );
        assert_eq!(stream.text().unwrap(), whole);
    }
    assert!(
        split_chars > 0,
        "no fixture text split a character over tokens"
    );
}

#[test]
fn smollm2_streamed_text_adds_up_to_the_decoded_text() {
    check_stream("smollm2-135m-instruct");
}

#[test]
fn qwen25_coder_streamed_text_adds_up_to_the_decoded_text() {
    check_stream("qwen2.5-coder-0.5b-instruct");
}
