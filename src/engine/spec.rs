//! What to load: model folder, dtype, device, SelectInfer mode and its
//! parameters — the one loader. One description shared by the CLI, the ROS
//! node and the tools, so all build the same engine from the same settings
//! (its defaults: [`super::defaults`]).

use super::generate::Engine;
use crate::method::{Method, Mode, SelectionParams};
use crate::model::LoadOptions;
use crate::sys::device::{parse_device, WeightDtype};
use anyhow::{bail, Result};
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
    #[serde(default = "super::defaults::prefill_chunk")]
    pub prefill_chunk: usize,
}

impl EngineSpec {
    /// The ranking file this spec uses: explicit, else one inside the model
    /// folder (synthetic models carry theirs), else the model's default in
    /// `rankings/`.
    pub fn ranking_path(&self) -> Option<PathBuf> {
        let inside = self.model.join(crate::method::ranking::IN_MODEL_FILE);
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
            quant: self.dtype.quant(),
            device: parse_device(&self.device)?,
            prefill_chunk: self.prefill_chunk,
            ..Default::default()
        })
    }
}
