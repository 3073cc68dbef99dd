//! What to load: model folder, dtype, device, SelectInfer mode and its
//! parameters — the one loader. One description shared by the CLI, the ROS
//! node and the tools, so all build the same engine from the same settings
//! (its defaults: [`super::defaults`]).

use super::defaults::{Defaults, CLI, LIBRARY_DTYPE};
use super::generate::Engine;
use super::text::TextCodec;
use crate::method::budget::MemoryPlan;
use crate::method::vocab::VocabRule;
use crate::method::{Method, Mode, SelectionParams};
use crate::model::footprint::Footprint;
use crate::model::head_screen::ScreenBits;
use crate::model::{KvDtype, LoadOptions};
use crate::sys::device::{parse_device, WeightDtype};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What a task swap ([`EngineSpec::swap_task`]) did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SwapReport {
    pub task: String,
    /// FFN neurons read in (over all layers).
    pub neurons_read: usize,
    /// Bytes read from the checkpoint while swapping.
    pub bytes_read: u64,
    /// Seconds, ranking read and plan included.
    pub seconds: f64,
}

/// Everything needed to load an [`Engine`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineSpec {
    /// HF-style model folder (config.json, tokenizer.json, *.safetensors).
    pub model: PathBuf,
    pub dtype: WeightDtype,
    /// `cpu` or `cuda:N`.
    pub device: String,
    pub mode: Mode,
    /// Ranking file; `None`: `<model>/ranking/neurons.ranking.safetensors` if present (synthetic models), else
    /// `rankings/<model folder name>.ranking.safetensors` of the source
    /// tree (the node and the CLI look in the installed package first:
    /// `store::installed`).
    pub ranking: Option<PathBuf>,
    /// γ, δ, φ, α, dense layers and the task whose base ranking is used.
    pub params: SelectionParams,
    /// Seed of the `random-load` subset.
    pub plan_seed: u64,
    /// Prompt tokens per forward pass; longer prompts are prefilled in
    /// chunks (lower peak memory, a little more time per chunk).
    #[serde(default = "super::defaults::prefill_chunk")]
    pub prefill_chunk: usize,
    /// Longest sequence (prompt + generated) served; `None`: the model's,
    /// at most 4096 (the KV cache a memory plan counts grows to it).
    #[serde(default)]
    pub max_context: Option<usize>,
    /// How the KV cache holds keys and values (q8: a quarter of f32's
    /// bytes; CPU only).
    #[serde(default)]
    pub kv_dtype: KvDtype,
    /// Resident memory (MiB) the process may use: the weights outside the
    /// FFN, the KV cache, prefill temporaries and the runtime are taken off
    /// it and γ is chosen to fit the rest ([`MemoryPlan`]); `None`: γ as given.
    #[serde(default)]
    pub memory_budget_mb: Option<u64>,
    /// Which output tokens decode computes (the lm_head's rows).
    #[serde(default)]
    pub vocab: VocabRule,
    /// lm_head rows computed exactly per step behind a low-bit screen
    /// ([`crate::model::head_screen`]); 0: every row exactly.
    #[serde(default)]
    pub head_screen: usize,
    /// Bits a weight of the screen's copy takes (4 or 2).
    #[serde(default)]
    pub head_screen_bits: ScreenBits,
    /// The lm_head's rows stay in the quantized checkpoint, read as the
    /// screen picks them ([`crate::model::file_rows`]).
    #[serde(default)]
    pub head_in_file: bool,
}

impl EngineSpec {
    /// The ranking file this spec uses: explicit, else one inside the model
    /// folder (synthetic models carry theirs), else the model's default in
    /// the source tree's `rankings/`.
    pub(crate) fn ranking_path(&self) -> Option<PathBuf> {
        let inside = self.model.join(crate::method::ranking::IN_MODEL_FILE);
        self.ranking
            .clone()
            .or_else(|| inside.is_file().then_some(inside))
            .or_else(|| {
                self.model.file_name().map(|n| {
                    Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("rankings")
                        .join(format!("{}.ranking.safetensors", n.to_string_lossy()))
                })
            })
    }

    /// The parameters the mode actually runs with: coreinfer loads every
    /// neuron and has no static set.
    pub(crate) fn effective_params(&self) -> SelectionParams {
        let mut p = self.params.clone();
        if self.mode == Mode::Coreinfer {
            p.load_ratio = 1.0;
            p.static_ratio = 0.0;
        }
        p
    }

    /// The selective method (plan read from the ranking), `None` for dense.
    pub(crate) fn method(&self) -> Result<Option<Method>> {
        if self.mode == Mode::Dense {
            return Ok(None);
        }
        Ok(Some(Method::new(
            self.mode,
            self.effective_params(),
            &self.model,
            self.ranking_path().as_deref(),
            self.plan_seed,
        )?))
    }

    /// Switches `engine` (loaded from these settings) to `task`'s base set
    /// while it stays loaded: the plan is rebuilt from the ranking with the
    /// engine's own parameters (γ as loaded, a memory plan's included) and
    /// only the neurons it adds are read ([`Engine::swap_method`]). Modes
    /// whose plan does not depend on the task only change their task.
    pub(crate) fn swap_task(&self, engine: &mut Engine, task: &str) -> Result<SwapReport> {
        let started = std::time::Instant::now();
        let params = SelectionParams {
            task: task.to_string(),
            ..engine
                .params()
                .context("dense loads no plan: there is no task to switch")?
                .clone()
        };
        let method = Method::new(
            self.mode,
            params,
            &self.model,
            self.ranking_path().as_deref(),
            self.plan_seed,
        )
        .with_context(|| format!("the plan of task `{task}`"))?;
        let planned = started.elapsed().as_secs_f64();
        let before = engine.model.weight_bytes_read();
        let neurons_read = engine.swap_method(method)?;
        log::debug!(
            "swap to {task}: plan {planned:.3} s, swap {:.3} s",
            started.elapsed().as_secs_f64() - planned
        );
        Ok(SwapReport {
            task: task.to_string(),
            neurons_read,
            bytes_read: engine.model.weight_bytes_read() - before,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Checks that the model folder exists and has a config.
    pub(crate) fn check_model_folder(&self) -> Result<()> {
        let m = &self.model;
        if !m.is_dir() {
            bail!(
                "model folder {} does not exist (run `selectinfer prepare-model`)",
                m.display()
            );
        }
        if !m.join("config.json").is_file() {
            bail!(
                "model folder {} has no config.json (run `selectinfer prepare-model`)",
                m.display()
            );
        }
        Ok(())
    }

    /// Checks the model folder, device and parameters, then loads (the
    /// tokenizer first: a memory plan measures the process with it).
    pub fn load(&self) -> Result<Engine> {
        self.check_model_folder()?;
        let codec = TextCodec::from_model_dir(&self.model)?;
        let (spec, plan) = self.planned(&codec)?;
        let mut engine =
            Engine::load_with_codec(&spec.model, &spec.load_options()?, spec.method()?, codec)?;
        engine.memory_plan = plan;
        engine.set_vocab(self.vocab)?;
        engine.set_head_screen(self.head_screen, self.head_screen_bits)?;
        Ok(engine)
    }

    /// Under a memory budget: these settings with the γ the budget gives,
    /// and the plan (logged); without one, the settings as they are. The
    /// process's resident memory now is the plan's runtime (`codec`, the
    /// model's tokenizer, loaded: it also gives the output vocabulary's rows).
    pub(crate) fn planned(&self, codec: &TextCodec) -> Result<(EngineSpec, Option<MemoryPlan>)> {
        let Some(mb) = self.memory_budget_mb else {
            return Ok((self.clone(), None));
        };
        if mb == 0 {
            bail!("memory_budget_mb must be a positive number of MiB");
        }
        let fp = self.footprint("memory_budget_mb", codec)?;
        let plan = MemoryPlan::new(
            mb << 20,
            &fp,
            crate::sys::memory::rss_bytes(),
            self.mode,
            &self.effective_params(),
        )
        .with_context(|| {
            format!(
                "planning {} in mode {}",
                self.model.display(),
                self.mode.name()
            )
        })?;
        log::info!("{plan}");
        let mut spec = self.clone();
        spec.params = plan.apply(self.mode, &self.params);
        Ok((spec, Some(plan)))
    }

    /// The memory plan of these settings as given (γ as set, no budget):
    /// its expected peak is the prediction for this configuration. The
    /// process's resident memory now is its runtime: call it with the
    /// tokenizer loaded, before the model.
    pub(crate) fn predicted_plan(&self, codec: &TextCodec) -> Result<MemoryPlan> {
        let fp = self.footprint("a memory plan", codec)?;
        Ok(MemoryPlan::predict(
            &fp,
            crate::sys::memory::rss_bytes(),
            self.mode,
            &self.effective_params(),
        ))
    }

    /// The CPU footprint these settings load, the lm_head's screen
    /// included (a copy of the output vocabulary's rows, which `codec`
    /// gives); `what` names the setting that asked, refused elsewhere.
    fn footprint(&self, what: &str, codec: &TextCodec) -> Result<Footprint> {
        let opts = self.load_options()?;
        if !opts.device.is_cpu() {
            bail!(
                "{what} plans the CPU's memory; device {} holds the weights elsewhere",
                self.device
            );
        }
        let mut fp = Footprint::of(&self.model, &opts)?;
        if self.head_screen > 0 {
            // The lm_head's screen is held beside every other weight.
            let cfg = crate::model::Config::from_file(&self.model.join("config.json"))?;
            let (vocab, _) = super::vocab::vocabulary(codec, self.vocab, cfg.vocab_size)?;
            fp.other_weights += crate::model::head_screen::memory_bytes(
                vocab.map_or(cfg.vocab_size, |v| v.rows()),
                cfg.hidden_size,
                self.head_screen_bits,
            );
        }
        Ok(fp)
    }

    /// The load options these settings give (dtype, device, prefill chunk).
    pub(crate) fn load_options(&self) -> Result<LoadOptions> {
        if self.head_in_file && self.head_screen == 0 {
            bail!(
                "head_in_file leaves the lm_head in the checkpoint for its screen to read a few rows a step: it needs head_screen > 0"
            );
        }
        Ok(LoadOptions {
            dtype: self.dtype.dtype(),
            quant: self.dtype.quant(),
            device: parse_device(&self.device)?,
            prefill_chunk: self.prefill_chunk,
            max_context: self.max_context,
            head_in_file: self.head_in_file,
            coarse_bits: self.params.coarse_bits,
            kv_dtype: self.kv_dtype,
            ..Default::default()
        })
    }
}

impl Defaults {
    /// The engine these defaults describe.
    pub(crate) fn engine_spec(&self) -> EngineSpec {
        EngineSpec {
            model: PathBuf::from(self.model),
            dtype: self.dtype,
            device: self.device.into(),
            mode: self.mode,
            ranking: None,
            params: self.selection_params(),
            plan_seed: self.plan_seed,
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

impl Default for EngineSpec {
    fn default() -> Self {
        EngineSpec {
            dtype: LIBRARY_DTYPE,
            ..CLI.engine_spec()
        }
    }
}
