//! The key/value cache of one sequence: per layer, `[1, kv_heads, capacity,
//! head_dim]` buffers filled up to the cached length.
//!
//! Prefill (and every GPU step) appends tensors, as candle-nn's `KvCache`
//! does. The CPU decode step instead writes its one new key row and value row
//! straight into the buffers and reads them back in place: going through
//! tensors (two new ones, `slice_set`, two narrowed views) cost ~1% of a
//! SmolLM2 decode step on the thread the helpers wait for.

use anyhow::{bail, Result};
use candle_core::{CpuStorage, DType, Device, Layout, Tensor};

/// Positions a layer's buffers grow by.
pub(crate) const GROW_BY: usize = 256;

/// Per-layer key/value cache of one sequence.
#[derive(Debug, Clone)]
pub struct KvCache {
    pub(super) layers: Vec<LayerCache>,
}

impl KvCache {
    pub(crate) fn new(num_layers: usize) -> Self {
        Self {
            layers: vec![LayerCache::default(); num_layers],
        }
    }

    /// Number of positions already cached.
    pub(crate) fn len(&self) -> usize {
        self.layers.first().map_or(0, |c| c.len)
    }

    /// Positions the buffers have room for (the first layer's keys).
    pub(crate) fn capacity(&self) -> usize {
        let first = self.layers.first().and_then(|c| c.k.as_ref());
        first.and_then(|k| k.dims4().ok()).map_or(0, |d| d.2)
    }

    /// A copy with buffers of its own (a clone shares them, and the next
    /// positions either writes would land in the same storage).
    pub(crate) fn fork(&self) -> Result<Self> {
        let copy = |t: &Option<Tensor>| t.as_ref().map(Tensor::copy).transpose();
        Ok(Self {
            layers: self
                .layers
                .iter()
                .map(|c| {
                    Ok(LayerCache {
                        k: copy(&c.k)?,
                        v: copy(&c.v)?,
                        len: c.len,
                        room: c.room,
                    })
                })
                .collect::<Result<_>>()?,
        })
    }

    /// Keeps the first `len` positions; the next positions overwrite the
    /// rest. Buffers larger than `len` rounded up to a [`GROW_BY`] step are
    /// reallocated to fit, so one long generation does not hold its memory
    /// for every request after it.
    pub(crate) fn truncate(&mut self, len: usize) -> Result<()> {
        for c in self.layers.iter_mut() {
            c.len = c.len.min(len);
            c.shrink()?;
        }
        Ok(())
    }

    /// Forgets the positions from `len` on, keeping the buffers and their
    /// room: the next positions overwrite them.
    pub(crate) fn rewind(&mut self, len: usize) {
        self.layers.iter_mut().for_each(|c| c.len = c.len.min(len));
    }

    /// Sizes the buffers for `positions` in all (a request's prompt plus its
    /// `max_new_tokens`): the next append allocates exactly that room once,
    /// instead of growing by [`GROW_BY`] steps, each step a copy of
    /// everything cached with both copies alive. Positions past the room
    /// still grow the buffers, by steps.
    pub(crate) fn reserve(&mut self, positions: usize) {
        self.layers.iter_mut().for_each(|c| c.room = positions);
    }

    /// Forgets every position (and frees the buffers).
    pub(crate) fn reset(&mut self) {
        self.layers
            .iter_mut()
            .for_each(|c| *c = LayerCache::default());
    }
}

/// One layer's keys and values, `[1, kv_heads, capacity, head_dim]` each;
/// positions `..len` are filled.
#[derive(Debug, Clone, Default)]
pub(crate) struct LayerCache {
    k: Option<Tensor>,
    v: Option<Tensor>,
    len: usize,
    /// Positions the buffers are given when they first need to grow (see
    /// [`KvCache::reserve`]; 0: none reserved).
    room: usize,
}

impl LayerCache {
    /// Reallocates the buffers to `len` rounded up to [`GROW_BY`] (one step
    /// at least) when they are larger.
    fn shrink(&mut self) -> Result<()> {
        let keep = self.len.div_ceil(GROW_BY).max(1) * GROW_BY;
        for buffer in [&mut self.k, &mut self.v] {
            let Some(b) = buffer.as_ref() else { continue };
            let (batch, heads, capacity, head_dim) = b.dims4()?;
            if capacity <= keep {
                continue;
            }
            let smaller = Tensor::zeros((batch, heads, keep, head_dim), b.dtype(), b.device())?;
            if self.len > 0 {
                smaller.slice_set(&b.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
            }
            *buffer = Some(smaller);
        }
        Ok(())
    }

    /// Appends `k` and `v` (`[1, kv_heads, seq, head_dim]`); returns all the
    /// cached keys and values, `[1, kv_heads, len, head_dim]` views.
    pub(crate) fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (b, heads, seq, head_dim) = k.dims4()?;
        let end = self.len + seq;
        let room = |buffer: &Option<Tensor>| {
            grown(
                buffer,
                (b, heads, head_dim),
                k.dtype(),
                k.device(),
                (end, self.room),
            )
        };
        let (kb, vb) = (room(&self.k)?, room(&self.v)?);
        kb.slice_set(k, 2, self.len)?;
        vb.slice_set(v, 2, self.len)?;
        let views = (kb.narrow(2, 0, end)?, vb.narrow(2, 0, end)?);
        (self.k, self.v, self.len) = (Some(kb), Some(vb), end);
        Ok(views)
    }

    /// The CPU decode step: writes one position's key and value rows
    /// (`[kv_heads * head_dim]` f32 each) into the buffers (f32, on the
    /// CPU), then runs `attend` on all the cached keys and values in place,
    /// as storage and `[1, kv_heads, len, head_dim]` layout.
    pub(crate) fn push_row_and<R>(
        &mut self,
        (k_row, v_row): (&[f32], &[f32]),
        (kv_heads, head_dim): (usize, usize),
        attend: impl FnOnce((&[f32], &Layout), (&[f32], &Layout)) -> candle_core::Result<R>,
    ) -> Result<R> {
        let end = self.len + 1;
        let room = |buffer: &Option<Tensor>| {
            grown(
                buffer,
                (1, kv_heads, head_dim),
                DType::F32,
                &Device::Cpu,
                (end, self.room),
            )
        };
        let (kb, vb) = (room(&self.k)?, room(&self.v)?);
        kb.inplace_op1(&WriteRow {
            row: k_row,
            pos: self.len,
        })?;
        vb.inplace_op1(&WriteRow {
            row: v_row,
            pos: self.len,
        })?;
        self.len = end;
        let (kb, vb) = (self.k.insert(kb), self.v.insert(vb));
        let result = crate::kernels::with_f32_layout(kb, |k, kl| {
            crate::kernels::with_f32_layout(vb, |v, vl| {
                attend((k, &kl.narrow(2, 0, end)?), (v, &vl.narrow(2, 0, end)?))
            })
        })?;
        Ok(result)
    }
}

/// `buffer` (or a new `[batch, heads, 0, head_dim]` one) with room for `end`
/// positions, keeping what it holds: grown to `reserved` positions when
/// those hold `end`, else to whole [`GROW_BY`] steps.
fn grown(
    buffer: &Option<Tensor>,
    (batch, heads, head_dim): (usize, usize, usize),
    dtype: DType,
    device: &Device,
    (end, reserved): (usize, usize),
) -> Result<Tensor> {
    let capacity = match buffer {
        Some(b) => {
            let (bb, bh, capacity, bd) = b.dims4()?;
            if (bb, bh, bd) != (batch, heads, head_dim) || b.dtype() != dtype {
                bail!(
                    "kv cache: {:?} {:?} buffers given {batch}x{heads} heads of {head_dim} in {dtype:?}",
                    b.dims(),
                    b.dtype()
                );
            }
            capacity
        }
        None => 0,
    };
    if let (Some(b), true) = (buffer, end <= capacity) {
        return Ok(b.clone());
    }
    let target = match end <= reserved {
        true => reserved,
        false => end.div_ceil(GROW_BY) * GROW_BY,
    };
    let more = target - capacity;
    let more = Tensor::zeros((batch, heads, more, head_dim), dtype, device)?;
    Ok(match buffer {
        Some(b) => Tensor::cat(&[b, &more], 2)?,
        None => more,
    })
}

/// Writes one position's rows (`[kv_heads * head_dim]`) into a contiguous
/// `[1, kv_heads, capacity, head_dim]` f32 CPU buffer.
struct WriteRow<'a> {
    row: &'a [f32],
    pos: usize,
}

impl candle_core::InplaceOp1 for WriteRow<'_> {
    fn name(&self) -> &'static str {
        "kv-cache-write-row"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("kv cache rows are written to f32 buffers");
        };
        let (_, heads, capacity, head_dim) = layout.shape().dims4()?;
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("kv cache buffer is not contiguous");
        };
        if self.pos >= capacity || self.row.len() != heads * head_dim || end > data.len() {
            candle_core::bail!(
                "kv cache: row of {} at position {} of a [{heads}, {capacity}, {head_dim}] buffer",
                self.row.len(),
                self.pos
            );
        }
        for (h, row) in self.row.chunks_exact(head_dim).enumerate() {
            let at = start + (h * capacity + self.pos) * head_dim;
            data[at..at + head_dim].copy_from_slice(row);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Position `p`'s rows, `[1, heads, 1, head_dim]`, distinct values.
    fn rows(p: usize, heads: usize, head_dim: usize, salt: f32) -> Vec<f32> {
        (0..heads * head_dim)
            .map(|i| p as f32 * 0.5 + i as f32 * 0.01 + salt)
            .collect()
    }

    fn tensor(v: &[f32], heads: usize, seq: usize, head_dim: usize) -> Tensor {
        Tensor::from_slice(v, (1, heads, seq, head_dim), &Device::Cpu).unwrap()
    }

    /// Reads a `[1, heads, len, head_dim]` view out of storage + layout.
    fn gather(data: &[f32], l: &Layout) -> Vec<f32> {
        let (_, heads, len, hd) = l.shape().dims4().unwrap();
        let s = l.stride();
        let mut out = Vec::new();
        for h in 0..heads {
            for p in 0..len {
                let at = l.start_offset() + h * s[1] + p * s[2];
                out.extend_from_slice(&data[at..at + hd]);
            }
        }
        out
    }

    /// Rows written in place read back like tensors appended (as prefill
    /// does), across a prefill/decode mix and past the buffers' growth.
    #[test]
    fn pushed_rows_read_back_like_appended_tensors() {
        let (heads, hd) = (2, 8);
        let (mut appended, mut pushed) = (LayerCache::default(), LayerCache::default());
        // A 5-position prompt, appended to both.
        let prompt_k: Vec<f32> = (0..heads * 5 * hd).map(|i| i as f32).collect();
        let prompt_v: Vec<f32> = prompt_k.iter().map(|x| -x).collect();
        for c in [&mut appended, &mut pushed] {
            c.append(
                &tensor(&prompt_k, heads, 5, hd),
                &tensor(&prompt_v, heads, 5, hd),
            )
            .unwrap();
        }
        for p in 5..GROW_BY + 40 {
            let (k, v) = (rows(p, heads, hd, 0.0), rows(p, heads, hd, 100.0));
            let (want_k, want_v) = appended
                .append(&tensor(&k, heads, 1, hd), &tensor(&v, heads, 1, hd))
                .unwrap();
            let (got_k, got_v) = pushed
                .push_row_and((&k, &v), (heads, hd), |(k, kl), (v, vl)| {
                    Ok((gather(k, kl), gather(v, vl)))
                })
                .unwrap();
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(got_k, flat(&want_k), "keys at position {p}");
            assert_eq!(got_v, flat(&want_v), "values at position {p}");
        }
        assert_eq!(pushed.len, GROW_BY + 40);
    }

    #[test]
    fn a_row_of_the_wrong_size_is_refused_and_changes_nothing() {
        let mut c = LayerCache::default();
        let (k, v) = (vec![1f32; 16], vec![2f32; 16]);
        c.push_row_and((&k, &v), (2, 8), |_, _| Ok(())).unwrap();
        let short = vec![0f32; 15];
        let err = c
            .push_row_and((&k, &short), (2, 8), |_, _| Ok(()))
            .unwrap_err();
        assert!(format!("{err:#}").contains("row of 15"), "{err:#}");
        assert_eq!(c.len, 1);
        let err = c.push_row_and((&k, &v), (4, 4), |_, _| Ok(())).unwrap_err();
        assert!(format!("{err:#}").contains("kv cache"), "{err:#}");
        assert_eq!(c.len, 1);
    }

    /// After a long sequence, truncating to a short prefix gives the memory
    /// back (buffers of one step) and keeps the prefix's rows; a buffer that
    /// fits is left alone.
    #[test]
    fn truncating_after_a_long_sequence_shrinks_the_buffers_and_keeps_the_prefix() {
        let (heads, hd) = (2, 4);
        let mut cache = KvCache::new(1);
        let n = 3 * GROW_BY + 7;
        let k: Vec<f32> = (0..heads * n * hd).map(|i| i as f32).collect();
        let v: Vec<f32> = k.iter().map(|x| x + 0.5).collect();
        let (want_k, _) = cache.layers[0]
            .append(&tensor(&k, heads, n, hd), &tensor(&v, heads, n, hd))
            .unwrap();
        assert_eq!(cache.capacity(), 4 * GROW_BY);
        cache.truncate(10).unwrap();
        assert_eq!((cache.len(), cache.capacity()), (10, GROW_BY));
        let c = &cache.layers[0];
        let kept = c.k.as_ref().unwrap().narrow(2, 0, 10).unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(flat(&kept), flat(&want_k.narrow(2, 0, 10).unwrap()));
        let kept_v = c.v.as_ref().unwrap().narrow(2, 0, 10).unwrap();
        assert_eq!(
            flat(&kept_v),
            flat(&kept).iter().map(|x| x + 0.5).collect::<Vec<_>>()
        );
        // Two steps for 300 positions, truncated to 260: no reallocation.
        let mut cache = KvCache::new(1);
        let n = GROW_BY + 44;
        let k: Vec<f32> = vec![1.0; heads * n * hd];
        cache.layers[0]
            .append(&tensor(&k, heads, n, hd), &tensor(&k, heads, n, hd))
            .unwrap();
        cache.truncate(GROW_BY + 4).unwrap();
        assert_eq!(cache.capacity(), 2 * GROW_BY);
        cache.truncate(5).unwrap();
        assert_eq!(cache.capacity(), GROW_BY);
    }

    /// A reserved cache is allocated once, to exactly the reserved room, by
    /// a prefill followed by decode steps; only positions past the room
    /// grow it, by a step; the rows read back as written throughout.
    #[test]
    fn a_reserved_cache_is_allocated_once_to_its_room() {
        let (heads, hd) = (2, 4);
        let room = GROW_BY + 44;
        let mut cache = KvCache::new(1);
        cache.reserve(room);
        let prompt: Vec<f32> = (0..heads * 7 * hd).map(|i| i as f32).collect();
        cache.layers[0]
            .append(
                &tensor(&prompt, heads, 7, hd),
                &tensor(&prompt, heads, 7, hd),
            )
            .unwrap();
        assert_eq!(cache.capacity(), room);
        let storage = |c: &KvCache| {
            let k = c.layers[0].k.as_ref().unwrap();
            let (s, _) = k.storage_and_layout();
            match &*s {
                candle_core::Storage::Cpu(CpuStorage::F32(d)) => d.as_ptr() as usize,
                _ => unreachable!("f32 CPU buffers"),
            }
        };
        let first = storage(&cache);
        for p in 7..room {
            let r = rows(p, heads, hd, 0.0);
            let last = cache.layers[0]
                .push_row_and((&r, &r), (heads, hd), |(k, kl), _| Ok(gather(k, kl)))
                .unwrap();
            assert_eq!(last[last.len() - hd..], r[r.len() - hd..], "position {p}");
        }
        assert_eq!((cache.len(), cache.capacity()), (room, room));
        assert_eq!(storage(&cache), first, "the buffers were reallocated");
        let r = rows(room, heads, hd, 0.0);
        cache.layers[0]
            .push_row_and((&r, &r), (heads, hd), |_, _| Ok(()))
            .unwrap();
        assert_eq!(cache.capacity(), 2 * GROW_BY);
    }
}
