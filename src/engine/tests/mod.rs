//! The engine's tests on the real weights (SmolLM2, Qwen2.5-Coder-0.5B,
//! prepared by the test command): tool-call gating and grammars
//! ([`structured`]), token ids against llama.cpp's ([`tokenizer`]), a task
//! hot-swap against a fresh load ([`hotswap`]), the output vocabulary
//! ([`vocab`]), selective loading and computation against dense
//! ([`selective_load`]), the per-token selection history ([`history`]).
//! They live in the crate, not
//! in tests/, so that the engine's internals they read need not be public.

// Shared with the tools' tests (`crate::engine::tests::common`): a file
// may be a module only once.
#[path = "../../../tests/common/mod.rs"]
pub(crate) mod common;
mod history;
mod hotswap;
mod selective_load;
mod structured;
mod tokenizer;
mod vocab;
