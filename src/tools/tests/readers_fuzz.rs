//! Property/fuzz tests of the readers of the project's own checkpoint
//! formats, on mutations of valid files made by the project's writers (the
//! shared harness of `tests/fuzz/`; see `tests/fuzz_inputs.rs` for the
//! rules and the environment variables): the ranking file, the quantized
//! checkpoint and its neuron bundles, the safetensors row reader. Each
//! answers Ok or an error naming the file, never panics, hangs or
//! allocates from an unchecked length. They run in the lib's test binary
//! (`cargo test --release --features ros --lib readers_fuzz`) because the
//! readers are the model's internals.

use super::fixtures;
use super::harness::{clear, file_bytes, fuzz, inputs, Input};
use super::mutate::{self, apply, apply_json, Noise};
use proptest::prelude::*;
use rusty_fork::rusty_fork_test;

/// A safetensors file's bytes for `input` (`valid` the unmutated file;
/// JSON document 1 is the ranking metadata string).
fn safetensors_bytes(valid: &[u8], input: &Input) -> Vec<u8> {
    match input {
        Input::Noise(n) => n.bytes(&valid[..8]),
        Input::Bytes(_, e) => apply(valid, e),
        Input::Json(which, consistent, e) => {
            let (mut header, data) = mutate::split_safetensors(valid);
            if *which == 0 {
                header = apply_json(&header, e);
                if *consistent {
                    mutate::fit_safetensors(&mut header);
                }
            } else {
                let meta = header["__metadata__"]["selectinfer"].as_str().unwrap();
                let meta = apply_json(&serde_json::from_str(meta).unwrap(), e);
                header["__metadata__"]["selectinfer"] = meta.to_string().into();
            }
            mutate::join_safetensors(&header, data)
        }
    }
}

/// A quantized checkpoint's bytes for `input`.
fn qfile_bytes(valid: &[u8], input: &Input) -> Vec<u8> {
    use crate::model::qfile::{ALIGN, MAGIC};
    let Input::Json(_, consistent, e) = input else {
        return file_bytes(&[valid.to_vec()], MAGIC, input);
    };
    let len = u64::from_le_bytes(valid[8..16].try_into().unwrap()) as usize;
    let data = &valid[(16 + len).next_multiple_of(ALIGN as usize)..];
    let mut header = apply_json(&serde_json::from_slice(&valid[16..16 + len]).unwrap(), e);
    if *consistent {
        mutate::fit_qfile(&mut header);
    }
    let json = serde_json::to_vec(&header).unwrap();
    let mut out = MAGIC.to_vec();
    out.extend((json.len() as u64).to_le_bytes());
    out.extend(json);
    out.resize(out.len().next_multiple_of(ALIGN as usize), 0);
    out.extend_from_slice(data);
    out
}

// Each reader in a process of its own (rusty-fork): the harness bounds the
// process's peak RSS, which the lib's other tests, loading real models
// beside these, would otherwise raise.
rusty_fork_test! {
    #[test]
    fn ranking_reader() {
        use crate::method::ranking::{Ranking, IN_MODEL_FILE};
        let tmp = tempfile::tempdir().unwrap();
        let valid = std::fs::read(fixtures::model(tmp.path(), false).join(IN_MODEL_FILE)).unwrap();
        let path = tmp.path().join("fuzz.ranking.safetensors");
        let again = tmp.path().join("again.ranking.safetensors");
        std::fs::write(&path, &valid).unwrap();
        Ranking::load(&path).expect("the valid ranking");
        fuzz("ranking", inputs(1, 2), |input| {
            std::fs::write(&path, safetensors_bytes(&valid, &input)).unwrap();
            let r = Ranking::load(&path);
            clear(&r, &path)?;
            if let Ok(r) = r {
                // What was accepted is a valid ranking: it saves and reads back.
                r.save(&again).map_err(|e| format!("{e:#}"))?;
                let back = Ranking::load(&again).map_err(|e| format!("{e:#}"))?;
                check!(back == r, "read back differs: {back:?} vs {r:?}");
                return Ok(true);
            }
            Ok(false)
        });
    }

    #[test]
    fn qfile_and_bundles_reader() {
        use crate::model::qfile::{QFile, ALIGN};
        let tmp = tempfile::tempdir().unwrap();
        let model = fixtures::model(tmp.path(), true);
        let valid = std::fs::read(model.join("model.q8.siq")).unwrap();
        let path = tmp.path().join("fuzz.q8.siq");
        let q = QFile::open(&model.join("model.q8.siq")).expect("the valid checkpoint");
        q.bundles(0, None).expect("its bundles");
        fuzz("qfile + bundles", inputs(1, 1), |input| {
            let bytes = qfile_bytes(&valid, &input);
            std::fs::write(&path, &bytes).unwrap();
            let r = QFile::open(&path);
            clear(&r, &path)?;
            let Ok(q) = r else { return Ok(false) };
            // Everything the header names lies inside the file (no wrapping).
            let size = bytes.len() as u64;
            let len = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
            let data_start = (16 + len).next_multiple_of(ALIGN);
            let spans = q.header.tensors.values().map(|e| (e.offset, e.bytes));
            for (offset, n) in spans.chain(q.header.ffn.iter().map(|e| (e.offset, e.bytes))) {
                let end = offset
                    .checked_add(n)
                    .and_then(|x| x.checked_add(data_start));
                check!(
                    end.is_some_and(|end| end <= size),
                    "accepted bytes {offset}+{n} past data start {data_start} in a file of {size}"
                );
            }
            // Every read answers Ok or an error naming the file.
            for (name, e) in &q.header.tensors {
                match e.shape[..] {
                    [n] if e.format == "f32" => clear(&q.f32(name, n), &path)?,
                    [rows, cols] => clear(&q.matrix(&[(name, rows)], cols), &path)?,
                    _ => {}
                }
            }
            for (layer, e) in q.header.ffn.iter().enumerate() {
                let ids: Vec<u32> = [0, 1, 2, 7, e.neurons.saturating_sub(1)]
                    .iter()
                    .map(|&i| i as u32)
                    .filter(|&i| (i as usize) < e.neurons)
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                for ids in [None, Some(&ids[..])] {
                    let b = q.bundles(layer, ids);
                    clear(&b, &path)?;
                    match b {
                        Ok(b) if b.layout().hidden <= 1 << 16 => {
                            let h = b.layout().hidden;
                            let y = b.forward_row(&vec![0.5; h]).map_err(|e| format!("{e:#}"))?;
                            check!(y.len() == h, "forward_row gave {} values for {h}", y.len());
                        }
                        _ => {}
                    }
                }
            }
            Ok(true)
        });
    }

    #[test]
    fn bundles_from_bytes() {
        use crate::kernels::planar::RowForm;
        use crate::kernels::quant::QFormat;
        use crate::kernels::quant_mlp::{BundleLayout, DownForm};
        use crate::model::bundles::Bundles;
        let format = prop::sample::select(vec![
            QFormat::Q4_0,
            QFormat::Q4_1,
            QFormat::Q5_0,
            QFormat::Q8_0,
        ]);
        let hidden = prop_oneof![
            3 => (0..8usize).prop_map(|k| k * 32),
            1 => mutate::edge_u64().prop_map(|v| v as usize),
        ];
        // Random bytes for `count` bundles of the layout's true size, give or
        // take `misaligned` bytes.
        let data = (
            0..40u128,
            prop_oneof![3 => Just(0u128), 1 => 1..40u128],
            any::<u64>(),
        );
        let strategy = (hidden, format.clone(), format.clone(), format, data);
        fuzz("bundles", strategy, |(hidden, gate, up, down, data)| {
            let layout = BundleLayout {
                hidden,
                gate,
                up,
                down,
                rows: RowForm::Blocks,
                down_form: DownForm::Rows,
            };
            // The bundle size, computed here without overflow.
            let blocks = [gate, up, down]
                .into_iter()
                .map(|f| f.block_bytes() as u128);
            let bb = (hidden / 32) as u128 * blocks.sum::<u128>();
            let (count, misaligned, seed) = data;
            let len = Some(count * bb + misaligned).filter(|&n| n <= 1 << 22);
            let noise = Noise {
                with_magic: false,
                len: len.unwrap_or(count + misaligned) as usize,
                seed,
            };
            let data = noise.bytes(&[]);
            let len = data.len();
            let Ok(b) = Bundles::new(layout, data) else {
                return Ok(false);
            };
            // Accepted: the bytes are whole bundles of the layout's size.
            check!(
                b.len() as u128 * bb == len as u128,
                "accepted {len} bytes as {} bundles of {bb} (hidden {hidden})",
                b.len()
            );
            if !b.is_empty() && hidden <= 1 << 16 {
                let y = b
                    .forward_row(&vec![0.25; hidden])
                    .map_err(|e| format!("{e:#}"))?;
                check!(y.len() == hidden, "forward_row gave {} values", y.len());
                check!(b.down_norms().len() == b.len(), "down_norms of {}", b.len());
                let mut p = b.clone();
                let rev: Vec<usize> = (0..b.len()).rev().collect();
                p.permute(&rev).map_err(|e| format!("{e:#}"))?;
            }
            Ok(true)
        });
    }

    #[test]
    fn safetensors_row_reader() {
        use crate::model::rowread::RowReader;
        use candle_core::DType;
        let tmp = tempfile::tempdir().unwrap();
        let model = fixtures::model(tmp.path(), false);
        let valid = std::fs::read(model.join("model.safetensors")).unwrap();
        let names: Vec<String> = mutate::split_safetensors(&valid)
            .0
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k != "__metadata__")
            .cloned()
            .collect();
        let path = tmp.path().join("fuzz.safetensors");
        let r = RowReader::open(&model.join("model.safetensors")).expect("the valid weights");
        r.rows("model.embed_tokens.weight", &[0, 299], DType::F32)
            .expect("its rows");
        fuzz("safetensors rows", inputs(1, 1), |input| {
            std::fs::write(&path, safetensors_bytes(&valid, &input)).unwrap();
            let r = RowReader::open(&path);
            clear(&r, &path)?;
            let Ok(r) = r else { return Ok(false) };
            for name in &names {
                let Ok(e) = r.entry(name) else { continue };
                if let [rows, cols] = e.shape[..] {
                    let last = |n: usize| [0, n.saturating_sub(1) as u32];
                    clear(&r.rows(name, &last(rows)[..rows.min(2)], DType::F32), &path)?;
                    clear(
                        &r.columns_t(name, &last(cols)[..cols.min(2)], DType::F32),
                        &path,
                    )?;
                }
            }
            Ok(true)
        });
    }
}
