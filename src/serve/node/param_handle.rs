//! The parameter handler r2r drives ([`ParamHandle`]): get, set, list
//! and describe over the node's typed parameters ([`super::params`]),
//! runtime changes applied to the managed server ([`super::lifecycle`])
//! and kept in the runtime parameters file; invalid or load-time changes
//! refused with a reason.

use super::lifecycle::Managed;
use super::param_specs::{spec_of, within, Spec, PARAMETERS};
use super::params::{set_float_range, NodeParams};
use anyhow::{bail, Context, Result};
use r2r::rcl_interfaces::msg::ParameterDescriptor;
use r2r::{Parameter, ParameterValue, RosParams};
use std::sync::Arc;

/// The parameter handler r2r drives: serves get/set/list/describe and
/// applies runtime changes to the server, refusing invalid or load-time
/// changes with a reason.
pub struct ParamHandle {
    pub params: NodeParams,
    pub server: Arc<Managed>,
}

fn refuse(name: &str, msg: impl std::fmt::Display) -> r2r::Error {
    r2r::Error::ParameterRefused {
        name: name.to_string(),
        msg: msg.to_string(),
    }
}

impl ParamHandle {
    /// The handler of a node started with `overrides` (as a parameters
    /// file gives them), unconfigured: no ROS, and no model until
    /// `server.transition(..)` configures it. What r2r drives through
    /// [`RosParams`]; public for the parameter fuzz tests.
    pub fn from_overrides(overrides: &[(String, ParameterValue)]) -> Result<Self> {
        let given: Vec<(String, Parameter)> = overrides
            .iter()
            .map(|(name, v)| (name.clone(), Parameter::new(v.clone())))
            .collect();
        let params = NodeParams::from_overrides(given.iter().map(|(n, p)| (n, p)))?;
        Ok(Self {
            server: Arc::new(Managed::new(params.clone())),
            params,
        })
    }

    /// The parameters after setting `name` to `v` at runtime, or why not:
    /// read-only and out-of-range as [`NodeParams::descriptor`] says, then
    /// the parameter's own parsing and the server's cross-checks.
    /// `spec`'s descriptor on this node, which runtime sets are checked
    /// against: [`NodeParams::descriptor`], narrowed once the model is
    /// loaded to what the server takes ([`Managed::bounds`]): φ within
    /// `[δ, γ]` as loaded (a memory budget may have chosen γ),
    /// `max_new_tokens` below the context, `task` one of those planned.
    pub(super) fn descriptor(&self, spec: &Spec) -> ParameterDescriptor {
        let mut d = self.params.descriptor(spec);
        let Some(b) = self.server.bounds() else {
            return d;
        };
        match spec.name {
            "compute_ratio" => {
                if let Some((lo, hi)) = b.compute_ratio {
                    set_float_range(&mut d, lo, hi);
                }
            }
            "max_new_tokens" => {
                if let Some(r) = d.integer_range.first_mut() {
                    r.to_value = r.to_value.min(b.max_context as i64 - 1);
                }
            }
            "task" => d.additional_constraints = format!("one of: {}", b.tasks.join(", ")),
            _ => {}
        }
        d
    }

    fn try_set(&self, name: &str, v: &ParameterValue) -> Result<NodeParams> {
        if name == "use_sim_time" {
            bail!("use_sim_time is read at start-up only (-p use_sim_time:=true, or launch's use_sim_time:=true)");
        }
        let Some(spec) = spec_of(name) else {
            bail!("unknown parameter `{name}`");
        };
        if let Some(why) = self.params.read_only(spec) {
            if self.params.get(name).as_ref() == Some(v) {
                return Ok(self.params.clone());
            }
            bail!("{name} is read-only: {why}");
        }
        within(&self.descriptor(spec), v).with_context(|| match name {
            "compute_ratio" => {
                "compute_ratio lies between static_ratio and load_ratio as loaded".into()
            }
            "max_new_tokens" => "max_new_tokens is below the context the node serves".into(),
            _ => format!("the range of {name}"),
        })?;
        let mut next = self.params.clone();
        next.set(name, v)?;
        Ok(next)
    }
}

impl RosParams for ParamHandle {
    fn describe_parameter(&self, name: &str) -> Option<ParameterDescriptor> {
        spec_of(name).map(|spec| self.descriptor(spec))
    }

    fn register_parameters(
        &mut self,
        _prefix: &str,
        _param: Option<Parameter>,
        params: &mut r2r::indexmap::IndexMap<String, Parameter>,
    ) -> r2r::Result<()> {
        for spec in PARAMETERS {
            let value = self.params.get(spec.name).expect("listed parameter");
            let description = spec.help;
            params.insert(spec.name.to_string(), Parameter { value, description });
        }
        Ok(())
    }

    fn get_parameter(&mut self, name: &str) -> r2r::Result<ParameterValue> {
        self.params
            .get(name)
            .ok_or_else(|| r2r::Error::InvalidParameterName { name: name.into() })
    }

    fn set_parameter(&mut self, name: &str, v: &ParameterValue) -> r2r::Result<()> {
        let next = self
            .try_set(name, v)
            .map_err(|e| refuse(name, format!("{e:#}")))?;
        self.server
            .update_settings(next.runtime.clone(), &next)
            .map_err(|e| refuse(name, format!("{e:#}")))?;
        log::info!("parameter {name} set to {v:?} (applies to the next request)");
        self.params = next;
        if let Err(e) = self.params.write_runtime_file() {
            log::warn!("{e:#}");
        }
        Ok(())
    }

    fn check_parameter(&self, name: &str, v: &ParameterValue) -> r2r::Result<()> {
        self.try_set(name, v)
            .map(|_| ())
            .map_err(|e| refuse(name, format!("{e:#}")))
    }
}
