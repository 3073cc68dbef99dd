//! Valid inputs made by the project's own writers (and, for the formats it
//! only reads, by the format's reference writer): a tiny synthetic model
//! with its ranking and quantized checkpoint, a tiny llama GGUF, an MCAP
//! and a rosbag2 sqlite3 bag.

use candle_core::quantized::gguf_file::{self, Value as G};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use selectinfer::sys::device::Quant;
use std::path::{Path, PathBuf};

/// A tiny synthetic llama folder in `dir` (config, weights, tokenizer,
/// ranking) and, with `quantized`, its `model.q8.siq`.
pub fn model(dir: &Path, quantized: bool) -> PathBuf {
    let shape = dir.join("shape.json");
    let cfg = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
        "tie_word_embeddings": true, "eos_token_id": 258, "hidden_act": "silu"
    });
    std::fs::write(&shape, cfg.to_string()).unwrap();
    let out = dir.join("model");
    selectinfer::tools::synth::write_model(&shape, &out, 3, DType::F32).unwrap();
    if quantized {
        selectinfer::store::quantize::quantize_model(&out, Quant::Q8).unwrap();
    }
    out
}

/// The metadata of the tiny GGUF of architecture `arch` (llama, qwen2).
pub fn gguf_metadata(arch: &str) -> Vec<(String, G)> {
    let u = |k: &str, v: u32| (format!("{arch}.{k}"), G::U32(v));
    vec![
        ("general.architecture".into(), G::String(arch.into())),
        u("attention.head_count", 2),
        u("attention.head_count_kv", 2),
        u("block_count", 1),
        u("embedding_length", 32),
        u("rope.dimension_count", 16),
        u("context_length", 64),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            G::F32(1e-5),
        ),
    ]
}

/// A tiny GGUF of `arch` (candle's writer; Q8_0 matrices, f32 norms and
/// biases) with `metadata`.
pub fn gguf(arch: &str, metadata: &[(String, G)]) -> Vec<u8> {
    let dev = Device::Cpu;
    let (h, n, v) = (32, 64, 16);
    let t = |shape: &[usize], seed: f32, dtype: GgmlDType| {
        let len: usize = shape.iter().product();
        let data: Vec<f32> = (0..len)
            .map(|i| (i as f32 * 0.37 + seed).sin() * 0.1)
            .collect();
        QTensor::quantize(&Tensor::from_vec(data, shape, &dev).unwrap(), dtype).unwrap()
    };
    let q = GgmlDType::Q8_0;
    let vector = || t(&[h], 1.0, GgmlDType::F32);
    let mut tensors: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), t(&[v, h], 0.1, q)),
        ("output_norm.weight".into(), vector()),
        ("blk.0.attn_q.weight".into(), t(&[h, h], 0.2, q)),
        ("blk.0.attn_k.weight".into(), t(&[h, h], 0.3, q)),
        ("blk.0.attn_v.weight".into(), t(&[h, h], 0.4, q)),
        ("blk.0.attn_output.weight".into(), t(&[h, h], 0.5, q)),
        ("blk.0.ffn_gate.weight".into(), t(&[n, h], 0.6, q)),
        ("blk.0.ffn_up.weight".into(), t(&[n, h], 0.7, q)),
        ("blk.0.ffn_down.weight".into(), t(&[h, n], 0.8, q)),
        ("blk.0.attn_norm.weight".into(), vector()),
        ("blk.0.ffn_norm.weight".into(), vector()),
    ];
    if arch == "qwen2" {
        for b in ["q", "k", "v"] {
            tensors.push((format!("blk.0.attn_{b}.bias"), vector()));
        }
    }
    let md: Vec<(&str, &G)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = std::io::Cursor::new(Vec::new());
    gguf_file::write(&mut out, &md, &ts).unwrap();
    out.into_inner()
}
