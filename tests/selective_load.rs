//! Selective loading on the real SmolLM2 weights: only the planned neurons
//! are read, and loading all of them reproduces the dense model exactly.

mod common;

use selectinfer::model::{LoadOptions, Model};
use selectinfer::plan::{LoadPlan, SelectionParams};
use selectinfer::ranking::Ranking;

fn plan(load_ratio: f64) -> LoadPlan {
    let ranking = Ranking::load(
        &common::repo_root().join("rankings/smollm2-135m-instruct.ranking.safetensors"),
    )
    .unwrap();
    let params = SelectionParams {
        load_ratio,
        static_ratio: 0.2 * load_ratio,
        compute_ratio: 0.5 * load_ratio,
        token_ratio: 0.1,
        dense_layers: vec![0, 29],
        task: "qa".into(),
    };
    LoadPlan::from_ranking(&ranking, &params).unwrap()
}

fn load(plan: Option<LoadPlan>) -> Model {
    Model::from_dir(
        &common::model_dir("smollm2-135m-instruct"),
        &LoadOptions {
            plan,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn loading_every_neuron_reproduces_dense_logits_exactly() {
    let dense = load(None);
    let full = load(Some(plan(1.0)));
    let ids = [1u32, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47];
    let (mut c1, mut c2) = (dense.new_cache(), full.new_cache());
    for step in 0..3 {
        let input: &[u32] = if step == 0 {
            &ids
        } else {
            &ids[step..step + 1]
        };
        let a = dense
            .forward(input, &mut c1)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let b = full
            .forward(input, &mut c2)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(a, b, "step {step}");
    }
}

#[test]
fn loaded_neurons_and_bytes_match_the_plan() {
    let p = plan(0.5);
    let model = load(Some(p.clone()));
    for (l, (block, lp)) in model.blocks.iter().zip(&p.layers).enumerate() {
        assert_eq!(block.mlp.width(), lp.loaded.len(), "layer {l}");
        assert_eq!(
            block.mlp.weight_bytes(),
            3 * lp.loaded.len() * 576 * 4,
            "layer {l}"
        );
        if lp.dense {
            assert!(block.mlp.neurons().is_none());
        } else {
            let mut want = lp.loaded.clone();
            want.sort_unstable();
            assert_eq!(block.mlp.neurons().unwrap(), &want[..], "layer {l}");
        }
    }
    let dense_bytes = load(None).decode_weight_bytes();
    let saved = 28 * (1536 - 768) * 3 * 576 * 4;
    assert_eq!(dense_bytes - model.decode_weight_bytes(), saved);
    // Still a working language model.
    let logits = model
        .forward(&[1, 4093, 198], &mut model.new_cache())
        .unwrap();
    assert!(logits
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .all(|v| v.is_finite()));
}
