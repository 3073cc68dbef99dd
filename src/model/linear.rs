//! A linear layer whose activations are always f32, whatever the weight dtype.
//!
//! Single-row inputs on CPU (the decode step) go through the streaming
//! [`crate::kernels::MatVec`] kernel; everything else through candle's matmul.

use crate::kernels::MatVec;
use anyhow::Result;
use candle_core::{DType, Tensor};

#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`, contiguous.
    weight: Tensor,
    /// `[out]`, f32.
    bias: Option<Tensor>,
}

/// True when `x` holds a single row (one token of one sequence).
pub fn is_single_row(x: &Tensor) -> bool {
    x.dims().iter().rev().skip(1).product::<usize>() == 1
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        let bias = bias.map(|b| b.to_dtype(DType::F32)).transpose()?;
        Ok(Self {
            weight: weight.contiguous()?,
            bias,
        })
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    pub fn weight_bytes(&self) -> usize {
        self.weight.elem_count() * self.weight.dtype().size_in_bytes()
    }

    /// `x [.., in]` (f32) → `[.., out]` (f32).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = if is_single_row(x) && x.device().is_cpu() {
            x.contiguous()?.apply_op2_no_bwd(&self.weight, &MatVec)?
        } else {
            let (lead, k) = (x.dims()[..x.rank() - 1].to_vec(), x.dim(x.rank() - 1)?);
            let x2 = x.reshape(((), k))?.to_dtype(self.weight.dtype())?;
            let y = x2.matmul(&self.weight.t()?)?.to_dtype(DType::F32)?;
            let mut dims = lead;
            dims.push(self.weight.dim(0)?);
            y.reshape(dims)?
        };
        match &self.bias {
            Some(b) => Ok(y.broadcast_add(b)?),
            None => Ok(y),
        }
    }
}
