//! The cache in both dtypes: rows written in place read back like tensors
//! appended, buffers grow, shrink and reserve alike, and `Q8_0` rows hold
//! ggml's quantization of what was written.

use super::*;
use crate::kernels::test_data::plain_dequantize;

/// Position `p`'s rows, `[1, heads, 1, head_dim]`, distinct values.
fn rows(p: usize, heads: usize, head_dim: usize, salt: f32) -> Vec<f32> {
    (0..heads * head_dim)
        .map(|i| p as f32 * 0.5 + i as f32 * 0.01 + salt)
        .collect()
}

fn tensor(v: &[f32], heads: usize, seq: usize, head_dim: usize) -> Tensor {
    Tensor::from_slice(v, (1, heads, seq, head_dim), &Device::Cpu).unwrap()
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

fn layer(dtype: KvDtype) -> LayerCache {
    LayerCache {
        dtype,
        ..Default::default()
    }
}

/// The values cached rows hold, `[heads, len, head_dim]` in order.
fn read(side: KvRows) -> Vec<f32> {
    let (heads, len, hd) = side.dims().unwrap();
    let mut out = Vec::new();
    for g in 0..heads {
        match side {
            KvRows::F32(data, l) => {
                for p in 0..len {
                    let at = l.start_offset() + g * l.stride()[1] + p * l.stride()[2];
                    out.extend_from_slice(&data[at..at + hd]);
                }
            }
            KvRows::Q8 { .. } => {
                out.extend(plain_dequantize(QFormat::Q8_0, side.q8_rows(g, 0..len)))
            }
        }
    }
    out
}

/// What a cache of `dtype` holds of `x` (rows of `head_dim`): `x` itself,
/// or each row's `Q8_0` quantization.
fn held(x: &[f32], head_dim: usize, dtype: KvDtype) -> Vec<f32> {
    match dtype {
        KvDtype::F32 => x.to_vec(),
        KvDtype::Q8 => x
            .chunks_exact(head_dim)
            .flat_map(|row| {
                let mut b = vec![0u8; QFormat::Q8_0.row_bytes(head_dim)];
                crate::kernels::blocks::quantize_q8_0(row, &mut b);
                plain_dequantize(QFormat::Q8_0, &b)
            })
            .collect(),
    }
}

/// Rows written in place read back like tensors appended (as prefill
/// does), across a prefill/decode mix and past the buffers' growth; in
/// `Q8_0` as their quantization, the tensor path's dequantized tensors
/// included.
#[test]
fn pushed_rows_read_back_like_appended_tensors() {
    let (heads, hd) = (2, 32);
    for dtype in [KvDtype::F32, KvDtype::Q8] {
        let (mut appended, mut pushed) = (layer(KvDtype::F32), layer(dtype));
        // A 5-position prompt, appended to both.
        let prompt_k: Vec<f32> = (0..heads * 5 * hd).map(|i| i as f32 * 0.1).collect();
        let prompt_v: Vec<f32> = prompt_k.iter().map(|x| -x).collect();
        let (pk, pv) = (
            tensor(&prompt_k, heads, 5, hd),
            tensor(&prompt_v, heads, 5, hd),
        );
        appended.append(&pk, &pv).unwrap();
        let (tk, tv) = pushed.append(&pk, &pv).unwrap();
        assert_eq!(flat(&tk), held(&prompt_k, hd, dtype), "{dtype} prompt keys");
        assert_eq!(
            flat(&tv),
            held(&prompt_v, hd, dtype),
            "{dtype} prompt values"
        );
        for p in 5..GROW_BY + 40 {
            let (k, v) = (rows(p, heads, hd, 0.0), rows(p, heads, hd, 100.0));
            let (want_k, want_v) = appended
                .append(&tensor(&k, heads, 1, hd), &tensor(&v, heads, 1, hd))
                .unwrap();
            let (got_k, got_v) = pushed
                .push_row_and((&k, &v), (heads, hd), |k, v| Ok((read(k), read(v))))
                .unwrap();
            assert_eq!(
                got_k,
                held(&flat(&want_k), hd, dtype),
                "{dtype} keys at {p}"
            );
            assert_eq!(
                got_v,
                held(&flat(&want_v), hd, dtype),
                "{dtype} values at {p}"
            );
        }
        assert_eq!(pushed.len, GROW_BY + 40);
        assert_eq!(pushed.capacity(), 2 * GROW_BY);
    }
}

#[test]
fn a_row_of_the_wrong_size_is_refused_and_changes_nothing() {
    for dtype in [KvDtype::F32, KvDtype::Q8] {
        let mut c = layer(dtype);
        let (k, v) = (vec![1f32; 64], vec![2f32; 64]);
        c.push_row_and((&k, &v), (2, 32), |_, _| Ok(())).unwrap();
        let short = vec![0f32; 63];
        let err = c
            .push_row_and((&k, &short), (2, 32), |_, _| Ok(()))
            .unwrap_err();
        assert!(format!("{err:#}").contains("row of 63"), "{dtype}: {err:#}");
        assert_eq!(c.len, 1);
        let err = c
            .push_row_and((&k, &v), (1, 64), |_, _| Ok(()))
            .unwrap_err();
        assert!(format!("{err:#}").contains("kv cache"), "{dtype}: {err:#}");
        assert_eq!(c.len, 1);
    }
}

/// After a long sequence, truncating to a short prefix gives the memory
/// back (buffers of one step) and keeps the prefix's rows; a buffer that
/// fits is left alone.
#[test]
fn truncating_after_a_long_sequence_shrinks_the_buffers_and_keeps_the_prefix() {
    let (heads, hd) = (2, 32);
    for dtype in [KvDtype::F32, KvDtype::Q8] {
        let mut cache = KvCache::new(1, dtype);
        let n = 3 * GROW_BY + 7;
        let k: Vec<f32> = (0..heads * n * hd).map(|i| (i % 977) as f32).collect();
        let v: Vec<f32> = k.iter().map(|x| x + 0.5).collect();
        cache.layers[0]
            .append(&tensor(&k, heads, n, hd), &tensor(&v, heads, n, hd))
            .unwrap();
        assert_eq!(cache.capacity(), 4 * GROW_BY);
        cache.truncate(10).unwrap();
        assert_eq!((cache.len(), cache.capacity()), (10, GROW_BY));
        // Each head's first 10 positions.
        let prefix = |x: &[f32]| -> Vec<f32> {
            let x = held(x, hd, dtype);
            (0..heads)
                .flat_map(|g| x[g * n * hd..][..10 * hd].to_vec())
                .collect()
        };
        let r = cache.layers[0]
            .push_row_and(
                (&vec![0.0; heads * hd], &vec![0.0; heads * hd]),
                (heads, hd),
                |k, v| Ok((read(k), read(v))),
            )
            .unwrap();
        let without_last = |x: Vec<f32>| -> Vec<f32> {
            x.chunks_exact(11 * hd)
                .flat_map(|c| c[..10 * hd].to_vec())
                .collect()
        };
        assert_eq!(without_last(r.0), prefix(&k), "{dtype} keys");
        assert_eq!(without_last(r.1), prefix(&v), "{dtype} values");
        // Two steps for 300 positions, truncated to 260: no reallocation.
        let mut cache = KvCache::new(1, dtype);
        let n = GROW_BY + 44;
        let k: Vec<f32> = vec![1.0; heads * n * hd];
        cache.layers[0]
            .append(&tensor(&k, heads, n, hd), &tensor(&k, heads, n, hd))
            .unwrap();
        cache.truncate(GROW_BY + 4).unwrap();
        assert_eq!(cache.capacity(), 2 * GROW_BY);
        cache.truncate(5).unwrap();
        assert_eq!(cache.capacity(), GROW_BY);
        // A fork has buffers of its own; a reset keeps the dtype.
        let mut fork = cache.fork().unwrap();
        fork.reset();
        assert_eq!((fork.len(), cache.len()), (0, 5));
        assert_eq!(fork.layers[0].dtype, dtype);
    }
}

/// A reserved cache is allocated once, to exactly the reserved room, by
/// a prefill followed by decode steps; only positions past the room
/// grow it, by a step; the rows read back as written throughout.
#[test]
fn a_reserved_cache_is_allocated_once_to_its_room() {
    let (heads, hd) = (2, 32);
    for dtype in [KvDtype::F32, KvDtype::Q8] {
        let room = GROW_BY + 44;
        let mut cache = KvCache::new(1, dtype);
        cache.reserve(room);
        let prompt: Vec<f32> = (0..heads * 7 * hd).map(|i| i as f32).collect();
        cache.layers[0]
            .append(
                &tensor(&prompt, heads, 7, hd),
                &tensor(&prompt, heads, 7, hd),
            )
            .unwrap();
        assert_eq!(cache.capacity(), room);
        let storage = |c: &KvCache| match (&c.layers[0].k, &c.layers[0].q8) {
            (Some(k), _) => match &*k.storage_and_layout().0 {
                candle_core::Storage::Cpu(CpuStorage::F32(d)) => d.as_ptr() as usize,
                _ => unreachable!("f32 CPU buffers"),
            },
            (None, Some(q)) => q.k.as_ptr() as usize,
            _ => unreachable!("a filled cache"),
        };
        let first = storage(&cache);
        for p in 7..room {
            let r = rows(p, heads, hd, 0.0);
            let last = cache.layers[0]
                .push_row_and((&r, &r), (heads, hd), |k, _| Ok(read(k)))
                .unwrap();
            let want = held(&r, hd, dtype);
            assert_eq!(
                last[last.len() - hd..],
                want[want.len() - hd..],
                "{dtype} at {p}"
            );
        }
        assert_eq!((cache.len(), cache.capacity()), (room, room));
        assert_eq!(
            storage(&cache),
            first,
            "{dtype}: the buffers were reallocated"
        );
        let r = rows(room, heads, hd, 0.0);
        cache.layers[0]
            .push_row_and((&r, &r), (heads, hd), |_, _| Ok(()))
            .unwrap();
        assert_eq!(cache.capacity(), 2 * GROW_BY);
    }
}

/// `Q8_0` rows take a quarter of f32's bytes and a bit (34 per 32 values).
#[test]
fn q8_rows_take_34_bytes_a_32_values() {
    assert_eq!(KvDtype::Q8.row_bytes(128), 136);
    assert_eq!(KvDtype::F32.row_bytes(128), 512);
    assert_eq!("q8".parse::<KvDtype>().unwrap(), KvDtype::Q8);
    let err = "q4".parse::<KvDtype>().unwrap_err().to_string();
    assert!(err.contains("kv_dtype") && err.contains("f32, q8"), "{err}");
}
