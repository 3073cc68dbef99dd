//! The models home and the resolution of a `model` setting: a catalog name
//! (`qwen2.5-coder-0.5b-instruct`) names a folder in the home, prepared on
//! first use; anything else is a folder path, relative to the working
//! directory. Errors name the path and the folder it was resolved against.

use super::prepare::{self, CatalogEntry, CATALOG};
use super::quantize;
use crate::sys::device::WeightDtype;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// The environment variable that names the models home.
pub(crate) const MODELS_ENV: &str = "SELECTINFER_MODELS";

/// The folder that holds the catalog's models: `$SELECTINFER_MODELS`, else
/// `$XDG_DATA_HOME/selectinfer/models`, else
/// `$HOME/.local/share/selectinfer/models`. A relative value is taken
/// against the working directory.
pub fn models_home() -> Result<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let home = match var(MODELS_ENV) {
        Some(d) => d,
        None => var("XDG_DATA_HOME")
            .or_else(|| var("HOME").map(|h| h.join(".local/share")))
            .context("no models home: set SELECTINFER_MODELS (or XDG_DATA_HOME, or HOME)")?
            .join("selectinfer/models"),
    };
    absolute(&home)
}

/// `p` made absolute against the working directory.
fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    let cwd = std::env::current_dir().context("reading the working directory")?;
    Ok(cwd.join(p))
}

/// What to do when a catalog model is not (fully) prepared in the home.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// Download, verify and convert it (with a progress bar).
    Prepare,
    /// Refuse, saying how to prepare it.
    Refuse,
}

/// A `model` setting resolved to a folder.
#[derive(Debug, Clone)]
pub struct ModelRef {
    /// The model folder, absolute.
    pub folder: PathBuf,
    /// The catalog entry when the setting was a catalog name.
    pub catalog: Option<&'static CatalogEntry>,
}

impl ModelRef {
    /// The name presets and rankings are found by: the catalog name, else
    /// the folder's own name.
    pub fn name(&self) -> String {
        match self.catalog {
            Some(e) => e.name.to_string(),
            None => self
                .folder
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default(),
        }
    }
}

/// Whether `folder` holds what loading it in `dtype` reads: config,
/// tokenizer, and the checkpoint of that dtype (for q8/q4 one whose
/// header matches the folder's weights).
pub(crate) fn is_ready(folder: &Path, dtype: WeightDtype) -> bool {
    let base = ["config.json", "tokenizer.json", "tokenizer_config.json"]
        .iter()
        .all(|f| folder.join(f).is_file());
    base && match dtype.quant() {
        Some(q) => quantize::is_quantized(folder, q),
        None => folder.join("model.safetensors").is_file(),
    }
}

/// Resolves a `model` setting (a catalog name or a folder path) for a load
/// in `dtype`. A catalog name names `models_home()/NAME`; when that folder
/// is missing or lacks what `dtype` needs, `missing` says whether to
/// prepare it (atomically: [`prepare::prepare_model`]) or to refuse.
pub fn resolve(setting: &str, dtype: WeightDtype, missing: Missing) -> Result<ModelRef> {
    let setting = setting.trim();
    if setting.is_empty() {
        bail!(
            "no model given: name a catalog model ({}) or a model folder",
            known()
        );
    }
    if let Ok(entry) = prepare::catalog_entry(setting) {
        let home = models_home()?;
        let folder = home.join(entry.name);
        if !is_ready(&folder, dtype) {
            if missing == Missing::Refuse {
                bail!(
                    "model {} is not prepared in the models home {} (${MODELS_ENV}): \
                     run `selectinfer prepare-model {}`",
                    entry.name,
                    home.display(),
                    entry.name
                );
            }
            log::info!(
                "model {} is not prepared in {}: preparing it (download, verify, convert)",
                entry.name,
                home.display()
            );
            // The f32 checkpoint is what every dtype is made from; only
            // what `dtype` reads stays.
            prepare::prepare_model(
                entry.name,
                &home,
                WeightDtype::F32,
                prepare::Keep::Only(dtype),
            )?;
        }
        return Ok(ModelRef {
            folder,
            catalog: Some(entry),
        });
    }
    let given = Path::new(setting);
    let folder = absolute(given)?;
    if !folder.is_dir() {
        bail!(
            "model {setting}: the folder {} does not exist{}, and {setting} is not a catalog \
             name ({})",
            folder.display(),
            resolved_against(given),
            known()
        );
    }
    if !folder.join("config.json").is_file() {
        bail!(
            "model folder {}{} has no config.json: not a model folder (run `selectinfer \
             prepare-model NAME` for a catalog model)",
            folder.display(),
            resolved_against(given)
        );
    }
    Ok(ModelRef {
        folder,
        catalog: None,
    })
}

/// For a relative `path` in an error: " (resolved against the working
/// directory D)"; nothing for an absolute one.
pub fn resolved_against(path: &Path) -> String {
    match path.is_absolute() {
        true => String::new(),
        false => format!(
            " (resolved against the working directory {})",
            std::env::current_dir().map_or_else(|_| "?".into(), |d| d.display().to_string())
        ),
    }
}

/// The catalog's names, for messages.
pub fn known() -> String {
    CATALOG
        .iter()
        .map(|e| e.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The catalog entry a `model` setting names, when it is a catalog name
/// (a folder path is a folder as it is, even one named after a catalog
/// model: no preset is laid under a path).
pub fn catalog_of(setting: &str) -> Option<&'static CatalogEntry> {
    prepare::catalog_entry(setting.trim()).ok()
}
