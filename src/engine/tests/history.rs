//! A reply does not depend on the requests before it. Selective modes move
//! the chosen neurons of each prompt to the front of their layer, so the
//! next prompt's prefill finds them where the last prompt left them; on the
//! quantized bundles it still sums them in their canonical order, and its
//! logits, selection and reply are those of a freshly loaded engine, to
//! the bit (real SmolLM2 weights). f16/f32 rows are not covered: their
//! prefill multiplies the rows in storage order (one matmul per layer), so
//! its sums, and at times a greedy token, follow the previous prompt's
//! arrangement.

use super::common;

use crate::engine::spec::EngineSpec;
use crate::engine::{Engine, GenerateOptions};
use crate::method::Mode;
use crate::sys::device::WeightDtype;

fn spec(dtype: WeightDtype) -> EngineSpec {
    let mut s = EngineSpec {
        model: common::model_dir("smollm2-135m-instruct"),
        dtype,
        mode: Mode::Selectinfer,
        ranking: Some(
            common::repo_root().join("rankings/smollm2-135m-instruct.ranking.safetensors"),
        ),
        ..Default::default()
    };
    s.params.task = "qa".into();
    s
}

/// Logits after the prompt and after each forced token, through prefill,
/// selection, the arrangement and decode on the chosen rows.
fn forced(engine: &mut Engine, prompt: &str) -> Vec<Vec<f32>> {
    let ids = engine.codec.chat_prompt_ids(prompt).unwrap();
    let forced: Vec<u32> = ids[..6].to_vec();
    engine.forced_logits(&ids, &forced, None).unwrap().0
}

#[test]
fn a_quantized_selective_reply_is_the_same_after_other_requests() {
    for dtype in [WeightDtype::Q4, WeightDtype::Q8] {
        let s = spec(dtype);
        let question = "Which room is the charging dock in?";
        let fresh = forced(&mut s.load().unwrap(), question);
        let mut used = s.load().unwrap();
        let opts = GenerateOptions {
            max_new_tokens: 8,
            ..Default::default()
        };
        for other in [
            "Translate into English: Der Roboter fährt in die Küche.",
            "Summarize: the arm picked up the red cup and placed it on the tray.",
        ] {
            used.generate_chat(other, &opts, |_| true).unwrap();
        }
        let after = forced(&mut used, question);
        assert_eq!(after.len(), fresh.len());
        for (i, (a, f)) in after.iter().zip(&fresh).enumerate() {
            let differ = a.iter().zip(f).filter(|(x, y)| x.to_bits() != y.to_bits());
            assert_eq!(
                differ.count(),
                0,
                "{dtype:?}: logits after {i} forced tokens differ from a fresh engine's"
            );
        }
    }
}
