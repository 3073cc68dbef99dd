//! A restriction of the output layer to some of the vocabulary: the rows of
//! the lm_head a decode step computes. Each lm_head row is an output
//! neuron; a model that only ever writes one script need not compute the
//! others. The rows are a prefix `0..prefix` (one contiguous stream) plus a
//! few `extra` rows past it, so no copy or reordering of the table is made
//! (a tied lm_head is the embedding table, which every input token needs
//! whole). Tokens outside get logit −∞. Which tokens to keep is the
//! method's choice ([`crate::method::vocab`]).

use anyhow::{bail, Result};

#[derive(Debug, Clone, PartialEq)]
pub struct OutputVocab {
    vocab_size: usize,
    prefix: usize,
    /// Ascending, each in `prefix..vocab_size`.
    extra: Vec<u32>,
}

impl OutputVocab {
    /// Rows `0..prefix` and `extra` of a vocabulary of `vocab_size`.
    pub(crate) fn new(vocab_size: usize, prefix: usize, mut extra: Vec<u32>) -> Result<Self> {
        if prefix > vocab_size {
            bail!("output vocabulary: prefix {prefix} past the vocabulary of {vocab_size}");
        }
        extra.sort_unstable();
        extra.dedup();
        if let Some(&bad) = extra
            .iter()
            .find(|&&id| (id as usize) < prefix || id as usize >= vocab_size)
        {
            bail!(
                "output vocabulary: extra token {bad} is not in {prefix}..{vocab_size} (after the prefix, inside the vocabulary)"
            );
        }
        if prefix + extra.len() == 0 {
            bail!("output vocabulary: no token kept");
        }
        Ok(Self {
            vocab_size,
            prefix,
            extra,
        })
    }

    /// The cheapest restriction holding every id in `keep`: the prefix is
    /// cut where `prefix + 2 × (kept ids past it)` is least — a row picked
    /// by index costs about two of a stream (measured on Qwen2.5's table:
    /// a cut at the fewest rows gathered 2/3 of them and decoded slower).
    pub(crate) fn covering(vocab_size: usize, keep: &[bool]) -> Result<Self> {
        if keep.len() != vocab_size {
            bail!(
                "output vocabulary: {} flags for a vocabulary of {vocab_size}",
                keep.len()
            );
        }
        // cost(p) = p + 2 · #kept in p..; scan p from the end.
        let (mut best, mut best_cost, mut after) = (vocab_size, vocab_size, 0usize);
        // p = vocab_size: every row in the prefix, cost vocab_size.
        for p in (0..vocab_size).rev() {
            after += usize::from(keep[p]);
            if p + 2 * after < best_cost {
                (best, best_cost) = (p, p + 2 * after);
            }
        }
        let extra = (best..vocab_size)
            .filter(|&i| keep[i])
            .map(|i| i as u32)
            .collect();
        Self::new(vocab_size, best, extra)
    }

    pub(crate) fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Refuses a restriction made for another vocabulary size.
    pub(crate) fn check_size(&self, vocab_size: usize) -> Result<()> {
        if self.vocab_size != vocab_size {
            bail!(
                "an output vocabulary of {} tokens for a model of {vocab_size}",
                self.vocab_size
            );
        }
        Ok(())
    }

    /// The contiguous rows `0..prefix`.
    pub(crate) fn prefix(&self) -> usize {
        self.prefix
    }

    /// The rows past the prefix, ascending.
    pub(crate) fn extra(&self) -> &[u32] {
        &self.extra
    }

    /// Rows computed per decode step.
    pub(crate) fn rows(&self) -> usize {
        self.prefix + self.extra.len()
    }

    pub(crate) fn contains(&self, id: u32) -> bool {
        (id as usize) < self.prefix || self.extra.binary_search(&id).is_ok()
    }

    /// Sets every logit outside the restriction to −∞ (the same result as
    /// computing only its rows: each row's logit is its own dot product).
    pub(crate) fn mask(&self, logits: &mut [f32]) {
        let mut next = self.extra.iter().peekable();
        for (i, l) in logits.iter_mut().enumerate().skip(self.prefix) {
            if next.peek().is_some_and(|&&e| e as usize == i) {
                next.next();
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cut_minimises_rows_and_masks_exactly_the_others() {
        // Kept: 0..6 except 3, then 9 and 11 of 12.
        let keep: Vec<bool> = (0..12)
            .map(|i| (i < 6 && i != 3) || i == 9 || i == 11)
            .collect();
        let v = OutputVocab::covering(12, &keep).unwrap();
        assert_eq!((v.prefix(), v.extra()), (6, &[9u32, 11][..]));
        assert_eq!(v.rows(), 8);
        for i in 0..12u32 {
            assert_eq!(v.contains(i), i < 6 || i == 9 || i == 11, "{i}");
        }
        let mut l = vec![1.0f32; 12];
        v.mask(&mut l);
        let kept: Vec<usize> = (0..12).filter(|&i| l[i].is_finite()).collect();
        assert_eq!(kept, [0, 1, 2, 3, 4, 5, 9, 11]);
        // All kept: the whole vocabulary as the prefix.
        let all = OutputVocab::covering(5, &[true; 5]).unwrap();
        assert_eq!((all.prefix(), all.extra().len()), (5, 0));
    }

    #[test]
    fn bad_restrictions_are_refused_with_the_reason() {
        assert!(OutputVocab::new(10, 11, vec![]).is_err());
        let e = OutputVocab::new(10, 4, vec![2]).unwrap_err().to_string();
        assert!(e.contains("extra token 2"), "{e}");
        assert!(OutputVocab::new(10, 4, vec![10]).is_err());
        assert!(OutputVocab::new(10, 0, vec![]).is_err());
        assert!(OutputVocab::covering(10, &[true; 9]).is_err());
        assert!(OutputVocab::covering(3, &[false; 3]).is_err());
    }
}
