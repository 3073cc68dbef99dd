//! A catalog model's preset: `config/models/<name>.yaml`, a ROS parameters
//! file (`/**: ros__parameters:`) written by `selectinfer tune` that holds
//! the knobs measured best for that model (dtype, mode, ratios, screen …).
//! The node lays it over its defaults and under the user's own parameters;
//! the CLI under the flags given. Every key is a node parameter and the
//! flag of the same name (`load_ratio` ↔ `--load-ratio`).

use super::installed;
use crate::sys::device::WeightDtype;
use anyhow::{bail, Context, Result};
use serde_yaml::Value;
use std::path::{Path, PathBuf};

/// Where presets live (installed share folder, source tree).
pub const DIR: &str = "config/models";

/// The keys a preset may set: the model's knobs, not the node's plumbing.
pub const KEYS: &[&str] = &[
    "dtype",
    "mode",
    "load_ratio",
    "static_ratio",
    "compute_ratio",
    "token_ratio",
    "score",
    "gate_keep",
    "vocab",
    "head_screen",
    "head_screen_bits",
    "head_in_file",
    "dense_layers",
    "layer_drop",
    "coarse_ratio",
    "coarse_bits",
    "kv_dtype",
];

/// A preset as read: its file and its `(key, value)` pairs in file order.
#[derive(Debug, Clone)]
pub struct Preset {
    pub path: PathBuf,
    pub values: Vec<(String, Value)>,
}

impl Preset {
    /// The installed preset of the model named `name`, if there is one.
    pub fn for_model(name: &str) -> Result<Option<Self>> {
        match installed::find(DIR, &format!("{name}.yaml")) {
            Ok(path) => Self::load(&path).map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Reads a preset file; a key outside [`KEYS`] is an error naming it.
    pub(crate) fn load(path: &Path) -> Result<Self> {
        let values = ros_parameters(path, "preset")?;
        for (key, _) in &values {
            if !KEYS.contains(&key.as_str()) {
                bail!(
                    "the preset {} sets `{key}`, which is not a model knob (a preset may set: {})",
                    path.display(),
                    KEYS.join(", ")
                );
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            values,
        })
    }

    /// The value of `key` as a command-line flag's text (lists
    /// comma-separated), if the preset sets it.
    pub fn flag_text(&self, key: &str) -> Option<String> {
        self.values
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| flag_text(v))
    }
}

/// The dtype the catalog model `name` is served in: its preset's `dtype`,
/// else the CLI's default.
pub(crate) fn serving_dtype(name: &str) -> Result<WeightDtype> {
    let Some(preset) = Preset::for_model(name)? else {
        return Ok(crate::engine::defaults::CLI.dtype);
    };
    match preset.flag_text("dtype") {
        Some(text) => crate::sys::named::parse(&text)
            .with_context(|| format!("the `dtype` of the preset {}", preset.path.display())),
        None => Ok(crate::engine::defaults::CLI.dtype),
    }
}

/// What preparing the catalog model `name` keeps: the checkpoint of the
/// dtype its preset runs in (every format when `all`).
pub fn keep_for_serving(name: &str, all: bool) -> Result<super::prepare::Keep> {
    match all {
        true => Ok(super::prepare::Keep::All),
        false => Ok(super::prepare::Keep::Only(serving_dtype(name)?)),
    }
}

/// A YAML value as a flag's text: scalars as written, lists comma-separated.
pub(crate) fn flag_text(v: &Value) -> String {
    match v {
        Value::Sequence(items) => items.iter().map(flag_text).collect::<Vec<_>>().join(","),
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => serde_yaml::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_string(),
    }
}

/// Writes a preset: `header` lines as `# ` comments, then the values
/// (keys outside [`KEYS`] refused). Atomic: a temporary file renamed.
pub(crate) fn write(path: &Path, header: &[String], values: &[(String, Value)]) -> Result<()> {
    let mut text = String::new();
    for line in header {
        text.push_str(&format!("# {line}\n").replace("# \n", "#\n"));
    }
    text.push_str("/**:\n  ros__parameters:\n");
    for (k, v) in values {
        if !KEYS.contains(&k.as_str()) {
            bail!("a preset cannot set `{k}` (only {})", KEYS.join(", "));
        }
        let v = match v {
            Value::Sequence(items) => format!(
                "[{}]",
                items.iter().map(flag_text).collect::<Vec<_>>().join(", ")
            ),
            other => serde_yaml::to_string(other)?.trim().to_string(),
        };
        text.push_str(&format!("    {k}: {v}\n"));
    }
    let tmp = path.with_extension("yaml.partial");
    std::fs::write(&tmp, &text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Preset::load(path).map(|_| ())
}

/// The `(key, value)` pairs of a ROS parameters file's `/**:
/// ros__parameters:` mapping, in file order; `what` names the file in
/// errors ("preset", "runtime parameters file").
pub(crate) fn ros_parameters(path: &Path, what: &str) -> Result<Vec<(String, Value)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the {what} {}", path.display()))?;
    let yaml: Value = serde_yaml::from_str(&text)
        .with_context(|| format!("parsing the {what} {}", path.display()))?;
    let params = yaml
        .get("/**")
        .and_then(|n| n.get("ros__parameters"))
        .and_then(Value::as_mapping)
        .with_context(|| {
            format!(
                "the {what} {} has no `/**: ros__parameters:` mapping",
                path.display()
            )
        })?;
    params
        .iter()
        .map(|(k, v)| {
            let key = k.as_str().with_context(|| {
                format!("the {what} {} has a key that is not text", path.display())
            })?;
            Ok((key.to_string(), v.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_preset_reads_back_and_a_foreign_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.yaml");
        let values = vec![
            ("dtype".to_string(), Value::String("q4".into())),
            (
                "load_ratio".to_string(),
                serde_yaml::from_str("0.9").unwrap(),
            ),
            (
                "dense_layers".to_string(),
                serde_yaml::from_str("[0, -1]").unwrap(),
            ),
        ];
        write(&path, &["made by a test".into(), String::new()], &values).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# made by a test\n#\n/**:"), "{text}");
        let p = Preset::load(&path).unwrap();
        assert_eq!(p.values, values);
        assert_eq!(p.flag_text("dense_layers").as_deref(), Some("0,-1"));
        assert_eq!(p.flag_text("load_ratio").as_deref(), Some("0.9"));
        assert_eq!(p.flag_text("mode"), None);
        std::fs::write(&path, "/**:\n  ros__parameters:\n    queue_depth: 3\n").unwrap();
        let e = format!("{:#}", Preset::load(&path).unwrap_err());
        assert!(
            e.contains("sets `queue_depth`, which is not a model knob") && e.contains("m.yaml"),
            "{e}"
        );
        std::fs::write(&path, "model: x\n").unwrap();
        let e = format!("{:#}", Preset::load(&path).unwrap_err());
        assert!(e.contains("no `/**: ros__parameters:` mapping"), "{e}");
        let e = write(&path, &[], &[("threads".into(), Value::Null)]).unwrap_err();
        assert!(e.to_string().contains("cannot set `threads`"), "{e}");
    }

    /// Every catalog model has a committed preset: known keys only, written
    /// by `selectinfer tune` (its command in the header), served in q4.
    #[test]
    fn the_committed_presets_are_valid() {
        for e in crate::store::prepare::CATALOG {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(DIR)
                .join(format!("{}.yaml", e.name));
            let p = Preset::load(&path).unwrap_or_else(|err| panic!("{err:#}"));
            assert!(
                p.flag_text("dtype").is_some(),
                "{}: no dtype",
                path.display()
            );
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                text.contains("# command: selectinfer") && text.contains(" tune --model "),
                "{}: not written by `selectinfer tune` (no command in its header)",
                path.display()
            );
            assert_eq!(
                serving_dtype(e.name).unwrap(),
                WeightDtype::Q4,
                "{}",
                e.name
            );
        }
    }
}
