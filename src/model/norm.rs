//! RMSNorm with f32 weights: batched, and one row on the CPU.

use anyhow::{Context, Result};
use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;

#[derive(Debug, Clone)]
pub(crate) struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    /// A norm over `weight` (`[size]`, f32).
    pub(crate) fn new(weight: Tensor, eps: f64) -> Self {
        Self {
            weight,
            eps: eps as f32,
        }
    }

    pub(crate) fn load(vb: VarBuilder, size: usize, eps: f64) -> Result<Self> {
        let weight = vb
            .get_with_hints_dtype(size, "weight", Default::default(), DType::F32)
            .with_context(|| format!("loading {}.weight", vb.prefix()))?;
        Ok(Self {
            weight,
            eps: eps as f32,
        })
    }
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(x, &self.weight, self.eps)?)
    }

    /// One row on the CPU: `out = norm(x)`.
    pub(crate) fn forward_row(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        crate::kernels::with_f32(&self.weight, |w| {
            if w.len() != x.len() {
                candle_core::bail!("rms norm of {} for a row of {}", w.len(), x.len());
            }
            crate::kernels::rms_norm_row(x, w, self.eps, out);
            Ok(())
        })?;
        Ok(())
    }
}
