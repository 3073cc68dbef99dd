//! The coarse tier of a layer's FFN (graded precision by rank): neurons
//! held beside the layer's own MLP with fewer bits a weight. Their gate
//! and up rows are the quantized checkpoint's blocks as they are
//! (`coarse_bits` 4) or requantized at load to our 3-bit `Q3_0` (3: each
//! block's step chosen for the least squared error,
//! [`crate::kernels::blocks::quantize_q3_0`]); their down rows (a
//! neuron's column of `down_proj`, which runs along the
//! hidden size) are requantized at load from the file's `Q8_0` to
//! [`FORMAT`] over per-channel scales: channel `h` of every down row of
//! the tier is divided by its RMS over the tier's neurons before
//! rounding, and the tier's output multiplied by it after. Without the
//! scales the hidden size's outlier channels set each block's step and
//! the small channels round to zero (plain 4-bit columns cost SmolLM2 ten
//! times the KL: docs/EXPERIMENTS.md, "Fidelity of the formats").
//!
//! A `Q4_0` down row is 864 bytes on Qwen 1.5B against `Q8_0`'s 1,632: a
//! neuron in the tier costs 2,784 bytes, not 3,552 (2,208 with 3-bit gate
//! and up rows, 672 bytes each against `Q4_1`'s 960). The tier is computed
//! whole, every token, after the layer's own MLP; the fused kernels run it
//! as any bundles (a down row in whole blocks is added per neuron).

use crate::kernels::blocks::quantize_q3_0;
use crate::kernels::quant::{self, QFormat};
use crate::kernels::quant_mlp::BundleLayout;
use crate::model::bundles::Bundles;
use crate::model::qfile::QFile;
use crate::model::Mlp;
use anyhow::{bail, Context, Result};
use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};
use rayon::prelude::*;

/// The block format of a coarse neuron's down row.
pub(crate) const FORMAT: QFormat = QFormat::Q4_0;

/// Neurons read (and requantized) at once: the load's transients stay a
/// few MiB whatever the tier's size.
const CHUNK: usize = 256;

/// The tier's bundles' layout from the file's `l` with gate and up rows of
/// `bits` (4: as in the file; 3: `Q3_0`), down rows in [`FORMAT`].
pub(crate) fn layout(l: &BundleLayout, bits: u32) -> Result<BundleLayout> {
    let (gate, up) = match bits {
        4 => (l.gate, l.up),
        3 => (QFormat::Q3_0, QFormat::Q3_0),
        _ => bail!("coarse_bits is 3 or 4, not {bits}"),
    };
    Ok(BundleLayout {
        gate,
        up,
        down: FORMAT,
        ..*l
    })
}

/// One layer's coarse tier.
#[derive(Debug, Clone)]
pub(crate) struct CoarseFfn {
    mlp: Mlp,
    /// Per hidden channel, the scale its down weights were divided by.
    scale: Vec<f32>,
}

impl CoarseFfn {
    /// Neurons `ids` (original indices, ascending) of layer `layer` of
    /// `file`, their gate and up rows of `bits` ([`layout`]), their down
    /// rows requantized to [`FORMAT`] over per-channel scales (module docs).
    pub(crate) fn load(file: &QFile, layer: usize, ids: &[u32], bits: u32) -> Result<Self> {
        let what = || format!("layer {layer}'s coarse FFN tier ({} neurons)", ids.len());
        if ids.is_empty() {
            bail!("{}: no neurons", what());
        }
        let mut file_layout = None;
        let (mut out, mut downs) = (Vec::new(), Vec::new());
        for chunk in ids.chunks(CHUNK) {
            let (l, raw) = file.raw_bundles(layer, Some(chunk)).with_context(what)?;
            if l.down != QFormat::Q8_0 {
                bail!("{}: its down rows are {}, not q8_0", what(), l.down);
            }
            let (bb, gb, gu) = (l.bundle_bytes(), l.gate_bytes(), l.gate_up_bytes());
            let tier = layout(&l, bits).with_context(what)?;
            let coarse = tier.bundle_bytes();
            if out.is_empty() {
                out.reserve_exact(ids.len() * coarse);
                downs.reserve_exact(ids.len() * l.down_bytes());
            }
            let at = out.len();
            out.resize(at + raw.len() / bb * coarse, 0);
            // Gate and up rows as they are, or requantized (the neurons of
            // the chunk over the threads: 3 bits doubled a 1.5B load on one).
            let (q3, new) = (tier.gate_bytes(), &mut out[at..]);
            new.par_chunks_exact_mut(coarse)
                .zip(raw.par_chunks_exact(bb))
                .for_each_init(
                    || vec![0f32; l.hidden],
                    |w, (o, b)| match bits {
                        4 => o[..gu].copy_from_slice(&b[..gu]),
                        _ => {
                            for (k, (from, row)) in [(l.gate, &b[..gb]), (l.up, &b[gb..gu])]
                                .into_iter()
                                .enumerate()
                            {
                                quant::dequantize_row(from, row, w);
                                quantize_q3_0(w, &[], &mut o[k * q3..(k + 1) * q3]);
                            }
                        }
                    },
                );
            for b in raw.chunks_exact(bb) {
                downs.extend_from_slice(&b[gu..]);
            }
            file_layout = Some(l);
        }
        let file_layout = file_layout.expect("at least one chunk");
        let layout = layout(&file_layout, bits)?;
        let h = file_layout.hidden;
        let scale = channel_scales(&downs, h);
        let (q8, coarse, gu) = (
            file_layout.down_bytes(),
            layout.bundle_bytes(),
            layout.gate_up_bytes(),
        );
        let mut rows = vec![0f32; CHUNK.min(ids.len()) * h];
        for (c, chunk) in downs.chunks(CHUNK * q8).enumerate() {
            let n = chunk.len() / q8;
            let rows = &mut rows[..n * h];
            for (row, d) in rows.chunks_exact_mut(h).zip(chunk.chunks_exact(q8)) {
                quant::dequantize_row(QFormat::Q8_0, d, row);
                row.iter_mut().zip(&scale).for_each(|(w, s)| *w /= s);
            }
            let t = Tensor::from_slice(rows, (n, h), &Device::Cpu)?;
            let ggml = FORMAT.ggml().context("the down rows' format is ggml's")?;
            let q = QTensor::quantize(&t, ggml)?.data()?.to_vec();
            let rb = FORMAT.row_bytes(h);
            for (j, r) in q.chunks_exact(rb).enumerate() {
                let at = (c * CHUNK + j) * coarse + gu;
                out[at..at + rb].copy_from_slice(r);
            }
        }
        drop(downs);
        let bundles = Bundles::new_in(layout, out, true).with_context(what)?;
        let mlp = Mlp::from_bundles(bundles, Some(ids.to_vec())).with_context(what)?;
        Ok(Self { mlp, scale })
    }

    /// The tier's output for `x [.., H]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let scale = Tensor::from_slice(&self.scale, self.scale.len(), &Device::Cpu)?;
        Ok(self.mlp.forward(x)?.broadcast_mul(&scale)?)
    }

    /// Adds the tier's output for one row `x [H]` into `y [H]`.
    pub(crate) fn add_row(&self, x: &[f32], y: &mut [f32]) -> Result<()> {
        let m = self.mlp.forward_row(x)?;
        for ((y, m), s) in y.iter_mut().zip(&m).zip(&self.scale) {
            *y += m * s;
        }
        Ok(())
    }

    /// The tier's MLP (its down rows divided by the scales) and the scales.
    #[cfg(test)]
    pub(crate) fn parts(&self) -> (&Mlp, &[f32]) {
        (&self.mlp, &self.scale)
    }

    /// Bytes of weights read per token.
    pub(crate) fn weight_bytes(&self) -> usize {
        self.mlp.weight_bytes()
    }
}

/// Per channel `h`, the RMS of `Q8_0` down rows `downs` (`hidden`
/// weights each) at `h`; 1 where a channel is all zeros.
fn channel_scales(downs: &[u8], hidden: usize) -> Vec<f32> {
    let q8 = QFormat::Q8_0.row_bytes(hidden);
    let n = downs.len() / q8;
    let mut sum = vec![0f64; hidden];
    let mut row = vec![0f32; hidden];
    for d in downs.chunks_exact(q8) {
        quant::dequantize_row(QFormat::Q8_0, d, &mut row);
        sum.iter_mut()
            .zip(&row)
            .for_each(|(s, &w)| *s += (w as f64) * (w as f64));
    }
    sum.iter()
        .map(|&s| match (s / n.max(1) as f64).sqrt() as f32 {
            r if r > 0.0 && r.is_finite() => r,
            _ => 1.0,
        })
        .collect()
}
