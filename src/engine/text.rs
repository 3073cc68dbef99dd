//! Text side of a checkpoint: the tokenizer, the model's chat template (and
//! the conversations requests may bring), the grammar compiler of
//! structured output, and incremental detokenization for streaming.

use super::grammar::Grammars;
use super::tool_calls::{self, Tool, ToolCall};
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
    /// An assistant turn's calls (its content may then be empty); a
    /// `tool` turn after it carries one call's result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
        }
    }
}

/// Roles a conversation may hold (`tool`: a call's result, after the
/// assistant turn that made the call).
pub(crate) const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// The conversation a request asks for: `system_prompt` (when not empty and
/// the messages bring no system turn of their own), then `messages`, then
/// `prompt` as the last user turn (when not empty). Refused with the reason:
/// no turn at all, an unknown role, an empty turn, a system turn anywhere
/// but first, calls on a turn that is not the assistant's, a tool result
/// that follows no call, or a conversation that does not end with the
/// user's turn or a tool result.
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
        if m.content.trim().is_empty() && m.tool_calls.is_empty() {
            bail!("message {i} ({}) is empty", m.role);
        }
        if !m.tool_calls.is_empty() && m.role != "assistant" {
            bail!(
                "message {i} ({}) has tool_calls; only assistant turns make calls",
                m.role
            );
        }
        for c in &m.tool_calls {
            if c.name.trim().is_empty() {
                bail!("message {i}: a tool call has no function name");
            }
            match serde_json::from_str::<serde_json::Value>(&c.arguments) {
                Ok(serde_json::Value::Object(_)) => {}
                _ => bail!(
                    "message {i}: the arguments of its call of `{}` are not a JSON object: {}",
                    c.name,
                    c.arguments
                ),
            }
        }
        if m.role == "tool" {
            let called = messages[..i]
                .iter()
                .rev()
                .find(|p| p.role != "tool")
                .is_some_and(|p| !p.tool_calls.is_empty());
            if !called {
                bail!("message {i} (tool) follows no assistant turn with tool_calls");
            }
        }
    }
    match turns.last() {
        Some(m) if m.role == "user" || m.role == "tool" => Ok(turns),
        _ => bail!("the conversation must end with a user turn (the prompt, or a last message of role user) or a tool result"),
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
    pub(crate) fn from_model_dir(dir: &Path) -> Result<Self> {
        let cfg = crate::model::Config::from_file(&dir.join("config.json"))?;
        Self::from_dir(dir, &cfg.eos_token_ids())
    }

    /// Loads `tokenizer.json` and (optionally) `tokenizer_config.json` from `dir`.
    /// `eos_ids` are the model config's end-of-sequence ids.
    pub(crate) fn from_dir(dir: &Path, eos_ids: &[u32]) -> Result<Self> {
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
        // Parsing tokenizer.json (151,936 entries for Qwen) leaves tens of
        // MiB of freed heap the allocator would keep resident through the
        // model's load and every request.
        crate::sys::memory::release_free_memory();
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
    pub(crate) fn tool_call_markers(&self) -> (String, String) {
        let item = |m: &str| match self.kept_specials.iter().find(|(_, t)| t == m) {
            Some((id, _)) => format!("<[{id}]>"),
            None => format!("{m:?}"),
        };
        (item(tool_calls::CALL_OPEN), item(tool_calls::CALL_CLOSE))
    }

    /// The call markers' token ids, where they are special tokens.
    pub(crate) fn tool_call_marker_ids(&self) -> Option<(u32, u32)> {
        let id = |m: &str| {
            self.kept_specials
                .iter()
                .find(|(_, t)| t == m)
                .map(|(id, _)| *id)
        };
        Some((id(tool_calls::CALL_OPEN)?, id(tool_calls::CALL_CLOSE)?))
    }

    pub(crate) fn tokenizer(&self) -> &Tokenizer {
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

    /// Where turns start in `ids` (the tokens of `turns` offering `tools`,
    /// rendered): for each turn after the first, how many tokens the turns
    /// before it render to, when those are exactly the first of `ids` (the
    /// template's default system turn counts: a one-turn prompt shares it
    /// with every other). At most the first and the last three, ascending.
    pub fn turn_starts(&self, turns: &[Message], tools: &[Tool], ids: &[u32]) -> Vec<usize> {
        let mut starts: Vec<usize> = (0..turns.len())
            .filter_map(|k| {
                let head = self
                    .encode(&self.render(&turns[..k], tools, false).ok()?)
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
    pub(crate) fn render_chat(&self, messages: &[Message]) -> Result<String> {
        self.render(messages, &[], true)
    }

    /// Renders a conversation that offers `tools` (and may hold calls and
    /// their results): through the template's own tools block where it has
    /// one (Qwen2.5's), else as Qwen2.5's text ([`Self::template_turns`]).
    pub(crate) fn render_chat_with_tools(
        &self,
        messages: &[Message],
        tools: &[Tool],
    ) -> Result<String> {
        self.render(messages, tools, true)
    }

    /// Whether the chat template shows tools, calls and results itself.
    fn template_knows_tools(&self) -> bool {
        self.chat_template
            .as_deref()
            .is_some_and(|t| t.contains("tools") && t.contains("tool_call"))
    }

    /// The turns and tools as the template is given them. A template that
    /// knows tools gets calls as OpenAI's `tool_calls` objects (arguments
    /// as objects) and the tools list. For any other, Qwen2.5's template is
    /// done here: the tools as text in the system turn
    /// ([`tool_calls::tools_system_text`]), each call as a `<tool_call>`
    /// block after the assistant's text, and consecutive tool results as
    /// one user turn of `<tool_response>` blocks.
    fn template_turns(
        &self,
        messages: &[Message],
        tools: &[Tool],
    ) -> Result<(Vec<serde_json::Value>, Vec<serde_json::Value>)> {
        use serde_json::{json, Value};
        let arguments = |c: &tool_calls::ToolCall| -> Result<Value> {
            serde_json::from_str(&c.arguments).with_context(|| {
                format!(
                    "the arguments of a call of `{}` are not JSON: {}",
                    c.name, c.arguments
                )
            })
        };
        if self.template_knows_tools() {
            let mut turns = Vec::with_capacity(messages.len());
            for m in messages {
                let mut t = json!({"role": m.role, "content": m.content});
                if !m.tool_calls.is_empty() {
                    let calls = m
                        .tool_calls
                        .iter()
                        .map(|c| {
                            Ok(json!({"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": arguments(c)?}}))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    t["tool_calls"] = Value::Array(calls);
                }
                turns.push(t);
            }
            return Ok((turns, tools.iter().map(Tool::template_value).collect()));
        }
        let mut turns: Vec<Message> = Vec::with_capacity(messages.len() + 1);
        for m in messages {
            if m.role == "tool" {
                let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
                match turns.last_mut() {
                    Some(prev)
                        if prev.role == "user" && prev.content.ends_with("</tool_response>") =>
                    {
                        prev.content.push('\n');
                        prev.content.push_str(&block);
                    }
                    _ => turns.push(Message::new("user", &block)),
                }
                continue;
            }
            let mut content = m.content.clone();
            for c in &m.tool_calls {
                let call = json!({"name": c.name, "arguments": arguments(c)?});
                if !content.is_empty() {
                    content.push('\n');
                }
                content.push_str(&format!(
                    "{}\n{}\n{}",
                    tool_calls::CALL_OPEN,
                    tool_calls::python_json(&call),
                    tool_calls::CALL_CLOSE
                ));
            }
            turns.push(Message::new(&m.role, &content));
        }
        if !tools.is_empty() {
            match turns.first_mut() {
                Some(m) if m.role == "system" => {
                    m.content = tool_calls::tools_system_text(&m.content, tools)
                }
                _ => turns.insert(
                    0,
                    Message::new("system", &tool_calls::tools_system_text("", tools)),
                ),
            }
        }
        let turns = turns
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        Ok((turns, Vec::new()))
    }

    fn render(
        &self,
        messages: &[Message],
        tools: &[Tool],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let (messages, tools) = self.template_turns(messages, tools)?;
        let Some(template) = &self.chat_template else {
            let mut s = String::new();
            for m in &messages {
                s.push_str(&format!(
                    "<|im_start|>{}\n{}<|im_end|>\n",
                    m["role"].as_str().unwrap_or_default(),
                    m["content"].as_str().unwrap_or_default()
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
    pub(crate) fn grammars(&self) -> Result<Arc<Grammars>> {
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
#[derive(Clone)]
pub(crate) struct TextStream<'a> {
    codec: &'a TextCodec,
    ids: Vec<u32>,
    /// Where the tokens of the last emitted piece start.
    context_start: usize,
    /// Tokens up to here have been emitted as text.
    emitted_to: usize,
}

impl<'a> TextStream<'a> {
    pub(crate) fn new(codec: &'a TextCodec) -> Self {
        Self {
            codec,
            ids: Vec::new(),
            context_start: 0,
            emitted_to: 0,
        }
    }

    /// Adds a token; returns the newly completed text, if any.
    pub(crate) fn push(&mut self, id: u32) -> Result<Option<String>> {
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
    pub(crate) fn text(&self) -> Result<String> {
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
        let orphan = [Message::new("user", "a"), Message::new("tool", "42")];
        assert!(err("", &orphan, "").contains("follows no assistant turn with tool_calls"));
        let mut user_calls = Message::new("user", "a");
        user_calls.tool_calls.push(call("stop", "{}"));
        assert!(err("", &[user_calls], "q").contains("only assistant turns make calls"));
        let mut bad_args = Message::new("assistant", "");
        bad_args.tool_calls.push(call("stop", "[1]"));
        let turns = [
            Message::new("user", "a"),
            bad_args,
            Message::new("tool", "ok"),
        ];
        assert!(err("", &turns, "").contains("not a JSON object"));
    }

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: "call_0".into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// A call and its result go back as Qwen2.5's template writes them:
    /// `<tool_call>` blocks in the assistant's turn, `<tool_response>`
    /// blocks in one user turn, whether the template does it (Qwen) or we
    /// do (SmolLM2, whose template knows no tools).
    #[test]
    fn calls_and_their_results_render_as_qwen_writes_them() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
        let tools = tool_calls::parse_tools(
            r#"[{"name": "battery", "description": "charge", "parameters": {"type": "object", "properties": {}}}]"#,
        )
        .unwrap();
        let mut asked = Message::new("assistant", "");
        asked.tool_calls = vec![call("battery", "{}"), call("battery", r#"{"unit": "%"}"#)];
        let turns = conversation(
            "",
            &[
                Message::new("user", "charge?"),
                asked,
                Message::new("tool", "81"),
                Message::new("tool", "80"),
            ],
            "",
        )
        .unwrap();
        let want = "<|im_start|>assistant\n<tool_call>\n{\"name\": \"battery\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"battery\", \"arguments\": {\"unit\": \"%\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n81\n</tool_response>\n<tool_response>\n80\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
        for model in ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"] {
            let codec = TextCodec::from_model_dir(&root.join(model)).unwrap();
            let text = codec.render_chat_with_tools(&turns, &tools).unwrap();
            assert!(text.ends_with(want), "{model}: {text}");
            let ids = codec.encode(&text).unwrap();
            // The conversation's turns are where a later request shares it.
            assert!(
                !codec.turn_starts(&turns, &tools, &ids).is_empty(),
                "{model}"
            );
        }
    }
}
