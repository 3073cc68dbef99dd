//! Text side of a checkpoint: the tokenizer, the model's chat template (and
//! the conversations requests may bring), the grammar compiler of
//! structured output, and incremental detokenization for streaming.

use super::grammar::Grammars;
use super::tool_calls::{self, Tool};
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
    /// Special tokens that stay in decoded text: the tool-call markers
    /// (Qwen2.5's `<tool_call>` and `</tool_call>` are special tokens, and
    /// the calls are read back from the text).
    kept_specials: Vec<(u32, String)>,
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
        let added = tokenizer.get_added_tokens_decoder();
        let kept_specials = [tool_calls::CALL_OPEN, tool_calls::CALL_CLOSE]
            .iter()
            .filter_map(|m| {
                let id = tokenizer.token_to_id(m)?;
                added
                    .get(&id)
                    .is_some_and(|t| t.special)
                    .then(|| (id, m.to_string()))
            })
            .collect();
        Ok(Self {
            tokenizer: Arc::new(tokenizer),
            chat_template: cfg.chat_template,
            stop_ids,
            dir: dir.to_path_buf(),
            grammars: Arc::default(),
            kept_specials,
        })
    }

    /// How a tool call's opening and closing markers are written in a
    /// grammar: the special tokens by id where the vocabulary has them
    /// (what the model was trained to emit), else the literal text.
    pub fn tool_call_markers(&self) -> (String, String) {
        let item = |m: &str| match self.kept_specials.iter().find(|(_, t)| t == m) {
            Some((id, _)) => format!("<[{id}]>"),
            None => format!("{m:?}"),
        };
        (item(tool_calls::CALL_OPEN), item(tool_calls::CALL_CLOSE))
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

    /// The text of `ids`, special tokens left out but for the tool-call
    /// markers.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let plain = |ids: &[u32]| {
            self.tokenizer
                .decode(ids, true)
                .map_err(|e| anyhow::anyhow!("detokenizing: {e}"))
        };
        let kept = |id: &u32| self.kept_specials.iter().find(|(k, _)| k == id);
        if !ids.iter().any(|id| kept(id).is_some()) {
            return plain(ids);
        }
        let mut text = String::new();
        for piece in ids.split_inclusive(|id| kept(id).is_some()) {
            match piece.split_last() {
                Some((last, head)) if kept(last).is_some() => {
                    text.push_str(&plain(head)?);
                    text.push_str(&kept(last).expect("kept").1);
                }
                _ => text.push_str(&plain(piece)?),
            }
        }
        Ok(text)
    }

    /// Where turns start in `ids` (the tokens of `turns` rendered): for
    /// each turn after the first, how many tokens the turns before it
    /// render to, when those are exactly the first of `ids` (the template's
    /// default system turn counts: a one-turn prompt shares it with every
    /// other). At most the first and the last three, ascending.
    pub fn turn_starts(&self, turns: &[Message], ids: &[u32]) -> Vec<usize> {
        let mut starts: Vec<usize> = (0..turns.len())
            .filter_map(|k| {
                let head = self
                    .encode(&self.render(&turns[..k], &[], false).ok()?)
                    .ok()?;
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
        self.render(messages, &[], true)
    }

    /// Renders a conversation that offers `tools`: through the template's
    /// own tools block where it has one (Qwen2.5's), else as Qwen2.5's
    /// tools text in the system turn ([`tool_calls::tools_system_text`]).
    pub fn render_chat_with_tools(&self, messages: &[Message], tools: &[Tool]) -> Result<String> {
        let own_block = self
            .chat_template
            .as_deref()
            .is_some_and(|t| t.contains("tools"));
        if tools.is_empty() || own_block {
            return self.render(messages, tools, true);
        }
        let mut turns = messages.to_vec();
        match turns.first_mut() {
            Some(m) if m.role == "system" => {
                m.content = tool_calls::tools_system_text(&m.content, tools)
            }
            _ => turns.insert(
                0,
                Message::new("system", &tool_calls::tools_system_text("", tools)),
            ),
        }
        self.render(&turns, &[], true)
    }

    fn render(
        &self,
        messages: &[Message],
        tools: &[Tool],
        add_generation_prompt: bool,
    ) -> Result<String> {
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
        // Python's json.dumps, as the Hugging Face templates' `tojson`
        // writes (minijinja's own escapes `<`, `>`, `&` and `'` for HTML).
        env.add_filter(
            "tojson",
            |v: minijinja::Value| -> Result<minijinja::Value, minijinja::Error> {
                let v = serde_json::to_value(&v).map_err(|e| {
                    minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
                })?;
                Ok(minijinja::Value::from_safe_string(tool_calls::python_json(
                    &v,
                )))
            },
        );
        env.add_template("chat", template)
            .context("parsing the model's chat template")?;
        let tools: Vec<serde_json::Value> = tools.iter().map(Tool::template_value).collect();
        let rendered = env
            .get_template("chat")
            .and_then(|t| {
                t.render(minijinja::context! {
                    messages => messages,
                    tools => (!tools.is_empty()).then_some(tools),
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

    /// Qwen2.5's template shows the tools as it was trained on them (its
    /// `<tools>` block, each tool as Python's json.dumps writes it, keys in
    /// OpenAI's order); SmolLM2's has no tools block, so the same text goes
    /// into the system turn; the call markers are Qwen's special tokens,
    /// kept in decoded text.
    #[test]
    fn tools_are_rendered_as_the_model_was_trained_and_markers_survive_decoding() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
        let tools = tool_calls::parse_tools(
            r#"[{"name": "math.hypot", "description": "x < y & z", "parameters": {"type": "dict", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}]"#,
        )
        .unwrap();
        let turns = [Message::new("user", "hypot of 4")];
        let qwen = TextCodec::from_model_dir(&root.join("qwen2.5-coder-0.5b-instruct")).unwrap();
        let text = qwen.render_chat_with_tools(&turns, &tools).unwrap();
        let want = r#"<tools>
{"type": "function", "function": {"name": "math.hypot", "description": "x < y & z", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": false}}}
</tools>"#;
        assert!(text.contains(want), "{text}");
        assert!(
            text.ends_with("<|im_start|>user\nhypot of 4<|im_end|>\n<|im_start|>assistant\n"),
            "{text}"
        );
        let (open, close) = qwen.tool_call_markers();
        assert!(
            open.starts_with("<[") && close.starts_with("<["),
            "{open} {close}"
        );
        let ids = qwen
            .encode("<tool_call>\n{}\n</tool_call><|im_end|>")
            .unwrap();
        assert_eq!(qwen.decode(&ids).unwrap(), "<tool_call>\n{}\n</tool_call>");
        let smol = TextCodec::from_model_dir(&root.join("smollm2-135m-instruct")).unwrap();
        let text = smol.render_chat_with_tools(&turns, &tools).unwrap();
        assert!(text.contains(want) && text.contains("# Tools"), "{text}");
        assert_eq!(smol.tool_call_markers().0, "\"<tool_call>\"");
    }

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
