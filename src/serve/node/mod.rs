//! `selectinfer_node`: the ROS 2 node (r2r), a thin shell over
//! [`crate::serve::server`]. Interfaces (package `selectinfer_msgs`, in `msg/`):
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
//! One file per interface ([`service`], [`topics`], [`action`],
//! [`diagnostics`], [`params`]); [`messages`] converts between their
//! messages and the server's types; this file only wires them up.

mod action;
mod clock;
mod diagnostics;
mod lifecycle;
mod messages;
mod pacer;
mod param_events;
mod param_handle;
mod param_specs;
mod params;
mod rosout;
mod runtime_file;
mod service;
mod topics;

use action::GoalWatch;
use anyhow::{Context as _, Result};
use clock::NodeClock;
use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use futures::StreamExt;
use lifecycle::Managed;
use messages::Outputs;
use param_events::ParameterEvents;
use params::NodeParams;
use r2r::selectinfer_msgs::{action::Generate as GenerateAction, msg as si, srv::Generate};
use r2r::{diagnostic_msgs, std_msgs, QosProfile};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The parameter handler (public for the parameter fuzz tests).
pub use param_handle::ParamHandle;
pub use param_specs::PARAMETERS;

/// How long the node still takes requests after a stop signal, to refuse
/// those already sent to it.
const SHUTDOWN_DRAIN: Duration = Duration::from_millis(300);

/// Name the node runs under (the parameters file may key on it or `/**`).
pub(crate) const NODE_NAME: &str = "selectinfer_node";

/// Exit code of a node that cannot start with its configuration (an unknown
/// or invalid parameter, a model or ranking that is not there, a model that
/// does not load): sysexits' EX_CONFIG. `launch/node.launch.py` does not
/// restart it, as restarting cannot help.
pub(crate) const EXIT_CONFIG: u8 = 78;

/// Marks an error as the configuration's (exit code [`EXIT_CONFIG`]).
#[derive(Debug)]
struct BadConfiguration;

impl std::fmt::Display for BadConfiguration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cannot start with this configuration")
    }
}

/// Runs the node until SIGINT/SIGTERM; start-up errors give exit code
/// [`EXIT_CONFIG`] (configuration) or 2 (anything else).
pub fn main() -> ExitCode {
    let Err(e) = run() else {
        return ExitCode::SUCCESS;
    };
    if rosout::installed() {
        log::error!("{e:#}");
    } else {
        eprintln!("{NODE_NAME}: {e:#}");
    }
    match e.downcast_ref::<BadConfiguration>() {
        Some(_) => ExitCode::from(EXIT_CONFIG),
        None => ExitCode::from(2),
    }
}

/// Loads the engine, creates every interface, then spins until a signal.
fn run() -> Result<()> {
    let ctx = r2r::Context::create().context("creating the ROS context")?;
    let mut node = r2r::Node::create(ctx, NODE_NAME, "").context("creating the ROS node")?;
    rosout::install(node.logger())?;
    let clock = NodeClock::of(&node);
    let deep = |n| QosProfile::default().keep_last(n);
    let transition_events = node.create_publisher("~/transition_event", deep(10))?;
    let (params, server) =
        load(&node, transition_events, clock.clone()).context(BadConfiguration)?;
    let handle = Arc::new(Mutex::new(ParamHandle {
        params: params.clone(),
        server: server.clone(),
    }));
    // r2r hands each service request and message through a small channel
    // (10) and drops what does not fit, so every stream is drained on the
    // spinning thread right after each spin (LocalPool), never elsewhere.
    let mut pool = LocalPool::new();
    let spawner = pool.spawner();
    // use_sim_time is read by r2r when the handler is made (the clock then
    // follows /clock); listed as rclcpp nodes list it.
    node.params
        .lock()
        .unwrap()
        .entry("use_sim_time".into())
        .or_insert_with(|| r2r::Parameter::new(r2r::ParameterValue::Bool(false)));
    let (param_server, mut param_changes) = node.make_derived_parameter_handler(handle.clone())?;
    spawner.spawn_local(param_server)?;
    let param_events = ParameterEvents::new(&mut node, clock.clone())?;
    {
        let all = node.params.lock().unwrap();
        param_events.announce(all.iter().map(|(n, p)| (n, &p.value)));
    }
    spawner.spawn_local(async move {
        while let Some((name, value)) = param_changes.next().await {
            param_events.changed(&name, &value);
        }
    })?;

    let out = Outputs {
        tokens: Arc::new(Mutex::new(node.create_publisher("~/tokens", deep(1000))?)),
        responses: Arc::new(Mutex::new(node.create_publisher("~/response", deep(100))?)),
        pacer: Arc::new(
            pacer::Pacer::new(Duration::from_secs_f64(params.reply_pace_ms / 1000.0))
                .context("starting the reply pacer")?,
        ),
        clock: clock.clone(),
    };
    let services = node.create_service::<Generate::Service>(
        "~/generate",
        QosProfile::services_default().keep_last(1000),
    )?;
    let goals = node.create_action_server_keeping_results::<GenerateAction::Action>(
        "~/generate_stream",
        Some(Duration::from_secs_f64(params.goal_result_timeout_s)),
    )?;
    let prompts = node.subscribe::<si::Prompt>("~/prompt", deep(1000))?;
    let instructions =
        node.subscribe::<std_msgs::msg::String>(&params.instruction_topic, deep(1000))?;
    let diag = diagnostics::Diagnostics {
        publisher: node.create_publisher::<diagnostic_msgs::msg::DiagnosticArray>(
            "/diagnostics",
            QosProfile::default(),
        )?,
        node_name: node.fully_qualified_name()?,
        clock,
    };
    let diag_timer =
        node.create_wall_timer(Duration::from_secs_f64(params.diagnostics_period_s))?;
    let lifecycle_services = {
        let q = || QosProfile::services_default();
        lifecycle::Services {
            change: node.create_service("~/change_state", q())?,
            get: node.create_service("~/get_state", q())?,
            states: node.create_service("~/get_available_states", q())?,
            transitions: node.create_service("~/get_available_transitions", q())?,
            graph: node.create_service("~/get_transition_graph", q())?,
        }
    };
    let watch = Arc::new(Mutex::new(GoalWatch::default()));
    let (s, o) = (&server, &out);
    spawner.spawn_local(service::serve(services, s.clone(), o.clone()))?;
    spawner.spawn_local(topics::serve_prompts(prompts, s.clone(), o.clone()))?;
    spawner.spawn_local(topics::serve_instructions(
        instructions,
        s.clone(),
        o.clone(),
    ))?;
    let goal_task = action::serve(goals, s.clone(), o.clone(), watch.clone(), spawner.clone());
    spawner.spawn_local(goal_task)?;
    spawner.spawn_local(lifecycle::serve(lifecycle_services, s.clone()))?;
    spawner.spawn_local(diagnostics::publish_on(diag_timer, diag, s.clone(), handle))?;

    log::debug!(
        "interfaces under {}: ~/generate, ~/generate_stream, ~/prompt, ~/response, ~/tokens, \
         ~/transition_event, /diagnostics, /parameter_events; logger {}",
        node.fully_qualified_name()?,
        node.logger()
    );
    // Signal handlers before the ready line: whoever reads it may stop us.
    let stop = stop_on_signals()?;
    log::info!(
        "{NODE_NAME} serving ~/generate, ~/generate_stream, ~/prompt, {}",
        params.instruction_topic
    );
    spin(&mut node, &mut pool, &watch, &server, &stop)?;
    log::info!("signal received: shutting down");
    // Answers what is still queued (rejections), then, for a moment, what
    // already reached the node's readers but was not taken yet (refused as
    // "shutting down"), then lets the node go.
    server.shutdown();
    let drain = Instant::now();
    while drain.elapsed() < SHUTDOWN_DRAIN {
        node.spin_once(Duration::from_millis(20));
        pool.run_until_stalled();
    }
    out.pacer.finish();
    drop(node);
    Ok(())
}

/// The node's parameters, and the managed server: loaded and active
/// unless `autostart` is off; its transitions go out on `transitions`.
fn load(
    node: &r2r::Node,
    transitions: r2r::Publisher<r2r::lifecycle_msgs::msg::TransitionEvent>,
    clock: NodeClock,
) -> Result<(NodeParams, Arc<Managed>)> {
    let params = {
        let overrides = node.params.lock().unwrap();
        NodeParams::from_overrides(overrides.iter()).context("invalid parameters")?
    };
    if params.threads > 0 {
        crate::sys::threads::set(params.threads).context("parameter threads")?;
    }
    let managed = Arc::new(Managed::new(params.clone()));
    managed.publish_transitions_on(transitions, clock);
    if !params.autostart {
        log::info!("autostart is off: unconfigured until ~/change_state configures it");
        return Ok((params, managed));
    }
    managed.transition(1)?; // configure
    managed.transition(3)?; // activate
    log::info!(
        "ready: mode {}, {} compute threads, peak RSS {:.0} MiB",
        params.engine.mode.name(),
        crate::sys::threads::current(),
        crate::sys::memory::peak_rss_bytes() as f64 / 1048576.0
    );
    Ok((params, managed))
}

/// A flag SIGINT and SIGTERM set.
fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    Ok(stop)
}

/// The executor until `stop`: spin, then run every task until it waits
/// again; every half second while goals run, look for goals whose clients
/// left.
fn spin(
    node: &mut r2r::Node,
    pool: &mut LocalPool,
    watch: &Mutex<GoalWatch>,
    server: &Managed,
    stop: &AtomicBool,
) -> Result<()> {
    let send_goal_topic = format!(
        "rq{}/generate_stream/_action/send_goalRequest",
        node.fully_qualified_name()?
    );
    let mut graph_checked = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        node.spin_once(Duration::from_millis(20));
        pool.run_until_stalled();
        let watching = !watch.lock().unwrap().goals.is_empty();
        if watching && graph_checked.elapsed() > Duration::from_millis(500) {
            graph_checked = Instant::now();
            action::cancel_abandoned(node, &send_goal_topic, watch, server);
        }
    }
    Ok(())
}
