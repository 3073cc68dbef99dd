//! Planner-facing generation on the real SmolLM2 (q4): output constrained
//! to a JSON schema or a Lark grammar (llguidance), stop strings,
//! conversations with a system turn, and the tool-call gate taking a call
//! back. The small model's answers are often wrong; what is checked is
//! that they always parse and validate.

use super::common;

use crate::engine::grammar::Grammar;
use crate::engine::text::{conversation, Message};
use crate::engine::tool_offer::Offer;
use crate::engine::{CallGate, CallThresholds, EngineSpec, GenerateOptions, StopReason};
use crate::sys::device::WeightDtype;

fn engine() -> crate::engine::Engine {
    EngineSpec {
        model: common::model_dir("smollm2-135m-instruct"),
        dtype: WeightDtype::Q4,
        ..Default::default()
    }
    .load()
    .unwrap()
}

const SCHEMA: &str = r#"{"type": "object",
  "properties": {"action": {"type": "string", "enum": ["dock", "navigate", "pick", "wait"]},
                 "station": {"type": "integer", "minimum": 0, "maximum": 9}},
  "required": ["action", "station"], "additionalProperties": false}"#;

/// The plan schema's rules, checked by hand.
fn valid_plan(text: &str) -> Result<(), String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("{e}: {text}"))?;
    let o = v.as_object().ok_or("not an object")?;
    let mut keys: Vec<&str> = o.keys().map(|k| k.as_str()).collect();
    keys.sort_unstable();
    let action = o["action"].as_str().ok_or("action is not a string")?;
    let station = o["station"].as_i64().ok_or("station is not an integer")?;
    (keys == ["action", "station"]
        && ["dock", "navigate", "pick", "wait"].contains(&action)
        && (0..=9).contains(&station))
    .then_some(())
    .ok_or(format!("breaks the schema: {text}"))
}

#[test]
fn json_schema_answers_always_parse_and_validate() {
    let mut e = engine();
    let g = Some(Grammar::JsonSchema(SCHEMA.into()));
    let asks = [
        "The battery is at 5 %. Plan the next step as JSON.",
        "A parcel waits at station 7: pick it up. JSON plan please.",
        "Nothing to do right now. Reply with a JSON plan.",
        "Drive to station 2. Output JSON only.",
        "What is the capital of France?",
    ];
    for ask in asks {
        let turns = conversation("You plan a robot's next step.", &[], ask).unwrap();
        let opts = GenerateOptions {
            max_new_tokens: 48,
            grammar: g.clone(),
            ..Default::default()
        };
        let mut streamed = String::new();
        let out = e
            .generate_turns(&turns, &[], &opts, |p| {
                streamed.push_str(p);
                true
            })
            .unwrap();
        assert_eq!(out.stop_reason, StopReason::Eos, "{ask}: {}", out.text);
        valid_plan(&out.text).unwrap_or_else(|why| panic!("{ask}: {why}"));
        assert_eq!(streamed, out.text);
        assert!(out.grammar_s > 0.0);
    }
    let free = e
        .generate_chat("Say yes or no.", &GenerateOptions::default(), |_| true)
        .unwrap();
    assert_eq!(free.grammar_s, 0.0, "no grammar, no cost");
}

#[test]
fn a_lark_grammar_holds_the_answer_to_its_language() {
    let mut e = engine();
    let opts = GenerateOptions {
        max_new_tokens: 8,
        grammar: Some(Grammar::Lark(r#"start: "yes" | "no""#.into())),
        ..Default::default()
    };
    for ask in ["Is the door open?", "Write a poem about the sea."] {
        let out = e.generate_chat(ask, &opts, |_| true).unwrap();
        assert!(
            ["yes", "no"].contains(&out.text.as_str()),
            "{ask}: {:?}",
            out.text
        );
    }
}

#[test]
fn invalid_grammars_are_refused_before_any_token() {
    let e = engine();
    let grammars = e.codec.grammars().unwrap();
    for (g, why) in [
        (Grammar::JsonSchema("{not json".into()), "not JSON"),
        (
            Grammar::JsonSchema(r#"{"type": "robot"}"#.into()),
            "json_schema",
        ),
        (Grammar::Lark("start: undefined_rule".into()), "grammar"),
    ] {
        let err = match grammars.compile(&g) {
            Ok(_) => panic!("{g:?} was accepted"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(why), "{g:?}: {err}");
    }
    assert!(
        Grammar::of_fields("{}", "start: \"a\"").is_err(),
        "both fields"
    );
    assert_eq!(Grammar::of_fields(" ", "").unwrap(), None);
}

#[test]
fn stop_strings_end_the_answer_and_are_not_part_of_it() {
    let mut e = engine();
    let ask = "List three fruits, one per line.";
    let full = e
        .generate_chat(
            ask,
            &GenerateOptions {
                max_new_tokens: 40,
                ..Default::default()
            },
            |_| true,
        )
        .unwrap();
    let first_line = full.text.split('\n').next().unwrap().to_string();
    assert!(full.text.len() > first_line.len(), "{:?}", full.text);
    let opts = GenerateOptions {
        max_new_tokens: 40,
        stop: vec!["\n".into()],
        ..Default::default()
    };
    let mut streamed = String::new();
    let cut = e
        .generate_chat(ask, &opts, |p| {
            streamed.push_str(p);
            true
        })
        .unwrap();
    assert_eq!(cut.stop_reason, StopReason::Stop);
    assert_eq!(cut.text, first_line);
    assert_eq!(streamed, first_line, "no part of the stop string streamed");
}

#[test]
fn a_conversation_renders_every_turn_with_the_template() {
    let e = engine();
    let history = [
        Message::new("user", "My name is Ada."),
        Message::new("assistant", "Hello Ada."),
    ];
    let turns = conversation("You are a robot.", &history, "What is my name?").unwrap();
    let text = e.codec.render_chat(&turns).unwrap();
    for part in [
        "You are a robot.",
        "My name is Ada.",
        "Hello Ada.",
        "What is my name?",
    ] {
        assert!(text.contains(part), "{part} missing from {text}");
    }
    assert!(text.find("Hello Ada.") < text.find("What is my name?"));
}

/// The call gate's name check on a call that follows a line of text: at 0
/// the call stands; above 1 (the offered names can never hold that share)
/// it is taken back before any of it is streamed, and the answer goes on
/// in text from where the call opened, with no call.
#[test]
fn a_call_taken_back_at_its_name_leaves_text_and_streams_none_of_it() {
    let mut e = engine();
    let tools = r#"[{"name": "navigate_to", "description": "Drive the robot to a numbered station.",
        "parameters": {"type": "object", "properties": {"station": {"type": "integer"}},
                       "required": ["station"]}}]"#;
    let offer = Offer::from_fields(tools, "auto", false).unwrap();
    // SmolLM2 answers this with a line of text, then the call.
    let turns = conversation("", &[], "Use your tool to drive to station 4.").unwrap();
    let mut run = |name: f32| {
        let thresholds = CallThresholds {
            call: 0.0,
            name,
            more: 2.0,
            more_later: 2.0,
        };
        let opts = GenerateOptions {
            max_new_tokens: 48,
            grammar: offer.grammar_with(None, &e.codec).unwrap(),
            call_gate: CallGate::for_offer(&e.codec, &offer, thresholds),
            ..Default::default()
        };
        let mut streamed = String::new();
        let g = e
            .generate_turns(&turns, &offer.tools, &opts, |p| {
                streamed.push_str(p);
                true
            })
            .unwrap();
        assert_eq!(streamed, g.text, "every piece streamed is the answer's");
        offer.answer(g.text, g.stop_reason.name())
    };
    let called = run(0.0);
    assert_eq!(called.calls.len(), 1, "{}", called.text);
    assert_eq!(called.calls[0].name, "navigate_to");
    let taken_back = run(1.5);
    assert!(taken_back.calls.is_empty(), "{:?}", taken_back.calls);
    // The text before the call stands; the answer goes on from there.
    let before = called.text.trim_end();
    assert!(!before.is_empty(), "{}", called.text);
    assert!(taken_back.text.starts_with(before), "{}", taken_back.text);
    assert!(taken_back.text.len() > before.len(), "{}", taken_back.text);
    assert!(
        !taken_back.text.contains("navigate_to"),
        "{}",
        taken_back.text
    );
}
