//! The GGUF reader (candle's, behind `QuantizedModel::load`): noise, byte
//! edits of a tiny valid llama and qwen2 GGUF, and valid files written
//! with metadata values replaced (edge numbers, other types) or removed.
//! A model that loads must also run a token or refuse it.

use crate::mutate::edge_u64;
use crate::{clear, file_bytes, fixtures, fuzz, inputs, Input};
use candle_core::quantized::gguf_file::Value as G;
use proptest::prelude::*;

/// A GGUF input: noise, byte edits of a valid file, or a valid file
/// written with some metadata values replaced or removed (`None`).
#[derive(Debug, Clone)]
enum GgufInput {
    File(Input),
    Meta(usize, Vec<(usize, Option<G>)>),
}

/// Metadata keys the loaders read (and some they should not trip on).
const GGUF_KEYS: &[&str] = &[
    "general.architecture",
    "general.alignment",
    "attention.head_count",
    "attention.head_count_kv",
    "block_count",
    "embedding_length",
    "rope.dimension_count",
    "context_length",
    "attention.layer_norm_rms_epsilon",
    "rope.freq_base",
    "expert_count",
    "expert_used_count",
];

fn gguf_value() -> impl Strategy<Value = G> {
    prop_oneof![
        4 => edge_u64().prop_map(|v| G::U32(v as u32)),
        1 => edge_u64().prop_map(G::U64),
        1 => any::<i32>().prop_map(G::I32),
        1 => prop::sample::select(vec![0.0f32, -1.0, 1e-5, f32::NAN, f32::INFINITY, 1e30])
            .prop_map(G::F32),
        1 => prop::sample::select(vec!["llama", "qwen2", "gpt2", ""])
            .prop_map(|s| G::String(s.into())),
        1 => any::<bool>().prop_map(G::Bool),
    ]
}

#[test]
fn gguf_reader() {
    use selectinfer::tools::gguf::QuantizedModel;
    let tmp = tempfile::tempdir().unwrap();
    let archs = ["llama", "qwen2"];
    let metas: Vec<_> = archs.iter().map(|a| fixtures::gguf_metadata(a)).collect();
    let valid: Vec<Vec<u8>> = archs
        .iter()
        .zip(&metas)
        .map(|(a, m)| fixtures::gguf(a, m))
        .collect();
    for v in &valid {
        let path = tmp.path().join("valid.gguf");
        std::fs::write(&path, v).unwrap();
        QuantizedModel::load(&path).expect("the unmutated GGUF loads");
    }
    let path = tmp.path().join("fuzz.gguf");
    let meta_edit = (
        0..GGUF_KEYS.len(),
        prop::option::weighted(0.9, gguf_value()),
    );
    let strategy = prop_oneof![
        3 => inputs(2, 0).prop_map(GgufInput::File),
        2 => (0..2usize, prop::collection::vec(meta_edit, 1..4))
            .prop_map(|(a, e)| GgufInput::Meta(a, e)),
    ];
    fuzz("gguf", strategy, |input| {
        let bytes = match &input {
            GgufInput::File(i) => file_bytes(&valid, b"GGUF\x03\0\0\0", i),
            GgufInput::Meta(a, edits) => {
                let mut meta = metas[*a].clone();
                for (k, v) in edits {
                    let key = match GGUF_KEYS[*k] {
                        k @ ("general.architecture" | "general.alignment") => k.to_string(),
                        k => format!("{}.{k}", archs[*a]),
                    };
                    meta.retain(|(name, _)| *name != key);
                    if let Some(v) = v {
                        meta.push((key, v.clone()));
                    }
                }
                fixtures::gguf(archs[*a], &meta)
            }
        };
        std::fs::write(&path, bytes).unwrap();
        let r = QuantizedModel::load(&path);
        clear(&r, &path)?;
        let Ok((mut m, _)) = r else { return Ok(false) };
        // A model that loads runs a token or refuses it.
        let _ = m.forward(&[1], 0);
        Ok(true)
    });
}
