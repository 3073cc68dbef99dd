//! The service `~/generate`: each request joins the server's queue and is
//! answered when its generation ends, through the reply pacer.

use super::lifecycle::Managed;
use super::messages::{request_of, service_response, Outputs};
use crate::serve::server::{CancelToken, Job, Reply};
use futures::StreamExt;
use r2r::selectinfer_msgs::srv::Generate;
use std::sync::Arc;

/// Serves service requests until the node goes.
pub(super) async fn serve(
    mut services: impl futures::Stream<Item = r2r::ServiceRequest<Generate::Service>> + Unpin,
    server: Arc<Managed>,
    out: Outputs,
) {
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
                let (response, id) = (service_response(&reply, &out2.clock), reply.request_id);
                out2.pacer.send(move || {
                    if let Err(e) = req.respond(response) {
                        log::error!("answering service request {id}: {e}");
                    }
                });
            }),
        };
        server.submit(job);
    }
}
