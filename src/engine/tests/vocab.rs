//! The output vocabulary (`--vocab`, `crate::method::vocab`) on the
//! real SmolLM2: decode computes only the kept lm_head rows, and their
//! logits are exactly the dense ones; a prompt with a token outside, or a
//! grammar, decodes over every token. SmolLM2's vocabulary is 98.6 %
//! Latin-script, so `latin` keeps every row there; these tests restrict it
//! to the first 40,000 tokens and a few more instead.

use super::common;

use crate::engine::grammar::Grammar;
use crate::engine::{EngineSpec, GenerateOptions};
use crate::method::vocab::VocabRule;
use crate::method::Mode;
use crate::model::vocab::OutputVocab;
use crate::sys::device::WeightDtype;

fn spec(dtype: WeightDtype, vocab: VocabRule) -> EngineSpec {
    EngineSpec {
        model: common::model_dir("smollm2-135m-instruct"),
        dtype,
        mode: Mode::Dense,
        vocab,
        ..EngineSpec::default()
    }
}

/// The first 40,000 tokens and every seventh after them.
fn restriction(vocab_size: usize) -> OutputVocab {
    OutputVocab::new(
        vocab_size,
        40_000,
        (40_003..vocab_size as u32).step_by(7).collect(),
    )
    .unwrap()
}

/// A dense engine restricted to [`restriction`].
fn restricted(dtype: WeightDtype) -> crate::engine::Engine {
    let mut e = spec(dtype, VocabRule::All).load().unwrap();
    let v = restriction(e.model.config().vocab_size);
    e.set_output_vocab(Some(v)).unwrap();
    e
}

#[test]
fn kept_tokens_have_exactly_the_dense_logits_and_the_others_none() {
    for dtype in [WeightDtype::F32, WeightDtype::F16, WeightDtype::Q4] {
        let mut all = spec(dtype, VocabRule::All).load().unwrap();
        let mut latin = restricted(dtype);
        let prompt = all
            .codec
            .chat_prompt_ids("Name three colours of a traffic light.")
            .unwrap();
        let forced = [504u32, 1345, 314, 253];
        let (want, _) = all.forced_logits(&prompt, &forced, None).unwrap();
        let (got, _) = latin.forced_logits(&prompt, &forced, None).unwrap();
        assert!(prompt.iter().all(|&t| t < 40_000), "{prompt:?}");
        // In force during the request only.
        assert!(latin.model.output_vocab().is_none());
        let v = restriction(latin.model.config().vocab_size);
        for (step, (w, g)) in want.iter().zip(&got).enumerate() {
            for (id, (a, b)) in w.iter().zip(g).enumerate() {
                match v.contains(id as u32) {
                    // The prompt's logits come from the prefill path, the
                    // others from decode's: both compute the same rows.
                    true => assert_eq!(a, b, "{dtype} step {step} token {id}"),
                    false => assert_eq!(*b, f32::NEG_INFINITY, "{dtype} step {step} token {id}"),
                }
            }
        }
        // Decode reads fewer bytes, by the rows dropped.
        let opts = GenerateOptions {
            max_new_tokens: 4,
            ..Default::default()
        };
        let (ga, gl) = (
            all.generate_ids(&prompt, &opts, |_| true).unwrap(),
            latin.generate_ids(&prompt, &opts, |_| true).unwrap(),
        );
        assert_eq!(ga.text, gl.text, "{dtype}");
        assert!(gl.decode_weight_bytes < ga.decode_weight_bytes, "{dtype}");
    }
}

#[test]
fn a_prompt_outside_the_vocabulary_or_a_grammar_decodes_every_token() {
    let mut all = spec(WeightDtype::F32, VocabRule::All).load().unwrap();
    let mut latin = restricted(WeightDtype::F32);
    let opts = GenerateOptions {
        max_new_tokens: 3,
        ..Default::default()
    };
    let full = all
        .generate_chat("Say hello.", &opts, |_| true)
        .unwrap()
        .decode_weight_bytes;
    let english = latin.generate_chat("Say hello.", &opts, |_| true).unwrap();
    assert!(english.decode_weight_bytes < full);
    // A prompt with tokens outside: the reply may need them.
    let rare = "Describe Llanfairpwllgwyngyll and Tegucigalpa.";
    let ids = latin.codec.chat_prompt_ids(rare).unwrap();
    let v = restriction(latin.model.config().vocab_size);
    assert!(ids.iter().any(|&t| !v.contains(t)), "{ids:?}");
    let outside = latin.generate_chat(rare, &opts, |_| true).unwrap();
    assert_eq!(outside.decode_weight_bytes, full);
    let json = GenerateOptions {
        grammar: Grammar::of_fields(r#"{"type": "object"}"#, "").unwrap(),
        ..opts.clone()
    };
    let constrained = latin.generate_chat("Say hello.", &json, |_| true).unwrap();
    assert_eq!(constrained.decode_weight_bytes, full);
    // And the next plain request is restricted again.
    let again = latin.generate_chat("Say hello.", &opts, |_| true).unwrap();
    assert_eq!(again.decode_weight_bytes, english.decode_weight_bytes);
    assert_eq!(again.text, english.text);
}

#[test]
fn latin_keeps_all_of_smollm2_so_restricts_nothing() {
    let mut e = spec(WeightDtype::F32, VocabRule::Latin).load().unwrap();
    assert!(e.model.output_vocab().is_none());
    let prompt = e.codec.chat_prompt_ids("Say hello.").unwrap();
    e.forced_logits(&prompt, &[], None).unwrap();
    assert!(e.model.output_vocab().is_none());
}

#[test]
fn an_unknown_rule_is_refused_naming_the_parameter() {
    let e = "cyrillic".parse::<VocabRule>().unwrap_err().to_string();
    assert!(e.contains("vocab") && e.contains("latin"), "{e}");
}

#[test]
fn latin_on_qwen_restricts_english_and_falls_back_for_other_scripts() {
    let qwen = |vocab| EngineSpec {
        model: common::model_dir("qwen2.5-coder-0.5b-instruct"),
        dtype: WeightDtype::Q4,
        mode: Mode::Dense,
        vocab,
        ..EngineSpec::default()
    };
    let mut all = qwen(VocabRule::All).load().unwrap();
    let mut latin = qwen(VocabRule::Latin).load().unwrap();
    let opts = GenerateOptions {
        max_new_tokens: 6,
        ..Default::default()
    };
    let english = "Name three colours of a traffic light.";
    let (a, l) = (
        all.generate_chat(english, &opts, |_| true).unwrap(),
        latin.generate_chat(english, &opts, |_| true).unwrap(),
    );
    assert_eq!(a.text, l.text);
    assert!(
        (l.decode_weight_bytes as f64) < 0.92 * a.decode_weight_bytes as f64,
        "{} vs {}",
        l.decode_weight_bytes,
        a.decode_weight_bytes
    );
    // Russian and Chinese: the rule dropped their tokens, so the reply
    // gets every token — also where all of them lie inside the computed
    // prefix (Здравствуйте's pieces all do).
    for other in [
        "Здравствуйте",
        "Привет, как дела?",
        "请用中文回答：天空是什么颜色？",
    ] {
        let g = latin.generate_chat(other, &opts, |_| true).unwrap();
        assert_eq!(g.decode_weight_bytes, a.decode_weight_bytes, "{other}");
    }
}

/// With a screen, Qwen's Latin vocabulary keeps a copy of its rows only
/// (104,148 of 151,936); a prompt outside it decodes over every row (those
/// outside the copy computed exactly) and answers as the whole model does.
#[test]
fn a_screen_under_latin_copies_the_latin_rows_only() {
    let qwen = |vocab, head_screen| EngineSpec {
        model: common::model_dir("qwen2.5-coder-0.5b-instruct"),
        dtype: WeightDtype::Q4,
        mode: Mode::Dense,
        vocab,
        head_screen,
        head_screen_bits: crate::model::ScreenBits::Two,
        ..EngineSpec::default()
    };
    let mut all = qwen(VocabRule::All, 0).load().unwrap();
    let mut latin = qwen(VocabRule::Latin, 256).load().unwrap();
    let (vocab, screen) = (
        latin.vocab.clone().unwrap(),
        latin.head_screen.clone().unwrap(),
    );
    assert_eq!(screen.rows(), vocab.rows());
    assert!(
        screen.rows() * 10 < vocab.vocab_size() * 7,
        "{}",
        screen.rows()
    );
    let opts = GenerateOptions {
        max_new_tokens: 6,
        ..Default::default()
    };
    for prompt in [
        "Name three colours of a traffic light.",
        "请用中文回答：天空是什么颜色？",
    ] {
        let (a, l) = (
            all.generate_chat(prompt, &opts, |_| true).unwrap(),
            latin.generate_chat(prompt, &opts, |_| true).unwrap(),
        );
        assert_eq!(a.text, l.text, "{prompt}");
    }
}
