//! What to load: model folder, dtype, device, SelectInfer mode and its
//! parameters. One description shared by the CLI and the ROS node, so both
//! build the same engine from the same settings.

use crate::convert::WeightDtype;
use crate::generate::Engine;
use crate::model::{LoadOptions, DEFAULT_PREFILL_CHUNK};
use crate::plan::SelectionParams;
use crate::selective::{Method, Mode};
use anyhow::{bail, Result};
use candle_core::Device;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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
    /// `rankings/<model folder name>.ranking.safetensors`.
    pub ranking: Option<PathBuf>,
    /// γ, δ, φ, α, dense layers and the task whose base ranking is used.
    pub params: SelectionParams,
    /// Seed of the `random-load` subset.
    pub plan_seed: u64,
    /// Prompt tokens per forward pass; longer prompts are prefilled in
    /// chunks (lower peak memory, a little more time per chunk).
    #[serde(default = "default_prefill_chunk")]
    pub prefill_chunk: usize,
}

fn default_prefill_chunk() -> usize {
    DEFAULT_PREFILL_CHUNK
}

impl Default for EngineSpec {
    fn default() -> Self {
        Self {
            model: PathBuf::from("models/smollm2-135m-instruct"),
            dtype: WeightDtype::F32,
            device: "cpu".into(),
            mode: Mode::Dense,
            ranking: None,
            params: SelectionParams {
                load_ratio: 0.7,
                static_ratio: 0.2,
                compute_ratio: 0.4,
                token_ratio: 0.2,
                dense_layers: Vec::new(),
                task: "qa".into(),
            },
            plan_seed: 0,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
        }
    }
}

/// Parses `cpu` or `cuda:N` (`cuda` = `cuda:0`).
pub fn parse_device(name: &str) -> Result<Device> {
    let name = name.trim();
    if name == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = match name {
        "cuda" => Some(0),
        _ => name
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok()),
    };
    let Some(ordinal) = ordinal else {
        bail!("device must be `cpu` or `cuda:N`, got `{name}`");
    };
    if !candle_core::utils::cuda_is_available() {
        bail!("device {name}: this build has no CUDA support (build with --features cuda)");
    }
    Device::new_cuda(ordinal).map_err(|e| {
        // candle attaches a backtrace to the message; the first line is the error.
        let first = e.to_string().lines().next().unwrap_or_default().to_string();
        let hint = if first.contains("STUB_LIBRARY") {
            " (the CUDA driver here is the link-time stub: this machine has no GPU driver)"
        } else {
            ""
        };
        anyhow::anyhow!("device {name}: no usable CUDA device: {first}{hint}")
    })
}

impl EngineSpec {
    /// The ranking file this spec uses: explicit, else one inside the model
    /// folder (synthetic models carry theirs), else the model's default in
    /// `rankings/`.
    pub fn ranking_path(&self) -> Option<PathBuf> {
        let inside = self.model.join(crate::synth::RANKING_FILE);
        self.ranking
            .clone()
            .or_else(|| inside.is_file().then_some(inside))
            .or_else(|| {
                self.model.file_name().map(|n| {
                    Path::new("rankings")
                        .join(format!("{}.ranking.safetensors", n.to_string_lossy()))
                })
            })
    }

    /// The parameters the mode actually runs with: coreinfer loads every
    /// neuron and has no static set.
    pub fn effective_params(&self) -> SelectionParams {
        let mut p = self.params.clone();
        if self.mode == Mode::Coreinfer {
            p.load_ratio = 1.0;
            p.static_ratio = 0.0;
        }
        p
    }

    /// The selective method (plan read from the ranking), `None` for dense.
    pub fn method(&self) -> Result<Option<Method>> {
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

    /// Checks that the model folder exists and has a config.
    pub fn check_model_folder(&self) -> Result<()> {
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

    /// Checks the model folder, device and parameters, then loads.
    pub fn load(&self) -> Result<Engine> {
        self.check_model_folder()?;
        Engine::load_with_method(&self.model, &self.load_options()?, self.method()?)
    }

    /// The load options these settings give (dtype, device, prefill chunk).
    pub fn load_options(&self) -> Result<LoadOptions> {
        Ok(LoadOptions {
            dtype: self.dtype.dtype(),
            device: parse_device(&self.device)?,
            prefill_chunk: self.prefill_chunk,
            ..Default::default()
        })
    }
}
