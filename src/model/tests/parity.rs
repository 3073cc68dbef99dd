//! Logits parity with candle-transformers' own `llama` and `qwen2` modules on
//! small random-weight checkpoints shaped like Llama-3.2 (GQA, llama3 rope
//! scaling, tied embeddings) and Qwen2.5 (GQA, q/k/v biases, separate
//! lm_head). Random weights are fine here: this checks our implementation
//! against an independent one, not model quality.

use crate::model::{Config, LoadOptions, Model};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;

const TOLERANCE: f32 = 1e-4;

/// Deterministic uniform values in [-scale, scale] (xorshift).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Writes config.json and model.safetensors with random weights into a temp dir.
fn random_checkpoint(config: serde_json::Value) -> (tempfile::TempDir, Config) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();
    let cfg: Config = serde_json::from_value(config).unwrap();
    let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let hd = cfg.head_dim();
    let (q, kv) = (cfg.num_attention_heads * hd, cfg.num_kv_heads() * hd);
    let mut shapes: Vec<(String, Vec<usize>, f32)> = vec![
        ("model.embed_tokens.weight".into(), vec![v, h], 1.0),
        ("model.norm.weight".into(), vec![h], 0.0),
    ];
    if !cfg.tie_word_embeddings {
        shapes.push(("lm_head.weight".into(), vec![v, h], 0.2));
    }
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        shapes.extend([
            (format!("{p}.input_layernorm.weight"), vec![h], 0.0),
            (format!("{p}.post_attention_layernorm.weight"), vec![h], 0.0),
            (format!("{p}.self_attn.q_proj.weight"), vec![q, h], 0.2),
            (format!("{p}.self_attn.k_proj.weight"), vec![kv, h], 0.2),
            (format!("{p}.self_attn.v_proj.weight"), vec![kv, h], 0.2),
            (format!("{p}.self_attn.o_proj.weight"), vec![h, q], 0.2),
            (format!("{p}.mlp.gate_proj.weight"), vec![i, h], 0.2),
            (format!("{p}.mlp.up_proj.weight"), vec![i, h], 0.2),
            (format!("{p}.mlp.down_proj.weight"), vec![h, i], 0.2),
        ]);
        if cfg.qkv_bias() {
            shapes.extend([
                (format!("{p}.self_attn.q_proj.bias"), vec![q], 0.5),
                (format!("{p}.self_attn.k_proj.bias"), vec![kv], 0.5),
                (format!("{p}.self_attn.v_proj.bias"), vec![kv], 0.5),
            ]);
        }
    }
    let mut tensors = HashMap::new();
    for (seed, (name, shape, scale)) in shapes.into_iter().enumerate() {
        let n: usize = shape.iter().product();
        let data = if scale == 0.0 {
            // Norm weights: around 1.
            values(n, seed as u64 + 1, 0.1)
                .into_iter()
                .map(|x| 1.0 + x)
                .collect()
        } else {
            values(n, seed as u64 + 1, scale)
        };
        tensors.insert(name, Tensor::from_vec(data, shape, &Device::Cpu).unwrap());
    }
    candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
    (dir, cfg)
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len(), "logit vectors differ in length");
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Prompt of 9 tokens, then 6 decode steps feeding the reference's argmax.
fn compare(ours: &Model, mut reference: impl FnMut(&[u32], usize) -> Tensor, vocab: usize) -> f32 {
    let prompt: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % vocab as u32).collect();
    let mut cache = ours.new_cache();
    let mut worst = 0f32;
    let mut ids = prompt.clone();
    let mut pos = 0;
    for step in 0..7 {
        let ours_logits = ours.forward(&ids, &mut cache).unwrap();
        let ref_logits = reference(&ids, pos).flatten_all().unwrap();
        let d = max_abs_diff(&ours_logits, &ref_logits);
        assert!(
            d <= TOLERANCE,
            "step {step}: max abs diff {d} > {TOLERANCE}"
        );
        worst = worst.max(d);
        pos += ids.len();
        let next = ref_logits.argmax(0).unwrap().to_scalar::<u32>().unwrap();
        ids = vec![next];
    }
    worst
}

#[test]
fn llama32_shape_with_llama3_rope_scaling_matches_candle_transformers() {
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 128, "intermediate_size": 352, "vocab_size": 300,
        "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 256,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8, "rope_type": "llama3"},
        "tie_word_embeddings": true, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": [2, 3]
    });
    let (dir, cfg) = random_checkpoint(config.clone());
    let ours = Model::from_dir(dir.path(), &LoadOptions::default()).unwrap();
    let file = dir.path().join("model.safetensors");
    let vb =
        unsafe { VarBuilder::from_mmaped_safetensors(&[file], DType::F32, &Device::Cpu).unwrap() };
    use candle_transformers::models::llama as ref_llama;
    let ref_cfg: ref_llama::LlamaConfig = serde_json::from_value(config).unwrap();
    let ref_cfg = ref_cfg.into_config(false);
    let reference = ref_llama::Llama::load(vb, &ref_cfg).unwrap();
    let mut cache = ref_llama::Cache::new(true, DType::F32, &ref_cfg, &Device::Cpu).unwrap();
    let worst = compare(
        &ours,
        |ids, pos| {
            let x = Tensor::new(ids, &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            reference.forward(&x, pos, &mut cache).unwrap()
        },
        cfg.vocab_size,
    );
    eprintln!("llama3.2-shaped: worst max abs logit diff {worst:e}");
}

#[test]
fn qwen25_shape_with_biases_matches_candle_transformers() {
    let config = serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": 112, "intermediate_size": 304, "vocab_size": 320,
        "num_hidden_layers": 3, "num_attention_heads": 7, "num_key_value_heads": 1,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 256,
        "sliding_window": 256, "max_window_layers": 3, "use_sliding_window": false,
        "tie_word_embeddings": false, "hidden_act": "silu", "eos_token_id": 151645
    });
    let (dir, cfg) = random_checkpoint(config.clone());
    assert!(cfg.qkv_bias());
    let ours = Model::from_dir(dir.path(), &LoadOptions::default()).unwrap();
    let file = dir.path().join("model.safetensors");
    let vb =
        unsafe { VarBuilder::from_mmaped_safetensors(&[file], DType::F32, &Device::Cpu).unwrap() };
    use candle_transformers::models::qwen2 as ref_qwen2;
    let ref_cfg: ref_qwen2::Config = serde_json::from_value(config).unwrap();
    let mut reference = ref_qwen2::ModelForCausalLM::new(&ref_cfg, vb).unwrap();
    let worst = compare(
        &ours,
        |ids, pos| {
            let x = Tensor::new(ids, &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            reference.forward(&x, pos).unwrap()
        },
        cfg.vocab_size,
    );
    eprintln!("qwen2.5-shaped: worst max abs logit diff {worst:e}");
}

#[test]
fn f16_weights_stay_close_to_f32() {
    let config = serde_json::json!({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "vocab_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "tie_word_embeddings": true
    });
    let (dir, _) = random_checkpoint(config);
    let f32_model = Model::from_dir(dir.path(), &LoadOptions::default()).unwrap();
    let f16_model = Model::from_dir(
        dir.path(),
        &LoadOptions {
            dtype: DType::F16,
            ..Default::default()
        },
    )
    .unwrap();
    let ids = [3u32, 9, 27, 81, 115];
    let a = f32_model.forward(&ids, &mut f32_model.new_cache()).unwrap();
    let b = f16_model.forward(&ids, &mut f16_model.new_cache()).unwrap();
    let d = max_abs_diff(&a, &b);
    assert!(d < 5e-2, "f16 vs f32 max abs diff {d}");
    assert!(d > 0.0, "f16 weights must actually be f16");
}
