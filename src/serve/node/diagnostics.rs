//! `/diagnostics`: the server's statistics as a `DiagnosticArray`, published
//! on a timer, stamped on the node's clock, named after the node's fully
//! qualified name (`/robot7/selectinfer_node: generation`).

use super::clock::NodeClock;
use super::lifecycle::Managed;
use super::param_handle::ParamHandle;
use super::params::NodeParams;
use crate::serve::server::Stats;
use r2r::{diagnostic_msgs, std_msgs, Publisher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(super) fn diagnostics(
    node_name: &str,
    stats: &Stats,
    params: &NodeParams,
    lifecycle: &str,
    now: Duration,
) -> diagnostic_msgs::msg::DiagnosticArray {
    use diagnostic_msgs::msg::{DiagnosticArray, DiagnosticStatus, KeyValue};
    let kv = |k: &str, v: String| KeyValue {
        key: k.into(),
        value: v,
    };
    let serving = lifecycle == "active";
    let full = serving && stats.queued >= stats.queue_capacity;
    let status = DiagnosticStatus {
        level: if full {
            DiagnosticStatus::WARN as u8
        } else {
            DiagnosticStatus::OK as u8
        },
        name: format!("{node_name}: generation"),
        message: match (serving, full, stats.busy) {
            (false, _, _) => format!("{lifecycle}: new requests are refused"),
            (true, true, _) => "queue full: new requests are rejected".into(),
            (true, false, true) => "generating".into(),
            (true, false, false) => "idle".into(),
        },
        hardware_id: params.engine.device.clone(),
        values: vec![
            kv("lifecycle_state", lifecycle.into()),
            kv("queue_depth", stats.queued.to_string()),
            kv("queue_capacity", stats.queue_capacity.to_string()),
            kv("busy", stats.busy.to_string()),
            kv("tokens_per_s", format!("{:.2}", stats.last_tokens_per_s)),
            kv("rss_bytes", stats.rss_bytes.to_string()),
            kv("peak_rss_bytes", stats.peak_rss_bytes.to_string()),
            kv("completed", stats.completed.to_string()),
            kv("failed", stats.failed.to_string()),
            kv("refused", stats.refused.to_string()),
            kv("rejected", stats.rejected.to_string()),
            kv("cancelled", stats.cancelled.to_string()),
            kv("mode", params.engine.mode.name().into()),
            kv("model", params.engine.model.display().to_string()),
        ],
    };
    DiagnosticArray {
        header: std_msgs::msg::Header {
            stamp: r2r::Clock::to_builtin_time(&now),
            frame_id: String::new(),
        },
        status: vec![status],
    }
}

/// Where and how the statistics go: `/diagnostics`, under the node's
/// fully qualified name, stamped on its clock.
pub(super) struct Diagnostics {
    pub publisher: Publisher<diagnostic_msgs::msg::DiagnosticArray>,
    pub node_name: String,
    pub clock: NodeClock,
}

/// Publishes the statistics on every tick of `timer`.
pub(super) async fn publish_on(
    mut timer: r2r::Timer,
    out: Diagnostics,
    server: Arc<Managed>,
    handle: Arc<Mutex<ParamHandle>>,
) {
    while timer.tick().await.is_ok() {
        let params = handle.lock().unwrap().params.clone();
        let state = server.state().label;
        let msg = diagnostics(
            &out.node_name,
            &server.stats(),
            &params,
            &state,
            out.clock.now(),
        );
        if let Err(e) = out.publisher.publish(&msg) {
            log::warn!("publishing diagnostics: {e}");
        }
    }
}
