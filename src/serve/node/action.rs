//! The action `~/generate_stream`: goals share the server's queue; new
//! text goes out as feedback and the result from the worker thread; cancel
//! requests are handled on the executor; goals whose clients left the graph
//! are cancelled.

use super::clock::NodeClock;
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

fn action_result(r: &Reply, status: i8, clock: &NodeClock) -> GenerateAction::Result {
    reply_into!(GenerateAction::Result, r, clock.stamp(), status: status)
}

/// Finds abandoned action goals. Each goal remembers its client's DDS
/// participant (the first 12 bytes of the goal request's writer GUID, which
/// every endpoint of that client shares). Once that participant has been
/// seen among the `send_goal` request writers on the graph and then no
/// longer is (that participant has no `send_goal` writer left: its action
/// client was destroyed, or its process died and its DDS lease ran out),
/// the goal is abandoned: it is cancelled, which frees its slot. Other
/// clients staying on the graph do not keep it alive. The GUID layout is
/// Fast DDS's (the RMW `.ros/env.sh` selects); under an RMW whose
/// `writer_guid` is no GUID the client is never seen and goals run to
/// their end, as they would with no watch.
#[derive(Default)]
pub(super) struct GoalWatch {
    /// Running or queued goals by goal id (two clients may use the same
    /// request id): their request id, cancel token, client's participant
    /// and whether it has been seen on the graph yet.
    pub goals: HashMap<r2r::uuid::Uuid, Watched>,
}

/// One watched goal.
pub(super) struct Watched {
    request_id: String,
    cancel: CancelToken,
    client: Participant,
    seen: bool,
}

/// A DDS participant: the 12-byte GUID prefix of its endpoints.
pub(super) type Participant = [u8; 12];

/// The participant of an endpoint GUID / GID (its first 12 bytes).
pub(super) fn participant_of(guid: &[u8]) -> Participant {
    let mut p = [0u8; 12];
    let n = guid.len().min(12);
    p[..n].copy_from_slice(&guid[..n]);
    p
}

impl GoalWatch {
    fn accept(
        &mut self,
        goal: r2r::uuid::Uuid,
        id: &str,
        cancel: CancelToken,
        client: Participant,
    ) {
        let w = Watched {
            request_id: id.to_string(),
            cancel,
            client,
            seen: false,
        };
        self.goals.insert(goal, w);
    }

    /// Takes the participants with a `send_goal` writer on the graph now;
    /// returns the goals (request id, cancel token) whose client was there
    /// before and has left.
    fn update(&mut self, present: &HashSet<Participant>) -> Vec<(String, CancelToken)> {
        let mut gone = Vec::new();
        for w in self.goals.values_mut() {
            if present.contains(&w.client) {
                w.seen = true;
            } else if w.seen && !w.cancel.is_cancelled() {
                gone.push((w.request_id.clone(), w.cancel.clone()));
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
        // Rejections leave through the pacer, as service replies do: every
        // client's reader gets every goal response, and a burst of them
        // overflows default-QoS clients (8 planners x 10 goals at once:
        // 133 of 400 goals never heard back, with r2r's goal-request depth
        // of 10 as well).
        if let Err(why) = server.room() {
            // An action goal response has no reason field: the reason
            // goes to ~/response under the goal's request id.
            log::info!("goal {id} {why}");
            let rid = id.clone();
            out.pacer.send(move || {
                if let Err(e) = req.reject() {
                    log::error!("rejecting goal {rid}: {e}");
                }
            });
            publish_response(&out, &Reply::error(&id, why));
            continue;
        }
        let (client, goal_id) = (participant_of(&req.client_guid()), req.uuid);
        // Accepted at once: admission (room, accept, submit) stays one step
        // on this thread, so the slot seen free is the slot taken; at most
        // queue_depth + 1 acceptances come in a burst.
        let (goal, mut cancels) = match req.accept() {
            Ok(x) => x,
            Err(e) => {
                log::error!("accepting goal {id}: {e}");
                continue;
            }
        };
        let cancel = CancelToken::default();
        watch
            .lock()
            .unwrap()
            .accept(goal_id, &id, cancel.clone(), client);
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
                goal.cancel(action_result(&reply, STATUS_CANCELED, &out2.clock))
            };
            let sent = if by_client.is_cancelled() {
                canceled(&mut result_goal)
            } else {
                let done = if reply.success && !reply.cancelled() {
                    result_goal.succeed(action_result(&reply, STATUS_SUCCEEDED, &out2.clock))
                } else {
                    result_goal.abort(action_result(&reply, STATUS_ABORTED, &out2.clock))
                };
                done.or_else(|e| {
                    log::warn!("goal {id}: {e} on its result; sending it as canceled");
                    canceled(&mut result_goal)
                })
            };
            if let Err(e) = sent {
                log::error!("sending the result of goal {id}: {e}");
            }
            watch_done.lock().unwrap().goals.remove(&goal_id);
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
            let present = infos
                .iter()
                .map(|i| participant_of(&i.endpoint_gid))
                .collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ps: &[Participant]) -> HashSet<Participant> {
        ps.iter().copied().collect()
    }

    #[test]
    fn a_goal_is_abandoned_when_its_own_client_leaves_though_others_stay() {
        let (a, b, c) = ([1u8; 12], [2u8; 12], [3u8; 12]);
        let mut w = GoalWatch::default();
        let (ga, gc) = (r2r::uuid::Uuid::from_u128(1), r2r::uuid::Uuid::from_u128(2));
        w.accept(ga, "from-a", CancelToken::default(), a);
        w.accept(gc, "from-c", CancelToken::default(), c);
        // c is not on the graph yet (discovery lags): never abandoned unseen.
        assert!(w.update(&set(&[a, b])).is_empty());
        assert!(w
            .update(&set(&[b]))
            .iter()
            .map(|(id, _)| id.as_str())
            .eq(["from-a"]));
        // Once seen, c's goal goes when c goes; a cancelled goal is not
        // reported again.
        assert!(w.update(&set(&[b, c])).iter().all(|(id, _)| id == "from-a"));
        w.goals[&ga].cancel.cancel();
        let gone = w.update(&set(&[b]));
        assert_eq!(
            gone.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
            ["from-c"]
        );
    }

    #[test]
    fn a_participant_is_the_guid_prefix() {
        let guid: Vec<u8> = (0..16).collect();
        assert_eq!(
            participant_of(&guid),
            <[u8; 12]>::try_from(&guid[..12]).unwrap()
        );
        assert_eq!(
            participant_of(&[7, 7]),
            [7, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
    }
}
