//! Task hot-swap on the real SmolLM2 weights: switching a loaded engine to
//! another task's base set reads only the neurons the new plan adds (the
//! quantized bundles exactly), and it then answers as an engine started
//! with that task does (greedy, same prompts); bad swaps are refused and
//! leave the engine serving its old plan.

use super::common;

use crate::engine::spec::EngineSpec;
use crate::engine::{Engine, GenerateOptions};
use crate::method::Mode;
use crate::model::footprint::Footprint;
use crate::sys::device::WeightDtype;

const PROMPTS: [&str; 2] = [
    "Translate into English: Der Roboter fährt in die Küche.",
    "What is the capital of France?",
];

fn spec(dtype: WeightDtype, mode: Mode, task: &str) -> EngineSpec {
    let mut s = EngineSpec {
        model: common::model_dir("smollm2-135m-instruct"),
        dtype,
        mode,
        ranking: Some(
            common::repo_root().join("rankings/smollm2-135m-instruct.ranking.safetensors"),
        ),
        ..Default::default()
    };
    s.params.task = task.into();
    s.params.dense_layers = vec![0, 29];
    s
}

fn answers(engine: &mut Engine) -> Vec<Vec<u32>> {
    let opts = GenerateOptions {
        max_new_tokens: 12,
        ..Default::default()
    };
    PROMPTS
        .iter()
        .map(|p| engine.generate_chat(p, &opts, |_| true).unwrap().token_ids)
        .collect()
}

/// Neurons (over all layers) one plan holds that another does not.
fn added(from: &EngineSpec, to: &EngineSpec) -> Vec<usize> {
    let (a, b) = (
        from.method().unwrap().unwrap(),
        to.method().unwrap().unwrap(),
    );
    let (a, b) = (a.plan.unwrap(), b.plan.unwrap());
    a.layers
        .iter()
        .zip(&b.layers)
        .map(|(a, b)| b.loaded.iter().filter(|n| !a.loaded.contains(n)).count())
        .collect()
}

#[test]
fn a_quantized_swap_reads_exactly_the_added_bundles_and_answers_as_a_fresh_start() {
    let (qa, tr) = (
        spec(WeightDtype::Q8, Mode::Selectinfer, "qa"),
        spec(WeightDtype::Q8, Mode::Selectinfer, "translation"),
    );
    let mut engine = qa.load().unwrap();
    let before = answers(&mut engine); // arranged by prompts: the swap starts from that
    let report = qa.swap_task(&mut engine, "translation").unwrap();
    let per_layer = added(&qa, &tr);
    let fp = Footprint::of(&qa.model, &qa.load_options().unwrap()).unwrap();
    let want: u64 = per_layer
        .iter()
        .zip(&fp.neuron_bytes)
        .map(|(&n, &b)| n as u64 * b)
        .sum();
    assert_eq!(report.neurons_read, per_layer.iter().sum::<usize>());
    assert!(report.neurons_read > 0, "the tasks' plans differ");
    assert_eq!(
        report.bytes_read, want,
        "bytes read = the plan difference's bundles"
    );
    let fresh = answers(&mut tr.load().unwrap());
    assert_eq!(
        answers(&mut engine),
        fresh,
        "after the swap = started with translation"
    );
    // And back: the first task's answers again.
    qa.swap_task(&mut engine, "qa").unwrap();
    assert_eq!(answers(&mut engine), before);
}

#[test]
fn an_f16_swap_answers_as_a_fresh_start() {
    let (qa, summ) = (
        spec(WeightDtype::F16, Mode::LoadOnly, "qa"),
        spec(WeightDtype::F16, Mode::LoadOnly, "summarization"),
    );
    let mut engine = qa.load().unwrap();
    answers(&mut engine);
    let report = qa.swap_task(&mut engine, "summarization").unwrap();
    assert_eq!(report.neurons_read, added(&qa, &summ).iter().sum::<usize>());
    assert_eq!(answers(&mut engine), answers(&mut summ.load().unwrap()));
}

#[test]
fn bad_swaps_are_refused_and_the_old_plan_keeps_serving() {
    let qa = spec(WeightDtype::Q8, Mode::LoadOnly, "qa");
    let mut engine = qa.load().unwrap();
    let before = answers(&mut engine);
    let err = format!("{:#}", qa.swap_task(&mut engine, "navigation").unwrap_err());
    assert!(err.contains("navigation") && err.contains("qa"), "{err}");
    assert_eq!(answers(&mut engine), before);
    let dense = spec(WeightDtype::Q8, Mode::Dense, "qa");
    let mut d = dense.load().unwrap();
    let err = format!("{:#}", dense.swap_task(&mut d, "translation").unwrap_err());
    assert!(err.contains("no task to switch"), "{err}");
}
