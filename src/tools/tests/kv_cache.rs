//! The `Q8_0` KV cache (`model::KvDtype::Q8`) on the real SmolLM2 q4
//! checkpoint: teacher-forced against the same model with an f32 cache,
//! and its tensor path (an observed decode step) against its plain one.

use super::common;
use super::quantized::{cases, compare, logits, smollm2};
use crate::model::{KvDtype, LoadOptions, Model};
use crate::sys::device::Quant;

fn q4(kv_dtype: KvDtype) -> Model {
    let opts = LoadOptions {
        quant: Some(Quant::Q4),
        kv_dtype,
        // Chunks of 5: prompts are prefilled over cached positions too.
        prefill_chunk: 5,
        ..Default::default()
    };
    Model::from_dir(&smollm2(), &opts).unwrap()
}

/// Keys and values in `Q8_0`: per position KL to the f32 cache's logits
/// and top-1 agreement, over llama.cpp's greedy replies.
#[test]
fn a_q8_cache_stays_near_the_f32_cache() {
    let fixture = common::fixture("llamacpp_greedy_smollm2-135m-instruct.json");
    let (f32c, q8c) = (q4(KvDtype::F32), q4(KvDtype::Q8));
    let (mut kl, mut agreed, mut count) = (0f64, 0usize, 0usize);
    for (prompt, steps) in cases(&fixture) {
        let want = logits(&f32c, &prompt, &steps);
        let (k, a) = compare(&want, &logits(&q8c, &prompt, &steps));
        (kl, agreed, count) = (kl + k, agreed + a, count + want.len());
    }
    let (kl, agree) = (kl / count as f64, agreed as f64 / count as f64);
    eprintln!("{count} positions: q8 cache KL {kl:.5} top-1 {agree:.3} against the f32 cache");
    // A broken row (a wrong offset, a stale position) moves KL by whole
    // units; rounding keys and values to 8 bits, by thousandths.
    assert!(kl < 0.01 && agree >= 0.95, "KL {kl} top-1 {agree}");
    assert!(kl > 0.0, "the q8 cache gave the f32 cache's logits exactly");
}

/// A decode step through the tensor path (dequantized cache tensors, as a
/// profiler's observed step runs) gives the plain path's logits, but for
/// the plain path's query rounded to 8 bits.
#[test]
fn a_q8_cache_decodes_alike_on_both_paths() {
    let m = q4(KvDtype::Q8);
    let fixture = common::fixture("llamacpp_greedy_smollm2-135m-instruct.json");
    let (prompt, steps) = cases(&fixture).remove(0);
    let mut plain = m.new_cache();
    m.forward(&prompt, &mut plain).unwrap();
    let mut observed = plain.fork().unwrap();
    for &t in &steps[..4] {
        let a: Vec<f32> = m.forward(&[t], &mut plain).unwrap().to_vec1().unwrap();
        let b: Vec<f32> = m
            .forward_observed(&[t], &mut observed, &mut |_, _| Ok(()))
            .unwrap()
            .to_vec1()
            .unwrap();
        let (k, same) = compare(&[b], &[a]);
        assert!(
            k < 1e-3 && same == 1,
            "token {t}: KL {k}, top-1 alike {same}"
        );
    }
    assert_eq!(plain.len(), observed.len());
}
