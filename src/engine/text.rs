//! Text side of a checkpoint: the tokenizer, the model's chat template (and
//! the conversations requests may bring), the grammar compiler of
//! structured output, and incremental detokenization for streaming.

use super::grammar::Grammars;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use tokenizers::Tokenizer;

#[derive(Debug, Default, Deserialize)]
struct TokenizerConfig {
    #[serde(default)]
    chat_template: Option<String>,
    #[serde(default)]
    eos_token: Option<String>,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Roles a conversation may hold.
pub const ROLES: [&str; 3] = ["system", "user", "assistant"];

/// The conversation a request asks for: `system_prompt` (when not empty and
/// the messages bring no system turn of their own), then `messages`, then
/// `prompt` as the last user turn (when not empty). Refused with the reason:
/// no turn at all, an unknown role, an empty turn, a system turn anywhere
/// but first, or a conversation that does not end with the user's turn.
pub fn conversation(
    system_prompt: &str,
    messages: &[Message],
    prompt: &str,
) -> Result<Vec<Message>> {
    let mut turns = Vec::with_capacity(messages.len() + 2);
    let own_system = messages.first().is_some_and(|m| m.role == "system");
    if !own_system && !system_prompt.trim().is_empty() {
        turns.push(Message::new("system", system_prompt));
    }
    turns.extend(messages.iter().cloned());
    if !prompt.trim().is_empty() {
        turns.push(Message::new("user", prompt));
    }
    if messages.is_empty() && prompt.trim().is_empty() {
        bail!("the prompt is empty (give a prompt or messages)");
    }
    for (i, m) in messages.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            bail!(
                "message {i} has role `{}`; roles are {}",
                m.role,
                ROLES.join(", ")
            );
        }
        if m.role == "system" && i > 0 {
            bail!("message {i}: a system turn may only come first");
        }
        if m.content.trim().is_empty() {
            bail!("message {i} ({}) is empty", m.role);
        }
    }
    match turns.last() {
        Some(m) if m.role == "user" => Ok(turns),
        _ => bail!("the conversation must end with a user turn (the prompt, or a last message of role user)"),
    }
}

/// Tokenizer plus chat template of one model folder. Cheap to clone (the
/// tokenizer is shared).
#[derive(Clone)]
pub struct TextCodec {
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<String>,
    stop_ids: Vec<u32>,
    dir: PathBuf,
    grammars: Arc<OnceLock<Result<Arc<Grammars>, String>>>,
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
            tokenizer: Arc::new(tokenizer),
            chat_template: cfg.chat_template,
            stop_ids,
            dir: dir.to_path_buf(),
            grammars: Arc::default(),
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

    /// Where turns start in `ids` (the tokens of `turns` rendered): for
    /// each turn after the first, how many tokens the turns before it
    /// render to, when those are exactly the first of `ids` (the template's
    /// default system turn counts: a one-turn prompt shares it with every
    /// other). At most the first and the last three, ascending.
    pub fn turn_starts(&self, turns: &[Message], ids: &[u32]) -> Vec<usize> {
        let mut starts: Vec<usize> = (0..turns.len())
            .filter_map(|k| {
                let head = self.encode(&self.render(&turns[..k], false).ok()?).ok()?;
                (!head.is_empty() && head.len() < ids.len() && ids.starts_with(&head))
                    .then_some(head.len())
            })
            .collect();
        starts.dedup();
        if starts.len() > 4 {
            starts.drain(1..starts.len() - 3);
        }
        starts
    }

    /// Renders a conversation with the model's chat template (falling back to
    /// plain ChatML), ending with the assistant's turn opened.
    pub fn render_chat(&self, messages: &[Message]) -> Result<String> {
        self.render(messages, true)
    }

    fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let Some(template) = &self.chat_template else {
            let mut s = String::new();
            for m in messages {
                s.push_str(&format!(
                    "<|im_start|>{}\n{}<|im_end|>\n",
                    m.role, m.content
                ));
            }
            if add_generation_prompt {
                s.push_str("<|im_start|>assistant\n");
            }
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
                    add_generation_prompt => add_generation_prompt,
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
        self.chat_ids(&[Message::new("user", prompt)])
    }

    /// Renders a conversation ([`conversation`]) and tokenizes it.
    pub fn chat_ids(&self, turns: &[Message]) -> Result<Vec<u32>> {
        self.encode(&self.render_chat(turns)?)
    }

    /// The grammar compiler of this model (built on first use, shared by
    /// clones): the tokenizer's trie, padded to the model's `vocab_size`
    /// logits.
    pub fn grammars(&self) -> Result<Arc<Grammars>> {
        let built = self.grammars.get_or_init(|| {
            let t = std::time::Instant::now();
            let vocab = crate::model::Config::from_file(&self.dir.join("config.json"))
                .map(|c| c.vocab_size)
                .unwrap_or_else(|_| self.tokenizer.get_vocab_size(true));
            Grammars::new(
                self.tokenizer.clone(),
                vocab.max(self.tokenizer.get_vocab_size(true)),
                &self.stop_ids,
            )
            .map(|g| {
                log::info!(
                    "grammar vocabulary ({vocab} tokens) built in {:.2} s",
                    t.elapsed().as_secs_f64()
                );
                Arc::new(g)
            })
            .map_err(|e| format!("{e:#}"))
        });
        built.clone().map_err(|e| anyhow::anyhow!(e))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn roles(turns: &[Message]) -> Vec<&str> {
        turns.iter().map(|m| m.role.as_str()).collect()
    }

    #[test]
    fn a_conversation_takes_the_system_prompt_unless_it_brings_its_own() {
        let t = conversation("be brief", &[], "hi").unwrap();
        assert_eq!(roles(&t), ["system", "user"]);
        assert_eq!(t[0].content, "be brief");
        let history = [
            Message::new("user", "where is the dock?"),
            Message::new("assistant", "in the lab"),
        ];
        let t = conversation("", &history, "go there").unwrap();
        assert_eq!(roles(&t), ["user", "assistant", "user"]);
        let own = [Message::new("system", "mine"), Message::new("user", "q")];
        let t = conversation("node's", &own, "").unwrap();
        assert_eq!(roles(&t), ["system", "user"]);
        assert_eq!(t[0].content, "mine");
    }

    #[test]
    fn bad_conversations_are_refused_with_the_reason() {
        let err =
            |sys: &str, m: &[Message], p: &str| conversation(sys, m, p).unwrap_err().to_string();
        assert!(err("sys", &[], " ").contains("empty"));
        assert!(err("", &[Message::new("robot", "x")], "q").contains("role `robot`"));
        let late_system = [Message::new("user", "a"), Message::new("system", "b")];
        assert!(err("", &late_system, "q").contains("only come first"));
        assert!(err("", &[Message::new("user", "")], "q").contains("message 0 (user) is empty"));
        let ends_with_assistant = [Message::new("user", "a"), Message::new("assistant", "b")];
        assert!(err("", &ends_with_assistant, "").contains("end with a user turn"));
    }
}
