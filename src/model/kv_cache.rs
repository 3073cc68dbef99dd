//! The key/value cache of one sequence: per layer, `[1, kv_heads, capacity,
//! head_dim]` buffers filled up to the cached length — f32 tensors, or
//! with [`KvDtype::Q8`] rows of ggml's `Q8_0` blocks (8.5 bits a value,
//! the attention kernels read them as they are: `kernels::KvRows`).
//!
//! Prefill (and every GPU step) appends tensors, as candle-nn's `KvCache`
//! does. The CPU decode step instead writes its one new key row and value row
//! straight into the buffers and reads them back in place: going through
//! tensors (two new ones, `slice_set`, two narrowed views) cost ~1% of a
//! SmolLM2 decode step on the thread the helpers wait for.

use crate::kernels::quant::{self, QFormat};
use crate::kernels::KvRows;
use anyhow::{bail, Result};
use candle_core::{CpuStorage, DType, Device, Layout, Tensor};
use serde::{Deserialize, Serialize};

/// Positions a layer's buffers grow by.
pub(crate) const GROW_BY: usize = 256;

/// How the cache holds keys and values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvDtype {
    /// f32 (the weights' dtype on the tensor path).
    #[default]
    F32,
    /// ggml's `Q8_0` blocks: 34 bytes a 32 values, a quarter of f32's
    /// bytes; CPU only.
    Q8,
}

crate::sys::named::impl_named!(KvDtype, "kv_dtype", { F32 => "f32", Q8 => "q8" });

impl KvDtype {
    /// Bytes of one cached row (one kv head's key or value at one position).
    pub(crate) fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            Self::F32 => 4 * head_dim,
            Self::Q8 => QFormat::Q8_0.row_bytes(head_dim),
        }
    }
}

/// Per-layer key/value cache of one sequence.
#[derive(Debug, Clone)]
pub struct KvCache {
    pub(super) layers: Vec<LayerCache>,
}

impl KvCache {
    pub(crate) fn new(num_layers: usize, dtype: KvDtype) -> Self {
        let empty = LayerCache {
            dtype,
            ..Default::default()
        };
        Self {
            layers: vec![empty; num_layers],
        }
    }

    /// Number of positions already cached.
    pub(crate) fn len(&self) -> usize {
        self.layers.first().map_or(0, |c| c.len)
    }

    /// Positions the buffers have room for (the first layer's).
    pub(crate) fn capacity(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::capacity)
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
                        q8: c.q8.clone(),
                        ..*c
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
        self.layers.iter_mut().for_each(|c| {
            *c = LayerCache {
                dtype: c.dtype,
                ..Default::default()
            }
        });
    }
}

/// One layer's keys and values, `[1, kv_heads, capacity, head_dim]` each;
/// positions `..len` are filled.
#[derive(Debug, Clone, Default)]
pub(crate) struct LayerCache {
    /// [`KvDtype::F32`]'s buffers.
    k: Option<Tensor>,
    v: Option<Tensor>,
    /// [`KvDtype::Q8`]'s.
    q8: Option<Q8Buffers>,
    dtype: KvDtype,
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
        if let Some(q) = self.q8.as_mut().filter(|q| q.capacity > keep) {
            q.resize(self.len, keep);
        }
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

    /// Positions the buffers have room for.
    fn capacity(&self) -> usize {
        match (&self.k, &self.q8) {
            (Some(k), _) => k.dims4().map_or(0, |d| d.2),
            (None, Some(q)) => q.capacity,
            (None, None) => 0,
        }
    }

    /// Appends `k` and `v` (`[1, kv_heads, seq, head_dim]`); returns all the
    /// cached keys and values, `[1, kv_heads, len, head_dim]` (views of the
    /// buffers; in [`KvDtype::Q8`] tensors dequantized from them, of `k`'s
    /// dtype).
    pub(crate) fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        if self.dtype == KvDtype::Q8 {
            self.store_q8(k, v)?;
            let q = self.q8.as_ref().expect("stored");
            let (heads, hd) = (q.heads, q.head_dim);
            let (kr, vr) = q.rows(self.len);
            let whole = |side: KvRows| -> Result<Tensor> {
                let mut out = vec![0f32; heads * self.len * hd];
                for (g, o) in out.chunks_exact_mut((self.len * hd).max(1)).enumerate() {
                    quant::dequantize_row(QFormat::Q8_0, side.q8_rows(g, 0..self.len), o);
                }
                let t = Tensor::from_vec(out, (1, heads, self.len, hd), k.device())?;
                Ok(t.to_dtype(k.dtype())?)
            };
            return Ok((whole(kr)?, whole(vr)?));
        }
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

    /// Appends `k` and `v` (`[1, kv_heads, seq, head_dim]`, f32 on the CPU)
    /// and runs `attend` on all the cached keys and values as they are
    /// held (prefill on plain buffers).
    pub(crate) fn append_and<R>(
        &mut self,
        k: &Tensor,
        v: &Tensor,
        attend: impl FnOnce(KvRows, KvRows) -> candle_core::Result<R>,
    ) -> Result<R> {
        if self.dtype == KvDtype::Q8 {
            self.store_q8(k, v)?;
            let (kr, vr) = self.q8.as_ref().expect("stored").rows(self.len);
            return Ok(attend(kr, vr)?);
        }
        let (k, v) = self.append(k, v)?;
        Ok(crate::kernels::with_f32_layout(&k, |ks, kl| {
            crate::kernels::with_f32_layout(&v, |vs, vl| {
                attend(KvRows::F32(ks, kl), KvRows::F32(vs, vl))
            })
        })?)
    }

    /// [`KvDtype::Q8`]: quantizes `k` and `v` (`[1, kv_heads, seq,
    /// head_dim]`) into the buffers at positions `len..`, growing them.
    fn store_q8(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        let (_, heads, seq, head_dim) = k.dims4()?;
        if v.dims4()? != (1, heads, seq, head_dim) || !head_dim.is_multiple_of(32) {
            bail!(
                "kv cache: keys {:?} and values {:?} for q8 rows (one sequence, head_dim a multiple of 32)",
                k.dims(),
                v.dims()
            );
        }
        let (len, end) = (self.len, self.len + seq);
        let q = self.q8_room((heads, head_dim), end)?;
        for (side, buffer) in [(k, &mut q.k), (v, &mut q.v)] {
            let rows = side.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            crate::kernels::store_q8(&rows, (heads, seq, head_dim), (buffer, q.capacity), len);
        }
        self.len = end;
        Ok(())
    }

    /// The `Q8_0` buffers, with room for `end` positions of `heads` rows of
    /// `head_dim` (refused when they hold another shape).
    fn q8_room(&mut self, (heads, head_dim): (usize, usize), end: usize) -> Result<&mut Q8Buffers> {
        let q = self.q8.get_or_insert_with(|| Q8Buffers {
            heads,
            head_dim,
            ..Default::default()
        });
        if (q.heads, q.head_dim) != (heads, head_dim) {
            bail!(
                "kv cache: q8 buffers of {}x{} given {heads} heads of {head_dim}",
                q.heads,
                q.head_dim
            );
        }
        if end > q.capacity {
            q.resize(self.len, target_capacity(end, self.room));
        }
        Ok(q)
    }

    /// The CPU decode step: writes one position's key and value rows
    /// (`[kv_heads * head_dim]` f32 each) into the buffers (f32 on the CPU,
    /// or `Q8_0`), then runs `attend` on all the cached keys and values in
    /// place.
    pub(crate) fn push_row_and<R>(
        &mut self,
        (k_row, v_row): (&[f32], &[f32]),
        (kv_heads, head_dim): (usize, usize),
        attend: impl FnOnce(KvRows, KvRows) -> candle_core::Result<R>,
    ) -> Result<R> {
        let end = self.len + 1;
        if self.dtype == KvDtype::Q8 {
            if k_row.len() != kv_heads * head_dim || v_row.len() != k_row.len() {
                bail!(
                    "kv cache: row of {} at position {} for {kv_heads} heads of {head_dim}",
                    v_row.len().min(k_row.len()),
                    self.len
                );
            }
            let len = self.len;
            let q = self.q8_room((kv_heads, head_dim), end)?;
            let at = (q.capacity, len);
            crate::kernels::store_q8(k_row, (kv_heads, 1, head_dim), (&mut q.k, at.0), at.1);
            crate::kernels::store_q8(v_row, (kv_heads, 1, head_dim), (&mut q.v, at.0), at.1);
            self.len = end;
            let (kr, vr) = self.q8.as_ref().expect("stored").rows(end);
            return Ok(attend(kr, vr)?);
        }
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
                attend(
                    KvRows::F32(k, &kl.narrow(2, 0, end)?),
                    KvRows::F32(v, &vl.narrow(2, 0, end)?),
                )
            })
        })?;
        Ok(result)
    }
}

/// [`KvDtype::Q8`]'s buffers: keys and values as `Q8_0` rows, kv head
/// `g`'s position `j` at row `g * capacity + j`.
#[derive(Debug, Clone, Default)]
struct Q8Buffers {
    k: Vec<u8>,
    v: Vec<u8>,
    heads: usize,
    head_dim: usize,
    capacity: usize,
}

impl Q8Buffers {
    /// Reallocates to `capacity` positions a head, keeping the first `len`.
    fn resize(&mut self, len: usize, capacity: usize) {
        let rb = QFormat::Q8_0.row_bytes(self.head_dim);
        let (old, heads) = (self.capacity, self.heads);
        for buffer in [&mut self.k, &mut self.v] {
            let mut next = vec![0u8; heads * capacity * rb];
            for g in 0..heads {
                let keep = len.min(capacity) * rb;
                next[g * capacity * rb..][..keep].copy_from_slice(&buffer[g * old * rb..][..keep]);
            }
            *buffer = next;
        }
        self.capacity = capacity;
    }

    /// The keys and values of positions `..len`, as the kernels read them.
    fn rows(&self, len: usize) -> (KvRows<'_>, KvRows<'_>) {
        let side = |data| KvRows::Q8 {
            data,
            kv_heads: self.heads,
            capacity: self.capacity,
            len,
            head_dim: self.head_dim,
        };
        (side(&self.k[..]), side(&self.v[..]))
    }
}

/// Positions a buffer grows to for `end` in all: `reserved` when that
/// holds them (see [`KvCache::reserve`]), else whole [`GROW_BY`] steps.
fn target_capacity(end: usize, reserved: usize) -> usize {
    match end <= reserved {
        true => reserved,
        false => end.div_ceil(GROW_BY) * GROW_BY,
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
    let more = target_capacity(end, reserved) - capacity;
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
mod tests;
