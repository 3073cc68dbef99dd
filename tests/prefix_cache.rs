//! The prefix cache on the real SmolLM2: a request that shares the last
//! one's system prompt, or continues its conversation, prefills only the
//! new tokens, and answers as an engine without the cache does (greedy),
//! in a mode that computes every held neuron and in one that selects per
//! prompt (the selection must be the one a full prefill makes).

mod common;

use selectinfer::engine::{conversation, Message};
use selectinfer::engine::{Engine, EngineSpec, GenerateOptions};
use selectinfer::method::Mode;

fn engine(mode: Mode, cache: bool) -> Engine {
    let mut spec = EngineSpec {
        model: common::model_dir("smollm2-135m-instruct"),
        mode,
        ..Default::default()
    };
    if mode == Mode::Selectinfer {
        spec.params.load_ratio = 0.7;
        spec.params.compute_ratio = 0.5;
    }
    let mut e = spec.load().unwrap();
    e.prefix_cache = cache;
    e
}

const SYSTEM: &str = "You are the planner of a delivery robot in a hospital. \
    The robot carries medicine, linen and meals between the wards, the pharmacy \
    and the kitchen. It must never enter the operating theatre. It docks at \
    station 3 to charge. Answer in one short sentence.";

fn ask(e: &mut Engine, turns: &[Message]) -> (String, usize, usize) {
    let opts = GenerateOptions {
        max_new_tokens: 12,
        ..Default::default()
    };
    let g = e.generate_turns(turns, &[], &opts, |_| true).unwrap();
    (g.text, g.prompt_tokens, g.cached_prompt_tokens)
}

fn check(mode: Mode) {
    let (mut cached, mut fresh) = (engine(mode, true), engine(mode, false));
    let q1 = conversation(SYSTEM, &[], "Where does the robot charge?").unwrap();
    let q2 = conversation(SYSTEM, &[], "May the robot enter the operating theatre?").unwrap();
    let (a1, n1, c1) = ask(&mut cached, &q1);
    assert_eq!(c1, 0, "nothing cached before the first request");
    assert_eq!(ask(&mut fresh, &q1).0, a1);
    // Same system prompt, another question: the system turn is reused.
    let (a2, n2, c2) = ask(&mut cached, &q2);
    let starts = cached
        .codec
        .turn_starts(&q2, &[], &cached.codec.chat_ids(&q2).unwrap());
    let head = *starts.last().unwrap();
    match mode {
        // Up to a checkpoint: where the last turn starts.
        Mode::Selectinfer => assert_eq!(c2, head, "reused up to the last turn"),
        // The whole common prefix (the last turn's `<|im_start|>user` too).
        _ => assert!(c2 >= head, "{c2} reused, the last turn starts at {head}"),
    }
    assert!(
        c2 > 40 && c2 < n2,
        "{mode:?}: {c2} of {n2} prompt tokens cached"
    );
    let (f2, _, f2_cached) = ask(&mut fresh, &q2);
    assert_eq!(f2_cached, 0);
    assert_eq!(a2, f2, "{mode:?}: the cache changes no answer");
    // The conversation goes on: the whole previous prompt is reused.
    let history = [
        Message::new("user", "May the robot enter the operating theatre?"),
        Message::new("assistant", &a2),
    ];
    let q3 = conversation(SYSTEM, &history, "Where does it charge, then?").unwrap();
    let (a3, n3, c3) = ask(&mut cached, &q3);
    assert_eq!(c3, n2, "{mode:?}: the previous prompt is reused whole");
    assert!(n3 > n2);
    assert_eq!(a3, ask(&mut fresh, &q3).0, "{mode:?}");
    // A new question after the conversation shares the system turn again.
    let q4 = conversation(SYSTEM, &[], "Which lift does it use?").unwrap();
    let (a4, _, c4) = ask(&mut cached, &q4);
    assert!(c4 >= head, "{mode:?}: {c4} reused after a conversation");
    assert_eq!(a4, ask(&mut fresh, &q4).0, "{mode:?}");
    assert!(n1 > 0);
}

#[test]
fn the_prefix_cache_reuses_the_shared_prompt_and_changes_no_answer() {
    check(Mode::LoadOnly);
    check(Mode::Selectinfer);
}
