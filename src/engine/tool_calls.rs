//! Tool calls (function calling): the functions a request offers, as the
//! model's chat template shows them (Qwen2.5's `<tools>` block; the same
//! text as a system turn for a template without tools), a grammar under
//! which every call the model writes names an offered function and
//! matches its parameters' schema (llguidance), and the calls read back
//! from the generated text.
//!
//! A call is written as Qwen2.5 was trained to write it:
//! `<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>`.

use super::grammar::Grammar;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Map, Value};

/// The markers around a call, as Qwen2.5 writes them.
pub(crate) const CALL_OPEN: &str = "<tool_call>";
pub(crate) const CALL_CLOSE: &str = "</tool_call>";
/// What a call's JSON holds just before the function's name (the grammar
/// writes `name` first, with these separators).
pub(crate) const NAME_OPEN: &str = "{\"name\": \"";

/// One function a request offers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// A JSON schema of the arguments object (BFCL's `dict`, `float`,
    /// `tuple` and `any` already turned into JSON schema's words).
    pub parameters: Value,
}

/// Whether and what the model must call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum ToolChoice {
    /// Text or calls, the model's choice.
    #[default]
    Auto,
    /// Text only (the tools are still shown).
    None,
    /// At least one call.
    Required,
    /// A call of this function.
    Function(String),
}

impl std::str::FromStr for ToolChoice {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.trim() {
            "" | "auto" => Self::Auto,
            "none" => Self::None,
            "required" => Self::Required,
            name => Self::Function(name.to_string()),
        })
    }
}

/// A call read from the text: `arguments` is JSON text (an object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// What a generation said: its text outside the calls, the calls, and
/// the call blocks that did not parse or name no offered function.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct Calls {
    pub content: String,
    pub calls: Vec<ToolCall>,
    pub invalid: usize,
}

/// JSON schema's word for a BFCL/OpenAPI-ish type name, `None` for `any`.
fn json_type(t: &str) -> Result<Option<&'static str>> {
    Ok(Some(match t {
        "dict" | "object" => "object",
        "float" | "number" | "double" => "number",
        "integer" | "int" => "integer",
        "string" | "str" => "string",
        "boolean" | "bool" => "boolean",
        "array" | "list" | "tuple" => "array",
        "null" => "null",
        "any" => return Ok(None),
        other => bail!("unknown type `{other}`"),
    }))
}

/// `schema` in JSON schema's words, objects closed to the properties they
/// declare (a call cannot invent an argument).
fn normalize(schema: &Value, at: &str) -> Result<Value> {
    let Value::Object(m) = schema else {
        bail!("{at}: a schema must be an object, got {schema}");
    };
    let mut out = Map::new();
    for (k, v) in m {
        match k.as_str() {
            "type" => {
                let types = match v {
                    Value::String(t) => vec![t.as_str()],
                    Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                    other => bail!("{at}: `type` must be a name, got {other}"),
                };
                let mut words = Vec::new();
                for t in types {
                    match json_type(t).with_context(|| at.to_string())? {
                        Some(w) => words.push(Value::from(w)),
                        None => {
                            words.clear();
                            break;
                        }
                    }
                }
                match words.len() {
                    0 => {}
                    1 => {
                        out.insert("type".into(), words.remove(0));
                    }
                    _ => {
                        out.insert("type".into(), Value::Array(words));
                    }
                }
            }
            "properties" => {
                let Value::Object(props) = v else {
                    bail!("{at}: `properties` must be an object");
                };
                let mut p = Map::new();
                for (name, s) in props {
                    p.insert(name.clone(), normalize(s, &format!("{at}.{name}"))?);
                }
                out.insert("properties".into(), Value::Object(p));
            }
            "items" => {
                let items = match v {
                    Value::Array(xs) => Value::Array(
                        xs.iter()
                            .map(|x| normalize(x, &format!("{at}[]")))
                            .collect::<Result<_>>()?,
                    ),
                    x => normalize(x, &format!("{at}[]"))?,
                };
                out.insert("items".into(), items);
            }
            // Shown to the model in the tools block, not for the grammar.
            "description" | "default" | "optional" | "title" | "examples" => {}
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    if out.get("type") == Some(&Value::from("object")) && out.contains_key("properties") {
        out.entry("additionalProperties")
            .or_insert(Value::Bool(false));
        if let Some(Value::Array(req)) = out.get("required") {
            let props = out["properties"].as_object().map(|p| p.len()).unwrap_or(0);
            for r in req {
                let known = r
                    .as_str()
                    .is_some_and(|n| out["properties"].get(n).is_some());
                if !known {
                    bail!("{at}: required `{r}` is not among its {props} properties");
                }
            }
        }
    }
    Ok(Value::Object(out))
}

/// Reads a request's `tools`: JSON text of an array of functions, each
/// `{"name", "description", "parameters"}` or OpenAI's `{"type":
/// "function", "function": {...}}`. A malformed one is an error naming the
/// tool and the problem.
pub(crate) fn parse_tools(text: &str) -> Result<Vec<Tool>> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let v: Value = serde_json::from_str(text).context("tools is not JSON")?;
    let Value::Array(items) = v else {
        bail!("tools must be a JSON array of functions");
    };
    let mut tools: Vec<Tool> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let f = match item.get("function") {
            Some(f) if item.get("type").and_then(Value::as_str) == Some("function") => f,
            _ => item,
        };
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.trim().is_empty())
            .with_context(|| format!("tool {i}: no `name`"))?;
        let at = format!("tool `{name}`");
        if tools.iter().any(|t| t.name == name) {
            bail!("{at}: offered twice");
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p) => {
                let s = normalize(p, &format!("{at} parameters"))?;
                if s.get("type") != Some(&Value::from("object")) {
                    bail!("{at}: parameters must be an object schema");
                }
                // The descriptions stay, for the model to read.
                merge_shown(p, &s)
            }
        };
        tools.push(Tool {
            name: name.to_string(),
            description: f
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            parameters,
        });
    }
    Ok(tools)
}

/// Keeps the descriptions of the given schema beside the normalized words,
/// so the tools block shows them to the model.
fn merge_shown(given: &Value, normalized: &Value) -> Value {
    match (given, normalized) {
        (Value::Object(g), Value::Object(n)) => {
            let mut out = n.clone();
            for key in ["description", "default", "title"] {
                if let Some(v) = g.get(key) {
                    out.insert(key.into(), v.clone());
                }
            }
            if let (Some(Value::Object(gp)), Some(Value::Object(np))) =
                (g.get("properties"), n.get("properties"))
            {
                let merged: Map<String, Value> = np
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            gp.get(k).map_or(v.clone(), |g| merge_shown(g, v)),
                        )
                    })
                    .collect();
                out.insert("properties".into(), Value::Object(merged));
            }
            Value::Object(out)
        }
        _ => normalized.clone(),
    }
}

impl Tool {
    /// The tool as chat templates take it (OpenAI's form, which Qwen2.5's
    /// template writes into its `<tools>` block).
    pub(crate) fn template_value(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            }
        })
    }

    /// The schema a call's arguments are held to (descriptions dropped).
    fn arguments_schema(&self) -> Value {
        strip_shown(&self.parameters)
    }
}

fn strip_shown(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "description" | "default" | "title"))
                .map(|(k, v)| {
                    let v = match k.as_str() {
                        "properties" => Value::Object(
                            v.as_object()
                                .map(|p| {
                                    p.iter().map(|(k, s)| (k.clone(), strip_shown(s))).collect()
                                })
                                .unwrap_or_default(),
                        ),
                        "items" => strip_shown(v),
                        _ => v.clone(),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The system text that shows `tools` to a model whose chat template has
/// no tools block: Qwen2.5's own words.
pub(crate) fn tools_system_text(system: &str, tools: &[Tool]) -> String {
    let mut s = String::from(system);
    if !s.is_empty() {
        s.push_str("\n\n");
    }
    s.push_str("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    for t in tools {
        s.push('\n');
        s.push_str(&python_json(&t.template_value()));
    }
    s.push_str("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
    s
}

/// JSON as Python's `json.dumps` writes it (`", "` and `": "`; non-ASCII
/// kept): what the Hugging Face templates' `tojson` gives.
pub(crate) fn python_json(v: &Value) -> String {
    match v {
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), python_json(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Array(xs) => format!(
            "[{}]",
            xs.iter().map(python_json).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
    }
}

/// The Lark grammar (llguidance) a request's output is held to: `None`
/// when nothing is offered; with `tool_choice: none`, any text without
/// the call markers when they are special tokens (Qwen2.5's: a grammar
/// admits no special token it does not name).
///
/// A call takes one of the forms models write, each held to the offered
/// functions' schemas: `<tool_call>\n{...}\n</tool_call>` (Qwen2.5's
/// trained form), a ```` ```json ```` fence (what small models write
/// unprompted), or the bare object as the whole answer. With `auto` the
/// answer is text, calls, or a line of text then marked calls; text holds
/// no `<` or backtick and does not start as a call would (`{`, `[`, white
/// space), so no call can hide in it unchecked. With `required` or a
/// function name, calls only. `parallel` allows several, on their own
/// lines.
///
/// `markers` are the call's opening and closing markers as grammar items
/// ([`crate::engine::text::TextCodec::tool_call_markers`]: special tokens
/// by id, or quoted text).
pub(crate) fn grammar(
    tools: &[Tool],
    choice: &ToolChoice,
    parallel: bool,
    (open, close): (&str, &str),
) -> Result<Option<Grammar>> {
    if tools.is_empty() {
        return Ok(None);
    }
    if *choice == ToolChoice::None {
        return Ok(Some(Grammar::Lark(
            "start: TEXT\nTEXT: /(.|\\n)*/\n".into(),
        )));
    }
    let offered: Vec<&Tool> = match choice {
        ToolChoice::Function(name) => vec![tools
            .iter()
            .find(|t| &t.name == name)
            .with_context(|| format!("tool_choice `{name}` is not among the tools offered"))?],
        _ => tools.iter().collect(),
    };
    let one_of: Vec<Value> = offered
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.arguments_schema()},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let call_schema = json!({
        "anyOf": one_of,
        "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "},
    });
    let (calls, marked_calls) = if parallel {
        ("call (SEP call)*", "marked (SEP marked)*")
    } else {
        ("call", "marked")
    };
    // Several calls in one fence, as a JSON list (how small models write
    // "do A and B").
    let fenced_list = if parallel {
        " | \"```json\\n[\" call_json (\", \" call_json)* \"]\\n```\""
    } else {
        ""
    };
    let start = match choice {
        ToolChoice::Auto => "calls | TEXT | TEXT marked_calls",
        _ => "calls",
    };
    Ok(Some(Grammar::Lark(format!(
        "start: {start}\n\
         calls: {calls}\n\
         marked_calls: {marked_calls}\n\
         call: marked | call_json\n\
         marked: {open} \"\\n\" call_json \"\\n\" {close} | \"```json\\n\" call_json \"\\n```\"{fenced_list}\n\
         call_json: %json {call_schema}\n\
         SEP: /\\n+/\n\
         TEXT: /[^<`{{\\[\\s][^<`]*/\n"
    ))))
}

/// The calls in generated `text` and the text around them: `<tool_call>`
/// blocks, ```` ```json ```` fences holding a call, or the whole text as
/// one call object (the forms [`grammar`] allows). A block that does not
/// parse, names no offered function or whose arguments are not an object
/// counts as invalid and stays out of `calls`; a call equal to an earlier
/// one (name and arguments) is dropped. `lenient` also takes any
/// call object found in the text (to score another engine's unconstrained
/// answers, as BFCL-style lenient scoring does).
pub(crate) fn read_calls(text: &str, tools: &[Tool], lenient: bool) -> Calls {
    let mut out = Calls::default();
    let push = |out: &mut Calls, body: &str| match call_of(body, tools) {
        // The same call twice in one answer is made once.
        Some((name, arguments))
            if out
                .calls
                .iter()
                .any(|c| c.name == name && c.arguments == arguments) => {}
        Some((name, arguments)) => {
            let id = format!("call_{}", out.calls.len());
            out.calls.push(ToolCall {
                id,
                name,
                arguments,
            })
        }
        None => out.invalid += 1,
    };
    // The whole answer as one object.
    if text.trim_start().starts_with('{') && call_of(text, tools).is_some() {
        push(&mut out, text);
        return out;
    }
    let mut content = String::new();
    let mut rest = text;
    loop {
        let tag = rest.find(CALL_OPEN).map(|i| (i, CALL_OPEN, CALL_CLOSE));
        let fence = rest.find("```json").map(|i| (i, "```json", "```"));
        let next = match (tag, fence) {
            (Some(a), Some(b)) => Some(if a.0 < b.0 { a } else { b }),
            (a, b) => a.or(b),
        };
        let Some((i, open, close)) = next else { break };
        content.push_str(&rest[..i]);
        let after = &rest[i + open.len()..];
        let (body, tail) = match after.find(close) {
            Some(j) => (&after[..j], &after[j + close.len()..]),
            None => (after, ""),
        };
        if open == CALL_OPEN || lenient || looks_like_call(body) {
            match serde_json::from_str::<Value>(body.trim()) {
                // A list of calls in one fence.
                Ok(Value::Array(items)) if open != CALL_OPEN => {
                    for item in items {
                        push(&mut out, &item.to_string());
                    }
                }
                _ => push(&mut out, body),
            }
        } else {
            content.push_str(&rest[i..rest.len() - tail.len()]);
        }
        rest = tail;
    }
    content.push_str(rest);
    if lenient {
        // Call objects elsewhere in the text (one per line, as models write them).
        for line in content.lines() {
            let line = line.trim();
            if line.starts_with('{') && call_of(line, tools).is_some() {
                push(&mut out, line);
            }
        }
    }
    out.content = content.trim().to_string();
    out
}

/// Whether a fenced block is meant as a call (an object with a `name`, or
/// a list of them).
fn looks_like_call(body: &str) -> bool {
    match serde_json::from_str::<Value>(body.trim()) {
        Ok(Value::Array(items)) => items.iter().any(|v| v.get("name").is_some()),
        Ok(v) => v.get("name").is_some(),
        Err(_) => false,
    }
}

fn call_of(body: &str, tools: &[Tool]) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?;
    tools.iter().any(|t| t.name == name).then_some(())?;
    let args = match v.get("arguments")? {
        Value::Object(_) => v["arguments"].clone(),
        // Some models write the arguments as a JSON string.
        Value::String(s) => serde_json::from_str::<Value>(s)
            .ok()
            .filter(Value::is_object)?,
        _ => return None,
    };
    Some((name.to_string(), args.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BFCL: &str = r#"[{"name": "math.hypot", "description": "Hypotenuse.", "parameters": {"type": "dict", "properties": {"x": {"type": "integer", "description": "x"}, "y": {"type": "float"}, "tags": {"type": "tuple", "items": {"type": "string"}}, "extra": {"type": "any"}}, "required": ["x", "y"]}}]"#;

    #[test]
    fn bfcl_types_become_json_schema_and_objects_are_closed() {
        let t = parse_tools(BFCL).unwrap();
        let s = t[0].arguments_schema();
        assert_eq!(s["type"], "object");
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["y"]["type"], "number");
        assert_eq!(s["properties"]["tags"]["type"], "array");
        assert!(s["properties"]["extra"].get("type").is_none());
        assert!(s["properties"]["x"].get("description").is_none());
        // What the model is shown keeps the descriptions.
        assert_eq!(t[0].parameters["properties"]["x"]["description"], "x");
        let shown = python_json(&t[0].template_value());
        assert!(
            shown.starts_with(r#"{"type": "function", "function": {"name": "math.hypot""#),
            "{shown}"
        );
    }

    #[test]
    fn malformed_tools_are_refused_naming_the_tool() {
        for (text, want) in [
            ("{}", "JSON array"),
            (r#"[{"description": "x"}]"#, "tool 0: no `name`"),
            (
                r#"[{"name": "a"}, {"name": "a"}]"#,
                "tool `a`: offered twice",
            ),
            (
                r#"[{"name": "a", "parameters": {"type": "dict", "properties": {"x": {"type": "quaternion"}}}}]"#,
                "unknown type `quaternion`",
            ),
            (
                r#"[{"name": "a", "parameters": {"type": "dict", "properties": {}, "required": ["x"]}}]"#,
                "required `\"x\"`",
            ),
            (
                r#"[{"name": "a", "parameters": {"type": "string"}}]"#,
                "must be an object schema",
            ),
        ] {
            let e = format!("{:#}", parse_tools(text).unwrap_err());
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn calls_are_read_back_and_broken_ones_counted() {
        let tools = parse_tools(BFCL).unwrap();
        let text = "Sure.\n<tool_call>\n{\"name\": \"math.hypot\", \"arguments\": {\"x\": 4, \"y\": 5}}\n</tool_call>\n<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{broken";
        let c = read_calls(text, &tools, false);
        assert_eq!(c.content, "Sure.");
        assert_eq!(c.calls.len(), 1);
        assert_eq!(c.calls[0].name, "math.hypot");
        assert_eq!(c.calls[0].arguments, r#"{"x":4,"y":5}"#);
        assert_eq!(c.invalid, 2);
        let list = "```json\n[{\"name\": \"math.hypot\", \"arguments\": {\"x\": 1, \"y\": 2}}, {\"name\": \"math.hypot\", \"arguments\": {\"x\": 3, \"y\": 4}}]\n```";
        let c = read_calls(list, &tools, false);
        assert_eq!((c.calls.len(), c.invalid, c.content.as_str()), (2, 0, ""));
    }

    const M: (&str, &str) = ("<[151657]>", "<[151658]>");

    #[test]
    fn the_grammar_follows_tool_choice() {
        let tools = parse_tools(BFCL).unwrap();
        // none: any text, but not the call marker (a special token).
        assert_eq!(
            grammar(&tools, &ToolChoice::None, true, M).unwrap(),
            Some(Grammar::Lark("start: TEXT\nTEXT: /(.|\\n)*/\n".into()))
        );
        assert_eq!(grammar(&[], &ToolChoice::Auto, true, M).unwrap(), None);
        let Some(Grammar::Lark(auto)) = grammar(&tools, &ToolChoice::Auto, false, M).unwrap()
        else {
            panic!()
        };
        assert!(
            auto.starts_with("start: calls | TEXT | TEXT marked_calls\ncalls: call\n"),
            "{auto}"
        );
        let Some(Grammar::Lark(req)) = grammar(&tools, &ToolChoice::Required, true, M).unwrap()
        else {
            panic!()
        };
        assert!(
            req.starts_with("start: calls\ncalls: call (SEP call)*"),
            "{req}"
        );
        let e = grammar(&tools, &"other".parse().unwrap(), true, M).unwrap_err();
        assert!(
            e.to_string().contains("`other` is not among the tools"),
            "{e}"
        );
    }
}
