//! `selectinfer_node`: the ROS 2 node (r2r), a thin shell over
//! [`crate::server`]. Interfaces (package `selectinfer_msgs`, in `msg/`):
//! - service `~/generate` (`selectinfer_msgs/srv/Generate`);
//! - topic `~/prompt` (`selectinfer_msgs/msg/Prompt`) and plain
//!   `std_msgs/String` instructions on `instruction_topic`, answered on
//!   `~/response` (`selectinfer_msgs/msg/Response`, same request id);
//! - `~/tokens` (`selectinfer_msgs/msg/Token`): streamed text of every request;
//! - action `~/generate_stream` (`selectinfer_msgs/action/Generate`): the
//!   same request as a goal, new text as feedback, cancel within one decode
//!   step; goals beyond the queue are rejected at acceptance (the reason goes
//!   to `~/response` under the goal's request id);
//! - `/diagnostics` (`diagnostic_msgs/DiagnosticArray`): queue depth,
//!   tokens/s, RSS, request counters.
//!
//! The ROS executor thread only moves messages: generation runs on the
//! server's worker thread, which answers services and publishes directly.

mod params;

use crate::server::{CancelToken, Job, Reply, Request, Server, Stats};
use anyhow::{Context as _, Result};
use futures::channel::oneshot;
use futures::executor::LocalPool;
use futures::future::{self, Either};
use futures::task::LocalSpawnExt;
use futures::StreamExt;
use params::{NodeParams, ParamHandle};
use r2r::selectinfer_msgs::{action::Generate as GenerateAction, msg as si, srv::Generate};
use r2r::{diagnostic_msgs, std_msgs, Publisher, QosProfile};
use std::collections::{HashMap, HashSet};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use std::time::Instant;

pub use params::PARAMETERS;

/// Name the node runs under (the parameters file may key on it or `/**`).
pub const NODE_NAME: &str = "selectinfer_node";

type Shared<T> = Arc<Mutex<Publisher<T>>>;

/// Where a request's tokens and reply go.
#[derive(Clone)]
struct Outputs {
    tokens: Shared<si::Token>,
    responses: Shared<si::Response>,
}

impl Outputs {
    fn token_sink(&self, request_id: &str) -> crate::server::TokenSink {
        let tokens = self.tokens.clone();
        let id = request_id.to_string();
        Box::new(move |index, text| {
            let msg = si::Token {
                request_id: id.clone(),
                index: index as u32,
                text: text.to_string(),
                done: false,
            };
            if let Err(e) = tokens.lock().unwrap().publish(&msg) {
                log::warn!("publishing a token of {id}: {e}");
            }
        })
    }

    /// Marks the end of a request's token stream.
    fn finish_tokens(&self, reply: &Reply) {
        let msg = si::Token {
            request_id: reply.request_id.clone(),
            index: reply.generated_tokens as u32,
            text: String::new(),
            done: true,
        };
        if let Err(e) = self.tokens.lock().unwrap().publish(&msg) {
            log::warn!("publishing the end of {}: {e}", reply.request_id);
        }
    }
}

/// Finds abandoned action goals. r2r does not say which client sent a goal,
/// so the rule is conservative: a goal remembers the action clients on the
/// graph at the first check after its acceptance (its sender among them, as
/// its request was received), and is abandoned once all of those have left
/// (their send_goal request writers are gone). It is then cancelled, which
/// frees its slot.
#[derive(Default)]
struct GoalWatch {
    /// Running or queued goals: their cancel token and the clients seen at
    /// the first check (empty until then).
    goals: HashMap<String, (CancelToken, HashSet<Gid>)>,
}

type Gid = Vec<u8>;

impl GoalWatch {
    fn accept(&mut self, id: &str, cancel: CancelToken) {
        self.goals.insert(id.to_string(), (cancel, HashSet::new()));
    }

    /// Takes the clients on the graph now; returns the goals whose clients
    /// all left.
    fn update(&mut self, present: &HashSet<Gid>) -> Vec<(String, CancelToken)> {
        let mut gone = Vec::new();
        for (id, (cancel, seen)) in self.goals.iter_mut() {
            if seen.is_empty() {
                seen.clone_from(present);
            } else if seen.is_disjoint(present) && !cancel.is_cancelled() {
                gone.push((id.clone(), cancel.clone()));
            }
        }
        gone
    }
}

/// Any interface type carrying the response fields (the Response message,
/// the service response, the action result), filled from a [`Reply`].
macro_rules! reply_into {
    ($ty:path, $r:expr $(, $field:ident: $value:expr)*) => {{
        let r: &Reply = $r;
        $ty {
            success: r.success,
            error: r.error.clone(),
            request_id: r.request_id.clone(),
            text: r.text.clone(),
            prompt_tokens: r.prompt_tokens as u32,
            generated_tokens: r.generated_tokens as u32,
            ttft_s: r.ttft_s as f32,
            tokens_per_s: r.tokens_per_s as f32,
            compute_ratio: r.compute_ratio as f32,
            stop_reason: r.stop_reason.clone(),
            $($field: $value,)*
        }
    }};
}

fn response_msg(r: &Reply) -> si::Response {
    reply_into!(si::Response, r)
}

fn service_response(r: &Reply) -> Generate::Response {
    reply_into!(Generate::Response, r)
}

/// GoalStatus values of the action result's `status` field.
const STATUS_SUCCEEDED: i8 = 4;
const STATUS_CANCELED: i8 = 5;
const STATUS_ABORTED: i8 = 6;

fn action_result(r: &Reply, status: i8) -> GenerateAction::Result {
    reply_into!(GenerateAction::Result, r, status: status)
}

/// A [`Request`] from any interface message with the request fields
/// (Prompt, the service request, the action goal).
macro_rules! request_of {
    ($m:expr) => {
        request(
            &$m.request_id,
            &$m.prompt,
            &$m.task,
            $m.max_new_tokens,
            $m.temperature,
            $m.top_p,
            $m.seed,
        )
    };
}

/// Request fields as the interfaces carry them (negative = node default);
/// a request without an id gets one.
#[allow(clippy::too_many_arguments)]
fn request(
    id: &str,
    prompt: &str,
    task: &str,
    max_new_tokens: i32,
    temperature: f32,
    top_p: f32,
    seed: i64,
) -> Request {
    Request {
        id: if id.is_empty() {
            crate::server::new_request_id()
        } else {
            id.to_string()
        },
        prompt: prompt.to_string(),
        task: task.to_string(),
        // -1 = default; 0 and other negatives are passed on and refused.
        max_new_tokens: (max_new_tokens != -1).then_some(max_new_tokens as i64),
        temperature: (temperature >= 0.0 || temperature.is_nan()).then_some(temperature as f64),
        top_p: (top_p >= 0.0 || top_p.is_nan()).then_some(top_p as f64),
        seed: (seed >= 0).then_some(seed),
    }
}

fn diagnostics(
    stats: &Stats,
    params: &NodeParams,
    now: Duration,
) -> diagnostic_msgs::msg::DiagnosticArray {
    use diagnostic_msgs::msg::{DiagnosticArray, DiagnosticStatus, KeyValue};
    let kv = |k: &str, v: String| KeyValue {
        key: k.into(),
        value: v,
    };
    let full = stats.queued >= stats.queue_capacity;
    let status = DiagnosticStatus {
        level: if full {
            DiagnosticStatus::WARN as u8
        } else {
            DiagnosticStatus::OK as u8
        },
        name: format!("{NODE_NAME}: generation"),
        message: match (full, stats.busy) {
            (true, _) => "queue full: new requests are rejected".into(),
            (false, true) => "generating".into(),
            (false, false) => "idle".into(),
        },
        hardware_id: params.engine.device.clone(),
        values: vec![
            kv("queue_depth", stats.queued.to_string()),
            kv("queue_capacity", stats.queue_capacity.to_string()),
            kv("busy", stats.busy.to_string()),
            kv("tokens_per_s", format!("{:.2}", stats.last_tokens_per_s)),
            kv("rss_bytes", stats.rss_bytes.to_string()),
            kv("peak_rss_bytes", stats.peak_rss_bytes.to_string()),
            kv("completed", stats.completed.to_string()),
            kv("failed", stats.failed.to_string()),
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

/// Runs the node until SIGINT/SIGTERM; start-up errors give exit code 2.
pub fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{NODE_NAME}: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<()> {
    let ctx = r2r::Context::create().context("creating the ROS context")?;
    let mut node = r2r::Node::create(ctx, NODE_NAME, "").context("creating the ROS node")?;
    let params = {
        let overrides = node.params.lock().unwrap();
        NodeParams::from_overrides(overrides.iter()).context("invalid parameters")?
    };
    log::info!("loading: {}", params.summary());
    let server = Arc::new(Server::start(params.server_config()).context("loading the engine")?);
    log::info!(
        "ready: {} tasks ({}), peak RSS {:.0} MiB",
        server.mode().name(),
        server.tasks().join(", "),
        crate::sysinfo::peak_rss_bytes() as f64 / 1048576.0
    );

    let handle = Arc::new(Mutex::new(ParamHandle {
        params: params.clone(),
        server: server.clone(),
    }));
    // r2r hands each service request and message through a small channel
    // (10) and drops what does not fit, so every stream is drained on the
    // spinning thread right after each spin (LocalPool), never elsewhere.
    let mut pool = LocalPool::new();
    let spawner = pool.spawner();
    let (param_server, mut param_events) = node.make_derived_parameter_handler(handle.clone())?;
    spawner.spawn_local(param_server)?;
    spawner.spawn_local(async move { while param_events.next().await.is_some() {} })?;

    let reliable_deep = QosProfile::default().keep_last(1000);
    let outputs = Outputs {
        tokens: Arc::new(Mutex::new(node.create_publisher::<si::Token>(
            "~/tokens",
            QosProfile::default().keep_last(1000),
        )?)),
        responses: Arc::new(Mutex::new(node.create_publisher::<si::Response>(
            "~/response",
            QosProfile::default().keep_last(100),
        )?)),
    };
    let diag_pub = node.create_publisher::<diagnostic_msgs::msg::DiagnosticArray>(
        "/diagnostics",
        QosProfile::default(),
    )?;
    let mut services = node.create_service::<Generate::Service>(
        "~/generate",
        QosProfile::services_default().keep_last(1000),
    )?;
    let mut goal_requests =
        node.create_action_server::<GenerateAction::Action>("~/generate_stream")?;
    let mut prompts = node.subscribe::<si::Prompt>("~/prompt", reliable_deep.clone())?;
    let mut instructions =
        node.subscribe::<std_msgs::msg::String>(&params.instruction_topic, reliable_deep)?;
    let mut diag_timer =
        node.create_wall_timer(Duration::from_secs_f64(params.diagnostics_period_s))?;

    // Service: the reply goes back from the worker thread.
    {
        let server = server.clone();
        let out = outputs.clone();
        spawner.spawn_local(async move {
            while let Some(req) = services.next().await {
                let m = &req.message;
                let r = request_of!(m);
                let id = r.id.clone();
                let out2 = out.clone();
                let job = Job {
                    request: r,
                    cancel: CancelToken::default(),
                    on_token: out.token_sink(&id),
                    on_done: Box::new(move |reply: Reply| {
                        out2.finish_tokens(&reply);
                        if let Err(e) = req.respond(service_response(&reply)) {
                            log::error!("answering service request {}: {e}", reply.request_id);
                        }
                    }),
                };
                server.submit(job);
            }
        })?;
    }

    // Topics: replies go to ~/response.
    let submit_topic = {
        let server = server.clone();
        let out = outputs.clone();
        move |r: Request| {
            let id = r.id.clone();
            let out2 = out.clone();
            let job = Job {
                request: r,
                cancel: CancelToken::default(),
                on_token: out.token_sink(&id),
                on_done: Box::new(move |reply: Reply| {
                    out2.finish_tokens(&reply);
                    if let Err(e) = out2
                        .responses
                        .lock()
                        .unwrap()
                        .publish(&response_msg(&reply))
                    {
                        log::error!("publishing the response of {}: {e}", reply.request_id);
                    }
                }),
            };
            server.submit(job);
        }
    };
    {
        let submit = submit_topic.clone();
        spawner.spawn_local(async move {
            while let Some(m) = prompts.next().await {
                submit(request_of!(m));
            }
        })?;
    }
    {
        let submit = submit_topic;
        spawner.spawn_local(async move {
            while let Some(m) = instructions.next().await {
                submit(request("", &m.data, "", -1, -1.0, -1.0, -1));
            }
        })?;
    }

    // Action: goals share the queue; feedback and the result go out from
    // the worker thread, cancel requests are handled here.
    let watch = Arc::new(Mutex::new(GoalWatch::default()));
    let send_goal_topic = format!(
        "rq{}/generate_stream/_action/send_goalRequest",
        node.fully_qualified_name()?
    );
    {
        let watch = watch.clone();
        let server = server.clone();
        let out = outputs.clone();
        let spawner_goals = spawner.clone();
        spawner.spawn_local(async move {
            while let Some(req) = goal_requests.next().await {
                let g = &req.goal;
                let r = request_of!(g);
                let id = r.id.clone();
                if !server.has_room() {
                    // An action goal response has no reason field: the reason
                    // goes to ~/response under the goal's request id.
                    let why = server.queue_full_reason();
                    log::info!("goal {id} {why}");
                    if let Err(e) = req.reject() {
                        log::error!("rejecting goal {id}: {e}");
                    }
                    let reply = Reply::error(&id, why);
                    if let Err(e) = out.responses.lock().unwrap().publish(&response_msg(&reply)) {
                        log::error!("publishing the rejection of {id}: {e}");
                    }
                    continue;
                }
                let (goal, mut cancels) = match req.accept() {
                    Ok(x) => x,
                    Err(e) => {
                        log::error!("accepting goal {id}: {e}");
                        continue;
                    }
                };
                let cancel = CancelToken::default();
                watch.lock().unwrap().accept(&id, cancel.clone());
                let watch_done = watch.clone();
                let (done_tx, mut done_rx) = oneshot::channel::<()>();
                let feedback_goal = goal.clone();
                let mut tokens = out.token_sink(&id);
                let started = Instant::now();
                let on_token: crate::server::TokenSink = Box::new(move |index, text| {
                    tokens(index, text);
                    let secs = started.elapsed().as_secs_f64();
                    let fb = GenerateAction::Feedback {
                        text: text.to_string(),
                        generated_tokens: index as u32 + 1,
                        tokens_per_s: ((index + 1) as f64 / secs.max(1e-9)) as f32,
                    };
                    if let Err(e) = feedback_goal.publish_feedback(fb) {
                        log::warn!("publishing feedback: {e}");
                    }
                });
                let out2 = out.clone();
                let by_client = cancel.clone();
                let mut result_goal = goal;
                let on_done: crate::server::ReplySink = Box::new(move |reply: Reply| {
                    out2.finish_tokens(&reply);
                    // Once r2r has accepted a cancel request it no longer lets
                    // the goal succeed or abort (it drops the goal from its
                    // executing set), so a goal whose client asked to cancel
                    // ends CANCELED, with whatever was generated — also when
                    // the generation finished just before the cancel landed.
                    // And should succeed/abort be refused anyway (the cancel
                    // arriving in between), CANCELED still reaches the client.
                    let id = &reply.request_id;
                    let canceled = |goal: &mut r2r::ActionServerGoal<GenerateAction::Action>| {
                        goal.cancel(action_result(&reply, STATUS_CANCELED))
                    };
                    let sent = if by_client.is_cancelled() {
                        canceled(&mut result_goal)
                    } else {
                        let done = if reply.success && !reply.cancelled() {
                            result_goal.succeed(action_result(&reply, STATUS_SUCCEEDED))
                        } else {
                            result_goal.abort(action_result(&reply, STATUS_ABORTED))
                        };
                        done.or_else(|e| {
                            log::warn!("goal {id}: {e} on its result; sending it as canceled");
                            canceled(&mut result_goal)
                        })
                    };
                    if let Err(e) = sent {
                        log::error!("sending the result of goal {id}: {e}");
                    }
                    watch_done.lock().unwrap().goals.remove(&reply.request_id);
                    let _ = done_tx.send(());
                });
                // Cancel requests until the goal is done.
                let server_c = server.clone();
                let cancel_c = cancel.clone();
                let spawned = spawner_goals.spawn_local(async move {
                    while let Either::Left((Some(c), _)) =
                        future::select(cancels.next(), &mut done_rx).await
                    {
                        c.accept();
                        cancel_c.cancel();
                        server_c.purge_cancelled();
                    }
                });
                if let Err(e) = spawned {
                    log::error!("watching goal {id} for cancel requests: {e}");
                }
                server.submit(Job {
                    request: r,
                    cancel,
                    on_token,
                    on_done,
                });
            }
        })?;
    }

    // Statistics.
    {
        let server = server.clone();
        let handle = handle.clone();
        spawner.spawn_local(async move {
            let mut clock = r2r::Clock::create(r2r::ClockType::SystemTime).ok();
            while diag_timer.tick().await.is_ok() {
                let now = clock
                    .as_mut()
                    .and_then(|c| c.get_now().ok())
                    .unwrap_or_default();
                let params = handle.lock().unwrap().params.clone();
                if let Err(e) = diag_pub.publish(&diagnostics(&server.stats(), &params, now)) {
                    log::warn!("publishing diagnostics: {e}");
                }
            }
        })?;
    }

    // The executor: spin, then run every task until it waits again.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    log::info!(
        "{NODE_NAME} serving ~/generate, ~/generate_stream, ~/prompt, {}",
        params.instruction_topic
    );
    let mut graph_checked = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        node.spin_once(Duration::from_millis(20));
        pool.run_until_stalled();
        let watching = !watch.lock().unwrap().goals.is_empty();
        if watching && graph_checked.elapsed() > Duration::from_millis(500) {
            graph_checked = Instant::now();
            match node.get_publishers_info_by_topic(&send_goal_topic, true) {
                Ok(infos) => {
                    let present = infos.into_iter().map(|i| i.endpoint_gid.to_vec()).collect();
                    let gone = watch.lock().unwrap().update(&present);
                    for (id, cancel) in &gone {
                        log::info!("goal {id}: its client left the graph; cancelling");
                        cancel.cancel();
                    }
                    if !gone.is_empty() {
                        server.purge_cancelled();
                    }
                }
                Err(e) => log::debug!("reading the graph for {send_goal_topic}: {e}"),
            }
        }
    }
    log::info!("signal received: shutting down");
    // Answers what is still queued (rejections), then lets the node go.
    server.shutdown();
    drop(node);
    Ok(())
}
