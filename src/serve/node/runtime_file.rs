//! The file a node keeps its runtime parameter changes in
//! (`runtime_params_file`): a parameters file (`/**: ros__parameters:`)
//! rewritten, atomically, on every accepted set and read back at start-up,
//! so a node respawned by launch keeps what `ros2 param set` changed.

use crate::store::preset::ros_parameters;
use anyhow::{Context, Result};
use r2r::ParameterValue;
use serde_yaml::{Mapping, Value};
use std::path::Path;

/// The kept `(name, value)` pairs; `None` when the file does not exist
/// (a first start).
pub(super) fn read(path: &Path) -> Result<Option<Vec<(String, Value)>>> {
    if !path.exists() {
        return Ok(None);
    }
    ros_parameters(path, "runtime parameters file").map(Some)
}

/// Writes `values` (scalars: the runtime parameters are) as a parameters
/// file; a temporary file renamed, so a kill mid-write leaves the last one.
pub(super) fn write(path: &Path, values: &[(&str, ParameterValue)]) -> Result<()> {
    let mut params = Mapping::new();
    for (name, v) in values {
        let v = match v {
            ParameterValue::Bool(b) => Value::from(*b),
            ParameterValue::Integer(x) => Value::from(*x),
            ParameterValue::Double(x) => Value::from(*x),
            ParameterValue::String(s) => Value::from(s.clone()),
            other => anyhow::bail!("runtime parameter {name}: no file form for {other:?}"),
        };
        params.insert(Value::from(*name), v);
    }
    let mut node = Mapping::new();
    node.insert("ros__parameters".into(), Value::Mapping(params));
    let mut top = Mapping::new();
    top.insert("/**".into(), Value::Mapping(node));
    let text = format!(
        "# Runtime parameters of a selectinfer_node, kept across its restarts.\n{}",
        serde_yaml::to_string(&Value::Mapping(top))?
    );
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating {} for runtime_params_file", dir.display()))?;
    }
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("writing the runtime parameters file {}", path.display()))
}
