//! A request's offer of tools, from its fields to its answer: the
//! functions, `tool_choice` and `parallel_tool_calls` read and checked,
//! the grammar the answer is held to, and the reply's text and calls read
//! back from what was generated.

use super::grammar::Grammar;
use super::text::TextCodec;
use super::tool_calls::{self, parse_tools, Tool, ToolCall, ToolChoice};
use anyhow::{bail, Result};

/// What a request offers: its functions, whether and which it must call,
/// and whether it may make several calls in one turn.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Offer {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl Offer {
    /// From a request's fields: `tools` as JSON text ([`parse_tools`];
    /// empty = none) and `tool_choice` (`""`/`auto`, `none`, `required` or
    /// a function's name). Refuses a choice other than `auto` with no
    /// tools, and a function name not offered.
    pub(crate) fn from_fields(tools: &str, tool_choice: &str, parallel: bool) -> Result<Self> {
        let tools = match tools.trim() {
            "" => Vec::new(),
            text => parse_tools(text)?,
        };
        let choice: ToolChoice = tool_choice.parse()?;
        if tools.is_empty() && !matches!(choice, ToolChoice::Auto) {
            bail!("tool_choice `{}` needs tools", tool_choice.trim());
        }
        if let ToolChoice::Function(name) = &choice {
            if !tools.iter().any(|t| &t.name == name) {
                bail!(
                    "tool_choice `{name}` is not among the tools offered ({})",
                    tools
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        Ok(Self {
            tools,
            choice,
            parallel,
        })
    }

    /// Whether calls are to be read from the answer.
    pub(crate) fn calls_wanted(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }
}

/// A generation's answer to an offer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    /// The text outside the calls (the raw text when a call was cut).
    pub text: String,
    pub calls: Vec<ToolCall>,
    /// The generation's, or `tool_calls` when it ended after its calls.
    pub stop_reason: String,
    /// Calls cut short (length, stop string, cancel) and not read.
    pub cut: usize,
}

impl Offer {
    /// The grammar the answer is held to: the request's own (`own`: its
    /// JSON schema or Lark grammar) without tools, the calls' grammar
    /// ([`tool_calls::grammar`]) with them; both together are refused.
    pub(crate) fn grammar_with(
        &self,
        own: Option<Grammar>,
        codec: &TextCodec,
    ) -> Result<Option<Grammar>> {
        if self.tools.is_empty() {
            return Ok(own);
        }
        if own.is_some() {
            bail!("tools hold the answer to their calls' grammar; give json_schema or grammar only without tools");
        }
        let (open, close) = codec.tool_call_markers();
        tool_calls::grammar(&self.tools, &self.choice, self.parallel, (&open, &close))
    }

    /// The reply to generated `text` that stopped for `stop_reason`: its
    /// calls read back ([`tool_calls::read_calls`]) and the text outside
    /// them. A call cut short leaves the raw text in place (nothing lost).
    pub(crate) fn answer(&self, text: String, stop_reason: &str) -> Answer {
        let mut answer = Answer {
            text,
            calls: Vec::new(),
            stop_reason: stop_reason.to_string(),
            cut: 0,
        };
        if !self.calls_wanted() {
            return answer;
        }
        let read = tool_calls::read_calls(&answer.text, &self.tools, false);
        answer.calls = read.calls;
        answer.cut = read.invalid;
        if read.invalid == 0 {
            answer.text = read.content;
            if !answer.calls.is_empty() && stop_reason == "eos" {
                answer.stop_reason = "tool_calls".into();
            }
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOOLS: &str = r#"[{"name": "dock", "parameters": {"type": "object", "properties": {"station": {"type": "integer"}}}}]"#;

    #[test]
    fn fields_are_checked_and_answers_read_back() {
        assert!(Offer::from_fields("", "required", true).is_err());
        let e = Offer::from_fields(TOOLS, "lift", true).unwrap_err();
        assert!(
            e.to_string().contains("not among the tools offered (dock)"),
            "{e}"
        );
        let offer = Offer::from_fields(TOOLS, "", true).unwrap();
        assert!(offer.calls_wanted() && offer.choice == ToolChoice::Auto);
        // Calls after text: read, the text kept apart, the reason tool_calls.
        let a = offer.answer(
            "Docking.\n<tool_call>\n{\"name\": \"dock\", \"arguments\": {\"station\": 2}}\n</tool_call>".into(),
            "eos",
        );
        assert_eq!(
            (
                a.text.as_str(),
                a.calls.len(),
                a.stop_reason.as_str(),
                a.cut
            ),
            ("Docking.", 1, "tool_calls", 0)
        );
        // A call cut by the token limit: the raw text stays, nothing lost.
        let raw = "<tool_call>\n{\"name\": \"dock\", \"argu";
        let a = offer.answer(raw.into(), "length");
        assert_eq!(
            (
                a.text.as_str(),
                a.calls.len(),
                a.stop_reason.as_str(),
                a.cut
            ),
            (raw, 0, "length", 1)
        );
        // tool_choice none: text as it is.
        let none = Offer::from_fields(TOOLS, "none", true).unwrap();
        assert_eq!(none.answer("<tool_call>".into(), "eos").text, "<tool_call>");
    }
}
