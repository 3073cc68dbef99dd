//! The flags every engine-loading command shares: model, dtype, device,
//! memory, and the SelectInfer mode with its parameters (defaults from
//! `selectinfer::engine::defaults`).

use clap::Args;
use selectinfer::engine::defaults::CLI;
use selectinfer::engine::EngineSpec;
use selectinfer::method::vocab::VocabRule;
use selectinfer::method::{params::Score, Mode, SelectionParams};
use selectinfer::model::head_screen::ScreenBits;
use selectinfer::sys::device::WeightDtype;
use std::path::PathBuf;

#[derive(Args)]
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
    /// Longest sequence served (prompt + generated); default the model's, at most 4096.
    #[arg(long)]
    pub max_context: Option<usize>,
    /// Resident memory (MiB) to fit in: γ is chosen so that weights, KV cache,
    /// temporaries and runtime stay within it (the plan is logged).
    #[arg(long)]
    pub memory_budget_mb: Option<u64>,
    /// Output tokens decode computes: all, or latin (Latin-script tokens;
    /// a prompt with a token outside gets all).
    #[arg(long, default_value_t = CLI.vocab)]
    pub vocab: VocabRule,
    /// lm_head rows computed exactly per step: a low-bit copy of the lm_head
    /// ranks its rows and the best K are computed from the weights (the
    /// others keep the copy's logits); 0 computes every row exactly.
    #[arg(long, default_value_t = CLI.head_screen)]
    pub head_screen: usize,
    /// Bits a weight of the screen's copy takes: 4 (ggml's Q4_0) or 2
    /// (half the bytes again; needs a larger --head-screen, and suits some
    /// models only: docs/RESULTS.md).
    #[arg(long, default_value_t = CLI.head_screen_bits)]
    pub head_screen_bits: ScreenBits,
    #[command(flatten)]
    pub method: MethodArgs,
}

/// SelectInfer mode and parameters (fractions of a layer's FFN width).
#[derive(Args)]
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
    /// Per layer, its share of the neurons φ leaves out (one weight per
    /// layer, comma-separated; `scripts/layer_scan.sh` calibrates them);
    /// none = an even split.
    #[arg(long, value_delimiter = ',')]
    pub layer_drop: Vec<f64>,
    /// Seed of the random-load subset.
    #[arg(long, default_value_t = CLI.plan_seed)]
    pub plan_seed: u64,
}

impl ModelArgs {
    /// Whether these flags ask for the model as it is: dense, every output
    /// row computed exactly (all another engine can run).
    pub fn plain(&self) -> bool {
        self.method.mode == Mode::Dense && self.vocab == VocabRule::All && self.head_screen == 0
    }

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
                layer_drop: m.layer_drop.clone(),
            },
            plan_seed: m.plan_seed,
            prefill_chunk: self.prefill_chunk,
            max_context: self.max_context,
            memory_budget_mb: self.memory_budget_mb,
            vocab: self.vocab,
            head_screen: self.head_screen,
            head_screen_bits: self.head_screen_bits,
        }
    }
}
