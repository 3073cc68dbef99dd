//! TTFT with and without the prefix cache on a planner's workload: the same
//! ~1,000-token system prompt before each of 10 questions, alternating
//! rounds without and with the cache in one process (greedy, 8 new tokens).
//!
//! cargo run --release -p selectinfer-lab --example prefix_ttft -- [model dir] [dtype] [mode]

use selectinfer::engine::conversation;
use selectinfer::engine::{EngineSpec, GenerateOptions};
use std::path::PathBuf;

const QUESTIONS: [&str; 10] = [
    "Where does the robot charge?",
    "May it enter the operating theatre?",
    "Which ward gets the meals first?",
    "What does it carry to the pharmacy?",
    "What should it do when a corridor is blocked?",
    "Who may open its drawers?",
    "How fast may it drive near patients?",
    "What happens when the battery is low?",
    "Where does it wait at night?",
    "Which lift does it use?",
];

fn system_prompt() -> String {
    let rules = [
        "The robot carries medicine, linen and meals between the wards, the pharmacy and the kitchen.",
        "It never enters the operating theatre or the intensive care unit.",
        "It docks at station 3 to charge when its battery drops below 20 percent.",
        "Meals go to ward A first, then wards B and C, between 11:30 and 12:30.",
        "Only nurses with a badge may open its drawers; the pharmacy drawer needs a code.",
        "Near patients it drives at walking pace and announces itself at doors.",
        "When a corridor is blocked it waits two minutes, then takes the next route.",
        "At night it waits at station 1 beside the service lift.",
        "It uses lift 2; lift 1 is for patients and visitors.",
        "It reports every delivery to the ward's terminal.",
    ];
    let mut s = String::from("You are the planner of a delivery robot in a hospital.\n");
    let mut i = 0;
    while s.len() < 3500 {
        s.push_str(&format!("Rule {}: {}\n", i + 1, rules[i % rules.len()]));
        i += 1;
    }
    s.push_str("Answer in one short sentence.");
    s
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let model = PathBuf::from(args.get(1).map_or("models/smollm2-135m-instruct", |s| s));
    let dtype = args.get(2).map_or("f32", |s| s).parse()?;
    let mode = args.get(3).map_or("load-only", |s| s).parse()?;
    let mut engine = EngineSpec {
        model,
        dtype,
        mode,
        ..Default::default()
    }
    .load()?;
    let system = system_prompt();
    let opts = GenerateOptions {
        max_new_tokens: 8,
        ..Default::default()
    };
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut prompt_tokens = 0;
    let mut cached_tokens = Vec::new();
    for round in 0..2 {
        for cache in [false, true] {
            engine.prefix_cache = cache;
            for q in QUESTIONS {
                let turns = conversation(&system, &[], q)?;
                let g = engine.generate_turns(&turns, &[], &opts, |_| true)?;
                prompt_tokens = g.prompt_tokens;
                match cache {
                    false => without.push(g.ttft_s),
                    true => {
                        with.push(g.ttft_s);
                        cached_tokens.push(g.cached_prompt_tokens);
                    }
                }
            }
            println!(
                "round {round}, cache {cache}: median TTFT {:.3} s",
                median(if cache { with.clone() } else { without.clone() })
            );
        }
    }
    let (a, b) = (median(without), median(with));
    println!(
        "{} prompt tokens, {} cached (median); median TTFT without {a:.3} s, with {b:.3} s: {:.1}x",
        prompt_tokens,
        median(cached_tokens.iter().map(|&c| c as f64).collect()),
        a / b
    );
    Ok(())
}
