//! Publishes a bag's prompts to a running `selectinfer_node` (at the recorded
//! timing or as fast as the node takes them) and collects the responses and
//! streamed tokens by request id.

use super::{ReplayReport, RequestRecord};
use crate::bag::{read_bag, BagMessage};
use anyhow::{bail, Context, Result};
use futures::{FutureExt, StreamExt};
use r2r::selectinfer_msgs::msg as si;
use r2r::{std_msgs, QosProfile, WrappedTypesupport};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use crate::bag::{PROMPT_TYPE, STRING_TYPE};

/// When prompts are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// At the recorded arrival times (scaled by `speed`).
    Recorded,
    /// As fast as the node takes them: at most `max_inflight` unanswered.
    Fast,
}

// The product's named-value rules (one parser, `Display`/`FromStr`),
// written out: its `impl_named!` macro is internal to that crate.
impl selectinfer::sys::named::Named for Timing {
    const WHAT: &'static str = "timing";
    const ALL: &'static [Self] = &[Self::Recorded, Self::Fast];
    fn name(self) -> &'static str {
        match self {
            Self::Recorded => "recorded",
            Self::Fast => "fast",
        }
    }
}

impl std::fmt::Display for Timing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(selectinfer::sys::named::Named::name(*self))
    }
}

impl std::str::FromStr for Timing {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        selectinfer::sys::named::parse(s)
    }
}

#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub bag: PathBuf,
    /// The node's fully qualified name, e.g. `/selectinfer_node`.
    pub node: String,
    /// Only these topics (empty: every topic of the bag).
    pub topics: Vec<String>,
    pub timing: Timing,
    pub speed: f64,
    pub max_inflight: usize,
    /// Give up on unanswered requests this long after the last one was sent.
    pub timeout_s: f64,
    pub limit: Option<usize>,
    /// Overrides each prompt's max_new_tokens (`None`: as recorded).
    pub max_new_tokens: Option<i32>,
    /// Called about every `PROGRESS_EVERY_S` while the replay runs, and at
    /// its end (`None`: silent).
    pub on_progress: Option<fn(&Progress)>,
}

/// Seconds between two progress reports of a replay.
pub const PROGRESS_EVERY_S: f64 = 5.0;

/// Where a running replay stands.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub elapsed_s: f64,
    pub planned: usize,
    pub sent: usize,
    /// Requests with a reply (answered or refused).
    pub replied: usize,
    pub rejected: usize,
    pub failed: usize,
}

/// A bag message turned into a prompt for the node.
struct Planned {
    at_s: f64,
    msg: si::Prompt,
}

/// Decodes the bag's prompts; unknown message types are errors.
fn plan(messages: Vec<BagMessage>, opts: &ReplayOptions) -> Result<Vec<Planned>> {
    let selected: Vec<BagMessage> = messages
        .into_iter()
        .filter(|m| opts.topics.is_empty() || opts.topics.contains(&m.topic))
        .collect();
    let unknown: HashSet<(String, String)> = selected
        .iter()
        .filter(|m| m.msg_type != PROMPT_TYPE && m.msg_type != STRING_TYPE)
        .map(|m| (m.topic.clone(), m.msg_type.clone()))
        .collect();
    if !unknown.is_empty() {
        let list: Vec<String> = unknown
            .iter()
            .map(|(t, ty)| format!("{t} ({ty})"))
            .collect();
        bail!(
            "bag {}: unsupported message type on {}; replay understands {PROMPT_TYPE} and {STRING_TYPE} (choose topics with --topic)",
            opts.bag.display(),
            list.join(", ")
        );
    }
    if selected.is_empty() {
        bail!("bag {}: no prompt messages to replay", opts.bag.display());
    }
    let t0 = selected[0].time_ns;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, m) in selected.iter().enumerate() {
        if opts.limit.is_some_and(|l| out.len() >= l) {
            break;
        }
        let ctx = || {
            format!(
                "bag {}: message {i} on {} is not a valid {}",
                opts.bag.display(),
                m.topic,
                m.msg_type
            )
        };
        let mut msg = if m.msg_type == PROMPT_TYPE {
            si::Prompt::from_serialized_bytes(&m.data).with_context(ctx)?
        } else {
            let s = std_msgs::msg::String::from_serialized_bytes(&m.data).with_context(ctx)?;
            si::Prompt {
                prompt: s.data,
                max_new_tokens: -1,
                temperature: -1.0,
                top_p: -1.0,
                seed: -1,
                ..Default::default()
            }
        };
        if msg.request_id.is_empty() {
            msg.request_id = format!("replay-{i:05}");
        }
        if !seen.insert(msg.request_id.clone()) {
            msg.request_id = format!("{}-{i}", msg.request_id);
            seen.insert(msg.request_id.clone());
        }
        if let Some(n) = opts.max_new_tokens {
            msg.max_new_tokens = n;
        }
        out.push(Planned {
            at_s: (m.time_ns - t0) as f64 / 1e9 / opts.speed,
            msg,
        });
    }
    Ok(out)
}

/// Replays the bag against the node and reports.
pub fn run(opts: &ReplayOptions) -> Result<ReplayReport> {
    if !(opts.speed > 0.0 && opts.speed.is_finite()) {
        bail!("--speed must be > 0, got {}", opts.speed);
    }
    if opts.max_inflight == 0 {
        bail!("--max-inflight must be at least 1");
    }
    let planned = plan(read_bag(&opts.bag)?, opts)?;
    let ctx = r2r::Context::create().context("creating the ROS context")?;
    let mut node = r2r::Node::create(
        ctx,
        &format!("selectinfer_replay_{}", std::process::id()),
        "",
    )?;
    let deep = QosProfile::default().keep_last(10_000);
    let publisher =
        node.create_publisher::<si::Prompt>(&format!("{}/prompt", opts.node), deep.clone())?;
    let mut responses =
        node.subscribe::<si::Response>(&format!("{}/response", opts.node), deep.clone())?;
    let mut tokens = node.subscribe::<si::Token>(&format!("{}/tokens", opts.node), deep)?;

    // Discovery: the node must subscribe to our prompts; then give our
    // subscriptions a moment to match its publishers.
    let waited = Instant::now();
    while publisher.get_inter_process_subscription_count()? == 0 {
        if waited.elapsed() > Duration::from_secs(30) {
            bail!(
                "no subscriber on {}/prompt after 30 s: is selectinfer_node running (same ROS_DOMAIN_ID)?",
                opts.node
            );
        }
        node.spin_once(Duration::from_millis(20));
    }
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(1500) {
        node.spin_once(Duration::from_millis(20));
    }

    let mut records: Vec<RequestRecord> = planned
        .iter()
        .map(|p| RequestRecord {
            request_id: p.msg.request_id.clone(),
            task: p.msg.task.clone(),
            ..Default::default()
        })
        .collect();
    let index: HashMap<String, usize> = records
        .iter()
        .enumerate()
        .map(|(i, r)| (r.request_id.clone(), i))
        .collect();
    let mut sent_at: Vec<Option<Instant>> = vec![None; planned.len()];
    let start = Instant::now();
    let mut next = 0usize;
    let mut inflight = 0usize;
    let mut answered = 0usize;
    let mut last_sent = start;
    let mut last_progress = start;
    let progress = |records: &[RequestRecord], sent: usize| Progress {
        elapsed_s: start.elapsed().as_secs_f64(),
        planned: records.len(),
        sent,
        replied: records.iter().filter(|r| r.answered).count(),
        rejected: records.iter().filter(|r| r.rejected).count(),
        failed: records
            .iter()
            .filter(|r| r.answered && !r.success && !r.rejected)
            .count(),
    };
    loop {
        if let Some(report) = opts.on_progress {
            if last_progress.elapsed().as_secs_f64() >= PROGRESS_EVERY_S {
                last_progress = Instant::now();
                report(&progress(&records, next));
            }
        }
        let now = start.elapsed().as_secs_f64();
        while next < planned.len() {
            let due = match opts.timing {
                Timing::Recorded => planned[next].at_s <= now,
                Timing::Fast => inflight < opts.max_inflight,
            };
            if !due {
                break;
            }
            publisher
                .publish(&planned[next].msg)
                .with_context(|| format!("publishing {}", planned[next].msg.request_id))?;
            let t = Instant::now();
            sent_at[next] = Some(t);
            records[next].sent_at_s = t.duration_since(start).as_secs_f64();
            last_sent = t;
            inflight += 1;
            next += 1;
        }
        node.spin_once(Duration::from_millis(2));
        while let Some(Some(tok)) = tokens.next().now_or_never() {
            if let Some(&i) = index.get(&tok.request_id) {
                if !tok.done && records[i].ttft_s.is_none() {
                    if let Some(t) = sent_at[i] {
                        records[i].ttft_s = Some(t.elapsed().as_secs_f64());
                    }
                }
            }
        }
        while let Some(Some(resp)) = responses.next().now_or_never() {
            let Some(&i) = index.get(&resp.request_id) else {
                continue;
            };
            let r = &mut records[i];
            if r.answered {
                continue;
            }
            r.answered = true;
            r.latency_s = sent_at[i].map(|t| t.elapsed().as_secs_f64());
            r.success = resp.success;
            r.rejected = !resp.success && resp.error.starts_with("rejected");
            r.error = resp.error;
            r.generated_tokens = resp.generated_tokens;
            r.tokens_per_s = resp.tokens_per_s as f64;
            inflight = inflight.saturating_sub(1);
            answered += 1;
        }
        if answered == planned.len() {
            break;
        }
        if next == planned.len() && last_sent.elapsed().as_secs_f64() > opts.timeout_s {
            log::warn!(
                "{} requests unanswered {} s after the last was sent",
                planned.len() - answered,
                opts.timeout_s
            );
            break;
        }
    }
    if let Some(report) = opts.on_progress {
        report(&progress(&records, next));
    }
    let wall = start.elapsed().as_secs_f64();
    Ok(ReplayReport::new(
        &opts.bag.display().to_string(),
        &opts.node,
        &opts.timing.to_string(),
        records,
        wall,
    ))
}
