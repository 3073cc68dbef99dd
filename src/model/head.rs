//! The model's output layer: the lm_head's rows a pass computes (an
//! output vocabulary, [`vocab`]) and how (every row exactly, or behind a
//! screen, [`head_screen`]).

use super::{head_screen, vocab, Model};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor};

impl Model {
    /// Restricts the logits to the tokens of `vocab` (the others are −∞):
    /// decode computes only its lm_head rows; other passes compute all and
    /// mask, which gives the same logits. `None` computes every row.
    pub(crate) fn set_output_vocab(
        &mut self,
        vocab: Option<std::sync::Arc<vocab::OutputVocab>>,
    ) -> Result<()> {
        if let Some(v) = &vocab {
            v.check_size(self.cfg.vocab_size)?;
        }
        self.vocab = vocab;
        Ok(())
    }

    /// A screen of this model's lm_head, its copy in `bits` of the rows of
    /// `covered` (every row without one), computing `k` rows exactly
    /// ([`head_screen`]). CPU only.
    pub(crate) fn build_head_screen(
        &self,
        k: usize,
        bits: head_screen::ScreenBits,
        covered: Option<&vocab::OutputVocab>,
    ) -> Result<head_screen::HeadScreen> {
        if !self.device.is_cpu() {
            bail!(
                "head_screen runs on the CPU; on {:?} use head_screen 0",
                self.device
            );
        }
        head_screen::HeadScreen::build(&self.lm_head, k, bits, covered)
            .context("building the lm_head's screen")
    }

    /// Screens the lm_head from now on, in every pass: the `k` rows the
    /// screen ranks highest are computed exactly, the others keep its
    /// logits; `None` computes every row exactly.
    pub(crate) fn set_head_screen(
        &mut self,
        screen: Option<head_screen::HeadScreen>,
    ) -> Result<()> {
        if let Some(s) = &screen {
            s.check_head(&self.lm_head)?;
        }
        self.screen = screen;
        Ok(())
    }

    /// The logits of one normed row: the lm_head's, through the screen and
    /// the output vocabulary in force.
    pub(super) fn head_row(&self, normed: &[f32]) -> Result<Vec<f32>> {
        match (&self.screen, &self.vocab) {
            (Some(s), v) => s.logits(&self.lm_head, normed, v.as_deref()),
            (None, Some(v)) => self.lm_head.forward_row_subset(normed, v),
            (None, None) => self.lm_head.forward_row(normed),
        }
    }

    /// The output vocabulary in force, if any.
    #[cfg(test)]
    pub(crate) fn output_vocab(&self) -> Option<&vocab::OutputVocab> {
        self.vocab.as_deref()
    }

    /// `logits [.., vocab]` with the tokens outside the output vocabulary at −∞.
    pub(super) fn mask_vocab(&self, logits: Tensor) -> Result<Tensor> {
        let Some(v) = &self.vocab else {
            return Ok(logits);
        };
        let dims = logits.dims().to_vec();
        let mut all = logits
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        all.chunks_mut(self.cfg.vocab_size)
            .for_each(|row| v.mask(row));
        Ok(Tensor::from_vec(all, dims, logits.device())?)
    }
}
