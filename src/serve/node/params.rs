//! The node's ROS parameters (`config/node.yaml`): parsing, validation and
//! runtime changes. Load-time parameters are read once at start-up; runtime
//! ones (φ, α, sampling, max tokens) go to the server for the next request.

use super::param_specs::{spec_of, Spec, PARAMETERS};
use super::runtime_file;
use crate::engine::defaults;
use crate::engine::EngineSpec;
use crate::method::params::resolve_layers;
use crate::method::Mode;
use crate::method::SelectionParams;
use crate::model::head_screen::ScreenBits;
use crate::model::Config;
use crate::serve::server::{RuntimeSettings, ServerConfig};
use crate::store::home::{self, Missing};
use crate::store::installed;
use crate::store::preset::Preset;
use anyhow::{bail, Context, Result};
use r2r::rcl_interfaces::msg::ParameterDescriptor;
use r2r::{Parameter, ParameterValue};
use std::path::{Path, PathBuf};

/// All node parameters, typed.
#[derive(Debug, Clone)]
pub struct NodeParams {
    /// `model` as given: a catalog name or a folder (`engine.model` is
    /// the folder it resolved to).
    pub model: String,
    /// The preset laid under the user's parameters, if the model has one.
    pub preset: Option<PathBuf>,
    pub engine: EngineSpec,
    /// As given (negative = from the end), for `get_parameter`.
    pub dense_layers_raw: Vec<i64>,
    pub runtime: RuntimeSettings,
    pub queue_depth: usize,
    pub instruction_topic: String,
    pub diagnostics_period_s: f64,
    pub reply_pace_ms: f64,
    /// Seconds a finished action goal's result is kept.
    pub goal_result_timeout_s: f64,
    /// Compute threads (0 = one per core).
    pub threads: usize,
    /// Configure and activate at start-up.
    pub autostart: bool,
    /// Where runtime changes are kept ("" = nowhere); see [`runtime_file`].
    pub runtime_params_file: String,
}

impl Default for NodeParams {
    /// [`defaults::NODE`] and the node-only defaults (`config/node.yaml`
    /// states the same values; a test holds them together).
    fn default() -> Self {
        let d = defaults::NODE;
        Self {
            model: d.model.into(),
            preset: None,
            engine: d.engine_spec(),
            dense_layers_raw: d.dense_layers.to_vec(),
            runtime: RuntimeSettings {
                max_new_tokens: d.max_new_tokens,
                sampling: d.sampling(),
                compute_ratio: d.compute_ratio,
                token_ratio: d.token_ratio,
                task: d.task.into(),
                system_prompt: defaults::SYSTEM_PROMPT.into(),
                prefix_cache: defaults::PREFIX_CACHE,
            },
            queue_depth: defaults::QUEUE_DEPTH,
            instruction_topic: defaults::INSTRUCTION_TOPIC.into(),
            diagnostics_period_s: defaults::DIAGNOSTICS_PERIOD_S,
            reply_pace_ms: defaults::REPLY_PACE_MS,
            goal_result_timeout_s: defaults::GOAL_RESULT_TIMEOUT_S,
            threads: defaults::THREADS,
            autostart: defaults::AUTOSTART,
            runtime_params_file: defaults::RUNTIME_PARAMS_FILE.into(),
        }
    }
}

fn float(name: &str, v: &ParameterValue) -> Result<f64> {
    match v {
        ParameterValue::Double(x) => Ok(*x),
        ParameterValue::Integer(x) => Ok(*x as f64),
        other => bail!("parameter {name} must be a number, got {other:?}"),
    }
}

fn int(name: &str, v: &ParameterValue) -> Result<i64> {
    match v {
        ParameterValue::Integer(x) => Ok(*x),
        other => bail!("parameter {name} must be an integer, got {other:?}"),
    }
}

fn boolean(name: &str, v: &ParameterValue) -> Result<bool> {
    match v {
        ParameterValue::Bool(b) => Ok(*b),
        other => bail!("parameter {name} must be true or false, got {other:?}"),
    }
}

fn string(name: &str, v: &ParameterValue) -> Result<String> {
    match v {
        ParameterValue::String(s) => Ok(s.clone()),
        other => bail!("parameter {name} must be a string, got {other:?}"),
    }
}

/// A preset's YAML value as the parameter value a parameters file gives.
fn yaml_value(v: &serde_yaml::Value) -> Result<ParameterValue> {
    use serde_yaml::Value as Y;
    Ok(match v {
        Y::Bool(b) => ParameterValue::Bool(*b),
        Y::Number(n) if n.is_f64() => ParameterValue::Double(n.as_f64().unwrap_or(f64::NAN)),
        Y::Number(n) => ParameterValue::Integer(n.as_i64().context("an integer out of range")?),
        Y::String(s) => ParameterValue::String(s.clone()),
        Y::Sequence(xs) if xs.iter().all(|x| x.is_i64()) => {
            ParameterValue::IntegerArray(xs.iter().filter_map(|x| x.as_i64()).collect())
        }
        Y::Sequence(xs) => ParameterValue::DoubleArray(
            xs.iter()
                .map(|x| x.as_f64().context("a list of numbers"))
                .collect::<Result<_>>()?,
        ),
        other => bail!("no parameter form for {other:?}"),
    })
}

fn positive_usize(name: &str, v: &ParameterValue) -> Result<usize> {
    let n = int(name, v)?;
    if n < 1 {
        bail!("parameter {name} must be >= 1, got {n}");
    }
    Ok(n as usize)
}

/// An integer parameter where 0 means "not set"; negative ones are refused.
fn non_negative(name: &str, v: &ParameterValue) -> Result<Option<u64>> {
    let n = int(name, v)?;
    if n < 0 {
        bail!("parameter {name} must be >= 0 (0 = not set), got {n}");
    }
    Ok((n > 0).then_some(n as u64))
}

impl NodeParams {
    /// Reads the parameters the node was started with (`--params-file`,
    /// `-p name:=value`) over the model's preset (`config/models/NAME.yaml`,
    /// if the model has one) over the defaults: the user's own parameters
    /// win over the preset, the preset over the defaults. Then resolves the
    /// model (a catalog model missing from the models home is prepared)
    /// and its ranking. Unknown names are errors.
    pub(crate) fn from_overrides<'a>(
        overrides: impl IntoIterator<Item = (&'a String, &'a Parameter)>,
    ) -> Result<Self> {
        let overrides: Vec<_> = overrides
            .into_iter()
            .filter(|(name, _)| name.as_str() != "use_sim_time")
            .collect();
        let mut p = Self::default();
        if let Some((name, param)) = overrides.iter().find(|(n, _)| n.as_str() == "model") {
            p.set(name, &param.value)?;
        }
        if let Some(entry) = home::catalog_of(&p.model) {
            if let Some(preset) = Preset::for_model(entry.name)? {
                for (name, v) in &preset.values {
                    yaml_value(v)
                        .and_then(|v| p.set(name, &v))
                        .with_context(|| format!("the preset {}", preset.path.display()))?;
                }
                p.preset = Some(preset.path);
            }
        }
        for (name, param) in overrides {
            p.set(name, &param.value)?;
        }
        p.read_runtime_file()?;
        p.resolve_model()?;
        p.resolve_dense_layers()?;
        p.engine.params.compute_ratio = p.runtime.compute_ratio;
        p.engine.params.token_ratio = p.runtime.token_ratio;
        Ok(p)
    }

    /// Lays the values kept in `runtime_params_file` (if it exists) over
    /// the rest: what was set at runtime before a respawn. A key there
    /// that is not a runtime parameter is an error naming the file.
    fn read_runtime_file(&mut self) -> Result<()> {
        if self.runtime_params_file.is_empty() {
            return Ok(());
        }
        let path = PathBuf::from(&self.runtime_params_file);
        let Some(kept) = runtime_file::read(&path)? else {
            return Ok(());
        };
        let context = || format!("the runtime parameters file {}", path.display());
        for (name, v) in &kept {
            if !spec_of(name).is_some_and(|s| s.runtime) {
                bail!("{}: `{name}` is not a runtime parameter", context());
            }
            yaml_value(v)
                .and_then(|v| self.set(name, &v))
                .with_context(context)?;
        }
        let names: Vec<&str> = kept.iter().map(|(n, _)| n.as_str()).collect();
        log::info!(
            "runtime parameters kept in {}: {}",
            path.display(),
            names.join(", ")
        );
        Ok(())
    }

    /// Writes every runtime parameter's value to `runtime_params_file`
    /// (when set).
    pub(super) fn write_runtime_file(&self) -> Result<()> {
        if self.runtime_params_file.is_empty() {
            return Ok(());
        }
        let values: Vec<(&str, ParameterValue)> = PARAMETERS
            .iter()
            .filter(|s| s.runtime)
            .filter_map(|s| Some((s.name, self.get(s.name)?)))
            .collect();
        runtime_file::write(Path::new(&self.runtime_params_file), &values)
    }

    /// Resolves `model` to a folder (preparing a catalog model missing from
    /// the models home) and, for a selective mode without an explicit
    /// `ranking`, finds the model's installed ranking.
    fn resolve_model(&mut self) -> Result<()> {
        let e = &mut self.engine;
        let model =
            home::resolve(&self.model, e.dtype, Missing::Prepare).context("parameter model")?;
        e.model = model.folder.clone();
        if e.ranking.is_none() && e.mode != Mode::Dense {
            e.ranking = Some(
                installed::ranking(&model.folder, &model.name()).context("parameter ranking")?,
            );
        }
        Ok(())
    }

    /// Turns negative dense layer indices into layer numbers (needs the
    /// model's config).
    fn resolve_dense_layers(&mut self) -> Result<()> {
        let n = Config::from_file(&self.engine.model.join("config.json"))?.num_hidden_layers;
        self.engine.params.dense_layers =
            resolve_layers(&self.dense_layers_raw, n).context("parameter dense_layers")?;
        Ok(())
    }

    /// Sets one parameter by name (type- and range-checked, not yet
    /// cross-validated).
    pub(super) fn set(&mut self, name: &str, v: &ParameterValue) -> Result<()> {
        if let Some(spec) = spec_of(name) {
            spec.check(v)?;
        }
        let e = &mut self.engine;
        match name {
            "model" => self.model = string(name, v)?,
            "ranking" => {
                let s = string(name, v)?;
                e.ranking = (!s.is_empty()).then(|| PathBuf::from(s));
            }
            "task" => {
                e.params.task = string(name, v)?;
                self.runtime.task = e.params.task.clone();
            }
            "mode" => {
                let s = string(name, v)?;
                e.mode = s.parse().context("parameter mode")?;
            }
            "load_ratio" => e.params.load_ratio = float(name, v)?,
            "static_ratio" => e.params.static_ratio = float(name, v)?,
            "compute_ratio" => self.runtime.compute_ratio = float(name, v)?,
            "token_ratio" => self.runtime.token_ratio = float(name, v)?,
            "score" => {
                let s = string(name, v)?;
                e.params.score = s.parse().context("parameter score")?;
            }
            "gate_keep" => e.params.gate_keep = float(name, v)?,
            "coarse_ratio" => e.params.coarse_ratio = float(name, v)?,
            "coarse_bits" => {
                e.params.coarse_bits =
                    u32::try_from(int(name, v)?).context("parameter coarse_bits")?
            }
            "layer_drop" => {
                e.params.layer_drop = match v {
                    ParameterValue::DoubleArray(a) => a.clone(),
                    ParameterValue::IntegerArray(a) => a.iter().map(|&x| x as f64).collect(),
                    ParameterValue::String(s) => comma_list(name, s, "numbers")?,
                    // rcl reads `[]` in a parameters file (as `ros2 param
                    // dump` writes an empty list) as no value.
                    ParameterValue::NotSet => Vec::new(),
                    other => bail!("parameter layer_drop must be a list of numbers, got {other:?}"),
                }
            }
            "vocab" => {
                let s = string(name, v)?;
                e.vocab = s.parse().context("parameter vocab")?;
            }
            "head_screen" => e.head_screen = non_negative(name, v)?.unwrap_or(0) as usize,
            "head_screen_bits" => {
                e.head_screen_bits =
                    ScreenBits::from_bits(int(name, v)?).context("parameter head_screen_bits")?;
            }
            "head_in_file" => e.head_in_file = boolean(name, v)?,
            "dense_layers" => {
                self.dense_layers_raw = match v {
                    ParameterValue::IntegerArray(a) => a.clone(),
                    ParameterValue::Integer(x) => vec![*x],
                    ParameterValue::String(s) => comma_list(name, s, "integers")?,
                    ParameterValue::NotSet => Vec::new(),
                    other => {
                        bail!("parameter dense_layers must be a list of integers, got {other:?}")
                    }
                }
            }
            "plan_seed" => e.plan_seed = int(name, v)?.max(0) as u64,
            "dtype" => {
                let s = string(name, v)?;
                e.dtype = s.parse().context("parameter dtype")?;
            }
            "device" => e.device = string(name, v)?,
            "prefill_chunk" => e.prefill_chunk = positive_usize(name, v)?,
            "max_context" => e.max_context = non_negative(name, v)?.map(|n| n as usize),
            "kv_dtype" => {
                let s = string(name, v)?;
                e.kv_dtype = s.parse().context("parameter kv_dtype")?;
            }
            "memory_budget_mb" => e.memory_budget_mb = non_negative(name, v)?,
            "max_new_tokens" => self.runtime.max_new_tokens = positive_usize(name, v)?,
            "temperature" => self.runtime.sampling.temperature = float(name, v)?,
            "top_p" => self.runtime.sampling.top_p = float(name, v)?,
            "seed" => {
                let s = int(name, v)?;
                if s < 0 {
                    bail!("parameter seed must be >= 0, got {s}");
                }
                self.runtime.sampling.seed = s as u64;
            }
            "system_prompt" => self.runtime.system_prompt = string(name, v)?,
            "prefix_cache" => self.runtime.prefix_cache = boolean(name, v)?,
            "threads" => self.threads = non_negative(name, v)?.unwrap_or(0) as usize,
            "autostart" => self.autostart = boolean(name, v)?,
            "runtime_params_file" => self.runtime_params_file = string(name, v)?,
            "queue_depth" => self.queue_depth = positive_usize(name, v)?,
            "reply_pace_ms" => self.reply_pace_ms = float(name, v)?,
            "instruction_topic" => self.instruction_topic = string(name, v)?,
            "diagnostics_period_s" => {
                let s = float(name, v)?;
                if !(s > 0.0 && s.is_finite()) {
                    bail!("parameter diagnostics_period_s must be > 0, got {s}");
                }
                self.diagnostics_period_s = s;
            }
            "goal_result_timeout_s" => self.goal_result_timeout_s = float(name, v)?,
            _ => bail!(
                "unknown parameter `{name}`; known: {}",
                PARAMETERS
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
        Ok(())
    }

    /// The current value of parameter `name`.
    pub(super) fn get(&self, name: &str) -> Option<ParameterValue> {
        let e = &self.engine;
        let r = &self.runtime;
        Some(match name {
            "model" => ParameterValue::String(self.model.clone()),
            "ranking" => ParameterValue::String(
                e.ranking
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            ),
            "task" => ParameterValue::String(e.params.task.clone()),
            "mode" => ParameterValue::String(e.mode.name().into()),
            "load_ratio" => ParameterValue::Double(e.params.load_ratio),
            "static_ratio" => ParameterValue::Double(e.params.static_ratio),
            "compute_ratio" => ParameterValue::Double(r.compute_ratio),
            "token_ratio" => ParameterValue::Double(r.token_ratio),
            "score" => ParameterValue::String(e.params.score.name().into()),
            "gate_keep" => ParameterValue::Double(e.params.gate_keep),
            "coarse_ratio" => ParameterValue::Double(e.params.coarse_ratio),
            "coarse_bits" => ParameterValue::Integer(e.params.coarse_bits as i64),
            "layer_drop" => ParameterValue::DoubleArray(e.params.layer_drop.clone()),
            "vocab" => ParameterValue::String(e.vocab.name().into()),
            "head_screen" => ParameterValue::Integer(e.head_screen as i64),
            "head_screen_bits" => ParameterValue::Integer(e.head_screen_bits.bits() as i64),
            "head_in_file" => ParameterValue::Bool(e.head_in_file),
            "dense_layers" => ParameterValue::IntegerArray(self.dense_layers_raw.clone()),
            "plan_seed" => ParameterValue::Integer(e.plan_seed as i64),
            "dtype" => ParameterValue::String(e.dtype.name().into()),
            "device" => ParameterValue::String(e.device.clone()),
            "prefill_chunk" => ParameterValue::Integer(e.prefill_chunk as i64),
            "max_context" => ParameterValue::Integer(e.max_context.unwrap_or(0) as i64),
            "kv_dtype" => ParameterValue::String(e.kv_dtype.name().into()),
            "memory_budget_mb" => ParameterValue::Integer(e.memory_budget_mb.unwrap_or(0) as i64),
            "max_new_tokens" => ParameterValue::Integer(r.max_new_tokens as i64),
            "temperature" => ParameterValue::Double(r.sampling.temperature),
            "top_p" => ParameterValue::Double(r.sampling.top_p),
            "seed" => ParameterValue::Integer(r.sampling.seed as i64),
            "system_prompt" => ParameterValue::String(r.system_prompt.clone()),
            "prefix_cache" => ParameterValue::Bool(r.prefix_cache),
            "threads" => ParameterValue::Integer(self.threads as i64),
            "autostart" => ParameterValue::Bool(self.autostart),
            "runtime_params_file" => ParameterValue::String(self.runtime_params_file.clone()),
            "queue_depth" => ParameterValue::Integer(self.queue_depth as i64),
            "reply_pace_ms" => ParameterValue::Double(self.reply_pace_ms),
            "instruction_topic" => ParameterValue::String(self.instruction_topic.clone()),
            "diagnostics_period_s" => ParameterValue::Double(self.diagnostics_period_s),
            "goal_result_timeout_s" => ParameterValue::Double(self.goal_result_timeout_s),
            _ => return None,
        })
    }

    pub(crate) fn server_config(&self) -> ServerConfig {
        ServerConfig {
            engine: self.engine.clone(),
            queue_depth: self.queue_depth,
            defaults: self.runtime.clone(),
        }
    }

    /// One line describing what the node serves.
    pub(crate) fn summary(&self) -> String {
        let e = &self.engine;
        let p: &SelectionParams = &e.params;
        let layer_drop = if p.layer_drop.is_empty() {
            "even".to_string()
        } else {
            format!("{:?}", p.layer_drop)
        };
        let preset = self.preset.as_ref().map_or("no preset".to_string(), |p| {
            format!("preset {}", p.display())
        });
        format!(
            "model {} in {} ({preset}; {:?}, {}), mode {}, task {}, γ={} δ={} φ={} α={}, score {}, \
             gate_keep {}, vocab {}, head_screen {} ({}-bit{}), dense layers {:?}, layer_drop {layer_drop}, \
             coarse_ratio {} ({}-bit), queue_depth {}",
            self.model,
            e.model.display(),
            e.dtype,
            e.device,
            e.mode.name(),
            p.task,
            p.load_ratio,
            p.static_ratio,
            self.runtime.compute_ratio,
            self.runtime.token_ratio,
            p.score,
            p.gate_keep,
            e.vocab,
            e.head_screen,
            e.head_screen_bits,
            if e.head_in_file { ", head in file" } else { "" },
            p.dense_layers,
            p.coarse_ratio,
            p.coarse_bits,
            self.queue_depth
        )
    }
}

impl NodeParams {
    /// Why `spec` cannot change at runtime on this node, if it cannot: a
    /// load-time parameter, or φ and α in a mode that computes every
    /// loaded neuron.
    pub(super) fn read_only(&self, spec: &Spec) -> Option<String> {
        let mode = self.engine.mode;
        match spec.name {
            _ if !spec.runtime => Some(
                "read at start-up only; change it in the parameters file and restart the node"
                    .into(),
            ),
            "compute_ratio" | "token_ratio" if !mode.selects() => Some(format!(
                "mode {} computes every loaded neuron (compute_ratio and token_ratio apply to selectinfer, coreinfer and random-load)",
                mode.name()
            )),
            _ => None,
        }
    }

    /// `spec`'s descriptor on this node, which runtime sets are checked
    /// against: read-only as [`NodeParams::read_only`] says (the reason
    /// appended to the description), compute_ratio at most load_ratio.
    pub(super) fn descriptor(&self, spec: &Spec) -> ParameterDescriptor {
        let mut d = spec.descriptor();
        if let Some(why) = self.read_only(spec) {
            d.read_only = true;
            if spec.runtime {
                d.description = format!("{}; read-only here: {why}", d.description);
            }
        }
        if spec.name == "compute_ratio" {
            let p = &self.engine.params;
            set_float_range(&mut d, p.static_ratio, p.load_ratio);
        }
        d
    }
}

/// A list parameter given as a string: comma-separated values, "" = none
/// (ROS 2's YAML parser refuses an empty list, so "" stands for one).
fn comma_list<T: std::str::FromStr>(name: &str, s: &str, what: &str) -> Result<Vec<T>> {
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|x| x.trim().parse::<T>().ok())
        .collect::<Option<_>>()
        .with_context(|| format!("parameter {name}: `{s}` is not a list of {what}"))
}

/// A float descriptor's range as `[lo, hi]`, `lo` no lower than the
/// spec's own bound (φ > 0 even where δ is 0).
pub(super) fn set_float_range(d: &mut ParameterDescriptor, lo: f64, hi: f64) {
    if let Some(r) = d.floating_point_range.first_mut() {
        r.from_value = r.from_value.max(lo);
        r.to_value = hi;
    }
}

#[cfg(test)]
mod tests;
