//! Property/fuzz tests (proptest) over the public readers of untrusted
//! bytes: the GGUF reader, request validation and the node's parameters
//! (feature `ros`). (The project's own checkpoint readers — the ranking
//! file, the quantized checkpoint and its neuron bundles, the safetensors
//! row reader — are fuzzed with the same harness in the lib's
//! `tools::tests::readers_fuzz`, the bag readers in
//! `crates/bagtools/tests/bag_fuzz.rs`.) Each reader gets random bytes
//! and mutations of a valid file made by the project's own writer (byte
//! edits, truncation, huge length/count fields, splices, edits of the JSON
//! headers kept self-consistent so deeper code runs): it must answer Ok or
//! an error naming the file, never panic, hang (a watchdog) or allocate
//! from an unchecked length (a failed allocation aborts; a case whose peak
//! RSS passes 1 GiB fails). Random `SetParameters` sequences must leave every
//! parameter in its declared range, reflect each accepted set and name the
//! parameter in each refusal.
//!
//! CI runs `SELECTINFER_FUZZ_CASES` inputs per reader (default 256):
//! `cargo test --release --features ros --test fuzz_inputs -- --nocapture`
//! prints `fuzz <reader>: <n> inputs, 0 panics (<k> accepted, ...)` per
//! reader. The long run (its counts go to docs/BENCHMARKS.md):
//! `SELECTINFER_FUZZ_CASES=40000 cargo test --release --features ros --test fuzz_inputs -- --nocapture`
//!
//! Each run draws new inputs from a random seed, printed with the counts;
//! `SELECTINFER_FUZZ_SEED=<seed>` replays a run. A case running over 120 s
//! aborts the run naming the reader and the input.
//! `SELECTINFER_FUZZ_TRACE=1` prints every input before it runs (a failed
//! allocation aborts before proptest can report: the last one printed is
//! the culprit). [`regressions`] keeps the inputs that found bugs.

#[macro_use]
#[path = "fuzz/harness.rs"]
mod harness;
#[path = "fuzz/fixtures.rs"]
mod fixtures;
#[path = "fuzz/gguf.rs"]
mod gguf;
#[allow(dead_code)]
#[path = "fuzz/mutate.rs"]
mod mutate;
#[cfg(feature = "ros")]
#[path = "fuzz/params.rs"]
mod params;
#[path = "fuzz/regressions.rs"]
mod regressions;
#[path = "fuzz/requests.rs"]
mod requests;

pub use harness::{cases, clear, file_bytes, fuzz, inputs, Input};
