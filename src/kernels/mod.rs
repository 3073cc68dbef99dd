//! CPU kernels (layer 1), split by op (as ggml-cpu does): for the
//! single-token (decode) path [`matvec`](mod@matvec), the fused SwiGLU MLP, RMSNorm, RoPE, decode
//! attention and row gathers, and the [`quant`]ized-row (ggml block)
//! forms of the products (rows of whole blocks or [`planar`]; the bundled
//! MLP in [`quant_mlp`]), the one polynomial [`exp`](mod@exp) and the
//! selection statistic's column [`energy`]; for
//! prefill the tiled 8-bit products ([`gemm_q`], tiles in `tiles`) and the
//! blocked causal attention (`prefill_attention`); the ISA back ends apart (`x86`: AVX2/FMA/F16C,
//! `x86_vnni`: AVX-512 VNNI for the quantized rows, `x86_vnni_planar` for
//! planar ones, `x86_vnni_gemm` for the tiles, `x86_avxvnni_gemm` the
//! tiles' 256-bit AVX-VNNI form;
//! [`portable`]: every other target, NEON on aarch64); the decode threads'
//! [`spin_pool`] beside them. This file holds the bridges from candle
//! tensors to the slices the kernels take.
//!
//! Decode is memory-bound: every weight is read once per token. candle's
//! general matmul streams ~20 GB/s on our CPUs for a `[1, K] x [N, K]^T`
//! product, well below the ~30 GB/s the memory delivers (see
//! `../shared/notes/cpu-perf-facts.md`). These kernels are plain row-dot and
//! row-axpy loops, vectorised with AVX2/FMA/F16C when the CPU has them, split
//! over the threads of [`spin_pool`] in contiguous row blocks so each thread
//! streams its own part of the matrix, in memory order. They work on
//! raw slices: the model's CPU decode step (`Model::decode_cpu`) runs a whole
//! token on plain buffers, reading weights through [`with_weight`], so no
//! candle op (allocation, dispatch) sits between two kernels while the other
//! threads wait. Other devices use candle's ops.

mod attention;
pub mod blocks;
pub(crate) mod cpu_features;
pub(crate) mod energy;
pub(crate) mod exp;
pub(crate) mod gather;
pub(crate) mod gemm;
pub(crate) mod gemm_q;
mod kv_rows;
pub mod matvec;
mod mlp;
mod norm;
pub mod planar;
pub mod portable;
mod portable_quant;
mod prefill_attention;
pub(crate) mod q2;
pub mod quads;
pub mod quant;
pub mod quant_mlp;
mod rope;
pub mod spin_pool;
mod tiles;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_avxvnni_gemm;
#[cfg(target_arch = "x86_64")]
mod x86_energy;
#[cfg(target_arch = "x86_64")]
mod x86_q2;
#[cfg(target_arch = "x86_64")]
mod x86_quant;
#[cfg(target_arch = "x86_64")]
mod x86_vnni;
#[cfg(target_arch = "x86_64")]
mod x86_vnni_gemm;
#[cfg(target_arch = "x86_64")]
mod x86_vnni_planar;
#[cfg(target_arch = "x86_64")]
mod x86_vnni_quads;

pub use attention::decode_attention;
pub(crate) use gather::{gather_rows, merge_rows, permute_rows_in_place};
pub(crate) use kv_rows::store_q8;
pub use kv_rows::KvRows;
pub use matvec::{matvec, matvec_ids, WeightElem};
pub use mlp::{gate_keep_mask, gated_neurons, swiglu_mlp, swiglu_mlp_gated, GATE_GROUP};
pub(crate) use mlp::{group_keep, swiglu_mlp_weights};
pub(crate) use norm::rms_norm_row;
pub(crate) use prefill_attention::prefill_attention;
pub(crate) use rope::rope_row;

use candle_core::{CpuStorage, Layout, Result, Storage, Tensor};

/// Rows of a strided f32 matrix: the data, where row 0 starts, and the
/// distance between rows (a KV-cache view of one kv head), as the decode
/// attention and its back ends pass them.
pub(crate) type StridedRows<'a> = (&'a [f32], usize, usize);
use half::f16;

/// A CPU weight matrix's data, by dtype.
pub(crate) enum Weight<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl Weight<'_> {
    /// `out = self · x` ([`matvec()`]).
    pub(crate) fn matvec(&self, x: &[f32], out: &mut [f32]) {
        match self {
            Weight::F32(w) => matvec(w, x, out),
            Weight::F16(w) => matvec(w, x, out),
        }
    }

    /// `out[j] = row ids[j] · x` ([`matvec_ids`]).
    pub(crate) fn matvec_ids(&self, ids: &[u32], x: &[f32], out: &mut [f32]) {
        match self {
            Weight::F32(w) => matvec_ids(w, ids, x, out),
            Weight::F16(w) => matvec_ids(w, ids, x, out),
        }
    }

    /// The first `rows` rows of `cols` weights.
    pub(crate) fn first_rows(&self, rows: usize, cols: usize) -> Self {
        match self {
            Weight::F32(w) => Weight::F32(&w[..rows * cols]),
            Weight::F16(w) => Weight::F16(&w[..rows * cols]),
        }
    }
}

/// Runs `f` on the data of a CPU tensor of f32 values, with its layout
/// (views such as a KV cache's filled part are strided).
pub(crate) fn with_f32_layout<R>(
    t: &Tensor,
    f: impl FnOnce(&[f32], &Layout) -> Result<R>,
) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => f(v, layout),
        _ => candle_core::bail!(
            "expected an f32 CPU tensor, found {:?} on {:?}",
            t.dtype(),
            t.device()
        ),
    }
}

/// Runs `f` on the data of a contiguous f32 CPU tensor.
pub(crate) fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    with_f32_layout(t, |v, l| match l.contiguous_offsets() {
        Some((a, b)) => f(&v[a..b]),
        None => candle_core::bail!("expected a contiguous tensor"),
    })
}

/// Runs `f` on the data of a contiguous f32 or f16 CPU tensor (a weight).
pub(crate) fn with_weight<R>(t: &Tensor, f: impl FnOnce(Weight<'_>) -> Result<R>) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Some((a, b)) = layout.contiguous_offsets() else {
        candle_core::bail!("weight must be contiguous");
    };
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => f(Weight::F32(&v[a..b])),
        Storage::Cpu(CpuStorage::F16(v)) => f(Weight::F16(&v[a..b])),
        _ => candle_core::bail!(
            "decode kernels take f32/f16 CPU weights, not {:?} on {:?}",
            t.dtype(),
            t.device()
        ),
    }
}

#[cfg(test)]
pub(crate) mod test_data {
    use super::blocks::{f16_at, QFormat, QK};
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    pub(crate) const ALL: [QFormat; 5] = [
        QFormat::Q3_0,
        QFormat::Q4_0,
        QFormat::Q4_1,
        QFormat::Q5_0,
        QFormat::Q8_0,
    ];

    /// Rows of `w` (`[rows, cols]`) quantized by ggml's own code (candle's
    /// port); `Q3_0` by ours.
    pub(crate) fn quantize_rows(w: &[f32], cols: usize, f: QFormat) -> Vec<u8> {
        let Some(ggml) = f.ggml() else {
            let mut out = vec![0u8; f.row_bytes(w.len())];
            super::blocks::quantize_q3_0(w, &[], &mut out);
            return out;
        };
        let t = Tensor::from_slice(w, (w.len() / cols, cols), &Device::Cpu).unwrap();
        QTensor::quantize(&t, ggml)
            .unwrap()
            .data()
            .unwrap()
            .to_vec()
    }

    /// A plain loop: block `b` of a row, dequantized one weight at a time.
    pub(crate) fn plain_dequantize(f: QFormat, row: &[u8]) -> Vec<f32> {
        let mut out = Vec::new();
        for b in row.chunks_exact(f.block_bytes()) {
            let d = f16_at(b, 0);
            for i in 0..QK {
                let nib = |qs: &[u8]| {
                    let byte = qs[i % 16];
                    (if i < 16 { byte & 15 } else { byte >> 4 }) as i32
                };
                out.push(match f {
                    QFormat::Q3_0 => {
                        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                        let lo = (b[6 + i % 8] >> (2 * (i / 8))) & 3;
                        let hi = ((qh >> i) & 1) as u8;
                        d * ((lo | hi << 2) as i32 - 4) as f32
                    }
                    QFormat::Q8_0 => d * (b[2 + i] as i8) as f32,
                    QFormat::Q4_0 => d * (nib(&b[2..]) - 8) as f32,
                    QFormat::Q4_1 => d * nib(&b[4..]) as f32 + f16_at(b, 2),
                    QFormat::Q5_0 => {
                        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                        let hi = ((qh >> i) & 1) as i32;
                        d * ((nib(&b[6..]) | hi << 4) - 16) as f32
                    }
                });
            }
        }
        out
    }

    pub(crate) fn reference_matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
        w.chunks(x.len())
            .map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    }

    pub(crate) fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }
}
