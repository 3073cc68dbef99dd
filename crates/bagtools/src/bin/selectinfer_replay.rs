//! `selectinfer_replay`: replays a rosbag2 bag (MCAP or sqlite3) of prompts
//! (`selectinfer_msgs/msg/Prompt` or `std_msgs/msg/String`) against a running
//! selectinfer_node and reports per-request TTFT and latency percentiles,
//! throughput, tokens/s, rejected and lost requests (markdown; JSON on request).

use anyhow::Result;
use clap::Parser;
use selectinfer_bagtools::replay::ros::{run, Progress, ReplayOptions, Timing};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "selectinfer_replay", version, about)]
struct Args {
    /// Bag folder (metadata.yaml + .mcap/.db3) or a single .mcap / .db3 file.
    bag: PathBuf,
    /// The node's name.
    #[arg(long, default_value = "/selectinfer_node")]
    node: String,
    /// Replay only these topics (repeatable); default: every topic.
    #[arg(long = "topic")]
    topics: Vec<String>,
    /// recorded: the bag's arrival times; fast: as fast as the node takes them.
    #[arg(long, default_value_t = Timing::Recorded)]
    timing: Timing,
    /// Speed-up of the recorded timing.
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// With --timing fast: unanswered requests at most.
    #[arg(long, default_value_t = 4)]
    max_inflight: usize,
    /// Seconds to wait for answers after the last prompt was sent.
    #[arg(long, default_value_t = 300.0)]
    timeout_s: f64,
    /// Replay the first N prompts only.
    #[arg(long)]
    limit: Option<usize>,
    /// Override every prompt's max_new_tokens.
    #[arg(long)]
    max_new_tokens: Option<i32>,
    /// Write the full report (summary + per-request records) as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the markdown summary here too.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn real_main() -> Result<()> {
    let a = Args::parse();
    let report = run(&ReplayOptions {
        bag: a.bag,
        node: a.node,
        topics: a.topics,
        timing: a.timing,
        speed: a.speed,
        max_inflight: a.max_inflight,
        timeout_s: a.timeout_s,
        limit: a.limit,
        max_new_tokens: a.max_new_tokens,
        on_progress: Some(print_progress),
    })?;
    let md = report.markdown();
    print!("{md}");
    if let Some(p) = a.json {
        std::fs::write(&p, serde_json::to_string_pretty(&report)?)?;
    }
    if let Some(p) = a.markdown {
        std::fs::write(&p, md)?;
    }
    Ok(())
}

/// One progress line on stderr (the report goes to stdout).
fn print_progress(p: &Progress) {
    eprintln!(
        "[{:6.1} s] sent {}/{}, replied {} ({} rejected, {} failed), in flight {}",
        p.elapsed_s,
        p.sent,
        p.planned,
        p.replied,
        p.rejected,
        p.failed,
        p.sent.saturating_sub(p.replied)
    );
}
