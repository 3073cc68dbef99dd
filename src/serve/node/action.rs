//! The action `~/generate_stream`: goals share the server's queue; new
//! text goes out as feedback and the result from the worker thread; cancel
//! requests are handled on the executor; goals whose clients left the graph
//! are cancelled.

use super::lifecycle::Managed;
use super::messages::{publish_response, reply_into, request_of, Outputs};
use crate::serve::server::{CancelToken, Job, Reply, ReplySink, TokenSink};
use futures::channel::oneshot;
use futures::executor::LocalSpawner;
use futures::future::{self, Either};
use futures::task::LocalSpawnExt;
use futures::StreamExt;
use r2r::selectinfer_msgs::action::Generate as GenerateAction;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// GoalStatus values of the action result's `status` field.
const STATUS_SUCCEEDED: i8 = 4;
const STATUS_CANCELED: i8 = 5;
const STATUS_ABORTED: i8 = 6;

fn action_result(r: &Reply, status: i8) -> GenerateAction::Result {
    reply_into!(GenerateAction::Result, r, status: status)
}

/// Finds abandoned action goals. r2r does not say which client sent a goal,
/// so the rule is conservative: a goal remembers the action clients on the
/// graph at the first check after its acceptance (its sender among them, as
/// its request was received), and is abandoned once all of those have left
/// (their send_goal request writers are gone). It is then cancelled, which
/// frees its slot.
#[derive(Default)]
pub(super) struct GoalWatch {
    /// Running or queued goals: their cancel token and the clients seen at
    /// the first check (empty until then).
    pub goals: HashMap<String, (CancelToken, HashSet<Gid>)>,
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

/// Serves goal requests until the node goes: admission against the queue,
/// then feedback, result and cancel handling per goal.
pub(super) async fn serve(
    mut goal_requests: impl futures::Stream<Item = r2r::ActionServerGoalRequest<GenerateAction::Action>>
        + Unpin,
    server: Arc<Managed>,
    out: Outputs,
    watch: Arc<Mutex<GoalWatch>>,
    spawner_goals: LocalSpawner,
) {
    while let Some(req) = goal_requests.next().await {
        let g = &req.goal;
        let r = request_of!(g);
        let id = r.id.clone();
        if let Err(why) = server.room() {
            // An action goal response has no reason field: the reason
            // goes to ~/response under the goal's request id.
            log::info!("goal {id} {why}");
            if let Err(e) = req.reject() {
                log::error!("rejecting goal {id}: {e}");
            }
            publish_response(&out, &Reply::error(&id, why));
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
        let on_token: TokenSink = Box::new(move |index, text| {
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
        let on_done: ReplySink = Box::new(move |reply: Reply| {
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
}

/// Cancels the goals whose clients all left the graph (their send_goal
/// request writers at `send_goal_topic` are gone).
pub(super) fn cancel_abandoned(
    node: &r2r::Node,
    send_goal_topic: &str,
    watch: &Mutex<GoalWatch>,
    server: &Managed,
) {
    match node.get_publishers_info_by_topic(send_goal_topic, true) {
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
