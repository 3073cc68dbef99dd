//! The tool-call gate's thresholds as `eval` flags.

use clap::Args;
use selectinfer::engine::CallThresholds;

/// The tool-call rows' call gate thresholds (`CallGate`).
#[derive(Args, Debug, Clone, Copy)]
pub struct GateArgs {
    /// No call unless the call's share of the first token is at least this.
    #[arg(long, default_value_t = CallThresholds::TUNED.call)]
    pub min_call_p: f32,
    /// The first call taken back (text instead) unless the offered names
    /// hold this share of the model's own mass at the name (0: never).
    #[arg(long, default_value_t = CallThresholds::TUNED.name)]
    pub min_name_p: f32,
    /// After the first call, a second when its share is at least this
    /// (above 1: the model's arg-max).
    #[arg(long, default_value_t = CallThresholds::TUNED.more)]
    pub min_more_p: f32,
    /// The same after the second and later calls.
    #[arg(long, default_value_t = CallThresholds::TUNED.more_later)]
    pub min_more_p_later: f32,
}

impl GateArgs {
    pub fn thresholds(&self) -> CallThresholds {
        let (call, name) = (self.min_call_p, self.min_name_p);
        let (more, more_later) = (self.min_more_p, self.min_more_p_later);
        CallThresholds {
            call,
            name,
            more,
            more_later,
        }
    }
}
