//! The node's parameters as `ros2 param list/describe` show them: name,
//! help, runtime or read-only, and the values each takes (ranges, names),
//! checked on every set. Their typed values and handler live in
//! [`super::params`].

use crate::method::params::Score;
use crate::method::vocab::VocabRule;
use crate::method::Mode;
use crate::model::KvDtype;
use crate::sys::device::WeightDtype;
use crate::sys::named::names;
use anyhow::{bail, Result};
use r2r::rcl_interfaces::msg::{FloatingPointRange, IntegerRange, ParameterDescriptor};
use r2r::ParameterValue;

/// What values a parameter takes, as `ros2 param describe` shows them
/// (ranges are inclusive, as ROS's are); every set, at start-up or at
/// runtime, is checked against it before the parameter's own validation.
#[derive(Clone, Copy)]
pub enum Values {
    /// Any value of the parameter's type (its own check may refuse some).
    Any,
    /// A number in `[lo, hi]`.
    Float(f64, f64),
    /// An integer in `[lo, hi]`.
    Int(i64, i64),
    /// One of these names (comma-separated).
    OneOf(fn() -> String),
}

/// One node parameter, declared once: name, help text (`ros2 param
/// describe`), whether it may change at runtime (the rest are read-only:
/// read at start-up), the values it takes, and whether the CLI's commands
/// take it as the flag of the same name (`load_ratio` ↔ `--load-ratio`).
/// Its default is [`crate::engine::defaults`]'s; `config/node.yaml`,
/// docs/PARAMETERS.md and the CLI's flags are checked against this by
/// tests (`params/tests.rs`, `tests/cli_flags.rs`).
pub struct Spec {
    pub name: &'static str,
    pub help: &'static str,
    pub runtime: bool,
    pub values: Values,
    pub cli: bool,
}

/// The smallest share a ratio or top_p takes (they are refused at 0: ROS
/// ranges are closed, so the open bound is written as this closed one).
const SHARE_MIN: f64 = 0.001;
/// Prompt and context lengths are bounded by the model long before this.
const TOKENS_MAX: i64 = 1 << 20;
/// Above a few, sampling is noise; the range keeps a typo (`70`) out.
const TEMPERATURE_MAX: f64 = 10.0;
const THREADS_MAX: i64 = 1024;
const QUEUE_MAX: i64 = 10_000;
const PERIOD_MIN_S: f64 = 0.01;
const PERIOD_MAX_S: f64 = 3600.0;
/// A second between replies would stall a queue's answers for minutes.
const PACE_MAX_MS: f64 = 1000.0;
/// A day: a planner that asks for a result later than that has lost it.
const RESULT_TIMEOUT_MAX_S: f64 = 86_400.0;

/// A parameter the node alone takes (no CLI flag).
const fn spec(name: &'static str, help: &'static str, runtime: bool, values: Values) -> Spec {
    Spec {
        name,
        help,
        runtime,
        values,
        cli: false,
    }
}

/// A parameter the CLI's commands take as well, as `--name-with-dashes`.
const fn shared(name: &'static str, help: &'static str, runtime: bool, values: Values) -> Spec {
    Spec {
        cli: true,
        ..spec(name, help, runtime, values)
    }
}

/// Every parameter, in the order `ros2 param list` shows.
pub const PARAMETERS: &[Spec] = &[
    shared(
        "model",
        "a catalog model by name (prepared in the models home on first use) or a model folder, relative to the working directory (load-time)",
        false,
        Values::Any,
    ),
    shared(
        "ranking",
        "ranking file; empty = the installed rankings/NAME.ranking.safetensors of the model (load-time)",
        false,
        Values::Any,
    ),
    shared(
        "task",
        "task whose base neurons are loaded and static; changed at runtime, the next request of that task swaps the base set in (reading only the neurons it adds) (runtime)",
        true,
        Values::Any,
    ),
    shared(
        "mode",
        "dense | load-only | selectinfer | coreinfer | random-load | disk-offload (load-time)",
        false,
        Values::OneOf(names::<Mode>),
    ),
    shared(
        "load_ratio",
        "gamma: FFN neurons loaded per sparse layer (load-time)",
        false,
        Values::Float(SHARE_MIN, 1.0),
    ),
    shared(
        "static_ratio",
        "delta: base neurons always computed (load-time)",
        false,
        Values::Float(0.0, 1.0),
    ),
    shared(
        "compute_ratio",
        "phi = delta + epsilon: neurons computed per prompt, at most load_ratio (runtime in selectinfer, coreinfer and random-load; read-only in the modes that compute every loaded neuron)",
        true,
        Values::Float(SHARE_MIN, 1.0),
    ),
    shared(
        "token_ratio",
        "alpha: per-token active fraction at prefill (runtime in selectinfer, coreinfer and random-load; read-only in the modes that compute every loaded neuron)",
        true,
        Values::Float(SHARE_MIN, 1.0),
    ),
    shared(
        "score",
        "counts | griffin | wina: how prefill ranks neurons for the dynamic set (load-time)",
        false,
        Values::OneOf(names::<Score>),
    ),
    shared(
        "vocab",
        "all | latin: output tokens decode computes (latin: Latin-script tokens; a prompt with a token outside, or a grammar, gets all) (load-time)",
        false,
        Values::OneOf(names::<VocabRule>),
    ),
    shared(
        "head_screen",
        "lm_head rows computed exactly per token: a low-bit copy of the lm_head (head_screen_bits) ranks its rows and the best N are computed from the weights (the rest keep the copy's logits; a grammar request gets every row); 0 = every row exactly; CPU only, ignored with a warning elsewhere (load-time)",
        false,
        Values::Int(0, i64::MAX),
    ),
    shared(
        "head_screen_bits",
        "4 | 2: bits a weight of head_screen's copy of the lm_head takes (4: ggml's Q4_0; 2: half the bytes again, needs a larger head_screen and suits some models only) (load-time)",
        false,
        Values::Int(2, 4),
    ),
    shared(
        "head_in_file",
        "the lm_head's rows stay in the quantized checkpoint (q8/q4, a model with an lm_head of its own): head_screen's exact rows are read each step (Qwen2.5-Coder-1.5B q4: 236 MiB less memory), a grammar request's step reads every row from the file (slower); needs head_screen > 0 (load-time)",
        false,
        Values::Any,
    ),
    shared(
        "gate_keep",
        "kappa: per decode token, the share of computed neurons whose up/down rows run (largest |silu(gate)| per 64); 1 = no gating; f32/f16 (load-time)",
        false,
        Values::Float(SHARE_MIN, 1.0),
    ),
    shared(
        "coarse_ratio",
        "rho: of each sparse layer's loaded neurons, the share (the lowest ranked) held in the coarse tier, down rows in 4 bits over per-channel scales (~22 % fewer bytes a neuron on Qwen); q8/q4, mode load-only; 0 = none (load-time)",
        false,
        Values::Float(0.0, 1.0),
    ),
    shared(
        "coarse_bits",
        "4 | 3: bits of the coarse tier's gate and up rows (4: the checkpoint's blocks as they are; 3: requantized to Q3_0 at load, ~21 % fewer bytes a tier neuron on Qwen, at some fidelity) (load-time)",
        false,
        Values::Int(3, 4),
    ),
    shared(
        "layer_drop",
        "per layer, its share of the neurons phi leaves out (one weight per layer; lab/scripts/layer_scan.sh calibrates them); [] = even (load-time)",
        false,
        Values::Any,
    ),
    shared(
        "dense_layers",
        "layers kept whole; negative counts from the end (load-time)",
        false,
        Values::Any,
    ),
    shared(
        "plan_seed",
        "seed of the random-load subset (load-time)",
        false,
        Values::Int(0, i64::MAX),
    ),
    shared(
        "dtype",
        "f32 | f16 | bf16 | q8 | q4 weights in memory (bf16: CUDA, compute capability >= 8.0; q8, q4: CPU, ggml blocks; load-time)",
        false,
        Values::OneOf(names::<WeightDtype>),
    ),
    shared(
        "device",
        "cpu | cuda:N (load-time)",
        false,
        Values::Any,
    ),
    shared(
        "prefill_chunk",
        "prompt tokens per forward pass; longer prompts are prefilled in chunks (peak memory vs. time to first token; load-time)",
        false,
        Values::Int(1, TOKENS_MAX),
    ),
    shared(
        "max_context",
        "longest sequence served (prompt + generated); 0 = the model's, at most 4096 (load-time)",
        false,
        Values::Int(0, TOKENS_MAX),
    ),
    shared(
        "kv_dtype",
        "f32 | q8: how the KV cache holds keys and values (q8: ggml's Q8_0 blocks, a quarter of f32's bytes, as llama.cpp's --cache-type-k q8_0; CPU; load-time)",
        false,
        Values::OneOf(names::<KvDtype>),
    ),
    shared(
        "memory_budget_mb",
        "resident memory (MiB) to fit in: gamma is chosen so that weights, KV cache, temporaries and runtime stay within it, and a budget below the floor is refused naming it; 0 = load_ratio as given (load-time)",
        false,
        Values::Int(0, i64::MAX),
    ),
    shared(
        "max_new_tokens",
        "default new-token limit of a request (runtime)",
        true,
        Values::Int(1, TOKENS_MAX),
    ),
    shared(
        "temperature",
        "default sampling temperature, 0 = greedy (runtime)",
        true,
        Values::Float(0.0, TEMPERATURE_MAX),
    ),
    shared(
        "top_p",
        "default nucleus mass (runtime)",
        true,
        Values::Float(SHARE_MIN, 1.0),
    ),
    shared(
        "seed",
        "default sampling seed (runtime)",
        true,
        Values::Int(0, i64::MAX),
    ),
    spec(
        "system_prompt",
        "system turn of every conversation that brings none; empty = the chat template's default (runtime)",
        true,
        Values::Any,
    ),
    spec(
        "prefix_cache",
        "reuse the last prompt's key/value cache (and prefill selection statistics) for a prompt that starts the same: a planner's fixed system prompt, a conversation so far (runtime)",
        true,
        Values::Any,
    ),
    spec(
        "autostart",
        "configure and activate at start-up (the lifecycle's configure loads the model); false = start unconfigured and wait for ~/change_state (load-time)",
        false,
        Values::Any,
    ),
    spec(
        "runtime_params_file",
        "file the runtime parameters are written to on every accepted set, and read back at start-up over the other parameters, so a respawned node keeps what was set; empty = not kept; node.launch.py gives each launch its own (load-time)",
        false,
        Values::Any,
    ),
    shared(
        "threads",
        "threads for decode and prefill; 0 = one per core (RAYON_NUM_THREADS if set); leave cores to the robot's other nodes (load-time)",
        false,
        Values::Int(0, THREADS_MAX),
    ),
    spec(
        "queue_depth",
        "requests waiting at most; more are rejected (load-time)",
        false,
        Values::Int(1, QUEUE_MAX),
    ),
    spec(
        "reply_pace_ms",
        "milliseconds at least between two replies (service responses, ~/response messages): a burst of rejections paced so a client with default QoS (history 10) keeps its own replies; 0 = unpaced (load-time)",
        false,
        Values::Float(0.0, PACE_MAX_MS),
    ),
    spec(
        "instruction_topic",
        "std_msgs/String instruction topic (load-time)",
        false,
        Values::Any,
    ),
    spec(
        "diagnostics_period_s",
        "seconds between /diagnostics messages (load-time)",
        false,
        Values::Float(PERIOD_MIN_S, PERIOD_MAX_S),
    ),
    spec(
        "goal_result_timeout_s",
        "seconds a finished action goal's result stays available to get_result; then the goal leaves the status topic and its memory is freed (load-time)",
        false,
        Values::Float(PERIOD_MIN_S, RESULT_TIMEOUT_MAX_S),
    ),
];

/// The parameter named `name`.
pub(super) fn spec_of(name: &str) -> Option<&'static Spec> {
    PARAMETERS.iter().find(|s| s.name == name)
}

impl Spec {
    /// Refuses a value outside [`Spec::values`], naming the parameter and
    /// the range: [`within`] of the parameter's descriptor, the one rule
    /// both follow. Type errors are left to the parameter's own parser.
    pub(super) fn check(&self, v: &ParameterValue) -> Result<()> {
        within(&self.descriptor(), v)
    }

    /// The descriptor `~/describe_parameters` returns: read-only for the
    /// load-time parameters, the range, the accepted names.
    pub(super) fn descriptor(&self) -> ParameterDescriptor {
        let mut d = ParameterDescriptor {
            name: self.name.into(),
            description: self.help.into(),
            read_only: !self.runtime,
            ..Default::default()
        };
        match self.values {
            Values::Any => {}
            Values::Float(from_value, to_value) => {
                d.floating_point_range = vec![FloatingPointRange {
                    from_value,
                    to_value,
                    step: 0.0,
                }]
            }
            Values::Int(from_value, to_value) => {
                d.integer_range = vec![IntegerRange {
                    from_value,
                    to_value,
                    step: 1,
                }]
            }
            Values::OneOf(names) => d.additional_constraints = format!("one of: {}", names()),
        }
        d
    }
}

/// Refuses a value outside the descriptor's range, naming the parameter
/// and the range as `ros2 param describe` shows it.
pub(super) fn within(d: &ParameterDescriptor, v: &ParameterValue) -> Result<()> {
    let name = &d.name;
    if let Some(r) = d.floating_point_range.first() {
        let x = match v {
            ParameterValue::Double(x) => *x,
            ParameterValue::Integer(x) => *x as f64,
            _ => return Ok(()),
        };
        if !(r.from_value..=r.to_value).contains(&x) {
            bail!(
                "parameter {name} must be in [{}, {}], got {x}",
                r.from_value,
                r.to_value
            );
        }
    }
    if let (Some(r), ParameterValue::Integer(x)) = (d.integer_range.first(), v) {
        if !(r.from_value..=r.to_value).contains(x) {
            match r.to_value {
                i64::MAX => bail!("parameter {name} must be >= {}, got {x}", r.from_value),
                hi => bail!(
                    "parameter {name} must be in [{}, {hi}], got {x}",
                    r.from_value
                ),
            }
        }
    }
    Ok(())
}
