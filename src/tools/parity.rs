//! The CPU-vs-device parity check run on a GPU machine
//! (`selectinfer device-check`): the same prompt and teacher-forced steps on
//! the CPU and on the device, per mode, and how far their logits and
//! selections differ.

use crate::engine::Engine;
use crate::engine::EngineSpec;
use anyhow::Result;
use serde::Serialize;

/// One mode's CPU-vs-device comparison.
#[derive(Debug, Clone, Serialize)]
pub struct ModeParity {
    pub mode: String,
    /// Largest |logit(cpu) − logit(device)| over the prompt and every forced step.
    pub max_abs_diff: f32,
    /// Steps (prompt + forced tokens) whose argmax agrees.
    pub argmax_agree: usize,
    pub steps: usize,
    /// Mean Jaccard overlap of the rows chosen per sparse layer (selective
    /// modes); 1.0 = the device chose exactly what the CPU chose.
    pub selection_jaccard: Option<f64>,
    /// Selective modes: the largest logit difference when the device decodes
    /// with the CPU's chosen rows (compute parity without selection ties).
    pub max_abs_diff_same_rows: Option<f32>,
}

/// Loads `spec` on the CPU and on `device`, runs one prompt plus `steps`
/// teacher-forced tokens (the CPU's greedy continuation) on both, and
/// compares the logits.
pub fn parity(spec: &EngineSpec, device: &str, prompt: &str, steps: usize) -> Result<ModeParity> {
    // Fail on a missing device before the CPU half does any work.
    crate::sys::device::parse_device(device)?;
    let cpu_spec = EngineSpec {
        device: "cpu".into(),
        ..spec.clone()
    };
    let dev_spec = EngineSpec {
        device: device.into(),
        ..spec.clone()
    };
    let mut cpu = cpu_spec.load()?;
    let ids = cpu.codec.chat_prompt_ids(prompt)?;
    let greedy = cpu.generate_ids(
        &ids,
        &crate::engine::GenerateOptions {
            max_new_tokens: steps + 1,
            ignore_eos: true,
            ..Default::default()
        },
        |_| true,
    )?;
    let forced = &greedy.token_ids[..steps.min(greedy.token_ids.len())];
    let (cpu_logits, cpu_rows) = cpu.forced_logits(&ids, forced, None)?;
    drop(cpu);
    let mut dev: Engine = dev_spec.load()?;
    let (dev_logits, dev_rows) = dev.forced_logits(&ids, forced, None)?;
    let max_abs_diff_same_rows = match &cpu_rows {
        Some(rows) => Some(max_abs_diff(
            &cpu_logits,
            &dev.forced_logits(&ids, forced, Some(rows))?.0,
        )),
        None => None,
    };
    let mut argmax_agree = 0;
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i)
    };
    for (a, b) in cpu_logits.iter().zip(&dev_logits) {
        argmax_agree += usize::from(argmax(a) == argmax(b));
    }
    let selection_jaccard = match (cpu_rows, dev_rows) {
        (Some(c), Some(d)) => {
            let overlaps: Vec<f64> = c
                .iter()
                .zip(&d)
                .filter_map(|(a, b)| {
                    Some(crate::method::ranking::jaccard(a.as_ref()?, b.as_ref()?))
                })
                .collect();
            (!overlaps.is_empty()).then(|| overlaps.iter().sum::<f64>() / overlaps.len() as f64)
        }
        _ => None,
    };
    Ok(ModeParity {
        mode: spec.mode.name().to_string(),
        max_abs_diff: max_abs_diff(&cpu_logits, &dev_logits),
        max_abs_diff_same_rows,
        argmax_agree,
        steps: cpu_logits.len(),
        selection_jaccard,
    })
}

fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0f32, f32::max)
}
