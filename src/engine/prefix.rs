//! The prefix cache: the last request's prompt with its key/value cache, so
//! a request that starts with the same tokens (a planner's fixed system
//! prompt, a conversation so far) prefills only what is new.
//!
//! Selective modes choose a prompt's neurons from statistics summed over
//! its tokens (`PromptCounts`, additive per token): the cache keeps them at
//! a few *checkpoints* — where the last user turn starts, and the prompt's
//! end — and reuses a prefix only up to one of them, adding the new tokens'
//! statistics, so the choice is the one a full prefill makes. Modes that
//! compute every held neuron reuse the whole common prefix.
//!
//! The keys and values of the reused positions are the ones the previous
//! prefill computed on the same held neurons (a task swap or a change of φ
//! or α empties the cache); they differ from a fresh prefill's only by the
//! order of float additions.

use crate::method::PromptCounts;
use crate::model::kv_cache::GROW_BY;
use crate::model::KvCache;

/// Per-layer selection statistics after the first `at` prompt tokens.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub at: usize,
    pub counts: Vec<PromptCounts>,
}

/// The last prompt and its cache.
pub(crate) struct PrefixCache {
    /// The prompt whose positions `0..tokens.len()` the cache holds (the
    /// generated tokens after them are not reused: in selective modes decode
    /// computed them on the chosen neurons only).
    pub tokens: Vec<u32>,
    pub cache: KvCache,
    /// Checkpoints (selective modes), ascending.
    pub snapshots: Vec<Snapshot>,
}

/// What a new prompt takes over from the cache.
pub(crate) struct Reuse {
    /// Prompt tokens already in `cache`.
    pub tokens: usize,
    pub cache: KvCache,
    /// The statistics of those tokens (selective modes; `None` when nothing
    /// is reused).
    pub counts: Option<Vec<PromptCounts>>,
    /// The cache's checkpoints before them, still valid for the new prompt.
    pub earlier: Vec<Snapshot>,
}

impl Reuse {
    /// Nothing reused: a prompt prefilled whole into `cache` (empty).
    pub(crate) fn none(cache: KvCache) -> Self {
        Self {
            tokens: 0,
            cache,
            counts: None,
            earlier: Vec::new(),
        }
    }
}

impl PrefixCache {
    /// The part of `prompt` this cache holds: the common prefix, at most all
    /// but the prompt's last token (its logits start the answer), and for
    /// `selective` modes only up to a checkpoint. The cache is cut to it.
    pub(crate) fn reuse(self, prompt: &[u32], selective: bool) -> Reuse {
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len().saturating_sub(1));
        let mut earlier = self.snapshots;
        earlier.retain(|s| s.at <= common && s.at > 0);
        let (tokens, counts) = if selective {
            match earlier.pop() {
                Some(s) => (s.at, Some(s.counts)),
                None => (0, None),
            }
        } else {
            (common, None)
        };
        let mut cache = self.cache;
        let (mut tokens, mut counts) = (tokens, counts);
        let before = cache.capacity();
        if tokens > 0 {
            if let Err(e) = cache.truncate(tokens) {
                // Only a failed reallocation gets here: start afresh, the
                // checkpoint's counts with it.
                log::warn!("prefix cache: {e:#}; prefilling the whole prompt");
                (tokens, counts) = (0, None);
            }
        }
        if tokens == 0 {
            cache.reset();
        }
        if before > GROW_BY && before > cache.capacity() {
            // A long sequence's buffers were freed: glibc keeps freed heap
            // unless asked (RSS stayed ~4 % up after one 2048-token goal).
            crate::sys::memory::release_free_memory();
        }
        earlier.retain(|s| s.at < tokens);
        Reuse {
            tokens,
            cache,
            counts,
            earlier,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(tokens: &[u32], snapshots: &[usize]) -> PrefixCache {
        PrefixCache {
            tokens: tokens.to_vec(),
            cache: KvCache::new(2, crate::model::KvDtype::F32),
            snapshots: snapshots
                .iter()
                .map(|&at| Snapshot {
                    at,
                    counts: vec![PromptCounts::default(); 2],
                })
                .collect(),
        }
    }

    #[test]
    fn reuse_stops_at_the_common_prefix_and_at_a_checkpoint_when_selecting() {
        let old = [1, 2, 3, 4, 5, 6];
        let r = cache(&old, &[3, 6]).reuse(&[1, 2, 3, 4, 9, 9], false);
        assert_eq!(r.tokens, 4);
        let r = cache(&old, &[3, 6]).reuse(&[1, 2, 3, 4, 9, 9], true);
        assert_eq!((r.tokens, r.counts.is_some()), (3, true));
        // The whole old prompt again, then more: up to its end.
        let r = cache(&old, &[3, 6]).reuse(&[1, 2, 3, 4, 5, 6, 7], true);
        assert_eq!(r.tokens, 6);
        // The same prompt: all but its last token (no checkpoint there).
        let r = cache(&old, &[3, 6]).reuse(&old, false);
        assert_eq!(r.tokens, 5);
        let r = cache(&old, &[3, 6]).reuse(&old, true);
        assert_eq!(r.tokens, 3);
        let r = cache(&old, &[3]).reuse(&[7, 2, 3], false);
        assert_eq!((r.tokens, r.counts.is_none()), (0, true));
        // Checkpoints before the reused end stay for the next prompt.
        let r = cache(&old, &[2, 3, 6]).reuse(&[1, 2, 3, 4, 5, 6, 7], true);
        let kept: Vec<usize> = r.earlier.iter().map(|s| s.at).collect();
        assert_eq!((r.tokens, kept), (6, vec![2, 3]));
    }
}
