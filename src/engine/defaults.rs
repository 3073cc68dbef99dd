//! Every default of the engine, in one place: the CLI's flags, the ROS
//! node's parameters (and so `config/node.yaml`, which a test compares with
//! the node's declared defaults) and the library's `Default` impls all read
//! these. Change a default here and nowhere else.

use super::decode::GenerateOptions;
use super::sampling::Sampling;
use crate::method::params::Score;
use crate::method::vocab::VocabRule;
use crate::method::{Mode, SelectionParams};
use crate::model::head_screen::ScreenBits;
use crate::model::{FfnRows, KvDtype, LoadOptions};
use crate::sys::device::WeightDtype;
use candle_core::Device;

/// The settings a front end starts from when it is told nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Defaults {
    /// A catalog model's name (resolved in the models home:
    /// `store::home`) or a model folder.
    pub model: &'static str,
    pub dtype: WeightDtype,
    /// `cpu` or `cuda:N`.
    pub device: &'static str,
    pub mode: Mode,
    /// Task whose base neurons are loaded and static.
    pub task: &'static str,
    /// How prefill ranks neurons for the dynamic set.
    pub score: Score,
    /// κ: share of computed neurons gated in per decode token (1 = all).
    pub gate_keep: f64,
    /// Which output tokens decode computes ([`VocabRule`]).
    pub vocab: VocabRule,
    /// lm_head rows computed exactly per step behind a low-bit screen
    /// ([`crate::model::head_screen`]); 0: every row exactly.
    pub head_screen: usize,
    /// Bits a weight of the screen's copy takes.
    pub head_screen_bits: ScreenBits,
    /// The lm_head's rows stay in the quantized checkpoint, read as the
    /// screen picks them ([`crate::model::file_rows`]).
    pub head_in_file: bool,
    /// γ, δ, φ, α (fractions of a layer's FFN width; see
    /// [`crate::method::params`]).
    pub load_ratio: f64,
    pub static_ratio: f64,
    pub compute_ratio: f64,
    pub token_ratio: f64,
    /// Layers kept whole; negative counts from the end (-1 = the last).
    /// Negative entries need the model's layer count: the node resolves
    /// them once it has read the model's config; [`Defaults::engine_spec`]
    /// keeps only the non-negative ones.
    pub dense_layers: &'static [i64],
    /// Per layer, its share of the neurons φ leaves out (empty: even;
    /// [`SelectionParams::layer_drop`]).
    pub layer_drop: &'static [f64],
    /// ρ: of each sparse layer's loaded neurons, the share held in the
    /// coarse tier ([`SelectionParams::coarse_ratio`]).
    pub coarse_ratio: f64,
    /// Bits of the coarse tier's gate and up rows, 4 or 3
    /// ([`SelectionParams::coarse_bits`]).
    pub coarse_bits: u32,
    /// Seed of the `random-load` subset.
    pub plan_seed: u64,
    /// Prompt tokens per forward pass; longer prompts are prefilled in
    /// chunks. 512: large enough that matmuls stay efficient, small enough
    /// that a 4096-token prompt's temporaries stay far below the weights of
    /// the models we serve.
    pub prefill_chunk: usize,
    /// Longest sequence served; `None`: the model's, at most 4096.
    pub max_context: Option<usize>,
    /// How the KV cache holds keys and values (f32, or q8: a quarter of
    /// the bytes).
    pub kv_dtype: KvDtype,
    /// Resident memory (MiB) to fit in, choosing γ; `None`: γ as given.
    pub memory_budget_mb: Option<u64>,
    /// New tokens of a request that names no limit.
    pub max_new_tokens: usize,
    /// 0 = greedy.
    pub temperature: f64,
    pub top_p: f64,
    pub seed: u64,
}

/// The command line's defaults: dense, with the paper's operating point
/// (γ 0.7, δ 0.2, φ 0.4, α 0.2) ready for `--mode`.
pub const CLI: Defaults = Defaults {
    model: MODEL_NAME,
    dtype: WeightDtype::Q4,
    device: "cpu",
    mode: Mode::Dense,
    task: "qa",
    score: Score::Counts,
    gate_keep: 1.0,
    vocab: VocabRule::All,
    head_screen: 0,
    head_screen_bits: ScreenBits::Four,
    head_in_file: false,
    load_ratio: 0.7,
    static_ratio: 0.2,
    compute_ratio: 0.4,
    token_ratio: 0.2,
    dense_layers: &[],
    layer_drop: &[],
    coarse_ratio: 0.0,
    coarse_bits: 4,
    plan_seed: 0,
    prefill_chunk: 512,
    max_context: None,
    kv_dtype: KvDtype::F32,
    memory_budget_mb: None,
    max_new_tokens: 128,
    temperature: 0.0,
    top_p: 1.0,
    seed: 299792458,
};

/// The ROS node's defaults (`config/node.yaml` states the node's own; a
/// catalog model's preset, `config/models/NAME.yaml`, sets the method's
/// knobs over these): the CLI's, with the first and last layers kept
/// whole should a mode be chosen without them.
pub(crate) const NODE: Defaults = Defaults {
    dense_layers: &[0, -1],
    ..CLI
};

/// The default model: the node's, the CLI's and `prepare-model`'s when
/// told no name (a catalog name; its preset sets the method's knobs).
pub const MODEL_NAME: &str = "qwen2.5-coder-1.5b-instruct";

/// Allocations of at least this many bytes get a mapping of their own,
/// returned to the system when freed
/// ([`crate::sys::memory::bound_allocator_retention`]): glibc's starting
/// value, kept fixed (peak RSS ≤ 1.1× RSS after load; docs/BENCHMARKS.md).
pub(crate) const MALLOC_MMAP_THRESHOLD: usize = 128 * 1024;
/// glibc malloc arenas (by default one per thread, each keeping what its
/// thread freed).
pub(crate) const MALLOC_ARENAS: usize = 1;

/// Node only: requests waiting at most; more are rejected.
pub(crate) const QUEUE_DEPTH: usize = 8;

/// Node only: the system turn of conversations that bring none; empty = the
/// chat template's own default (SmolLM2's and Qwen's name themselves).
pub(crate) const SYSTEM_PROMPT: &str = "";

/// Reuse the last prompt's cache for a prompt that starts the same.
pub(crate) const PREFIX_CACHE: bool = true;

/// Node only: configure and activate (load the model, serve) at start-up.
pub(crate) const AUTOSTART: bool = true;

/// Node only: the file runtime parameter changes are kept in and read back
/// from at start-up (a respawned node keeps them); empty = not kept.
pub(crate) const RUNTIME_PARAMS_FILE: &str = "";

/// Compute threads; 0 = one per core (or `RAYON_NUM_THREADS`).
pub(crate) const THREADS: usize = 0;
/// Node only: the `std_msgs/String` instruction topic.
pub(crate) const INSTRUCTION_TOPIC: &str = "~/instructions";
/// Node only: milliseconds at least between two replies (service responses,
/// `~/response` messages), so a burst of rejections cannot overflow a
/// default-QoS client's reply history (`serve::node::pacer`).
pub(crate) const REPLY_PACE_MS: f64 = 5.0;
/// Node only: seconds between `/diagnostics` messages.
pub(crate) const DIAGNOSTICS_PERIOD_S: f64 = 1.0;
/// Node only: seconds an action goal's result stays available to
/// `get_result` after the goal ends; then the goal leaves the status topic
/// and its memory is freed. rcl's default is 10 s (Jazzy); a minute leaves
/// a planner whose executor lags time to ask, and keeps the status list to
/// the goals of the last minute.
pub(crate) const GOAL_RESULT_TIMEOUT_S: f64 = 60.0;
/// Tasks a request may name when the mode has no ranking file.
pub(crate) const TASKS: [&str; 3] = ["qa", "summarization", "translation"];
/// `selectinfer eval`: new tokens per example.
pub const EVAL_MAX_NEW_TOKENS: usize = 64;
/// `selectinfer bench`: tokens decoded per prompt.
pub const BENCH_NEW_TOKENS: usize = 64;
/// The dev splits (`../shared/data`), one per task.
pub const DEV_SETS: [&str; 3] = [
    "../shared/data/qa_squad11.dev.jsonl",
    "../shared/data/summarization_xsum.dev.jsonl",
    "../shared/data/translation_wmt22_deen.dev.jsonl",
];

impl Defaults {
    /// The method's parameters these defaults give (non-negative
    /// `dense_layers` only, see there).
    pub fn selection_params(&self) -> SelectionParams {
        SelectionParams {
            load_ratio: self.load_ratio,
            static_ratio: self.static_ratio,
            compute_ratio: self.compute_ratio,
            token_ratio: self.token_ratio,
            dense_layers: self
                .dense_layers
                .iter()
                .filter_map(|&l| usize::try_from(l).ok())
                .collect(),
            task: self.task.into(),
            score: self.score,
            gate_keep: self.gate_keep,
            layer_drop: self.layer_drop.to_vec(),
            coarse_ratio: self.coarse_ratio,
            coarse_bits: self.coarse_bits,
        }
    }

    pub fn sampling(&self) -> Sampling {
        Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            seed: self.seed,
        }
    }
}

/// The dtype of the library's own `Default`s ([`super::EngineSpec`],
/// [`LoadOptions`]): the weights as stored, which every model folder has (a
/// synthetic one has no q4 file). The front ends, CLI and node, default to
/// [`CLI`]'s q4.
pub(crate) const LIBRARY_DTYPE: WeightDtype = WeightDtype::F32;

impl Default for Sampling {
    fn default() -> Self {
        CLI.sampling()
    }
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_new_tokens: CLI.max_new_tokens,
            sampling: Sampling::default(),
            ignore_eos: false,
            stop: Vec::new(),
            grammar: None,
            call_gate: None,
        }
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            dtype: LIBRARY_DTYPE.dtype(),
            quant: LIBRARY_DTYPE.quant(),
            device: Device::Cpu, // CLI.device
            max_context: None,
            ffn: FfnRows::All,
            prefill_chunk: CLI.prefill_chunk,
            head_in_file: false,
            ffn_coarse: Vec::new(),
            coarse_bits: CLI.coarse_bits,
            kv_dtype: CLI.kv_dtype,
        }
    }
}

/// For serde: a spec file without `prefill_chunk` gets the default.
pub fn prefill_chunk() -> usize {
    CLI.prefill_chunk
}
