//! A memory budget turned into γ: what the weights outside the FFN, the KV
//! cache at the longest context served, the prefill temporaries and the
//! runtime (the process's own resident memory before any weight, plus a
//! margin) cost is taken off the budget; the rest goes to the FFN, the same
//! number of neurons in every sparse layer (dense layers whole), with room
//! for one layer's copy while a prompt's chosen rows are arranged or a task
//! swap merges a layer. A budget the mode cannot meet is refused with its
//! floor in MiB.

use super::params::{SelectionParams, LOAD_BLOCK};
use super::Mode;
use crate::model::footprint::Footprint;
use anyhow::{bail, Result};

/// The least γ a budget may choose for a mode that computes every loaded
/// neuron (below it answers are not worth having); a selecting mode's floor
/// is its φ.
pub(crate) const MIN_LOAD_RATIO: f64 = 0.1;
/// Added to the measured runtime: allocator slack, thread stacks, the
/// tokenizer's per-request buffers.
pub(crate) const RUNTIME_MARGIN: u64 = 16 << 20;

const MIB: f64 = (1u64 << 20) as f64;

/// The plan a budget gives: neurons held per layer and the peak it expects.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MemoryPlan {
    pub budget: u64,
    /// Resident before the weights (binary, libraries, tokenizer) + margin.
    pub runtime: u64,
    pub other_weights: u64,
    pub ffn_weights: u64,
    pub kv_cache: u64,
    pub activations: u64,
    /// One layer's FFN held twice: the per-prompt arrangement of a
    /// selecting mode, a task swap's merge.
    pub transient: u64,
    /// Neurons held per layer.
    pub held: Vec<usize>,
    /// γ of the sparse layers (1 when every layer is whole).
    pub load_ratio: f64,
    /// The least budget this mode and these parameters accept.
    pub floor: u64,
}

/// What a plan costs before the FFN's sparse layers: the fixed part and
/// the bytes per neuron held in each sparse layer.
struct Costs {
    runtime: u64,
    /// Runtime, weights outside the FFN, KV cache, temporaries, whole
    /// layers, a selecting mode's whole-layer copy.
    fixed: u64,
    /// A streamed FFN's one layer, held as a temporary.
    streamed: u64,
    whole_copy: u64,
    /// Per neuron held in every sparse layer (and its copy's, if any).
    per_neuron: u64,
    /// Per neuron of the largest sparse layer: the copy made of it.
    copy_per_neuron: u64,
    sparse: Vec<bool>,
    /// ρ: the share of each sparse layer's neurons in the coarse tier.
    coarse_ratio: f64,
}

/// A prefill chunk's temporaries, a coarse tier's included.
fn activations(fp: &Footprint, coarse_ratio: f64) -> u64 {
    match coarse_ratio > 0.0 {
        true => fp.activations + fp.coarse_activations,
        false => fp.activations,
    }
}

impl Costs {
    fn of(fp: &Footprint, resident: u64, mode: Mode, params: &SelectionParams) -> Self {
        let layers = fp.neuron_bytes.len();
        let runtime = resident + RUNTIME_MARGIN;
        let sparse: Vec<bool> = (0..layers)
            .map(|l| mode.loads_subset() && !params.dense_layers.contains(&l))
            .collect();
        // A streamed FFN holds one layer's neurons at a time, as a temporary.
        let streamed = match mode.streams_ffn() {
            true => fp.neuron_bytes.iter().max().copied().unwrap_or(0) * fp.width as u64,
            false => 0,
        };
        let fixed_ffn: u64 = (0..layers)
            .filter(|&l| !sparse[l] && !mode.streams_ffn())
            .map(|l| fp.neuron_bytes[l] * fp.width as u64)
            .sum();
        // A layer copied whole while it is rearranged (selecting modes) or
        // merged with a new task's neurons (ranked plans): per held neuron
        // of the largest sparse layer, or a fixed cost for whole layers.
        // A model with a coarse tier swaps no neurons (`Model::swap_ffn`).
        let copies = mode.selects() || (mode.needs_ranking() && params.coarse_ratio == 0.0);
        let largest = (0..layers)
            .filter(|&l| sparse[l])
            .map(|l| fp.neuron_bytes[l])
            .max()
            .unwrap_or(0);
        let whole_copy = match mode.selects() && !mode.loads_subset() {
            true => (0..layers)
                .filter(|l| !params.dense_layers.contains(l))
                .map(|l| fp.neuron_bytes[l] * fp.width as u64)
                .max()
                .unwrap_or(0),
            false => 0,
        };
        let copy_per_neuron = if copies { largest } else { 0 };
        Self {
            runtime,
            fixed: runtime
                + fp.other_weights
                + fp.kv_cache
                + activations(fp, params.coarse_ratio)
                + streamed
                + fixed_ffn
                + whole_copy,
            streamed,
            whole_copy,
            // A neuron's mean cost with ρ of them in the coarse tier.
            per_neuron: (0..layers)
                .filter(|&l| sparse[l])
                .map(|l| {
                    let (main, coarse) = (fp.neuron_bytes[l], fp.coarse_neuron_bytes[l]);
                    main - (params.coarse_ratio * main.saturating_sub(coarse) as f64) as u64
                })
                .sum::<u64>()
                + copy_per_neuron,
            copy_per_neuron,
            sparse,
            coarse_ratio: params.coarse_ratio,
        }
    }

    /// The plan holding `n` neurons in each sparse layer.
    fn plan(&self, fp: &Footprint, mode: Mode, n: usize, budget: u64, floor: u64) -> MemoryPlan {
        let held: Vec<usize> = (self.sparse.iter())
            .map(|&sparse| match (sparse, mode.streams_ffn()) {
                (_, true) => 0,
                (true, false) => n,
                (false, false) => fp.width,
            })
            .collect();
        let coarse: Vec<usize> = (self.sparse.iter().zip(&held))
            .map(|(&sparse, &n)| match sparse {
                true => super::params::coarse_count(self.coarse_ratio, n),
                false => 0,
            })
            .collect();
        MemoryPlan {
            budget,
            runtime: self.runtime,
            other_weights: fp.other_weights,
            ffn_weights: fp.weights(&held, &coarse) - fp.other_weights,
            kv_cache: fp.kv_cache,
            activations: activations(fp, self.coarse_ratio) + self.streamed,
            transient: self.whole_copy + self.copy_per_neuron * n as u64,
            load_ratio: match self.per_neuron {
                0 => 1.0,
                _ => n as f64 / fp.width as f64,
            },
            held,
            floor,
        }
    }
}

impl MemoryPlan {
    /// Plans `budget` bytes for `mode` with `params` (γ is what is chosen;
    /// φ and δ are the caller's) on a model of footprint `fp`, the process
    /// holding `resident` bytes before any weight is loaded.
    pub(crate) fn new(
        budget: u64,
        fp: &Footprint,
        resident: u64,
        mode: Mode,
        params: &SelectionParams,
    ) -> Result<Self> {
        let c = Costs::of(fp, resident, mode, params);
        let min_ratio = match mode.selects() {
            true => params.compute_ratio.max(MIN_LOAD_RATIO),
            false => MIN_LOAD_RATIO,
        };
        let min_neurons = (super::params::count(min_ratio, fp.width))
            .next_multiple_of(LOAD_BLOCK)
            .min(fp.width);
        let floor = match c.per_neuron {
            0 => c.fixed,
            p => c.fixed + p * min_neurons as u64,
        };
        if budget < floor {
            let what = match c.per_neuron {
                0 => format!("mode {} holds every FFN neuron", mode.name()),
                _ => format!("mode {} at its least load_ratio {min_ratio}", mode.name()),
            };
            let temporaries = activations(fp, params.coarse_ratio);
            let fixed_ffn_and_copies =
                c.fixed - c.runtime - fp.other_weights - fp.kv_cache - temporaries;
            bail!(
                "memory budget {:.0} MiB is below the floor of {:.0} MiB ({what}: weights outside the FFN {:.0} MiB, FFN and its one-layer copy {:.0} MiB, KV cache for {} positions {:.0} MiB, prefill temporaries {:.0} MiB, runtime {:.0} MiB){}",
                budget as f64 / MIB,
                floor as f64 / MIB,
                fp.other_weights as f64 / MIB,
                (floor - c.fixed + fixed_ffn_and_copies) as f64 / MIB,
                fp.context,
                fp.kv_cache as f64 / MIB,
                temporaries as f64 / MIB,
                c.runtime as f64 / MIB,
                match c.per_neuron {
                    0 => ": a selective mode (load-only, selectinfer) holds fewer",
                    _ => "; a shorter max_context or prefill_chunk lowers the floor",
                }
            );
        }
        // Whole blocks of neurons (`LOAD_BLOCK`), rounded down to fit.
        let n = match c.per_neuron {
            0 => 0,
            p => match ((budget - c.fixed) / p) as usize {
                n if n >= fp.width => fp.width,
                n => n / LOAD_BLOCK * LOAD_BLOCK,
            },
        };
        Ok(c.plan(fp, mode, n, budget, floor))
    }

    /// What the settings as given will hold (γ as given, in whole blocks
    /// as the load plan takes it), with no budget: the peak it expects is
    /// the plan's prediction for this configuration (its `budget` is that
    /// peak).
    pub(crate) fn predict(
        fp: &Footprint,
        resident: u64,
        mode: Mode,
        params: &SelectionParams,
    ) -> Self {
        let c = Costs::of(fp, resident, mode, params);
        let n = super::params::load_count(
            params.load_ratio,
            fp.width,
            super::params::count(params.static_ratio, fp.width),
        );
        let mut plan = c.plan(fp, mode, n, 0, 0);
        plan.budget = plan.expected_peak();
        plan
    }

    /// The peak resident memory the plan expects.
    pub(crate) fn expected_peak(&self) -> u64 {
        self.runtime
            + self.other_weights
            + self.ffn_weights
            + self.kv_cache
            + self.activations
            + self.transient
    }

    /// `params` with the planned γ; for a mode that computes every loaded
    /// neuron (load-only) φ and δ follow γ down where they exceed it.
    pub(crate) fn apply(&self, mode: Mode, params: &SelectionParams) -> SelectionParams {
        let mut p = params.clone();
        if !mode.loads_subset() {
            return p;
        }
        p.load_ratio = self.load_ratio;
        if !mode.selects() {
            p.compute_ratio = p.compute_ratio.min(p.load_ratio);
            p.static_ratio = p.static_ratio.min(p.compute_ratio);
        }
        p
    }
}

impl std::fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = |b: u64| b as f64 / MIB;
        write!(
            f,
            "memory plan: budget {:.0} MiB, expected peak {:.0} MiB (floor {:.0}); load_ratio {:.3} ({} of {} neurons per sparse layer); weights {:.0} MiB outside the FFN + {:.0} MiB FFN, KV cache {:.0} MiB, prefill temporaries {:.0} MiB, one layer's copy {:.0} MiB, runtime {:.0} MiB",
            m(self.budget),
            m(self.expected_peak()),
            m(self.floor),
            self.load_ratio,
            self.held.iter().min().copied().unwrap_or(0),
            self.held.iter().max().copied().unwrap_or(0),
            m(self.other_weights),
            m(self.ffn_weights),
            m(self.kv_cache),
            m(self.activations),
            m(self.transient),
            m(self.runtime),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn footprint() -> Footprint {
        Footprint {
            other_weights: 100 << 20,
            neuron_bytes: vec![1000; 4],
            coarse_neuron_bytes: vec![800; 4],
            width: 1000,
            kv_cache: 10 << 20,
            activations: 5 << 20,
            context: 512,
            coarse_activations: 1 << 20,
        }
    }

    fn params() -> SelectionParams {
        SelectionParams {
            load_ratio: 0.7,
            static_ratio: 0.2,
            compute_ratio: 0.4,
            token_ratio: 0.2,
            dense_layers: vec![0],
            task: "qa".into(),
            score: crate::method::params::Score::Counts,
            gate_keep: 1.0,
            layer_drop: Vec::new(),
            coarse_ratio: 0.0,
            coarse_bits: 4,
        }
    }

    #[test]
    fn the_rest_of_the_budget_goes_to_the_sparse_layers() {
        let fp = footprint();
        let resident = 20 << 20;
        let fixed = resident + RUNTIME_MARGIN + (115 << 20) + 1000 * 1000;
        // Three sparse layers and one layer's copy per held neuron.
        let budget = fixed + 4 * 1000 * 600 + 999;
        let plan = MemoryPlan::new(budget, &fp, resident, Mode::Selectinfer, &params()).unwrap();
        // 600 fit, whole blocks of 32 held.
        assert_eq!(plan.held, vec![1000, 576, 576, 576]);
        assert_eq!(plan.load_ratio, 0.576);
        assert!(plan.expected_peak() <= budget);
        assert_eq!(plan.apply(Mode::Selectinfer, &params()).load_ratio, 0.576);
    }

    #[test]
    fn a_budget_below_the_floor_names_it() {
        let fp = footprint();
        let p = params(); // φ 0.4: 400 neurons, 416 in whole blocks
        let err = MemoryPlan::new(150 << 20, &fp, 20 << 20, Mode::Selectinfer, &p).unwrap_err();
        let floor = (20u64 << 20) + RUNTIME_MARGIN + (115 << 20) + 1_000_000 + 4 * 1000 * 416;
        let want = format!("floor of {:.0} MiB", floor as f64 / MIB);
        assert!(err.to_string().contains(&want), "{err}");
        let dense = MemoryPlan::new(150 << 20, &fp, 20 << 20, Mode::Dense, &p).unwrap_err();
        assert!(
            dense.to_string().contains("holds every FFN neuron"),
            "{dense}"
        );
    }

    #[test]
    fn load_only_lowers_phi_and_delta_with_gamma() {
        let fp = footprint();
        let budget = (20u64 << 20) + RUNTIME_MARGIN + (115 << 20) + 1_000_000 + 4 * 1000 * 200;
        let plan = MemoryPlan::new(budget, &fp, 20 << 20, Mode::LoadOnly, &params()).unwrap();
        let p = plan.apply(Mode::LoadOnly, &params());
        assert_eq!(p.load_ratio, 0.192);
        assert!(p.compute_ratio <= 0.192 && p.static_ratio <= p.compute_ratio);
        p.validate(4).unwrap();
    }
}
