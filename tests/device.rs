//! The device-generic pieces that the GPU path uses, checked on the CPU:
//! synthetic checkpoints (written, loaded, run in every mode, deterministic)
//! and the tensor-op version of the dynamic selection (what runs on a GPU),
//! which must choose exactly what the host version chooses.

mod common;

use candle_core::{DType, Device, Tensor};
use selectinfer::engine::EngineSpec;
use selectinfer::engine::GenerateOptions;
use selectinfer::method::SelectionParams;
use selectinfer::method::{LayerSelector, Mode};
use selectinfer::sys::device::WeightDtype;
use std::path::Path;

/// A small Llama-3-style shape (llama3 rope scaling, GQA) and a Qwen2 one
/// (q/k/v biases, untied head), so the synthetic writer covers both families.
fn tiny_shape(dir: &Path, qwen: bool) -> std::path::PathBuf {
    let cfg = if qwen {
        serde_json::json!({
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 512,
            "tie_word_embeddings": false, "eos_token_id": 258, "hidden_act": "silu"
        })
    } else {
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 320,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 2048,
            "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 256, "rope_type": "llama3"},
            "tie_word_embeddings": true, "eos_token_id": 258, "hidden_act": "silu"
        })
    };
    let path = dir.join(if qwen { "qwen.json" } else { "llama.json" });
    std::fs::write(&path, cfg.to_string()).unwrap();
    path
}

fn spec(model: &Path, mode: Mode) -> EngineSpec {
    EngineSpec {
        model: model.to_path_buf(),
        dtype: WeightDtype::F32,
        mode,
        params: SelectionParams {
            load_ratio: 0.7,
            static_ratio: 0.2,
            compute_ratio: 0.4,
            token_ratio: 0.2,
            dense_layers: vec![0],
            task: "qa".into(),
            score: Default::default(),
            gate_keep: 1.0,
            layer_drop: Vec::new(),
            coarse_ratio: 0.0,
            coarse_bits: 4,
        },
        ..Default::default()
    }
}

#[test]
fn synthetic_models_load_and_run_in_every_mode_deterministically() {
    let tmp = tempfile::tempdir().unwrap();
    for qwen in [false, true] {
        let shape = tiny_shape(tmp.path(), qwen);
        let a = tmp.path().join(format!("a-{qwen}"));
        let b = tmp.path().join(format!("b-{qwen}"));
        selectinfer::tools::synth::write_model(&shape, &a, 7, DType::F16).unwrap();
        selectinfer::tools::synth::write_model(&shape, &b, 7, DType::F16).unwrap();
        let bytes = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
        assert_eq!(bytes(&a), bytes(&b), "same seed, same weights");
        let c = tmp.path().join(format!("c-{qwen}"));
        selectinfer::tools::synth::write_model(&shape, &c, 8, DType::F16).unwrap();
        assert_ne!(bytes(&a), bytes(&c), "another seed, other weights");

        let opts = GenerateOptions {
            max_new_tokens: 6,
            ignore_eos: true,
            ..Default::default()
        };
        for mode in [
            Mode::Dense,
            Mode::LoadOnly,
            Mode::Selectinfer,
            Mode::Coreinfer,
        ] {
            // The ranking inside the folder is found without --ranking.
            let mut engine = spec(&a, mode)
                .load()
                .unwrap_or_else(|e| panic!("{mode:?}: {e:#}"));
            let g = engine
                .generate_chat("hello robot", &opts, |_| true)
                .unwrap();
            assert_eq!(g.generated_tokens, 6, "{mode:?}");
            let again = engine
                .generate_chat("hello robot", &opts, |_| true)
                .unwrap();
            assert_eq!(g.token_ids, again.token_ids, "{mode:?} is deterministic");
            if mode == Mode::Selectinfer {
                assert!(
                    g.compute_ratio < 0.75,
                    "selectinfer computed {}",
                    g.compute_ratio
                );
            }
        }
    }
}

#[test]
fn synthetic_model_rejects_a_bad_shape_with_the_file_named() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.json");
    std::fs::write(&bad, r#"{"model_type": "llama", "hidden_size": 64}"#).unwrap();
    let err = selectinfer::tools::synth::write_model(&bad, &tmp.path().join("out"), 0, DType::F16)
        .unwrap_err();
    assert!(format!("{err:#}").contains("bad.json"), "{err:#}");
}

#[test]
fn tensor_op_selection_chooses_what_the_host_selection_chooses() {
    // Real activations: SmolLM2 layer 10 on a real prompt.
    let dir = common::model_dir("smollm2-135m-instruct");
    let engine = spec(&dir, Mode::Dense).load().unwrap();
    let ids = engine
        .codec
        .chat_prompt_ids("Translate to English: Der Roboter fährt zur Ladestation.")
        .unwrap();
    let mut acts = Vec::new();
    let mut cache = engine.model.new_cache();
    engine
        .model
        .forward_observed(&ids, &mut cache, &mut |layer, a: &Tensor| {
            if layer % 10 == 5 {
                acts.push(a.clone());
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(acts.len(), 3);
    for a in &acts {
        let n = a.dim(2).unwrap();
        let sel = LayerSelector {
            static_positions: (0..n).step_by(7).collect(),
            token_k: n / 5,
            dynamic_k: n / 4,
            score: Default::default(),
            down_norms: None,
        };
        let (h_hits, h_mass) = sel.counts_on_host(a).unwrap();
        let (d_hits, d_mass) = sel.counts_on_device(a).unwrap();
        assert_eq!(h_hits, d_hits);
        for (x, y) in h_mass.iter().zip(&d_mass) {
            assert!((x - y).abs() <= 1e-4 * x.abs().max(1.0), "{x} vs {y}");
        }
        let chosen = sel.select(a).unwrap();
        assert_eq!(chosen.len(), sel.static_positions.len() + sel.dynamic_k);
    }
    // Sanity of the comparison itself: a different α changes the counts.
    let n = acts[0].dim(2).unwrap();
    let wide = LayerSelector {
        static_positions: vec![],
        token_k: n / 2,
        dynamic_k: n / 4,
        score: Default::default(),
        down_norms: None,
    };
    let narrow = LayerSelector {
        token_k: n / 10,
        ..wide.clone()
    };
    assert_ne!(
        wide.counts_on_device(&acts[0]).unwrap().0,
        narrow.counts_on_device(&acts[0]).unwrap().0
    );
}

#[test]
fn device_check_refuses_cpu_and_cuda_without_support() {
    let tmp = tempfile::tempdir().unwrap();
    let shape = tiny_shape(tmp.path(), false);
    let m = tmp.path().join("m");
    selectinfer::tools::synth::write_model(&shape, &m, 1, DType::F16).unwrap();
    // In a build without the cuda feature, cuda:0 is refused by name.
    if !candle_core::utils::cuda_is_available() {
        let err = selectinfer::tools::parity::parity(&spec(&m, Mode::Dense), "cuda:0", "hi", 2)
            .unwrap_err();
        assert!(format!("{err:#}").contains("--features cuda"), "{err:#}");
    }
    let err = selectinfer::sys::device::check_dtype(&Device::Cpu, DType::BF16).unwrap_err();
    assert!(err.to_string().contains("not supported on CPU"), "{err}");
}
