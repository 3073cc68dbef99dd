//! The engine's output layer: its vocabulary ([`crate::method::vocab`]),
//! built from the tokenizer's bytes, and its screen
//! ([`crate::model::head_screen`]), both put in force per request where
//! they serve.

use super::generate::Engine;
use super::text::TextCodec;
use crate::method::vocab::VocabRule;
use crate::model::head_screen::ScreenBits;
use crate::model::vocab::OutputVocab;
use anyhow::{bail, Context, Result};

impl Engine {
    /// Computes only the output tokens `rule` keeps from now on (the
    /// lm_head rows; [`crate::method::vocab`]).
    pub(crate) fn set_vocab(&mut self, rule: VocabRule) -> Result<()> {
        let (vocab, keep) = vocabulary(&self.codec, rule, self.model.config().vocab_size)?;
        match &vocab {
            Some(v) if v.rows() < v.vocab_size() => log::info!(
                "vocab {rule}: {} of {} output tokens computed (rows 0..{} and {} more)",
                v.rows(),
                v.vocab_size(),
                v.prefix(),
                v.extra().len()
            ),
            Some(_) => log::info!("vocab {rule}: it keeps every row of this vocabulary"),
            None => {}
        }
        self.set_output_vocab(vocab.filter(|v| v.rows() < v.vocab_size()))?;
        if self.vocab.is_some() {
            self.vocab_keep = keep.map(std::sync::Arc::new);
        }
        // A screen copies the vocabulary's rows only: build it anew.
        if let Some(s) = &self.head_screen {
            let (k, bits) = (s.k(), s.bits());
            self.set_head_screen(k, bits)?;
        }
        Ok(())
    }

    /// Computes only the output tokens of `vocab` from now on (`None`: all);
    /// [`Engine::set_vocab`] builds it from a rule.
    pub(crate) fn set_output_vocab(&mut self, vocab: Option<OutputVocab>) -> Result<()> {
        if vocab.is_some() && !self.model.device().is_cpu() {
            bail!(
                "an output vocabulary thins the CPU decode's lm_head; on {:?} it would only add a mask (use vocab all)",
                self.model.device()
            );
        }
        if let Some(v) = &vocab {
            v.check_size(self.model.config().vocab_size)?;
        }
        self.vocab = vocab.map(std::sync::Arc::new);
        self.vocab_keep = None;
        self.model.set_output_vocab(None)
    }

    /// Screens the lm_head from now on: `k` rows computed exactly per
    /// step, the rest ranked by a copy in `bits` ([`crate::model::head_screen`]);
    /// 0 computes every row exactly and frees the copy. Off a CPU the
    /// whole head is computed (the screen is a CPU decode's saving; the
    /// node's default asks for one), with a warning.
    pub(crate) fn set_head_screen(&mut self, k: usize, bits: ScreenBits) -> Result<()> {
        let device = self.model.device().clone();
        if k > 0 && !device.is_cpu() {
            log::warn!("head_screen {k} ignored on {device:?}: every lm_head row is computed");
        }
        self.head_screen = match (k, self.head_screen.take()) {
            (0, _) => None,
            _ if !device.is_cpu() => None,
            (k, Some(s)) if s.bits() == bits && s.covers(self.vocab.as_deref()) => {
                Some(s.with_k(k, self.model.config().vocab_size)?)
            }
            (k, _) => {
                let s = self
                    .model
                    .build_head_screen(k, bits, self.vocab.as_deref())?;
                log::info!(
                    "head_screen {k}: a {bits}-bit copy of the lm_head's {} rows ({:.1} MB) ranks them, {k} computed exactly",
                    s.rows(),
                    s.bytes() as f64 / 1e6
                );
                Some(s)
            }
        };
        self.model.set_head_screen(None)
    }

    #[cfg(test)]
    /// The rows the lm_head's screen computes exactly (0: no screen).
    pub(crate) fn head_screen_k(&self) -> usize {
        self.head_screen.as_ref().map_or(0, |s| s.k())
    }

    /// Puts the output vocabulary and the lm_head's screen in force for a
    /// request of `prompt`, or every token exactly where they would not
    /// serve: the vocabulary for a prompt with a token outside it (the
    /// reply may need that script), both for a grammar (which may allow
    /// only tokens outside them: the greedy choice among the tokens it
    /// allows must be the exact head's).
    pub(super) fn vocab_for(&mut self, prompt: &[u32], constrained: bool) -> Result<()> {
        let inside = |t: u32| match (&self.vocab_keep, &self.vocab) {
            (Some(keep), _) => keep.get(t as usize).copied().unwrap_or(false),
            (None, Some(v)) => v.contains(t),
            (None, None) => true,
        };
        let v = self
            .vocab
            .clone()
            .filter(|_| !constrained && prompt.iter().all(|&t| inside(t)));
        if self.vocab.is_some() && v.is_none() {
            log::debug!("this request decodes over the whole vocabulary");
        }
        self.model.set_output_vocab(v)?;
        let screen = self.head_screen.clone().filter(|_| !constrained);
        self.model.set_head_screen(screen)
    }
}

/// The output vocabulary `rule` keeps of a model's `vocab_size` rows
/// (`None` for every row), and per token whether it is kept (the
/// tokenizer's ids; the model's table may be padded past them).
pub(crate) fn vocabulary(
    codec: &TextCodec,
    rule: VocabRule,
    vocab_size: usize,
) -> Result<(Option<OutputVocab>, Option<Vec<bool>>)> {
    if rule == VocabRule::All {
        return Ok((None, None));
    }
    let tok = codec.tokenizer();
    let mut words = super::grammar::token_bytes(tok)
        .with_context(|| format!("vocab {rule}: reading the tokens' bytes"))?;
    words.resize(vocab_size, Vec::new());
    let added: Vec<u32> = tok.get_added_tokens_decoder().keys().copied().collect();
    Ok(rule.vocabulary(&words, &added)?.unzip())
}
