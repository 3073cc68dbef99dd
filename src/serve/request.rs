//! What goes into the request queue and what comes out: one generation
//! request, as any front end fills it, and its reply. No ROS in here.

use crate::engine::tool_calls::ToolCall;
use crate::engine::Message;
use serde::Serialize;

/// One generation request. `None` fields take the server's current defaults.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub id: String,
    /// The last user turn (may be empty when `messages` ends with one).
    pub prompt: String,
    /// Earlier turns of the conversation (role + content), before `prompt`.
    pub messages: Vec<Message>,
    /// Strings at which the answer ends (not part of it).
    pub stop: Vec<String>,
    /// A JSON schema the answer must validate under (empty = none).
    pub json_schema: String,
    /// A Lark grammar the answer must parse under (empty = none).
    pub grammar: String,
    /// Functions the model may call, as JSON text
    /// ([`crate::engine::tool_calls::parse_tools`]; empty = none).
    pub tools: String,
    /// `""`/`auto`, `none`, `required` or a function's name.
    pub tool_choice: String,
    /// Whether one turn may make several calls.
    pub parallel_tool_calls: bool,
    /// `""` = the server's task when the request is accepted; otherwise one
    /// of [`crate::serve::server::Server::tasks`].
    pub task: String,
    pub max_new_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub seed: Option<i64>,
}

/// The answer to one request.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Reply {
    pub success: bool,
    pub error: String,
    pub request_id: String,
    pub text: String,
    pub prompt_tokens: usize,
    /// Of the prompt tokens, those the prefix cache held.
    pub cached_prompt_tokens: usize,
    pub generated_tokens: usize,
    pub ttft_s: f64,
    pub tokens_per_s: f64,
    pub compute_ratio: f64,
    /// `eos`, `length`, `cancelled`, `stop`, `tool_calls` (ended after
    /// its calls); empty when `success` is false.
    pub stop_reason: String,
    /// The task whose plan answered.
    pub task: String,
    /// The calls the answer made (with tools offered); `text` is then the
    /// answer's text outside them.
    pub tool_calls: Vec<ToolCall>,
}

impl Reply {
    /// A failed request: nothing generated, `error` says why.
    pub(crate) fn error(request_id: &str, error: impl Into<String>) -> Self {
        Self {
            success: false,
            error: error.into(),
            request_id: request_id.to_string(),
            ..Default::default()
        }
    }

    pub fn cancelled(&self) -> bool {
        self.stop_reason == "cancelled"
    }
}
