//! Selective loading on the real SmolLM2 weights: only the planned neurons
//! are read, and loading all of them reproduces the dense model exactly.

use super::common;

use crate::method::ranking::Ranking;
use crate::method::{LoadPlan, SelectionParams};
use crate::model::{FfnRows, LoadOptions, Model};

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
        score: Default::default(),
        gate_keep: 1.0,
        layer_drop: Vec::new(),
        coarse_ratio: 0.0,
        coarse_bits: 4,
    };
    LoadPlan::from_ranking(&ranking, &params).unwrap()
}

fn load(plan: Option<LoadPlan>) -> Model {
    Model::from_dir(
        &common::model_dir("smollm2-135m-instruct"),
        &LoadOptions {
            ffn: plan.map_or(FfnRows::All, |p| p.ffn_rows()),
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn an_ffn_row_selection_that_does_not_fit_the_model_is_refused() {
    let dir = common::model_dir("smollm2-135m-instruct");
    let load = |ffn| {
        Model::from_dir(
            &dir,
            &LoadOptions {
                ffn,
                ..Default::default()
            },
        )
    };
    let e = format!("{:#}", load(FfnRows::Layers(vec![None; 3])).unwrap_err());
    assert!(e.contains("has 3 layers, the model 30"), "{e}");
    let mut layers = vec![None; 30];
    layers[4] = Some(vec![0, 1536]);
    let e = format!("{:#}", load(FfnRows::Layers(layers)).unwrap_err());
    assert!(e.contains("names neuron 1536; the layers have 1536"), "{e}");
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

mod compute {
    use super::common;
    use crate::engine::{generate::Chosen, Engine, GenerateOptions};
    use crate::method::SelectionParams;
    use crate::method::{Method, Mode};
    use crate::model::LoadOptions;

    fn engine(mode: Mode, load_ratio: f64, compute_ratio: f64) -> Engine {
        engine_with(mode, load_ratio, compute_ratio, &LoadOptions::default())
    }

    fn engine_with(mode: Mode, load_ratio: f64, compute_ratio: f64, opts: &LoadOptions) -> Engine {
        let dir = common::model_dir("smollm2-135m-instruct");
        let params = SelectionParams {
            load_ratio,
            static_ratio: 0.2,
            compute_ratio,
            token_ratio: 0.2,
            dense_layers: vec![0, 29],
            task: "translation".into(),
            score: Default::default(),
            gate_keep: 1.0,
            layer_drop: Vec::new(),
            coarse_ratio: 0.0,
            coarse_bits: 4,
        };
        let ranking =
            common::repo_root().join("rankings/smollm2-135m-instruct.ranking.safetensors");
        let method = Method::new(mode, params, &dir, Some(&ranking), 0).unwrap();
        Engine::load_with_method(&dir, opts, Some(method)).unwrap()
    }

    /// Same rows chosen per layer, up to rounding: a neuron at the top-α
    /// border may flip, nothing more.
    fn assert_same_choice(a: &Chosen, b: &Chosen) {
        for (layer, (x, y)) in a.iter().zip(b).enumerate() {
            let (Some(x), Some(y)) = (x, y) else {
                assert_eq!(x, y, "layer {layer}");
                continue;
            };
            let same = x.iter().filter(|p| y.binary_search(p).is_ok()).count();
            assert!(
                same + 2 >= x.len(),
                "layer {layer}: {same} of {} rows kept",
                x.len()
            );
        }
    }

    /// Teacher-forced logits equal up to rounding.
    fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>]) {
        let diff = a
            .iter()
            .flatten()
            .zip(b.iter().flatten())
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-3, "logits differ by {diff}");
    }

    fn run(e: &mut Engine) -> crate::engine::Generation {
        let opts = GenerateOptions {
            max_new_tokens: 8,
            ignore_eos: true,
            ..Default::default()
        };
        e.generate_chat(
            "Translate into English: Der Hund schläft im Garten.",
            &opts,
            |_| true,
        )
        .unwrap()
    }

    #[test]
    fn phi_equal_gamma_equal_one_reproduces_dense_exactly() {
        let mut dense = Engine::load(
            &common::model_dir("smollm2-135m-instruct"),
            &LoadOptions::default(),
        )
        .unwrap();
        let mut full = engine(Mode::Selectinfer, 1.0, 1.0);
        let (a, b) = (run(&mut dense), run(&mut full));
        assert_eq!(a.token_ids, b.token_ids);
        assert_eq!(b.compute_ratio, 1.0);
        assert_eq!(a.decode_weight_bytes, b.decode_weight_bytes);
    }

    #[test]
    fn selectinfer_computes_phi_of_the_neurons() {
        let mut e = engine(Mode::Selectinfer, 0.7, 0.4);
        let g = run(&mut e);
        // 28 sparse layers at φ = 0.4 (614 of 1536), 2 dense layers.
        let want = (28.0 * 614.0 + 2.0 * 1536.0) / (30.0 * 1536.0);
        assert!(
            (g.compute_ratio - want).abs() < 1e-9,
            "{} vs {want}",
            g.compute_ratio
        );
        // Bytes per decode token: the loaded FFN (γ = 0.7 → 1088 neurons, 34
        // blocks of 32, in sparse layers) is replaced by the computed one
        // (614 neurons).
        let neuron_bytes = 3 * 576 * 4;
        let loaded_ffn = (28 * 1088 + 2 * 1536) * neuron_bytes;
        let computed_ffn = (28 * 614 + 2 * 1536) * neuron_bytes;
        assert_eq!(
            g.decode_weight_bytes as usize,
            e.model.decode_weight_bytes() - loaded_ffn + computed_ffn
        );
        assert!(!g.text.is_empty());
    }

    #[test]
    fn disk_offload_reproduces_dense_and_keeps_no_ffn_in_memory() {
        let mut dense = Engine::load(
            &common::model_dir("smollm2-135m-instruct"),
            &LoadOptions::default(),
        )
        .unwrap();
        let mut offload = engine(Mode::DiskOffload, 0.7, 0.4);
        let (a, b) = (run(&mut dense), run(&mut offload));
        assert_eq!(a.token_ids, b.token_ids, "same weights, same tokens");
        assert_eq!(b.compute_ratio, 1.0);
        assert_eq!(a.decode_weight_bytes, b.decode_weight_bytes);
        assert!(offload.model.ffn_streamed());
        for block in &offload.model.blocks {
            assert_eq!(block.mlp.width(), 0, "no FFN neuron held in memory");
        }
    }

    /// Each prompt rearranges the held neurons (chosen ones in front); the
    /// next prompt must still see every loaded neuron and choose by neuron,
    /// not by storage position.
    #[test]
    fn a_prompt_chooses_and_answers_the_same_after_another_prompt() {
        let mut e = engine(Mode::Selectinfer, 0.7, 0.4);
        let a = e
            .codec
            .chat_prompt_ids("Translate into English: Der Hund schläft im Garten.");
        let b = e
            .codec
            .chat_prompt_ids("What is the capital of France? Answer briefly.");
        let (a, b) = (a.unwrap(), b.unwrap());
        let forced = [504u32, 2767, 2730];
        let (first, rows_first) = e.forced_logits(&a, &forced, None).unwrap();
        let (_, rows_b) = e.forced_logits(&b, &forced, None).unwrap();
        let (again, rows_again) = e.forced_logits(&a, &forced, None).unwrap();
        let (rows_first, rows_again) = (rows_first.unwrap(), rows_again.unwrap());
        assert_ne!(
            rows_first,
            rows_b.unwrap(),
            "the prompts choose differently"
        );
        // Storage order changes the summation order, so allow rounding.
        assert_same_choice(&rows_first, &rows_again);
        assert_close(&first, &again);
        let g1 = run(&mut e);
        let g2 = run(&mut e);
        assert_eq!(g1.token_ids, g2.token_ids);
    }

    /// A prompt longer than the prefill chunk runs chunk by chunk through
    /// the KV cache; the selection adds up the chunks' counts. Same logits
    /// and same chosen neurons as one pass, up to rounding.
    #[test]
    fn a_prompt_prefilled_in_chunks_chooses_and_answers_as_in_one_pass() {
        let chunked_opts = LoadOptions {
            prefill_chunk: 7,
            ..Default::default()
        };
        let mut whole = engine(Mode::Selectinfer, 0.7, 0.4);
        let mut chunked = engine_with(Mode::Selectinfer, 0.7, 0.4, &chunked_opts);
        let prompt = whole
            .codec
            .chat_prompt_ids("Translate into English: Der Hund schläft im Garten.")
            .unwrap();
        assert!(prompt.len() > 3 * 7, "the prompt spans several chunks");
        let forced = [504u32, 2767, 2730];
        let (a, rows_a) = whole.forced_logits(&prompt, &forced, None).unwrap();
        let (b, rows_b) = chunked.forced_logits(&prompt, &forced, None).unwrap();
        assert_same_choice(&rows_a.unwrap(), &rows_b.unwrap());
        assert_close(&a, &b);
        assert_eq!(run(&mut whole).token_ids, run(&mut chunked).token_ids);
    }
}

#[test]
fn a_prompt_prefilled_in_chunks_gives_the_logits_of_one_pass() {
    let dir = common::model_dir("smollm2-135m-instruct");
    let whole = Model::from_dir(&dir, &LoadOptions::default()).unwrap();
    let chunked = Model::from_dir(
        &dir,
        &LoadOptions {
            prefill_chunk: 5,
            ..Default::default()
        },
    )
    .unwrap();
    let ids: Vec<u32> = (0..23u32).map(|i| 100 + 37 * i).collect();
    let a = whole
        .forward(&ids, &mut whole.new_cache())
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let mut cache = chunked.new_cache();
    let b = chunked
        .forward(&ids, &mut cache)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(cache.len(), ids.len(), "every chunk went through the cache");
    let diff = a
        .iter()
        .zip(&b)
        .map(|(p, q)| (p - q).abs())
        .fold(0f32, f32::max);
    assert!(diff < 1e-4, "logits differ by {diff}");
    let bad = Model::from_dir(
        &dir,
        &LoadOptions {
            prefill_chunk: 0,
            ..Default::default()
        },
    );
    let err = format!("{:#}", bad.expect_err("a zero chunk is refused"));
    assert!(err.contains("prefill_chunk"), "{err}");
}
