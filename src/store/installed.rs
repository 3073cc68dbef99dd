//! Files installed with the package, found whatever the working directory:
//! `share/selectinfer/<sub>` under each prefix of `$AMENT_PREFIX_PATH` (the
//! package installed by colcon), then the source tree the binary was built
//! from. The neuron rankings (`rankings/`) and the presets
//! (`config/models/`) are looked up here.

use crate::method::ranking::IN_MODEL_FILE;
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// The ROS package's name (its share folder).
pub(crate) const PACKAGE: &str = "selectinfer";
/// Where the rankings live, in the share folder and the source tree.
pub(crate) const RANKINGS: &str = "rankings";

/// The folders searched for `sub`, in order.
pub(crate) fn search_dirs(sub: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(paths) = std::env::var_os("AMENT_PREFIX_PATH") {
        for prefix in std::env::split_paths(&paths).filter(|p| !p.as_os_str().is_empty()) {
            dirs.push(prefix.join("share").join(PACKAGE).join(sub));
        }
    }
    dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join(sub));
    dirs
}

/// The first `sub/file` in [`search_dirs`]; `Err` lists the folders searched.
pub(crate) fn find(sub: &str, file: &str) -> std::result::Result<PathBuf, Vec<PathBuf>> {
    let dirs = search_dirs(sub);
    dirs.iter()
        .map(|d| d.join(file))
        .find(|p| p.is_file())
        .ok_or(dirs)
}

/// The ranking file of a model folder named `name`: the one inside the
/// folder (synthetic models carry theirs), else `NAME.ranking.safetensors`
/// in the installed rankings.
pub fn ranking(folder: &Path, name: &str) -> Result<PathBuf> {
    let inside = folder.join(IN_MODEL_FILE);
    if inside.is_file() {
        return Ok(inside);
    }
    let file = format!("{name}.ranking.safetensors");
    match find(RANKINGS, &file) {
        Ok(p) => Ok(p),
        Err(dirs) => bail!(
            "no neuron ranking for model {name}: neither {} nor {file} in {} \
             (write one with `selectinfer_profile`, or give `ranking`)",
            inside.display(),
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
