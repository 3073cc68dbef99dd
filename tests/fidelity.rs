//! The fidelity instrument on the real SmolLM2: an engine against itself
//! is exact (KL 0, every top-1 agreeing); a quantized dtype is not, but close.

mod common;

use selectinfer::engine::EngineSpec;
use selectinfer::sys::device::WeightDtype;
use selectinfer::tools::fidelity::{self, Candidate, FidelityOptions};

#[test]
fn dense_against_itself_is_exact_and_q4_is_close() {
    let spec = EngineSpec {
        model: common::model_dir("smollm2-135m-instruct"),
        ..EngineSpec::default()
    };
    let data = common::repo_root().join("../shared/data/qa_squad11.dev.jsonl");
    let opts = FidelityOptions {
        data: vec![data],
        limit: 2,
        tokens: 6,
    };
    let mut reference = spec.load().unwrap();
    let mut same = spec.load().unwrap();
    let r = fidelity::run(&mut reference, &mut [Candidate::Ours(&mut same)], &opts).unwrap();
    let r = &r[0];
    assert_eq!((r[0].prompts, r[0].positions), (2, 12));
    assert_eq!(r[0].mean_kl, 0.0);
    assert_eq!(r[0].top1_agreement, 1.0);
    assert_eq!(r[0].mean_first_divergence, 6.0);
    let mut q4 = EngineSpec {
        dtype: WeightDtype::Q4,
        ..spec.clone()
    }
    .load()
    .unwrap();
    let r = fidelity::run(&mut reference, &mut [Candidate::Ours(&mut q4)], &opts).unwrap();
    let r = &r[0];
    assert!(r[0].mean_kl > 0.0 && r[0].mean_kl < 0.05, "{}", r[0]);
    assert!(r[0].decode_bytes_per_token < 0.5 * 538e6, "{}", r[0]);
    let bad = FidelityOptions { tokens: 0, ..opts };
    assert!(fidelity::run(&mut reference, &mut [Candidate::Ours(&mut q4)], &bad).is_err());
}
