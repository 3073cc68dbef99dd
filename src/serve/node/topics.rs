//! The topics: `~/prompt` (`selectinfer_msgs/msg/Prompt`) and plain
//! `std_msgs/String` instructions, answered on `~/response` under the same
//! request id.

use super::lifecycle::Managed;
use super::messages::{publish_response, request, request_of, Outputs};
use crate::serve::server::{CancelToken, Job, Reply, Request};
use futures::StreamExt;
use r2r::selectinfer_msgs::msg as si;
use r2r::std_msgs;
use std::sync::Arc;

/// Queues a topic request; its reply goes to `~/response`.
fn submit(server: &Managed, out: &Outputs, r: Request) {
    let id = r.id.clone();
    let out2 = out.clone();
    server.submit(Job {
        request: r,
        cancel: CancelToken::default(),
        on_token: out.token_sink(&id),
        on_done: Box::new(move |reply: Reply| {
            out2.finish_tokens(&reply);
            publish_response(&out2, &reply);
        }),
    });
}

/// Serves `~/prompt` messages until the node goes.
pub(super) async fn serve_prompts(
    mut prompts: impl futures::Stream<Item = si::Prompt> + Unpin,
    server: Arc<Managed>,
    out: Outputs,
) {
    while let Some(m) = prompts.next().await {
        submit(&server, &out, request_of!(m));
    }
}

/// Serves plain instructions (every request field at the node's default)
/// until the node goes.
pub(super) async fn serve_instructions(
    mut instructions: impl futures::Stream<Item = std_msgs::msg::String> + Unpin,
    server: Arc<Managed>,
    out: Outputs,
) {
    while let Some(m) = instructions.next().await {
        submit(&server, &out, request("", &m.data, "", -1, -1.0, -1.0, -1));
    }
}
