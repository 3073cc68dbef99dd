//! The file a node keeps its runtime parameter changes in
//! (`runtime_params_file`): a parameters file (`/**: ros__parameters:`)
//! rewritten, atomically, on every accepted set and read back at start-up,
//! so a node respawned by launch keeps what `ros2 param set` changed.

use anyhow::{Context, Result};
use r2r::ParameterValue;
use serde_yaml::{Mapping, Value};
use std::path::Path;

/// The kept `(name, value)` pairs; `None` when the file does not exist
/// (a first start).
pub(super) fn read(path: &Path) -> Result<Option<Vec<(String, Value)>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("reading the runtime parameters file {}", path.display()))
        }
    };
    let yaml: Value = serde_yaml::from_str(&text)
        .with_context(|| format!("parsing the runtime parameters file {}", path.display()))?;
    let params = yaml
        .get("/**")
        .and_then(|n| n.get("ros__parameters"))
        .and_then(Value::as_mapping)
        .with_context(|| {
            format!(
                "the runtime parameters file {} has no `/**: ros__parameters:` mapping",
                path.display()
            )
        })?;
    params
        .iter()
        .map(|(k, v)| {
            let k = k.as_str().with_context(|| {
                format!(
                    "the runtime parameters file {} has a key that is not text",
                    path.display()
                )
            })?;
            Ok((k.to_string(), v.clone()))
        })
        .collect::<Result<_>>()
        .map(Some)
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
