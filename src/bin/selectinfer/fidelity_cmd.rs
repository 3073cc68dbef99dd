//! `selectinfer fidelity`: loads the dense reference and the candidates,
//! runs the teacher-forced instrument and prints its figures.

use crate::args::ModelArgs;
use anyhow::Result;
use selectinfer::engine::EngineSpec;
use selectinfer::method::Mode;
use selectinfer::sys::device::WeightDtype;
use selectinfer::tools::{fidelity, gguf};

pub fn run(
    model: &ModelArgs,
    dtypes: &[WeightDtype],
    candidate: &[String],
    with_gguf: bool,
    reference_dtype: WeightDtype,
    opts: &fidelity::FidelityOptions,
    json: bool,
) -> Result<()> {
    let spec = model.spec();
    let mut reference = EngineSpec {
        dtype: reference_dtype,
        mode: Mode::Dense,
        vocab: Default::default(),
        head_screen: 0,
        head_in_file: false,
        ..spec.clone()
    }
    .load()?;
    let mut lineup = fidelity::Lineup::load(&spec, candidate, dtypes)?;
    let mut q = match with_gguf {
        true => Some(gguf::GgufEngine::load(&model.folder)?.into_parts()),
        false => None,
    };
    let mut names = lineup.names.clone();
    let mut candidates = lineup.candidates();
    if let Some((q, _, bytes)) = q.as_mut() {
        candidates.push(fidelity::Candidate::Gguf(q, *bytes));
        names.push("candle-gguf".into());
    }
    let report = fidelity::run_with_progress(&mut reference, &mut candidates, opts, &mut |p| {
        eprintln!("{p}")
    })?;
    let named: Vec<_> = names.iter().zip(&report).collect();
    match json {
        true => println!("{}", serde_json::to_string_pretty(&named)?),
        false => named.iter().for_each(|(n, tasks)| {
            tasks.iter().for_each(|t| println!("{n}: {t}"));
        }),
    }
    Ok(())
}
