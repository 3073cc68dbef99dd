//! Rotary position embeddings: the cos/sin tables (with Llama 3's
//! `rope_scaling`) and their application to a batch or to one decode row.

use super::Config;
use anyhow::Result;
use candle_core::{Device, Tensor};

/// RoPE tables for positions `0..max_positions`.
#[derive(Debug, Clone)]
pub(crate) struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    pub(crate) fn new(cfg: &Config, max_positions: usize, device: &Device) -> Result<Self> {
        let dim = cfg.head_dim();
        let mut inv_freq: Vec<f64> = (0..dim)
            .step_by(2)
            .map(|i| 1.0 / cfg.rope_theta.powf(i as f64 / dim as f64))
            .collect();
        if let Some(s) = cfg
            .rope_scaling
            .as_ref()
            .filter(|s| s.rope_type == "llama3")
        {
            let orig = s.original_max_position_embeddings as f64;
            let low_wavelen = orig / s.low_freq_factor;
            let high_wavelen = orig / s.high_freq_factor;
            for f in inv_freq.iter_mut() {
                let wavelen = 2.0 * std::f64::consts::PI / *f;
                *f = if wavelen < high_wavelen {
                    *f
                } else if wavelen > low_wavelen {
                    *f / s.factor
                } else {
                    let smooth = (orig / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    (1.0 - smooth) * *f / s.factor + smooth * *f
                };
            }
        }
        let half = inv_freq.len();
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for f in &inv_freq {
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (max_positions, half), device)?,
            sin: Tensor::from_vec(sin, (max_positions, half), device)?,
        })
    }

    /// Rotates, in place, the first `heads` heads of one row of activations
    /// (`[.., head_dim]` each) at position `pos` (CPU).
    pub(crate) fn apply_row(
        &self,
        x: &mut [f32],
        heads: usize,
        head_dim: usize,
        pos: usize,
    ) -> Result<()> {
        let row = pos * (head_dim / 2)..(pos + 1) * (head_dim / 2);
        crate::kernels::with_f32(&self.cos, |cos| {
            crate::kernels::with_f32(&self.sin, |sin| {
                match (cos.get(row.clone()), sin.get(row.clone())) {
                    (Some(cos), Some(sin)) => {
                        crate::kernels::rope_row(x, cos, sin, head_dim, heads);
                        Ok(())
                    }
                    _ => candle_core::bail!("rope: position {pos} is beyond the table"),
                }
            })
        })?;
        Ok(())
    }

    /// Applies the rotation to `x [b, heads, seq, head_dim]` at positions `pos..`.
    pub(crate) fn apply(&self, x: &Tensor, pos: usize) -> Result<Tensor> {
        let seq = x.dim(2)?;
        let cos = self.cos.narrow(0, pos, seq)?;
        let sin = self.sin.narrow(0, pos, seq)?;
        Ok(candle_nn::rotary_emb::rope(&x.contiguous()?, &cos, &sin)?)
    }
}
