//! Request validation: random generation requests (prompts, conversations,
//! stop strings, JSON schemas, Lark grammars and tools, valid and mutated,
//! tool_choice, task, numbers) against the server's check. Each is accepted or refused with
//! a message, and the check agrees with the rules it states: every request
//! breaking one is refused, and a plain valid one is accepted.

use crate::mutate::{apply, edge_u64, edits};
use crate::{fixtures, fuzz};
use proptest::prelude::*;
use selectinfer::engine::EngineSpec;
use selectinfer::engine::Message;
use selectinfer::engine::Sampling;
use selectinfer::method::Mode;
use selectinfer::serve::server::{Request, RuntimeSettings, Server, ServerConfig};
use selectinfer::sys::device::WeightDtype;

/// The fixture model's context (`max_position_embeddings`).
const CONTEXT: i64 = 256;

const SCHEMAS: &[&str] = &[
    r#"{"type": "object", "properties": {"action": {"enum": ["pick", "place"]}, "x": {"type": "number"}}, "required": ["action"]}"#,
    r#"{"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 3}"#,
    r#"{"type": "string", "pattern": "^[a-z]+$"}"#,
];
const TOOLS: &[&str] = &[
    r#"[{"name": "navigate_to", "description": "drive", "parameters": {"type": "object", "properties": {"station": {"type": "integer"}}, "required": ["station"]}}]"#,
    r#"[{"type": "function", "function": {"name": "grip", "parameters": {"type": "dict", "properties": {"open": {"type": "boolean"}}}}}]"#,
];
const GRAMMARS: &[&str] = &[
    "start: \"yes\" | \"no\"",
    "start: cmd (\",\" cmd)*\ncmd: /[a-z]+/",
];

/// A text: empty (weight `empty`), blank, one of `valid`, a mutation of
/// one, or random.
fn text(valid: &'static [&'static str], empty: u32) -> impl Strategy<Value = String> {
    let mutated = (prop::sample::select(valid), edits())
        .prop_map(|(s, e)| String::from_utf8_lossy(&apply(s.as_bytes(), &e)).into_owned());
    prop_oneof![
        empty => Just(String::new()),
        1 => Just(" \n".to_string()),
        3 => prop::sample::select(valid).prop_map(String::from),
        2 => mutated,
        1 => "\\PC{0,40}",
    ]
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        prop::sample::select(vec![0.0, 0.5, 1.0, -0.0, -1.0, 1.0 + 1e-9, 1e308]),
        Just(f64::NAN),
        Just(f64::INFINITY),
        any::<f64>(),
    ]
}

fn number() -> impl Strategy<Value = i64> {
    prop_oneof![
        prop::sample::select(vec![-1i64, 0, 1, 2, CONTEXT - 1, CONTEXT, i64::MIN]),
        edge_u64().prop_map(|v| v as i64),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    let role = prop::sample::select(vec!["user", "assistant", "system", "tool", "", "User"]);
    let message = (role, "\\PC{0,12}").prop_map(|(r, c)| Message::new(r, &c));
    let prompts: &'static [&'static str] = &["Pick up the red cup.", "hi"];
    let texts = (
        text(prompts, 1),
        prop_oneof![2 => Just(vec![]), 1 => prop::collection::vec(message, 1..4)],
        prop_oneof![2 => Just(vec![]), 1 => prop::collection::vec("\\PC{0,6}", 1..3)],
        text(SCHEMAS, 8),
        text(GRAMMARS, 8),
        prop::sample::select(vec!["", "", "qa", "translation", "nope", "QA"]),
        text(TOOLS, 6),
        prop::sample::select(vec![
            "",
            "",
            "auto",
            "none",
            "required",
            "grip",
            "navigate_to",
        ]),
    );
    let numbers = (
        prop::option::weighted(0.3, number()),
        prop::option::weighted(0.3, float()),
        prop::option::weighted(0.3, float()),
        prop::option::weighted(0.3, number()),
    );
    (texts, numbers).prop_map(
        |(
            (prompt, messages, stop, json_schema, grammar, task, tools, choice),
            (max, t, p, seed),
        )| Request {
            id: "fuzz".into(),
            prompt,
            messages,
            stop,
            json_schema,
            grammar,
            task: task.into(),
            max_new_tokens: max,
            temperature: t,
            top_p: p,
            seed,
            tools,
            tool_choice: choice.into(),
            parallel_tool_calls: true,
        },
    )
}

/// Why `r` must be refused, if a rule says so.
fn must_refuse(r: &Request) -> Option<&'static str> {
    let blank = |s: &str| s.trim().is_empty();
    if blank(&r.prompt) && r.messages.is_empty() {
        return Some("no prompt");
    }
    if !blank(&r.json_schema) && !blank(&r.grammar) {
        return Some("both a schema and a grammar");
    }
    if r.messages.iter().any(|m| m.role == "tool") {
        // The strategy's turns make no calls, so a tool result answers none.
        return Some("a tool result that follows no call");
    }
    let own_grammar = !blank(&r.json_schema) || !blank(&r.grammar);
    if !blank(&r.tools) && own_grammar {
        return Some("tools with a schema or grammar");
    }
    let offered: &[&str] = match r.tools.as_str() {
        t if t == TOOLS[0] => &["navigate_to"],
        t if t == TOOLS[1] => &["grip"],
        _ => &[],
    };
    if !["", "auto", "none", "required"].contains(&r.tool_choice.as_str())
        && !blank(&r.tools)
        && (TOOLS.contains(&r.tools.as_str()) && !offered.contains(&r.tool_choice.as_str()))
    {
        return Some("tool_choice naming a function not offered");
    }
    if blank(&r.tools) && !["", "auto"].contains(&r.tool_choice.as_str()) {
        return Some("tool_choice without tools");
    }
    if r.max_new_tokens.is_some_and(|n| !(1..CONTEXT).contains(&n)) {
        return Some("max_new_tokens outside [1, context)");
    }
    if r.seed.is_some_and(|s| s < 0) {
        return Some("negative seed");
    }
    if r.temperature.is_some_and(|t| !(t.is_finite() && t >= 0.0)) {
        return Some("temperature not a finite number >= 0");
    }
    if r.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
        return Some("top_p outside (0, 1]");
    }
    if r.stop.iter().any(String::is_empty) {
        return Some("an empty stop string");
    }
    if !["", "qa", "translation", "summarization"].contains(&r.task.as_str()) {
        return Some("an unknown task");
    }
    None
}

#[test]
fn request_validation() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixtures::model(tmp.path(), false);
    let server = Server::start(ServerConfig {
        engine: EngineSpec {
            model,
            mode: Mode::Dense,
            dtype: WeightDtype::F32,
            ..Default::default()
        },
        queue_depth: 2,
        defaults: RuntimeSettings {
            max_new_tokens: 8,
            sampling: Sampling::default(),
            compute_ratio: 1.0,
            token_ratio: 1.0,
            task: "qa".into(),
            system_prompt: String::new(),
            prefix_cache: false,
        },
    })
    .unwrap();
    // The valid schemas and grammars compile (the fuzz reaches the compiler).
    let base = Request {
        prompt: "Pick up the cup.".into(),
        ..Default::default()
    };
    server.check_request(&base).expect("a plain request");
    for s in SCHEMAS {
        let r = Request {
            json_schema: s.to_string(),
            ..base.clone()
        };
        server.check_request(&r).expect("a valid schema");
    }
    for g in GRAMMARS {
        let r = Request {
            grammar: g.to_string(),
            ..base.clone()
        };
        server.check_request(&r).expect("a valid grammar");
    }
    let broken = Request {
        json_schema: "{\"type\": ".into(),
        ..base
    };
    assert!(server.check_request(&broken).is_err(), "a broken schema");
    fuzz("request validation", request(), |r| {
        let verdict = server.check_request(&r);
        if let Err(e) = &verdict {
            check!(!format!("{e:#}").trim().is_empty(), "an empty refusal");
        }
        if let (Some(why), Ok(())) = (must_refuse(&r), &verdict) {
            return Err(format!("accepted a request with {why}"));
        }
        // A plain request that breaks no rule is accepted.
        let plain = r.messages.is_empty()
            && r.stop.is_empty()
            && r.json_schema.is_empty()
            && r.grammar.is_empty()
            && (r.tools.is_empty() || TOOLS.contains(&r.tools.as_str()));
        if plain && must_refuse(&r).is_none() {
            verdict
                .as_ref()
                .map_err(|e| format!("refused a valid request: {e:#}"))?;
        }
        Ok(verdict.is_ok())
    });
}
