//! A linear layer whose activations are always f32, whatever the weight dtype.
//!
//! Single-row inputs on CPU (the decode step) go through the streaming
//! [`crate::kernels::matvec`] kernel; everything else through candle's matmul.

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

    /// One row on the CPU: `x [in]` → `[out]`, bias added.
    pub fn forward_row(&self, x: &[f32]) -> Result<Vec<f32>> {
        let (out, k) = self.weight.dims2()?;
        if x.len() != k {
            anyhow::bail!("linear layer [{out}, {k}] given a row of {}", x.len());
        }
        let mut y = vec![0f32; out];
        crate::kernels::with_weight(&self.weight, |w| {
            w.matvec(x, &mut y);
            Ok(())
        })?;
        if let Some(b) = &self.bias {
            crate::kernels::with_f32(b, |b| {
                y.iter_mut().zip(b).for_each(|(y, b)| *y += b);
                Ok(())
            })?;
        }
        Ok(y)
    }

    /// `x [.., in]` (f32) → `[.., out]` (f32).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if is_single_row(x) && x.device().is_cpu() {
            let y = self.forward_row(&x.flatten_all()?.to_vec1::<f32>()?)?;
            let mut dims = x.dims().to_vec();
            *dims.last_mut().expect("rank >= 1") = y.len();
            return Ok(Tensor::from_vec(y, dims, x.device())?);
        }
        let (lead, k) = (x.dims()[..x.rank() - 1].to_vec(), x.dim(x.rank() - 1)?);
        let x2 = x.reshape(((), k))?.to_dtype(self.weight.dtype())?;
        let y = x2.matmul(&self.weight.t()?)?.to_dtype(DType::F32)?;
        let mut dims = lead;
        dims.push(self.weight.dim(0)?);
        let y = y.reshape(dims)?;
        match &self.bias {
            Some(b) => Ok(y.broadcast_add(b)?),
            None => Ok(y),
        }
    }
}
