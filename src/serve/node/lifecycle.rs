//! The managed (lifecycle) node: the `lifecycle_msgs` services
//! (`~/change_state`, `~/get_state`, `~/get_available_states`,
//! `~/get_available_transitions`, `~/get_transition_graph`) and
//! `~/transition_event`, served directly (r2r has no lifecycle support).
//!
//! configure loads the model (the server and its engine), activate serves,
//! deactivate refuses new work with the reason while what is queued or
//! running finishes, cleanup frees the model's memory (what still runs is
//! stopped at its next token and answered), shutdown cleans up and ends in
//! finalized. The interfaces reach the server through [`Managed`], which
//! answers every request itself while no server is active. Configure runs
//! on a thread of its own: the executor keeps draining requests meanwhile.
//!
//! Each transition publishes two events on `~/transition_event`, as rcl's
//! state machine does: into its intermediate state (`configure`:
//! unconfigured -> configuring), then out of it (`transition_success`:
//! configuring -> inactive, or `transition_failure` back to where it
//! started), so launch's `OnStateTransition(start_state='configuring',
//! goal_state='inactive')` can activate the node.

use super::clock::NodeClock;
use super::params::NodeParams;
use crate::serve::server::{Bounds, Job, Reply, RuntimeSettings, Server, Stats};
use anyhow::{bail, Result};
use futures::StreamExt;
use r2r::lifecycle_msgs::msg::{State, Transition, TransitionDescription, TransitionEvent};
use r2r::lifecycle_msgs::srv::{
    ChangeState, GetAvailableStates, GetAvailableTransitions, GetState,
};
use r2r::Publisher;
use std::sync::{Arc, Mutex};

// lifecycle_msgs/msg/State and Transition ids.
const UNCONFIGURED: u8 = 1;
const INACTIVE: u8 = 2;
const ACTIVE: u8 = 3;
const FINALIZED: u8 = 4;
const CONFIGURING: u8 = 10;
const CLEANINGUP: u8 = 11;
const SHUTTINGDOWN: u8 = 12;
const ACTIVATING: u8 = 13;
const DEACTIVATING: u8 = 14;
const CONFIGURE: u8 = 1;
const CLEANUP: u8 = 2;
const ACTIVATE: u8 = 3;
const DEACTIVATE: u8 = 4;
const UNCONFIGURED_SHUTDOWN: u8 = 5;
const INACTIVE_SHUTDOWN: u8 = 6;
const ACTIVE_SHUTDOWN: u8 = 7;

fn state(id: u8) -> State {
    let label = match id {
        UNCONFIGURED => "unconfigured",
        INACTIVE => "inactive",
        ACTIVE => "active",
        FINALIZED => "finalized",
        CONFIGURING => "configuring",
        CLEANINGUP => "cleaningup",
        SHUTTINGDOWN => "shuttingdown",
        ACTIVATING => "activating",
        DEACTIVATING => "deactivating",
        _ => "unknown",
    };
    State {
        id,
        label: label.into(),
    }
}

/// Every transition: (id, label, from, to).
const TRANSITIONS: [(u8, &str, u8, u8); 7] = [
    (CONFIGURE, "configure", UNCONFIGURED, INACTIVE),
    (CLEANUP, "cleanup", INACTIVE, UNCONFIGURED),
    (ACTIVATE, "activate", INACTIVE, ACTIVE),
    (DEACTIVATE, "deactivate", ACTIVE, INACTIVE),
    (UNCONFIGURED_SHUTDOWN, "shutdown", UNCONFIGURED, FINALIZED),
    (INACTIVE_SHUTDOWN, "shutdown", INACTIVE, FINALIZED),
    (ACTIVE_SHUTDOWN, "shutdown", ACTIVE, FINALIZED),
];

/// A transition's intermediate state and the ids of its way out (rcl's
/// `on_<transition>_success`; failure is one more).
fn intermediate(id: u8) -> (u8, u8) {
    match id {
        CONFIGURE => (CONFIGURING, 10),
        CLEANUP => (CLEANINGUP, 20),
        ACTIVATE => (ACTIVATING, 30),
        DEACTIVATE => (DEACTIVATING, 40),
        _ => (SHUTTINGDOWN, 50),
    }
}

fn description(t: &(u8, &str, u8, u8)) -> TransitionDescription {
    TransitionDescription {
        transition: Transition {
            id: t.0,
            label: t.1.into(),
        },
        start_state: state(t.2),
        goal_state: state(t.3),
    }
}

/// The server behind the interfaces, and the lifecycle state.
pub struct Managed {
    inner: Mutex<Inner>,
    params: Mutex<NodeParams>,
    events: Mutex<Option<(Publisher<TransitionEvent>, NodeClock)>>,
}

struct Inner {
    state: u8,
    server: Option<Arc<Server>>,
}

impl Managed {
    /// Unconfigured; `params` are what configure loads.
    pub(crate) fn new(params: NodeParams) -> Self {
        Self {
            inner: Mutex::new(Inner {
                state: UNCONFIGURED,
                server: None,
            }),
            params: Mutex::new(params),
            events: Mutex::new(None),
        }
    }

    /// From now on, every transition is published on `publisher`.
    pub(super) fn publish_transitions_on(
        &self,
        publisher: Publisher<TransitionEvent>,
        clock: NodeClock,
    ) {
        *self.events.lock().unwrap() = Some((publisher, clock));
    }

    fn publish(&self, (id, label): (u8, &str), from: u8, to: u8) {
        if let Some((publisher, clock)) = &*self.events.lock().unwrap() {
            let event = TransitionEvent {
                timestamp: clock.now().as_nanos() as u64,
                transition: Transition {
                    id,
                    label: label.into(),
                },
                start_state: state(from),
                goal_state: state(to),
            };
            if let Err(e) = publisher.publish(&event) {
                log::warn!("publishing the transition event: {e}");
            }
        }
    }

    pub(crate) fn state(&self) -> State {
        state(self.inner.lock().unwrap().state)
    }

    /// The server when the node is active.
    fn active(&self) -> Result<Arc<Server>, String> {
        let i = self.inner.lock().unwrap();
        match (&i.server, i.state) {
            (Some(s), ACTIVE) => Ok(s.clone()),
            (_, id) => Err(format!(
                "rejected: the node is {} (lifecycle); it serves once activated",
                state(id).label
            )),
        }
    }

    /// Queues `job` on the active server, or answers it at once.
    pub(crate) fn submit(&self, job: Job) -> bool {
        match self.active() {
            Ok(s) => s.submit(job),
            Err(why) => {
                log::info!("request {} {why}", job.request.id);
                (job.on_done)(Reply::error(&job.request.id, why));
                false
            }
        }
    }

    /// Whether a goal would be queued now, else why not.
    pub(crate) fn room(&self) -> Result<(), String> {
        let s = self.active()?;
        match s.has_room() {
            true => Ok(()),
            false => Err(s.queue_full_reason()),
        }
    }

    pub(crate) fn purge_cancelled(&self) {
        if let Some(s) = self.inner.lock().unwrap().server.clone() {
            s.purge_cancelled();
        }
    }

    /// The loaded server's [`Bounds`]; `None` while unconfigured.
    pub(crate) fn bounds(&self) -> Option<Bounds> {
        let server = self.inner.lock().unwrap().server.clone();
        server.map(|s| s.bounds())
    }

    pub(crate) fn stats(&self) -> Stats {
        match self.inner.lock().unwrap().server.clone() {
            Some(s) => s.stats(),
            None => Stats {
                rss_bytes: crate::sys::memory::rss_bytes(),
                peak_rss_bytes: crate::sys::memory::peak_rss_bytes(),
                ..Default::default()
            },
        }
    }

    /// Applies runtime settings to the loaded server (unconfigured: kept
    /// for the next configure, which checks them).
    pub fn update_settings(&self, new: RuntimeSettings, params: &NodeParams) -> Result<()> {
        let server = self.inner.lock().unwrap().server.clone();
        if let Some(s) = server {
            s.update_settings(new)?;
        }
        *self.params.lock().unwrap() = params.clone();
        Ok(())
    }

    /// Runs transition `id`; returns the state reached.
    pub fn transition(&self, id: u8) -> Result<u8> {
        let from = self.inner.lock().unwrap().state;
        let Some(t) = TRANSITIONS.iter().find(|t| t.0 == id && t.2 == from) else {
            bail!(
                "transition {id} is not available from state {}",
                state(from).label
            );
        };
        let (between, success) = intermediate(id);
        self.publish((id, t.1), from, between);
        match id {
            CONFIGURE => {
                self.inner.lock().unwrap().state = CONFIGURING;
                let params = self.params.lock().unwrap().clone();
                log::info!("configure: loading {}", params.summary());
                match Server::start(params.server_config()) {
                    Ok(s) => self.inner.lock().unwrap().server = Some(Arc::new(s)),
                    Err(e) => {
                        self.inner.lock().unwrap().state = UNCONFIGURED;
                        self.publish((success + 1, "transition_failure"), between, from);
                        return Err(e.context("configure: loading the engine"));
                    }
                }
            }
            CLEANUP | UNCONFIGURED_SHUTDOWN | INACTIVE_SHUTDOWN | ACTIVE_SHUTDOWN => {
                let server = self.inner.lock().unwrap().server.take();
                if let Some(s) = server {
                    // Stops what runs, answers what waits, joins the worker:
                    // the engine goes with it.
                    s.shutdown();
                    drop(s);
                    crate::sys::memory::release_free_memory();
                }
            }
            _ => {}
        }
        self.inner.lock().unwrap().state = t.3;
        self.publish((success, "transition_success"), between, t.3);
        log::info!(
            "lifecycle: {} -> {} ({}), RSS {:.0} MiB",
            state(from).label,
            state(t.3).label,
            t.1,
            crate::sys::memory::rss_bytes() as f64 / 1048576.0
        );
        Ok(t.3)
    }

    /// Stops everything at exit.
    pub(crate) fn shutdown(&self) {
        // Kept in place: what arrives after this is refused by the server
        // itself, as "the node is shutting down".
        let server = self.inner.lock().unwrap().server.clone();
        if let Some(s) = server {
            s.shutdown();
        }
    }
}

/// The lifecycle services' request streams.
pub(super) struct Services<A, B, C, D, E> {
    pub change: A,
    pub get: B,
    pub states: C,
    pub transitions: D,
    pub graph: E,
}

/// Serves the lifecycle services until the node goes.
pub(super) async fn serve<A, B, C, D, E>(services: Services<A, B, C, D, E>, managed: Arc<Managed>)
where
    A: futures::Stream<Item = r2r::ServiceRequest<ChangeState::Service>> + Unpin,
    B: futures::Stream<Item = r2r::ServiceRequest<GetState::Service>> + Unpin,
    C: futures::Stream<Item = r2r::ServiceRequest<GetAvailableStates::Service>> + Unpin,
    D: futures::Stream<Item = r2r::ServiceRequest<GetAvailableTransitions::Service>> + Unpin,
    E: futures::Stream<Item = r2r::ServiceRequest<GetAvailableTransitions::Service>> + Unpin,
{
    let (mut change, mut get, mut states, mut transitions, mut graph) = (
        services.change.fuse(),
        services.get.fuse(),
        services.states.fuse(),
        services.transitions.fuse(),
        services.graph.fuse(),
    );
    let busy = Arc::new(Mutex::new(false));
    loop {
        futures::select! {
            req = change.select_next_some() => {
                // By id, or (id 0) by label from the current state, as rcl takes it.
                let t = &req.message.transition;
                let now = managed.state().id;
                let id = match t.id {
                    0 => TRANSITIONS.iter().find(|x| x.1 == t.label && x.2 == now).map_or(0, |x| x.0),
                    id => id,
                };
                let (m, busy) = (managed.clone(), busy.clone());
                if std::mem::replace(&mut *busy.lock().unwrap(), true) {
                    log::warn!("transition {id} refused: another transition is running");
                    let _ = req.respond(ChangeState::Response { success: false });
                    continue;
                }
                // Configure loads the model: off the executor.
                std::thread::spawn(move || {
                    let result = m.transition(id);
                    if let Err(e) = &result {
                        log::error!("lifecycle: {e:#}");
                    }
                    *busy.lock().unwrap() = false;
                    let _ = req.respond(ChangeState::Response { success: result.is_ok() });
                });
            }
            req = get.select_next_some() => {
                let _ = req.respond(GetState::Response { current_state: managed.state() });
            }
            req = states.select_next_some() => {
                let all = [
                    UNCONFIGURED, INACTIVE, ACTIVE, FINALIZED, CONFIGURING, CLEANINGUP, SHUTTINGDOWN,
                    ACTIVATING, DEACTIVATING,
                ]
                .map(state);
                let _ = req.respond(GetAvailableStates::Response { available_states: all.to_vec() });
            }
            req = transitions.select_next_some() => {
                let now = managed.state().id;
                let available = TRANSITIONS.iter().filter(|t| t.2 == now).map(description).collect();
                let _ = req.respond(GetAvailableTransitions::Response { available_transitions: available });
            }
            req = graph.select_next_some() => {
                let all = TRANSITIONS.iter().map(description).collect();
                let _ = req.respond(GetAvailableTransitions::Response { available_transitions: all });
            }
            complete => break,
        }
    }
}
