//! An FFN layer's neurons as quantized *bundles* (the `q8`/`q4` dtypes):
//! neuron `n`'s gate row, up row and down row (its column of `down_proj`)
//! stored together ([`crate::kernels::quant_mlp::BundleLayout`]), as in the
//! quantized checkpoint file, so a run of chosen neurons is one read and
//! one stream. In memory, where the AVX-512 VNNI kernels run, every four
//! bundles are stored as a quad ([`crate::kernels::quads`]); moves make
//! them whole first. Decode runs the fused kernel
//! ([`crate::kernels::quant_mlp::swiglu_bundles`]) over the bundles in any
//! order (in quads, the rounding of four neurons' coefficients depends on
//! which four share one); prefill dequantizes a chunk of neurons at a time (~1 MiB of
//! f32, a reused buffer) and multiplies into its output
//! ([`crate::kernels::gemm`]), or on AVX-512 VNNI runs the gate and up rows
//! on 8-bit activations.

use crate::kernels::gather::{is_permutation, permute_in_place};
use crate::kernels::gemm::{self, Out, Rhs, View};
use crate::kernels::gemm_q;
use crate::kernels::planar::{self, RowForm};
use crate::kernels::quads::{self, QUAD};
use crate::kernels::quant::{self, QFormat};
use crate::kernels::quant_mlp::{self, BundleLayout, DownForm};
use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use std::sync::Arc;

/// A layer's bundles (or a view of the first bundles of one; clones and
/// views share the buffer).
#[derive(Debug, Clone)]
pub(crate) struct Bundles {
    layout: BundleLayout,
    data: Arc<Vec<u8>>,
    count: usize,
}

impl Bundles {
    /// Bundles over `data`, a whole number of them. Gate and up rows of
    /// whole blocks are made planar in place where the kernels for them
    /// run ([`planar::preferred`]), and bundles with `Q8_0` down rows are
    /// stored in quads where theirs run ([`quads::preferred`]).
    #[cfg(test)]
    pub(crate) fn new(layout: BundleLayout, data: Vec<u8>) -> Result<Self> {
        Self::new_in(layout, data, true)
    }

    /// As [`Bundles::new`]; `quads: false` keeps the down rows whole
    /// (exact `Q8_0` rows, no rounding of the coefficients).
    pub(crate) fn new_in(mut layout: BundleLayout, mut data: Vec<u8>, quads: bool) -> Result<Self> {
        layout.check()?;
        // The in-memory forms are made here from the file's; bytes said to
        // be in one already would be trusted unchecked.
        if layout.rows != RowForm::Blocks || layout.down_form != DownForm::Rows {
            bail!(
                "neuron bundles are given as a file holds them (whole blocks, whole bundles), not {:?} / {:?}",
                layout.rows,
                layout.down_form
            );
        }
        let bb = layout.bundle_bytes();
        if !data.len().is_multiple_of(bb) {
            bail!(
                "{} bytes are not a whole number of neuron bundles of {bb} bytes",
                data.len()
            );
        }
        if planar::preferred() && layout.gate.goes_planar() && layout.up.goes_planar() {
            let (h, gb) = (layout.hidden, layout.gate_bytes());
            let rows = gb + layout.up_bytes();
            for b in data.chunks_exact_mut(bb) {
                let (g, u) = b[..rows].split_at_mut(gb);
                planar::make_planar(layout.gate, h, g);
                planar::make_planar(layout.up, h, u);
            }
            layout.rows = RowForm::Planar;
        }
        if quads && layout.down == QFormat::Q8_0 && quads::preferred() {
            quant_mlp::reform(&layout, &mut data, DownForm::Quads);
            layout.down_form = DownForm::Quads;
        }
        crate::sys::hugepages::collapse(data.as_ptr(), data.len());
        Ok(Self {
            layout,
            count: data.len() / bb,
            data: Arc::new(data),
        })
    }

    #[cfg(test)]
    pub(crate) fn layout(&self) -> &BundleLayout {
        &self.layout
    }

    /// Neurons held.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes read per token.
    pub(crate) fn bytes(&self) -> usize {
        self.count * self.layout.bundle_bytes()
    }

    fn data(&self) -> &[u8] {
        &self.data[..self.bytes()]
    }

    /// The first `n` bundles, sharing this buffer.
    pub(crate) fn prefix(&self, n: usize) -> Self {
        Self {
            count: n.min(self.count),
            ..self.clone()
        }
    }

    pub(crate) fn collapse_to_huge_pages(&self) {
        crate::sys::hugepages::collapse(self.data.as_ptr(), self.data.len());
    }

    /// Stores bundle `src[i]` at `i` (moving blocks, never requantizing):
    /// in place when no view shares the buffer (so it keeps its huge
    /// pages; one bundle of scratch, each cycle of the permutation followed
    /// once), else into a new buffer. Bundles in quads are made whole for
    /// the move and put in quads again after it.
    pub(crate) fn permute(&mut self, src: &[usize]) -> Result<()> {
        let bb = self.layout.bundle_bytes();
        let n = self.count;
        check_permutation(src, n)?;
        if self.layout.down_form == DownForm::Quads {
            let layout = self.layout;
            let buf = Arc::make_mut(&mut self.data);
            quant_mlp::reform(&layout, buf, DownForm::Rows);
            permute_in_place(&mut buf[..n * bb], src, bb);
            quant_mlp::reform(&layout, buf, DownForm::Quads);
            return Ok(());
        }
        let Some(buf) = Arc::get_mut(&mut self.data) else {
            let old = self.data();
            let mut moved = Vec::with_capacity(old.len());
            for &s in src {
                moved.extend_from_slice(&old[s * bb..(s + 1) * bb]);
            }
            self.data = Arc::new(moved);
            return Ok(());
        };
        permute_in_place(&mut buf[..n * bb], src, bb);
        Ok(())
    }

    /// Writes bundle `j` of `from` over bundle `slots[j]` (a swap's added
    /// neurons into the slots of the dropped ones): in place when no view
    /// shares the buffer, else on a copy of it.
    #[cfg(test)]
    pub(crate) fn overwrite(&mut self, slots: &[usize], from: &Self) -> Result<()> {
        self.replace(slots, from, None)
    }

    /// [`Bundles::overwrite`] then [`Bundles::permute`] (a task swap's
    /// added neurons into the dropped ones' slots, then the new order), in
    /// one go: bundles in quads are made whole once for both, not twice.
    /// Both are checked before anything is written.
    pub(crate) fn overwrite_and_permute(
        &mut self,
        slots: &[usize],
        from: &Self,
        src: &[usize],
    ) -> Result<()> {
        self.replace(slots, from, Some(src))
    }

    fn replace(&mut self, slots: &[usize], from: &Self, src: Option<&[usize]>) -> Result<()> {
        if self.layout != from.layout {
            bail!("bundles of different layouts cannot be mixed");
        }
        if slots.len() != from.count {
            bail!("{} slots given for {} bundles", slots.len(), from.count);
        }
        if let Some(&bad) = slots.iter().find(|&&s| s >= self.count) {
            bail!("bundle slot {bad} is out of range ({} held)", self.count);
        }
        if let Some(src) = src {
            check_permutation(src, self.count)?;
        }
        let (layout, bb, n) = (self.layout, self.layout.bundle_bytes(), self.count);
        let quads = layout.down_form == DownForm::Quads;
        // Whole bundles on both sides for the copy.
        let incoming = if quads {
            let mut whole = from.data.to_vec();
            quant_mlp::reform(&layout, &mut whole, DownForm::Rows);
            std::borrow::Cow::Owned(whole)
        } else {
            std::borrow::Cow::Borrowed(&from.data[..])
        };
        let buf = Arc::make_mut(&mut self.data);
        if quads {
            quant_mlp::reform(&layout, buf, DownForm::Rows);
        }
        for (j, &s) in slots.iter().enumerate() {
            buf[s * bb..(s + 1) * bb].copy_from_slice(&incoming[j * bb..(j + 1) * bb]);
        }
        if let Some(src) = src {
            permute_in_place(&mut buf[..n * bb], src, bb);
        }
        if quads {
            quant_mlp::reform(&layout, buf, DownForm::Quads);
        }
        Ok(())
    }

    /// One row `x [H]` → `[H]` over every bundle held.
    pub(crate) fn forward_row(&self, x: &[f32]) -> Result<Vec<f32>> {
        if x.len() != self.layout.hidden {
            bail!(
                "neuron bundles of hidden size {} given a row of {}",
                self.layout.hidden,
                x.len()
            );
        }
        let mut y = vec![0f32; x.len()];
        if self.count > 0 {
            quant_mlp::swiglu_bundles(x, &self.layout, &self.data, self.count, &mut y);
        }
        Ok(y)
    }

    /// Neurons dequantized at once in prefill (~1 MiB of f32 per matrix).
    fn chunk(&self) -> usize {
        ((1 << 18) / self.layout.hidden).max(8)
    }

    /// Rows `part` (0 gate, 1 up, 2 down) of bundles `range`, dequantized
    /// into `out` (`[range.len(), H]`).
    fn dequantize(&self, part: usize, range: std::ops::Range<usize>, out: &mut [f32]) {
        use rayon::prelude::*;
        self.dequantize_each(part, range.into_par_iter(), out)
    }

    /// Rows `part` of bundles `rows` (storage positions, in the order
    /// wanted), dequantized into `out` (`[rows.len(), H]`).
    fn dequantize_rows(&self, part: usize, rows: &[u32], out: &mut [f32]) {
        use rayon::prelude::*;
        self.dequantize_each(part, rows.par_iter().map(|&i| i as usize), out)
    }

    fn dequantize_each(
        &self,
        part: usize,
        rows: impl rayon::iter::IndexedParallelIterator<Item = usize>,
        out: &mut [f32],
    ) {
        use rayon::prelude::*;
        let (l, h, bb) = (&self.layout, self.layout.hidden, self.layout.bundle_bytes());
        let format = [l.gate, l.up, l.down][part];
        let in_quads = l.in_quads(&self.data);
        let buf = &self.data[..];
        out.par_chunks_mut(h)
            .zip(rows)
            .with_min_len(8)
            .for_each(|(o, i)| match part {
                0 | 1 => {
                    let (g, u) = l.gate_up_of(buf, i, in_quads);
                    quant::dequantize_row_in(format, l.rows, [g, u][part], o)
                }
                _ if i < in_quads => {
                    let qb = QUAD * bb;
                    let tile = &buf[i / QUAD * qb + QUAD * l.gate_up_bytes()..(i / QUAD + 1) * qb];
                    quads::dequantize(tile, i % QUAD, o)
                }
                _ => {
                    let down = l.split(&buf[i * bb..(i + 1) * bb]).2;
                    quant::dequantize_row_in(format, RowForm::Blocks, down, o)
                }
            });
    }

    /// `‖down_j‖₂` of every bundle, in storage order.
    pub(crate) fn down_norms(&self) -> Vec<f32> {
        let h = self.layout.hidden;
        let mut out = Vec::with_capacity(self.count);
        let step = self.chunk();
        gemm::with_scratch(step.min(self.count) * h, |w| {
            for n0 in (0..self.count).step_by(step) {
                let r = n0..(n0 + step).min(self.count);
                let w = &mut w[..r.len() * h];
                self.dequantize(2, r, w);
                out.extend(
                    w.chunks_exact(h)
                        .map(|row| row.iter().map(|v| v * v).sum::<f32>().sqrt()),
                );
            }
        });
        out
    }

    /// `silu(gate·x) * (up·x)` of every bundle, `x [.., H]` → `[.., N]` f32, in storage order.
    pub(crate) fn activations(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.layout.hidden;
        let lead = x.dims()[..x.rank() - 1].to_vec();
        let mut dims = lead.clone();
        dims.push(self.count);
        if x.dims().last() != Some(&h) {
            bail!(
                "MLP input of shape {:?} for bundles of hidden size {h}",
                x.dims()
            );
        }
        let v: Vec<f32> = x.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?;
        let m = v.len() / h;
        if gemm_q::pays(m) && x.device().is_cpu() {
            // Sixteen neurons' rows over eight tokens at a time (`gemm_q`).
            let acts = gemm_q::Acts::quantize(&v, h);
            let mut out = vec![0f32; self.count * m];
            quant_mlp::swiglu_activations_gemm(
                &acts,
                &self.layout,
                &self.data,
                self.count,
                &mut out,
            );
            return Ok(Tensor::from_vec(out, (m, self.count), &Device::Cpu)?.reshape(dims)?);
        }
        if quant::int8_prefill() && x.device().is_cpu() {
            // 8-bit activations, as decode's (see `quant::int8_prefill`).
            let xs: Vec<quant::Q8Act> = v.chunks_exact(h).map(quant::Q8Act::quantize).collect();
            let mut out = vec![0f32; self.count * m];
            quant_mlp::swiglu_activations_q(&xs, &self.layout, &self.data, self.count, &mut out);
            let a = Tensor::from_vec(out, (self.count, m), &Device::Cpu)?.t()?;
            return Ok(a.contiguous()?.reshape(dims)?);
        }
        // A chunk of gate rows dequantized and multiplied into the output's
        // columns, then the chunk's up rows into `up`, combined in place.
        let (n, step) = (self.count, self.chunk());
        let mut out = vec![0f32; m * n];
        let mut up = vec![0f32; m * step.min(n)];
        gemm::with_scratch(step.min(n) * h, |w| {
            for n0 in (0..n).step_by(step) {
                let r = n0..(n0 + step).min(n);
                let (len, x) = (r.len(), View::new(&v, m, h));
                let w = &mut w[..len * h];
                self.dequantize(0, r.clone(), w);
                let gate_out = Out {
                    data: &mut out,
                    cols: n,
                    col0: n0,
                    accumulate: false,
                };
                gemm::matmul_into(x, View::new(w, len, h), Rhs::Transposed, gate_out);
                self.dequantize(1, r, w);
                let up_out = Out {
                    data: &mut up,
                    cols: len,
                    col0: 0,
                    accumulate: false,
                };
                gemm::matmul_into(x, View::new(w, len, h), Rhs::Transposed, up_out);
                for (o, u) in out.chunks_exact_mut(n).zip(up.chunks_exact(len)) {
                    o[n0..n0 + len]
                        .iter_mut()
                        .zip(u)
                        .for_each(|(g, &u)| *g = quant_mlp::swiglu(*g, u));
                }
            }
        });
        Ok(Tensor::from_vec(out, dims, &Device::Cpu)?)
    }

    /// `down_proj` of activations `a [.., N]` (storage order) → `[.., H]`:
    /// a chunk of down rows dequantized at a time, its product added to
    /// the output, the neurons summed in storage order.
    pub(crate) fn down(&self, a: &Tensor) -> Result<Tensor> {
        self.down_in_order(a, None)
    }

    /// [`Bundles::down`], the neurons summed in the order `order` names
    /// them (storage positions, each once; `None`: storage order): with a
    /// canonical order, the result does not depend on where an
    /// arrangement left the neurons. Each chunk's down rows and its
    /// columns of `a` are gathered in that order.
    pub(crate) fn down_in_order(&self, a: &Tensor, order: Option<&[u32]>) -> Result<Tensor> {
        let (h, n) = (self.layout.hidden, self.count);
        if a.dims().last() != Some(&n) {
            bail!(
                "down_proj input of shape {:?} for {n} neuron bundles",
                a.dims()
            );
        }
        if let Some(o) = order {
            if o.len() != n || !is_permutation(o.iter().map(|&i| i as usize), n) {
                bail!(
                    "an order of {} neurons for {n} neuron bundles is not a permutation of them",
                    o.len()
                );
            }
        }
        let mut dims = a.dims()[..a.rank() - 1].to_vec();
        dims.push(h);
        let m = dims[..dims.len() - 1].iter().product::<usize>();
        let a: Vec<f32> = a.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?;
        let mut y = vec![0f32; m * h];
        if n == 0 {
            // None held (a layer wholly in a coarse tier): no output.
            return Ok(Tensor::from_vec(y, dims, &Device::Cpu)?);
        }
        if gemm_q::pays(a.len() / n) {
            self.down_gemm(&a, order, &mut y);
            return Ok(Tensor::from_vec(y, dims, &Device::Cpu)?);
        }
        let step = self.chunk();
        // The chunk's columns of `a`, gathered when an order is given.
        let mut cols = vec![0f32; if order.is_some() { m * step.min(n) } else { 0 }];
        gemm::with_scratch(step.min(n) * h, |w| {
            for n0 in (0..n).step_by(step) {
                let r = n0..(n0 + step).min(n);
                let len = r.len();
                let w = &mut w[..len * h];
                let part = match order {
                    Some(o) => {
                        let rows = &o[r];
                        self.dequantize_rows(2, rows, w);
                        let cols = &mut cols[..m * len];
                        for (dst, src) in cols.chunks_exact_mut(len).zip(a.chunks_exact(n)) {
                            dst.iter_mut()
                                .zip(rows)
                                .for_each(|(d, &i)| *d = src[i as usize]);
                        }
                        View::new(cols, m, len)
                    }
                    None => {
                        self.dequantize(2, r, w);
                        View::new(&a, m, n).columns(n0, len)
                    }
                };
                let into = Out {
                    data: &mut y,
                    cols: h,
                    col0: 0,
                    accumulate: n0 > 0,
                };
                gemm::matmul_into(part, View::new(w, len, h), Rhs::AsIs, into);
            }
        });
        Ok(Tensor::from_vec(y, dims, &Device::Cpu)?)
    }
}

impl Bundles {
    /// [`Bundles::down_in_order`] of several tokens on [`gemm_q`]: `a`'s
    /// columns (in `order`) quantized to 8 bits per 32 neurons, each
    /// block of 32 outputs' down weights per 32 neurons too.
    fn down_gemm(&self, a: &[f32], order: Option<&[u32]>, y: &mut [f32]) {
        let (l, h, n) = (&self.layout, self.layout.hidden, self.count);
        let k = n.next_multiple_of(quant::QK);
        let acts = gemm_q::Acts::quantize_gathered(a, n, order, k);
        let (bb, in_quads, blocks) = (l.bundle_bytes(), l.in_quads(&self.data), h / quant::QK);
        let (fb, qb) = (l.down.block_bytes(), QUAD * bb);
        let tile_of = |q: usize| &self.data[q * qb + QUAD * l.gate_up_bytes()..(q + 1) * qb];
        let neuron = |pos: usize| order.map_or(pos, |o| o[pos] as usize);
        let block = |b: usize, vals: &mut [f32]| {
            let mut one = [0f32; quant::QK];
            let mut four = [0f32; quant::QK * QUAD];
            let mut pos = 0;
            while pos < n {
                let i = neuron(pos);
                // A whole quad in its own order: its tile at once.
                let whole = i < in_quads
                    && i % QUAD == 0
                    && pos + QUAD <= n
                    && (1..QUAD).all(|j| neuron(pos + j) == i + j);
                if whole {
                    quads::dequantize_block_t(tile_of(i / QUAD), blocks, b, &mut vals[pos..], k);
                    pos += QUAD;
                    continue;
                }
                if i < in_quads {
                    quads::dequantize_block_t(tile_of(i / QUAD), blocks, b, &mut four, QUAD);
                    (0..quant::QK).for_each(|o| one[o] = four[o * QUAD + i % QUAD]);
                } else {
                    let down = l.split(&self.data[i * bb..(i + 1) * bb]).2;
                    quant::dequantize_row(l.down, &down[b * fb..(b + 1) * fb], &mut one);
                }
                (0..quant::QK).for_each(|o| vals[o * k + pos] = one[o]);
                pos += 1;
            }
        };
        // Every neuron in quads (any order): the tiles straight from them.
        let columns = match n == in_quads && n.is_multiple_of(quant::QK) {
            true => gemm_q::Columns::Quads(gemm_q::QuadSource {
                quad: &tile_of,
                blocks,
                order,
            }),
            false => gemm_q::Columns::Values(&block),
        };
        gemm_q::matmul_columns(h, columns, &acts, y);
    }
}

/// Refuses `src` unless it is a permutation of `0..n` bundles.
fn check_permutation(src: &[usize], n: usize) -> Result<()> {
    if src.len() != n {
        bail!("a permutation of {n} bundles names {}", src.len());
    }
    if !is_permutation(src.iter().copied(), n) {
        bail!("{src:?} is not a permutation of {n} bundles");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::QFormat;

    /// `Q8_0` bundles of hidden size 32, as a file holds them.
    fn q8_layout() -> BundleLayout {
        BundleLayout {
            hidden: 32,
            gate: QFormat::Q8_0,
            up: QFormat::Q8_0,
            down: QFormat::Q8_0,
            rows: RowForm::Blocks,
            down_form: DownForm::Rows,
        }
    }

    /// `n` bundles whose bytes all hold their index.
    fn numbered(n: usize) -> Bundles {
        let layout = q8_layout();
        let bb = layout.bundle_bytes();
        let data = (0..n).flat_map(|i| vec![i as u8; bb]).collect();
        Bundles::new(layout, data).unwrap()
    }

    #[test]
    fn prefill_inputs_of_the_wrong_width_are_refused_naming_the_sizes() {
        let b = numbered(5);
        let x = Tensor::zeros((2, 33), DType::F32, &Device::Cpu).unwrap();
        let err = b.activations(&x).unwrap_err().to_string();
        assert!(
            err.contains("[2, 33]") && err.contains("hidden size 32"),
            "{err}"
        );
        let a = Tensor::zeros((2, 4), DType::F32, &Device::Cpu).unwrap();
        let err = b.down(&a).unwrap_err().to_string();
        assert!(
            err.contains("[2, 4]") && err.contains("5 neuron bundles"),
            "{err}"
        );
        // The right widths go through: `[2, 5]` activations, `[2, 32]` out.
        let a = Tensor::zeros((2, 5), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(b.down(&a).unwrap().dims(), [2, 32]);
    }

    /// Summing in a given order equals summing bundles stored in that
    /// order, to the bit, over more than one prefill chunk; an order that
    /// is not a permutation is refused.
    #[test]
    fn down_in_an_order_is_down_of_the_bundles_stored_so() {
        let layout = q8_layout();
        let (bb, m) = (layout.bundle_bytes(), 3);
        let n = (1 << 18) / 32 + 37;
        // Bytes 0..96: every two-byte f16 scale is finite.
        let bundle = |i: usize| (0..bb).map(move |j| ((i * 31 + j * 7) % 97) as u8);
        let data: Vec<u8> = (0..n).flat_map(bundle).collect();
        let order: Vec<u32> = (0..n as u32).map(|k| (k * 7919) % n as u32).collect();
        let a: Vec<f32> = (0..m * n)
            .map(|i| ((i * 13) % 29) as f32 * 0.1 - 1.4)
            .collect();
        let moved: Vec<u8> = order.iter().flat_map(|&i| bundle(i as usize)).collect();
        let a_moved: Vec<f32> = a
            .chunks_exact(n)
            .flat_map(|row| order.iter().map(|&i| row[i as usize]))
            .collect();
        let b = Bundles::new(layout, data).unwrap();
        let stored_so = Bundles::new(layout, moved).unwrap();
        let t = |v: &[f32]| Tensor::from_slice(v, (m, n), &Device::Cpu).unwrap();
        let got = b.down_in_order(&t(&a), Some(&order)).unwrap();
        let want = stored_so.down(&t(&a_moved)).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        assert_eq!(bits(&got), bits(&want));
        assert_ne!(
            bits(&got),
            bits(&b.down(&t(&a)).unwrap()),
            "storage order sums differently"
        );
        let mut twice = order.clone();
        twice[1] = twice[0];
        let err = b
            .down_in_order(&t(&a), Some(&twice))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a permutation"), "{err}");
    }

    /// Each bundle's first gate byte (where it lies in quads too).
    fn labels(b: &Bundles) -> Vec<usize> {
        let q = b.layout.in_quads(&b.data);
        (0..b.count)
            .map(|i| b.layout.gate_up_of(&b.data, i, q).0[0] as usize)
            .collect()
    }

    #[test]
    fn bundles_said_to_be_in_a_memory_form_already_are_refused() {
        let layout = numbered(1).layout;
        for (rows, down_form) in [
            (RowForm::Planar, DownForm::Rows),
            (RowForm::Blocks, DownForm::Quads),
        ] {
            let l = BundleLayout {
                rows,
                down_form,
                ..layout
            };
            let data = vec![0u8; 4 * l.bundle_bytes()];
            let err = Bundles::new(l, data).unwrap_err().to_string();
            assert!(err.contains("as a file holds them"), "{err}");
        }
    }

    #[test]
    fn permute_in_place_follows_every_cycle_and_a_shared_buffer_is_copied() {
        let n = 9;
        // Cycles of lengths 1, 2, 3 and 3.
        let src = [0, 2, 1, 4, 5, 3, 8, 6, 7];
        let mut b = numbered(n);
        let before = b.data.as_ptr();
        b.permute(&src).unwrap();
        assert_eq!(labels(&b), src);
        assert_eq!(b.data.as_ptr(), before, "moved in place");

        let mut b = numbered(n);
        let view = b.prefix(4);
        b.permute(&src).unwrap();
        assert_eq!(labels(&b), src);
        assert_eq!(labels(&view), [0, 1, 2, 3], "a view keeps the old order");

        let err = numbered(3).permute(&[0, 0, 1]).unwrap_err().to_string();
        assert!(err.contains("not a permutation"), "{err}");
    }

    #[test]
    fn overwrite_writes_the_given_slots() {
        let mut b = numbered(5);
        let incoming = Bundles {
            count: 2,
            ..numbered(12)
        };
        let mut fresh = numbered(12);
        fresh
            .permute(&[10, 11, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1])
            .unwrap();
        b.overwrite(&[3, 1], &fresh.prefix(2)).unwrap();
        assert_eq!(labels(&b), [0, 11, 2, 10, 4]);
        assert!(b.overwrite(&[5], &incoming.prefix(1)).is_err());
        assert!(
            b.overwrite(&[0], &incoming).is_err(),
            "two bundles, one slot"
        );
    }

    #[test]
    fn overwrite_and_permute_equals_the_two_steps_and_checks_both_first() {
        // Nine bundles: two whole quads (where the kernels for them run)
        // and one bundle after them.
        let fresh = || {
            let mut f = numbered(12);
            f.permute(&[10, 11, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]).unwrap();
            f.prefix(2)
        };
        let src = [1, 0, 3, 2, 8, 4, 5, 6, 7];
        let mut two = numbered(9);
        two.overwrite(&[3, 6], &fresh()).unwrap();
        two.permute(&src).unwrap();
        let mut one = numbered(9);
        one.overwrite_and_permute(&[3, 6], &fresh(), &src).unwrap();
        assert_eq!(one.data, two.data, "the same bytes");
        assert_eq!(labels(&one), [1, 0, 10, 2, 8, 4, 5, 11, 7]);
        // A bad permutation leaves the bundles as they were.
        let before = one.data.clone();
        let err = one
            .overwrite_and_permute(&[0, 1], &fresh(), &[0, 0, 1, 2, 3, 4, 5, 6, 7])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a permutation"), "{err}");
        assert_eq!(one.data, before);
    }
}
