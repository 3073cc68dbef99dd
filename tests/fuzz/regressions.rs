//! The inputs the fuzz tests found that crashed a reader (a panic, or an
//! abort on a failed allocation) or were accepted wrongly, each kept as a
//! fixed case: refused now with an error naming the file. (The cases of
//! the project's own checkpoint readers are in the lib's
//! `tools::tests::reader_regressions`.)

use crate::fixtures;
use crate::harness::refused;
use candle_core::quantized::gguf_file::Value as G;
use std::path::Path;

/// The tiny GGUF of `arch` with metadata `set` (keys under the
/// architecture's prefix unless `general.`).
fn gguf_with(dir: &Path, arch: &str, set: &[(&str, G)]) -> std::path::PathBuf {
    let mut meta = fixtures::gguf_metadata(arch);
    let mut name = arch.to_string();
    for (key, value) in set {
        let key = match key.starts_with("general.") {
            true => key.to_string(),
            false => format!("{arch}.{key}"),
        };
        meta.retain(|(k, _)| *k != key);
        meta.push((key.clone(), value.clone()));
        name = format!("{name}-{key}");
    }
    let path = dir.join(format!("{name}.gguf"));
    std::fs::write(&path, fixtures::gguf(arch, &meta)).unwrap();
    path
}

#[test]
fn gguf_headers_that_crashed_the_loader_are_refused() {
    use selectinfer::tools::gguf::QuantizedModel;
    let tmp = tempfile::tempdir().unwrap();
    let max = G::U32(u32::MAX);
    let cases = [
        // candle's reader divided by zero (a panic).
        ("llama", vec![("general.alignment", G::U32(0))], "panicked"),
        // candle's llama allocated 1.4 TB for the layers (an abort).
        ("llama", vec![("block_count", max.clone())], "block_count"),
        ("llama", vec![("expert_count", max.clone())], "expert_count"),
        // ... or a rotary table of 4096 × 2^31 entries.
        (
            "llama",
            vec![("rope.dimension_count", max.clone())],
            "rotary",
        ),
        // 4096 × 32,768 entries: a 1.6 GB peak under the old cap of 2^27.
        (
            "llama",
            vec![("rope.dimension_count", G::U32(65_535))],
            "rotary",
        ),
        // candle's qwen2 divided by zero.
        (
            "qwen2",
            vec![("attention.head_count", G::U32(0))],
            "head_count is 0",
        ),
        ("qwen2", vec![("context_length", max.clone())], "rotary"),
        // A head dimension of 0 with 1.8e9 positions: 14 GB for a table of
        // no entries (it fit in this machine's memory, in 40 s).
        (
            "qwen2",
            vec![
                ("attention.head_count", max),
                ("context_length", G::U32(1_788_398_598)),
            ],
            "rotary",
        ),
        // No positions, a head dimension of 2^30: 4 GB of frequencies.
        (
            "qwen2",
            vec![
                ("embedding_length", G::U32(i32::MAX as u32)),
                ("context_length", G::U32(0)),
            ],
            "rotary",
        ),
    ];
    for (arch, set, what) in cases {
        let path = gguf_with(tmp.path(), arch, &set);
        refused(QuantizedModel::load(&path), &path, what);
    }
}

#[test]
fn gguf_tensor_with_an_empty_dimension_is_refused() {
    // token_embd.weight of [0, 2^41 + 32]: no bytes, so inside the file,
    // but the first token's embedding allocated 8 TB (an abort).
    use selectinfer::tools::gguf::QuantizedModel;
    let tmp = tempfile::tempdir().unwrap();
    let mut bytes = fixtures::gguf("llama", &fixtures::gguf_metadata("llama"));
    let name = b"token_embd.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    assert_eq!(bytes[at..at + 4], 2u32.to_le_bytes(), "two dimensions");
    bytes[at + 4..at + 12].copy_from_slice(&((1u64 << 41) + 32).to_le_bytes());
    bytes[at + 12..at + 20].copy_from_slice(&0u64.to_le_bytes());
    let path = tmp.path().join("empty-dim.gguf");
    std::fs::write(&path, bytes).unwrap();
    refused(QuantizedModel::load(&path), &path, "empty dimension");
}
