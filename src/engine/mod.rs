//! The engine (layer 4): the one loader ([`spec`], with every default in
//! [`defaults`]), our engine ([`generate`]: prefill + selection + decode on
//! the chosen rows), the decode loop any engine shares ([`decode`]),
//! sampling, the tokenizer/chat-template side ([`text`]), stop strings
//! ([`stops`]), structured output ([`grammar`]), tool calls
//! ([`tool_calls`], a request's offer of them: [`tool_offer`]) and the
//! prefix cache ([`prefix`]), the output vocabulary per request ([`vocab`]).

pub(crate) mod decode;
pub mod defaults;
pub(crate) mod generate;
pub(crate) mod grammar;
pub(crate) mod prefix;
pub(crate) mod sampling;
pub(crate) mod spec;
pub(crate) mod stops;
pub(crate) mod text;
pub(crate) mod tool_calls;
pub(crate) mod tool_offer;
pub(crate) mod vocab;

#[cfg(test)]
pub(crate) mod tests;

pub use decode::{CallGate, CallThresholds, GenerateOptions, Generation, Generator, StopReason};
pub use generate::Engine;
pub use grammar::Grammar;
pub use sampling::Sampling;
pub use spec::{EngineSpec, SwapReport};
pub use text::{conversation, Message, TextCodec};
pub use tool_calls::{Tool, ToolCall};
