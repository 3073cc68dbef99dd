//! Text side of a checkpoint: the tokenizer, the model's chat template and
//! incremental detokenization for streaming.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::Path;
use tokenizers::Tokenizer;

#[derive(Debug, Default, Deserialize)]
struct TokenizerConfig {
    #[serde(default)]
    chat_template: Option<String>,
    #[serde(default)]
    eos_token: Option<String>,
}

/// One chat message.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// Tokenizer plus chat template of one model folder. Cheap to clone (the
/// tokenizer is shared).
#[derive(Clone)]
pub struct TextCodec {
    tokenizer: std::sync::Arc<Tokenizer>,
    chat_template: Option<String>,
    stop_ids: Vec<u32>,
}

/// Tokens that end an assistant turn in ChatML-style models.
const TURN_END_TOKENS: &[&str] = &["<|im_end|>", "<|endoftext|>", "<|eot_id|>"];

impl TextCodec {
    /// The tokenizer of the model folder `dir`, with the end-of-sequence
    /// ids of its `config.json`.
    pub fn from_model_dir(dir: &Path) -> Result<Self> {
        let cfg = crate::model::Config::from_file(&dir.join("config.json"))?;
        Self::from_dir(dir, &cfg.eos_token_ids())
    }

    /// Loads `tokenizer.json` and (optionally) `tokenizer_config.json` from `dir`.
    /// `eos_ids` are the model config's end-of-sequence ids.
    pub fn from_dir(dir: &Path, eos_ids: &[u32]) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&path)
            .map_err(|e| anyhow::anyhow!("loading tokenizer {}: {e}", path.display()))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: TokenizerConfig = if cfg_path.exists() {
            let text = std::fs::read_to_string(&cfg_path)
                .with_context(|| format!("reading {}", cfg_path.display()))?;
            serde_json::from_str(&text)
                .with_context(|| format!("{} is not valid JSON", cfg_path.display()))?
        } else {
            TokenizerConfig::default()
        };
        let mut stop_ids: Vec<u32> = eos_ids.to_vec();
        for tok in TURN_END_TOKENS
            .iter()
            .copied()
            .chain(cfg.eos_token.as_deref())
        {
            if let Some(id) = tokenizer.token_to_id(tok) {
                stop_ids.push(id);
            }
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        Ok(Self {
            tokenizer: std::sync::Arc::new(tokenizer),
            chat_template: cfg.chat_template,
            stop_ids,
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Token ids at which generation stops.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Encodes text as-is (special tokens written in the text are recognised,
    /// no BOS is added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| anyhow::anyhow!("tokenizing prompt: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| anyhow::anyhow!("detokenizing: {e}"))
    }

    /// Renders a conversation with the model's chat template (falling back to
    /// plain ChatML), ending with the assistant's turn opened.
    pub fn render_chat(&self, messages: &[Message]) -> Result<String> {
        let Some(template) = &self.chat_template else {
            let mut s = String::new();
            for m in messages {
                s.push_str(&format!(
                    "<|im_start|>{}\n{}<|im_end|>\n",
                    m.role, m.content
                ));
            }
            s.push_str("<|im_start|>assistant\n");
            return Ok(s);
        };
        let mut env = minijinja::Environment::new();
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template("chat", template)
            .context("parsing the model's chat template")?;
        let rendered = env
            .get_template("chat")
            .and_then(|t| {
                t.render(minijinja::context! {
                    messages => messages,
                    add_generation_prompt => true,
                })
            })
            .context("rendering the model's chat template")?;
        Ok(rendered)
    }

    /// Renders a single user prompt as a chat and tokenizes it.
    pub fn chat_prompt_ids(&self, prompt: &str) -> Result<Vec<u32>> {
        if prompt.trim().is_empty() {
            bail!("the prompt is empty");
        }
        let text = self.render_chat(&[Message {
            role: "user".into(),
            content: prompt.into(),
        }])?;
        self.encode(&text)
    }
}

/// Turns a growing list of token ids into text pieces as soon as they are
/// complete UTF-8 (byte-level BPE splits characters over several tokens).
/// Each push decodes only the tokens since the piece before last (the last
/// piece's tokens give the decoder its context, e.g. for a leading space),
/// so a token costs the same at the end of a long answer as at its start.
pub struct TextStream<'a> {
    codec: &'a TextCodec,
    ids: Vec<u32>,
    /// Where the tokens of the last emitted piece start.
    context_start: usize,
    /// Tokens up to here have been emitted as text.
    emitted_to: usize,
}

impl<'a> TextStream<'a> {
    pub fn new(codec: &'a TextCodec) -> Self {
        Self {
            codec,
            ids: Vec::new(),
            context_start: 0,
            emitted_to: 0,
        }
    }

    /// Adds a token; returns the newly completed text, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let context = self
            .codec
            .decode(&self.ids[self.context_start..self.emitted_to])?;
        let text = self.codec.decode(&self.ids[self.context_start..])?;
        if text.ends_with('\u{FFFD}')
            || text.len() <= context.len()
            || !text.is_char_boundary(context.len())
        {
            return Ok(None);
        }
        let piece = text[context.len()..].to_string();
        self.context_start = self.emitted_to;
        self.emitted_to = self.ids.len();
        Ok(Some(piece))
    }

    /// The whole text so far.
    pub fn text(&self) -> Result<String> {
        self.codec.decode(&self.ids)
    }
}
