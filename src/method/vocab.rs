//! Which output tokens decode computes (the lm_head's rows: its output
//! neurons), as a rule over the vocabulary's bytes:
//! - `all`: every token (dense's output layer);
//! - `latin`: tokens written in the Latin script — ASCII, Latin-1, Latin
//!   Extended-A/B, general punctuation and currency signs — plus every
//!   single-byte token (any text can still be spelled byte by byte) and the
//!   added/special tokens. For a robot that speaks English or another
//!   European language this drops the other scripts' tokens: 34 % of
//!   Qwen2.5's vocabulary (the cut below computes 69 % of its rows: 8.7 %
//!   fewer decode bytes for the 0.5B model in f16), under 2 % of SmolLM2's
//!   (there the cut keeps every row). The engine falls back to every token for a
//!   request whose prompt has a token outside, or that is constrained by a
//!   grammar ([`crate::engine::Engine`]).
//!
//! The rows become a contiguous prefix plus a few extra rows
//! ([`OutputVocab::covering`]).

use crate::model::vocab::OutputVocab;
use anyhow::Result;

/// The rule that picks the output vocabulary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VocabRule {
    #[default]
    All,
    Latin,
}

crate::sys::named::impl_named!(VocabRule, "vocab", {
    All => "all",
    Latin => "latin",
});

/// Whether `c` is of the Latin script or common to it (digits,
/// punctuation, spaces, currency).
fn latin_char(c: char) -> bool {
    matches!(c as u32, 0..=0x024F | 0x1E00..=0x1EFF | 0x2000..=0x206F | 0x20A0..=0x20CF)
}

impl VocabRule {
    /// The output vocabulary of this rule for tokens of the given bytes
    /// (`words[id]`), where `added` are the tokenizer's added tokens (kept
    /// whatever their text), with the rule's own per-token choice
    /// ([`VocabRule::keeps`]: the vocabulary computes every token kept, and
    /// maybe a few more in its prefix); `None` for `all`.
    pub(crate) fn vocabulary(
        self,
        words: &[Vec<u8>],
        added: &[u32],
    ) -> Result<Option<(OutputVocab, Vec<bool>)>> {
        self.keeps(words, added)
            .map(|keep| Ok((OutputVocab::covering(words.len(), &keep)?, keep)))
            .transpose()
    }

    /// Per token, whether the rule keeps it; `None` for `all`.
    pub(crate) fn keeps(self, words: &[Vec<u8>], added: &[u32]) -> Option<Vec<bool>> {
        match self {
            VocabRule::All => None,
            VocabRule::Latin => {
                let mut keep: Vec<bool> = words
                    .iter()
                    .map(|w| {
                        // Empty: a padding row past the tokenizer's ids.
                        !w.is_empty()
                            && (w.len() == 1
                                || std::str::from_utf8(w).is_ok_and(|s| s.chars().all(latin_char)))
                    })
                    .collect();
                for &id in added {
                    if let Some(k) = keep.get_mut(id as usize) {
                        *k = true;
                    }
                }
                Some(keep)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latin_keeps_latin_text_bytes_and_added_tokens() {
        let words: Vec<Vec<u8>> = [
            "the",
            " Müller",
            "中文",
            "\u{fffd}",
            "ß",
            "–",
            "Привет",
            "<|im_end|>",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .chain([vec![0xE4], vec![0xE4, 0xB8], vec![]])
        .collect();
        let keep = VocabRule::Latin.keeps(&words, &[7]).expect("a rule");
        let kept: Vec<usize> = (0..words.len()).filter(|&i| keep[i]).collect();
        // 中文, U+FFFD, Привет and the two-byte piece are dropped.
        assert_eq!(kept, [0, 1, 4, 5, 7, 8]);
        let (v, same) = VocabRule::Latin.vocabulary(&words, &[7]).unwrap().unwrap();
        assert_eq!(same, keep);
        assert!(kept.iter().all(|&i| v.contains(i as u32)));
        assert!(VocabRule::All.vocabulary(&words, &[]).unwrap().is_none());
        assert_eq!("latin".parse::<VocabRule>().unwrap(), VocabRule::Latin);
        assert!("greek".parse::<VocabRule>().is_err());
    }
}
