//! The inputs the fuzz tests found that crashed a reader (a panic, or an
//! abort on a failed allocation) or were accepted wrongly, each kept as a
//! fixed case: refused now with an error naming the file. (The qfile
//! hidden-size case was found reading the code behind the fuzz-found
//! offset case: the same unchecked arithmetic.)

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

#[test]
fn qfile_headers_whose_numbers_wrap_are_refused() {
    use selectinfer::model::qfile::{QFile, ALIGN, MAGIC};
    let tmp = tempfile::tempdir().unwrap();
    let valid = std::fs::read(fixtures::model(tmp.path(), true).join("model.q8.siq")).unwrap();
    let len = u64::from_le_bytes(valid[8..16].try_into().unwrap()) as usize;
    let data = &valid[(16 + len).next_multiple_of(ALIGN as usize)..];
    let header: serde_json::Value = serde_json::from_slice(&valid[16..16 + len]).unwrap();
    let write = |name: &str, header: &serde_json::Value| {
        let json = serde_json::to_vec(header).unwrap();
        let mut out = MAGIC.to_vec();
        out.extend((json.len() as u64).to_le_bytes());
        out.extend(json);
        out.resize(out.len().next_multiple_of(ALIGN as usize), 0);
        out.extend_from_slice(data);
        let path = tmp.path().join(name);
        std::fs::write(&path, out).unwrap();
        path
    };
    // An offset of 2^64 - 8: data start + offset + bytes wrapped into the
    // file, and the tensor was read from the header's bytes.
    let mut h = header.clone();
    let first = h["tensors"].as_object_mut().unwrap().values_mut().next();
    first.unwrap()["offset"] = (u64::MAX - 7).into();
    let path = write("offset.q8.siq", &h);
    refused(QFile::open(&path), &path, "truncated");
    // A hidden size of 2^63 with the byte count its wrapped bundle size
    // gives (0): opened, then loading bundles overflowed (a panic).
    let mut h = header;
    h["ffn"][0]["hidden"] = (1u64 << 63).into();
    h["ffn"][0]["bytes"] = 0.into();
    let path = write("hidden.q8.siq", &h);
    refused(QFile::open(&path), &path, "too large");
}

#[test]
fn safetensors_shape_whose_size_wraps_is_refused() {
    use selectinfer::model::rowread::RowReader;
    // A shape of [2^63, 64] f32 is 0 bytes, wrapped: the row reader took
    // it and `columns_t` indexed an empty row (a panic).
    let tmp = tempfile::tempdir().unwrap();
    let valid =
        std::fs::read(fixtures::model(tmp.path(), false).join("model.safetensors")).unwrap();
    let (mut header, data) = crate::mutate::split_safetensors(&valid);
    let t = &mut header["model.embed_tokens.weight"];
    t["shape"] = serde_json::json!([1u64 << 63, 64]);
    let start = t["data_offsets"][0].clone();
    t["data_offsets"] = serde_json::json!([start, start]);
    let path = tmp.path().join("wrapped.safetensors");
    std::fs::write(&path, crate::mutate::join_safetensors(&header, data)).unwrap();
    refused(RowReader::open(&path), &path, "inconsistent offsets");
}

#[test]
fn safetensors_empty_dimension_is_refused() {
    use selectinfer::model::rowread::RowReader;
    // [0, 2^40] f32 has no bytes, but reading its columns allocated a row
    // of 4 TiB (an abort). Found by review of the case above.
    let tmp = tempfile::tempdir().unwrap();
    let valid =
        std::fs::read(fixtures::model(tmp.path(), false).join("model.safetensors")).unwrap();
    let (mut header, data) = crate::mutate::split_safetensors(&valid);
    let t = &mut header["model.embed_tokens.weight"];
    t["shape"] = serde_json::json!([0, 1u64 << 40]);
    let start = t["data_offsets"][0].clone();
    t["data_offsets"] = serde_json::json!([start, start]);
    let path = tmp.path().join("empty.safetensors");
    std::fs::write(&path, crate::mutate::join_safetensors(&header, data)).unwrap();
    refused(RowReader::open(&path), &path, "empty dimension");
}
