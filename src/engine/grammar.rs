//! Structured output: a JSON schema or a Lark grammar constrains decoding so
//! that the text always parses (llguidance, the constrained decoding of
//! llama.cpp and vLLM). The token trie is built once per model from our
//! tokenizer; each request compiles its grammar
//! into a [`Constraint`] that masks the logits before every sample.
//!
//! llguidance's own bridge (`toktrie_hf_tokenizers`) pins an older
//! `tokenizers` and would hold a second copy of the vocabulary: the few
//! lines of [`Vocab`] reuse ours.

use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use llguidance::api::TopLevelGrammar;
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use std::sync::Arc;
use tokenizers::Tokenizer;
use toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// What a request constrains its output to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grammar {
    /// A JSON schema (its text): the output is one JSON value valid under it.
    JsonSchema(String),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
}

impl Grammar {
    /// The grammar of a request's `json_schema` and `grammar` fields (empty
    /// = unset; both set is refused).
    pub(crate) fn of_fields(json_schema: &str, lark: &str) -> Result<Option<Self>> {
        match (json_schema.trim().is_empty(), lark.trim().is_empty()) {
            (true, true) => Ok(None),
            (false, true) => Ok(Some(Self::JsonSchema(json_schema.into()))),
            (true, false) => Ok(Some(Self::Lark(lark.into()))),
            (false, false) => bail!("give json_schema or grammar, not both"),
        }
    }
}

/// The vocabulary as llguidance sees it: token bytes in a trie, and our
/// tokenizer for the text it needs tokenized.
struct Vocab {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default()
        })
    }
}

/// Compiles requests' grammars for one model.
pub(crate) struct Grammars {
    factory: ParserFactory,
    /// Each token's first byte (0 for special and empty tokens).
    first_bytes: Vec<u8>,
    /// Whether a token holds `<` or a backtick (what a tool call opens
    /// with after text, and what text may not hold).
    call_bytes: Vec<bool>,
}

impl Grammars {
    /// The trie of `tokenizer`'s vocabulary (a byte-level BPE, as SmolLM2's
    /// and Qwen's), padded to the model's `n_vocab` logits; `eos`: the ids
    /// that end a turn (allowed once the grammar is complete).
    pub(crate) fn new(tokenizer: Arc<Tokenizer>, n_vocab: usize, eos: &[u32]) -> Result<Self> {
        let what = "building the grammar vocabulary";
        let mut words = token_bytes(&tokenizer).context(what)?;
        if words.len() > n_vocab {
            bail!(
                "{what}: the tokenizer has {} tokens for a model of {n_vocab} logits",
                words.len()
            );
        }
        // Logits past the tokenizer's ids: special tokens nothing matches.
        while words.len() < n_vocab {
            let mut name = format!(".<[{}]>", words.len()).into_bytes();
            name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            words.push(name);
        }
        let Some(&first) = eos.first() else {
            bail!("the model has no end-of-turn token to end a constrained answer with");
        };
        let first_bytes = words
            .iter()
            .map(|w| match w.first() {
                Some(&b) if b != TokTrie::SPECIAL_TOKEN_MARKER => b,
                _ => 0,
            })
            .collect();
        let call_bytes = words
            .iter()
            .map(|w| match w.first() {
                Some(&b) if b != TokTrie::SPECIAL_TOKEN_MARKER => {
                    w.iter().any(|&b| b == b'<' || b == b'`')
                }
                _ => false,
            })
            .collect();
        let info = TokRxInfo::new(n_vocab as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        drop(words);
        let env: toktrie::TokEnv = Arc::new(Vocab { trie, tokenizer });
        // No precomputed slices of the vocabulary: on Qwen they cost 35 MiB
        // and masked no faster (0.20 ms/token either way, a free-text field
        // included; docs/BENCHMARKS.md).
        let mut factory = ParserFactory::new(&env, Default::default(), &[]).context(what)?;
        factory.quiet();
        Ok(Self {
            factory,
            first_bytes,
            call_bytes,
        })
    }

    /// Whether each token holds `<` or a backtick (special tokens: false).
    pub(crate) fn call_bytes(&self) -> &[bool] {
        &self.call_bytes
    }

    /// Each token's first byte (0 for special and empty tokens).
    pub(crate) fn first_bytes(&self) -> &[u8] {
        &self.first_bytes
    }

    /// The constraint of `grammar`, or why it cannot be one (an invalid
    /// schema is refused here, before any token is generated).
    pub(crate) fn compile(&self, grammar: &Grammar) -> Result<Constraint> {
        let top = match grammar {
            Grammar::JsonSchema(s) => {
                let mut schema: serde_json::Value =
                    serde_json::from_str(s).context("json_schema is not JSON")?;
                // One line, `{"a": 1, "b": 2}`: with free whitespace a small
                // model may emit newlines until the token limit. A schema's
                // own `x-guidance` options win.
                if schema.is_object() && schema.get("x-guidance").is_none() {
                    JsonCompileOptions {
                        item_separator: ", ".into(),
                        key_separator: ": ".into(),
                        whitespace_flexible: false,
                        ..Default::default()
                    }
                    .apply_to(&mut schema);
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            Grammar::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        };
        let what = match grammar {
            Grammar::JsonSchema(_) => "json_schema",
            Grammar::Lark(_) => "grammar",
        };
        let parser = self
            .factory
            .create_parser(top)
            .with_context(|| format!("{what} is not a grammar llguidance accepts"))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            bail!("{what}: {e}");
        }
        Ok(Constraint { matcher })
    }
}

/// Each token's bytes, straight from the tokenizer (no second parse of
/// `tokenizer.json`: a `serde_json::Value` of Qwen's peaked 100 MiB above
/// the model). Special added tokens get llguidance's marker byte in front,
/// so no text ever matches them.
pub(crate) fn token_bytes(tokenizer: &Tokenizer) -> Result<Vec<Vec<u8>>> {
    if !matches!(
        tokenizer.get_decoder(),
        Some(tokenizers::DecoderWrapper::ByteLevel(_))
    ) {
        bail!("structured output needs a byte-level BPE tokenizer (as SmolLM2's and Qwen's)");
    }
    // GPT-2's byte-to-character map, reversed: printable bytes stand for
    // themselves, the others for the characters from U+0100 on.
    let mut byte_of = std::collections::HashMap::new();
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).expect("a character below U+0200")
        };
        byte_of.insert(c, b);
    }
    let added = tokenizer.get_added_tokens_decoder();
    let n = tokenizer.get_vocab_size(true);
    let mut words = vec![Vec::new(); n];
    for (id, word) in words.iter_mut().enumerate() {
        let id = id as u32;
        if let Some(t) = added.get(&id) {
            *word = t.content.as_bytes().to_vec();
            if t.special {
                word.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
            }
            continue;
        }
        let Some(name) = tokenizer.id_to_token(id) else {
            continue;
        };
        *word = name
            .chars()
            .map(|c| byte_of.get(&c).copied())
            .collect::<Option<Vec<u8>>>()
            .with_context(|| format!("token {id} ({name:?}) is not byte-level"))?;
    }
    Ok(words)
}

/// One request's grammar state: which tokens may come next.
pub(crate) struct Constraint {
    matcher: Matcher,
}

impl Constraint {
    /// [`Self::mask`] as values.
    pub(crate) fn mask_values(&mut self, logits: &Tensor) -> Result<Vec<f32>> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| anyhow::anyhow!("the grammar failed: {e}"))?;
        let mut v = logits.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?;
        let n = v.len();
        allowed.iter_unset_entries(|t| {
            if t < n {
                v[t] = f32::NEG_INFINITY;
            }
        });
        Ok(v)
    }

    /// Advances over the sampled `token` (one the mask allowed).
    pub(crate) fn accept(&mut self, token: u32) -> Result<()> {
        self.matcher
            .consume_token(token)
            .map_err(|e| anyhow::anyhow!("the grammar refused token {token}: {e}"))
    }

    /// Forgets the last `tokens` accepted.
    pub(crate) fn rollback(&mut self, tokens: usize) -> Result<()> {
        self.matcher
            .rollback(tokens)
            .map_err(|e| anyhow::anyhow!("the grammar could not go back {tokens} tokens: {e}"))
    }

    /// Whether the grammar admits nothing more (the answer is complete).
    pub(crate) fn finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}
