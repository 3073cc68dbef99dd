//! Between the interfaces' messages and the server's types: requests from
//! the Prompt message, the service request and the action goal; replies
//! into the Response message, the service response and the action result;
//! the publishers every request's tokens and reply go out on.

use super::clock::NodeClock;
use super::pacer::Pacer;
use crate::engine::tool_calls::ToolCall;
use crate::engine::Message;
use crate::serve::server::{new_request_id, Reply, Request, TokenSink};
use r2r::selectinfer_msgs::{msg as si, srv::Generate};
use r2r::Publisher;
use std::sync::{Arc, Mutex};

type Shared<T> = Arc<Mutex<Publisher<T>>>;

/// Where a request's tokens and reply go.
#[derive(Clone)]
pub(super) struct Outputs {
    pub tokens: Shared<si::Token>,
    pub responses: Shared<si::Response>,
    /// Every reply (service response, `~/response` message) leaves through it.
    pub pacer: Arc<Pacer>,
    /// Stamps every token and reply.
    pub clock: NodeClock,
}

impl Outputs {
    pub(crate) fn token_sink(&self, request_id: &str) -> TokenSink {
        let (tokens, clock) = (self.tokens.clone(), self.clock.clone());
        let id = request_id.to_string();
        Box::new(move |index, text| {
            let msg = si::Token {
                request_id: id.clone(),
                index: index as u32,
                text: text.to_string(),
                done: false,
                stamp: clock.stamp(),
            };
            if let Err(e) = tokens.lock().unwrap().publish(&msg) {
                log::warn!("publishing a token of {id}: {e}");
            }
        })
    }

    /// Marks the end of a request's token stream.
    pub(crate) fn finish_tokens(&self, reply: &Reply) {
        let msg = si::Token {
            request_id: reply.request_id.clone(),
            index: reply.generated_tokens as u32,
            text: String::new(),
            done: true,
            stamp: self.clock.stamp(),
        };
        if let Err(e) = self.tokens.lock().unwrap().publish(&msg) {
            log::warn!("publishing the end of {}: {e}", reply.request_id);
        }
    }
}

/// Any interface type carrying the response fields (the Response message,
/// the service response, the action result), filled from a [`Reply`] and
/// stamped with `$stamp`.
macro_rules! reply_into {
    ($ty:path, $r:expr, $stamp:expr $(, $field:ident: $value:expr)*) => {{
        let r: &Reply = $r;
        $ty {
            stamp: $stamp,
            success: r.success,
            error: r.error.clone(),
            request_id: r.request_id.clone(),
            text: r.text.clone(),
            prompt_tokens: r.prompt_tokens as u32,
            cached_prompt_tokens: r.cached_prompt_tokens as u32,
            generated_tokens: r.generated_tokens as u32,
            ttft_s: r.ttft_s as f32,
            tokens_per_s: r.tokens_per_s as f32,
            compute_ratio: r.compute_ratio as f32,
            stop_reason: r.stop_reason.clone(),
            tool_calls: r.tool_calls.iter().map($crate::serve::node::messages::tool_call_msg).collect(),
            $($field: $value,)*
        }
    }};
}

/// A call as the interfaces carry it.
pub(super) fn tool_call_msg(c: &ToolCall) -> si::ToolCall {
    si::ToolCall {
        id: c.id.clone(),
        name: c.name.clone(),
        arguments: c.arguments.clone(),
    }
}

/// A conversation turn from its message.
pub(super) fn turn(m: &si::ChatMessage) -> Message {
    Message {
        tool_calls: m
            .tool_calls
            .iter()
            .map(|c| ToolCall {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect(),
        ..Message::new(&m.role, &m.content)
    }
}

pub(super) fn response_msg(r: &Reply, clock: &NodeClock) -> si::Response {
    reply_into!(si::Response, r, clock.stamp())
}

pub(super) fn service_response(r: &Reply, clock: &NodeClock) -> Generate::Response {
    reply_into!(Generate::Response, r, clock.stamp())
}

/// A [`Request`] from any interface message with the request fields
/// (Prompt, the service request, the action goal).
macro_rules! request_of {
    ($m:expr) => {{
        let m = &$m;
        $crate::serve::server::Request {
            messages: m
                .messages
                .iter()
                .map($crate::serve::node::messages::turn)
                .collect(),
            stop: m.stop.clone(),
            json_schema: m.json_schema.clone(),
            grammar: m.grammar.clone(),
            tools: m.tools.clone(),
            tool_choice: m.tool_choice.clone(),
            parallel_tool_calls: m.parallel_tool_calls,
            ..$crate::serve::node::messages::request(
                &m.request_id,
                &m.prompt,
                &m.task,
                m.max_new_tokens,
                m.temperature,
                m.top_p,
                m.seed,
            )
        }
    }};
}

/// Request fields as the interfaces carry them (negative = node default);
/// a request without an id gets one.
#[allow(clippy::too_many_arguments)]
pub(super) fn request(
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
            new_request_id()
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
        ..Request::default()
    }
}

/// Publishes a reply on `~/response` (topic requests, rejected goals),
/// paced behind the replies before it.
pub(super) fn publish_response(out: &Outputs, reply: &Reply) {
    let (responses, msg) = (out.responses.clone(), response_msg(reply, &out.clock));
    out.pacer.send(move || {
        if let Err(e) = responses.lock().unwrap().publish(&msg) {
            log::error!("publishing the response of {}: {e}", msg.request_id);
        }
    });
}

pub(crate) use reply_into;
pub(crate) use request_of;
