//! The inputs the fuzz tests found that crashed the checkpoint readers (a
//! panic, or an abort on a failed allocation), each kept as a fixed case:
//! refused now with an error naming the file. (The qfile hidden-size case
//! was found reading the code behind the fuzz-found offset case: the same
//! unchecked arithmetic.) The GGUF cases are in `tests/fuzz/regressions.rs`.

use super::fixtures;
use super::harness::refused;
use super::mutate;

#[test]
fn qfile_headers_whose_numbers_wrap_are_refused() {
    use crate::model::qfile::{QFile, ALIGN, MAGIC};
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
    use crate::model::rowread::RowReader;
    // A shape of [2^63, 64] f32 is 0 bytes, wrapped: the row reader took
    // it and `columns_t` indexed an empty row (a panic).
    let tmp = tempfile::tempdir().unwrap();
    let valid =
        std::fs::read(fixtures::model(tmp.path(), false).join("model.safetensors")).unwrap();
    let (mut header, data) = mutate::split_safetensors(&valid);
    let t = &mut header["model.embed_tokens.weight"];
    t["shape"] = serde_json::json!([1u64 << 63, 64]);
    let start = t["data_offsets"][0].clone();
    t["data_offsets"] = serde_json::json!([start, start]);
    let path = tmp.path().join("wrapped.safetensors");
    std::fs::write(&path, mutate::join_safetensors(&header, data)).unwrap();
    refused(RowReader::open(&path), &path, "inconsistent offsets");
}

#[test]
fn safetensors_empty_dimension_is_refused() {
    use crate::model::rowread::RowReader;
    // [0, 2^40] f32 has no bytes, but reading its columns allocated a row
    // of 4 TiB (an abort). Found by review of the case above.
    let tmp = tempfile::tempdir().unwrap();
    let valid =
        std::fs::read(fixtures::model(tmp.path(), false).join("model.safetensors")).unwrap();
    let (mut header, data) = mutate::split_safetensors(&valid);
    let t = &mut header["model.embed_tokens.weight"];
    t["shape"] = serde_json::json!([0, 1u64 << 40]);
    let start = t["data_offsets"][0].clone();
    t["data_offsets"] = serde_json::json!([start, start]);
    let path = tmp.path().join("empty.safetensors");
    std::fs::write(&path, mutate::join_safetensors(&header, data)).unwrap();
    refused(RowReader::open(&path), &path, "empty dimension");
}
