//! Tests of internals that need the layers below `tools` together: the
//! quantized checkpoints on the real SmolLM2 and Qwen weights
//! ([`quantized`]), the fidelity harness and its knobs on SmolLM2
//! ([`fidelity`]), the coarse FFN tier ([`ffn_tier`]), the 8-bit KV cache ([`kv_cache`]), property/fuzz tests of the project's own checkpoint
//! readers ([`readers_fuzz`]) and the inputs that once crashed them
//! ([`reader_regressions`]). They live in the crate, not in tests/, so that
//! the model's readers need not be public; they share the fuzz harness and
//! fixtures of `tests/fuzz/`.

use crate::engine::tests::common;
#[allow(dead_code)]
#[path = "../../../tests/fuzz/fixtures.rs"]
mod fixtures;
#[macro_use]
#[allow(dead_code)]
#[path = "../../../tests/fuzz/harness.rs"]
mod harness;
mod ffn_tier;
mod fidelity;
mod kv_cache;
#[allow(dead_code)]
#[path = "../../../tests/fuzz/mutate.rs"]
mod mutate;
mod quantized;
mod reader_regressions;
mod readers_fuzz;
