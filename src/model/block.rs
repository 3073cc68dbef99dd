//! One decoder block: pre-norm attention and SwiGLU MLP with residuals.

use super::attention::Attention;
use super::kv_cache::LayerCache;
use super::norm::RmsNorm;
use super::rope::Rope;
use super::{Config, Mlp, MlpObserver};
use anyhow::Result;
use candle_core::Tensor;
use candle_nn::VarBuilder;

#[derive(Debug, Clone)]
pub(crate) struct Block {
    input_norm: RmsNorm,
    pub(crate) attn: Attention,
    post_attention_norm: RmsNorm,
    pub mlp: Mlp,
}

impl Block {
    /// Loads a block; `mlp` replaces the dense MLP (selective loading).
    pub(crate) fn load(vb: VarBuilder, cfg: &Config, mlp: Option<Mlp>) -> Result<Self> {
        let mlp = match mlp {
            Some(m) => m,
            None => Mlp::load(vb.pp("mlp"), cfg.hidden_size, cfg.intermediate_size)?,
        };
        Ok(Self {
            input_norm: RmsNorm::load(vb.pp("input_layernorm"), cfg.hidden_size, cfg.rms_norm_eps)?,
            attn: Attention::load(vb.pp("self_attn"), cfg)?,
            post_attention_norm: RmsNorm::load(
                vb.pp("post_attention_layernorm"),
                cfg.hidden_size,
                cfg.rms_norm_eps,
            )?,
            mlp,
        })
    }

    /// Loads block `layer` of a quantized checkpoint, with `mlp` (its bundles).
    pub(crate) fn from_file(
        file: &super::qfile::QFile,
        cfg: &Config,
        layer: usize,
        mlp: Mlp,
    ) -> Result<Self> {
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let norm = |name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(
                file.f32(&format!("model.layers.{layer}.{name}.weight"), h)?,
                eps,
            ))
        };
        Ok(Self {
            input_norm: norm("input_layernorm")?,
            attn: Attention::from_file(file, cfg, layer)?,
            post_attention_norm: norm("post_attention_layernorm")?,
            mlp,
        })
    }

    /// One block at positions `pos..`; `observe` (e.g. a profiler) sees the
    /// MLP activations `silu(gate)·up`; `mlp` replaces the block's own MLP
    /// (a per-prompt compact one).
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        pos: usize,
        rope: &Rope,
        cache: &mut LayerCache,
        observe: Option<MlpObserver>,
        mlp: Option<&Mlp>,
    ) -> Result<Tensor> {
        let h = (x + self
            .attn
            .forward(&self.input_norm.forward(x)?, pos, rope, cache)?)?;
        let normed = self.post_attention_norm.forward(&h)?;
        let mlp = mlp.unwrap_or(&self.mlp);
        let m = match observe {
            Some(obs) => {
                let a = mlp.activations(&normed)?;
                obs(&a)?;
                mlp.down(&a)?
            }
            None => mlp.forward(&normed)?,
        };
        Ok((h + m)?)
    }

    /// One token on the CPU, on plain buffers: `x [hidden]` becomes the
    /// block's output; the same computation as [`Block::forward`].
    pub(crate) fn forward_row(
        &self,
        x: &mut [f32],
        pos: usize,
        rope: &Rope,
        cache: &mut LayerCache,
        mlp: Option<&Mlp>,
    ) -> Result<()> {
        let mut normed = vec![0f32; x.len()];
        self.input_norm.forward_row(x, &mut normed)?;
        let attn = self.attn.forward_row(&normed, pos, rope, cache)?;
        x.iter_mut().zip(&attn).for_each(|(x, a)| *x += a);
        self.post_attention_norm.forward_row(x, &mut normed)?;
        let m = mlp.unwrap_or(&self.mlp).forward_row(&normed)?;
        x.iter_mut().zip(&m).for_each(|(x, m)| *x += m);
        Ok(())
    }
}
