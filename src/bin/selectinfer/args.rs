//! The flags every engine-loading command shares: model, dtype, device,
//! memory, and the SelectInfer mode with its parameters (defaults from
//! `selectinfer::engine::defaults`, under a catalog model's preset, under
//! the flags given).

use anyhow::{anyhow, Context, Result};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args};
use selectinfer::engine::defaults::CLI;
use selectinfer::engine::EngineSpec;
use selectinfer::method::params::resolve_layers;
use selectinfer::method::vocab::VocabRule;
use selectinfer::method::{params::Score, Mode, SelectionParams};
use selectinfer::model::ScreenBits;
use selectinfer::model::{Config, KvDtype};
use selectinfer::store::home::{self, Missing};
use selectinfer::store::installed;
use selectinfer::store::preset::Preset;
use selectinfer::sys::device::WeightDtype;
use std::path::PathBuf;

#[derive(Args)]
pub struct ModelArgs {
    /// A catalog model by name (smollm2-135m-instruct,
    /// qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct: prepared
    /// in the models home, $SELECTINFER_MODELS, on first use; its preset
    /// config/models/NAME.yaml sets every flag not given), or a model folder.
    #[arg(long, default_value = CLI.model)]
    pub model: String,
    /// Ignore the catalog model's preset (the built-in defaults instead).
    #[arg(long)]
    pub no_preset: bool,
    /// The model folder `--model` resolved to ([`ModelArgs::resolve`]).
    #[arg(skip)]
    pub folder: PathBuf,
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
    /// KV cache dtype: f32, or q8 (ggml's Q8_0 blocks, a quarter of the bytes; CPU).
    #[arg(long, default_value_t = CLI.kv_dtype)]
    pub kv_dtype: KvDtype,
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
    /// The lm_head's rows stay in the quantized checkpoint (a model with
    /// an lm_head of its own, q8/q4): the screen reads the K rows it
    /// computes each step, a grammar's step every row. Needs --head-screen.
    #[arg(long, default_value_t = CLI.head_in_file, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub head_in_file: bool,
    #[command(flatten)]
    pub method: MethodArgs,
}

/// SelectInfer mode and parameters (fractions of a layer's FFN width).
#[derive(Args)]
pub struct MethodArgs {
    /// dense, load-only, selectinfer, coreinfer, random-load, disk-offload (docs/CLI.md).
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
    /// Dynamic-set ranking: counts (the paper's), griffin, wina (docs/CLI.md).
    #[arg(long, default_value_t = CLI.score)]
    pub score: Score,
    /// κ: per decode token, share of computed neurons run (1 = no gating).
    #[arg(long, default_value_t = CLI.gate_keep)]
    pub gate_keep: f64,
    /// Layers kept dense, comma-separated; negative count from the end
    /// (e.g. 0,1,-2,-1).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub dense_layers: Vec<i64>,
    /// `dense_layers` as layer numbers ([`ModelArgs::resolve`]).
    #[arg(skip)]
    pub dense: Vec<usize>,
    /// Per layer, its share of the neurons φ leaves out (one weight per
    /// layer, comma-separated; `lab/scripts/layer_scan.sh` calibrates them);
    /// none = an even split.
    #[arg(long, value_delimiter = ',')]
    pub layer_drop: Vec<f64>,
    /// ρ: of each sparse layer's loaded neurons, the share (the lowest
    /// ranked) held in the coarse tier: down rows in 4 bits over
    /// per-channel scales, ~22 % fewer bytes a neuron on Qwen (q8/q4,
    /// mode load-only; docs/CLI.md).
    #[arg(long, default_value_t = CLI.coarse_ratio)]
    pub coarse_ratio: f64,
    /// Bits of the coarse tier's gate and up rows: 4 (the file's blocks) or 3
    /// (requantized to Q3_0: ~21 % fewer bytes a tier neuron; docs/CLI.md).
    #[arg(long, default_value_t = CLI.coarse_bits)]
    pub coarse_bits: u32,
    /// Seed of the random-load subset.
    #[arg(long, default_value_t = CLI.plan_seed)]
    pub plan_seed: u64,
}

fn parse<T: std::str::FromStr<Err: std::fmt::Display>>(text: &str) -> Result<T> {
    text.trim().parse().map_err(|e| anyhow!("`{text}`: {e}"))
}

fn list<T: std::str::FromStr>(text: &str) -> Result<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    text.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(parse)
        .collect()
}

impl ModelArgs {
    /// Resolves `--model` (a catalog model missing from the models home is
    /// prepared), lays the model's preset under the flags `given` on the
    /// command line, finds the installed ranking for a selective mode and
    /// turns negative dense layers into layer numbers.
    pub fn resolve(&mut self, given: &ArgMatches) -> Result<()> {
        let explicit = |id: &str| given.value_source(id) == Some(ValueSource::CommandLine);
        if let Some(entry) = home::catalog_of(&self.model).filter(|_| !self.no_preset) {
            if let Some(preset) = Preset::for_model(entry.name)? {
                for (key, _) in &preset.values {
                    if !explicit(key) {
                        let text = preset.flag_text(key).unwrap_or_default();
                        self.set(key, &text).with_context(|| {
                            format!("the preset {}: `{key}`", preset.path.display())
                        })?;
                    }
                }
                log::info!("preset {} (flags given win)", preset.path.display());
            }
        }
        let model = home::resolve(&self.model, self.dtype, Missing::Prepare)?;
        self.folder = model.folder.clone();
        let m = &mut self.method;
        if m.ranking.is_none() && m.mode != Mode::Dense {
            m.ranking = Some(installed::ranking(&model.folder, &model.name())?);
        }
        let layers = Config::from_file(&model.folder.join("config.json"))?.num_hidden_layers;
        m.dense = resolve_layers(&m.dense_layers, layers).context("--dense-layers")?;
        Ok(())
    }

    /// Sets the flag named `key` (its id: `load_ratio` for `--load-ratio`)
    /// from its text, as a preset gives it.
    pub fn set(&mut self, key: &str, text: &str) -> Result<()> {
        let m = &mut self.method;
        match key {
            "dtype" => self.dtype = parse(text)?,
            "vocab" => self.vocab = parse(text)?,
            "head_screen" => self.head_screen = parse(text)?,
            "head_screen_bits" => self.head_screen_bits = parse(text)?,
            "head_in_file" => self.head_in_file = parse(text)?,
            "kv_dtype" => self.kv_dtype = parse(text)?,
            "mode" => m.mode = parse(text)?,
            "load_ratio" => m.load_ratio = parse(text)?,
            "static_ratio" => m.static_ratio = parse(text)?,
            "compute_ratio" => m.compute_ratio = parse(text)?,
            "token_ratio" => m.token_ratio = parse(text)?,
            "score" => m.score = parse(text)?,
            "gate_keep" => m.gate_keep = parse(text)?,
            "dense_layers" => m.dense_layers = list(text)?,
            "layer_drop" => m.layer_drop = list(text)?,
            "coarse_ratio" => m.coarse_ratio = parse(text)?,
            "coarse_bits" => m.coarse_bits = parse(text)?,
            other => anyhow::bail!("no flag --{}", other.replace('_', "-")),
        }
        Ok(())
    }

    /// Whether these flags ask for the model as it is: dense, every output
    /// row computed exactly (all another engine can run).
    pub fn plain(&self) -> bool {
        self.method.mode == Mode::Dense && self.vocab == VocabRule::All && self.head_screen == 0
    }

    /// The engine these flags describe (shared with the ROS node).
    pub fn spec(&self) -> EngineSpec {
        let m = &self.method;
        EngineSpec {
            model: self.folder.clone(),
            dtype: self.dtype,
            device: self.device.clone(),
            mode: m.mode,
            ranking: m.ranking.clone(),
            params: SelectionParams {
                load_ratio: m.load_ratio,
                static_ratio: m.static_ratio,
                compute_ratio: m.compute_ratio,
                token_ratio: m.token_ratio,
                dense_layers: m.dense.clone(),
                task: m.task.clone(),
                score: m.score,
                gate_keep: m.gate_keep,
                layer_drop: m.layer_drop.clone(),
                coarse_ratio: m.coarse_ratio,
                coarse_bits: m.coarse_bits,
            },
            plan_seed: m.plan_seed,
            prefill_chunk: self.prefill_chunk,
            max_context: self.max_context,
            kv_dtype: self.kv_dtype,
            memory_budget_mb: self.memory_budget_mb,
            vocab: self.vocab,
            head_screen: self.head_screen,
            head_screen_bits: self.head_screen_bits,
            head_in_file: self.head_in_file,
        }
    }
}
