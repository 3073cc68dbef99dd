//! Tools around the engine (layer 5): fetching and converting real weights
//! ([`prepare`], [`convert`]), the offline profiler ([`profile`]), the
//! evaluation harness ([`eval`], [`metrics`], [`data`]), the teacher-forced
//! [`fidelity`] instrument, benchmarks
//! ([`bench`]), synthetic models of real shapes ([`synth`]), candle's
//! quantized GGUF model as a baseline engine ([`gguf`]) and the CPU-vs-device
//! parity check ([`parity`]), a task hot-swap against a restart
//! ([`hotswap`]); with the `plot` feature, the fidelity
//! instrument's retention/speed-up plot ([`plot`]).

pub mod bench;
pub mod bfcl;
pub mod data;
pub mod eval;
pub mod fidelity;
pub mod gguf;
pub mod hotswap;
pub mod metrics;
pub mod parity;
#[cfg(feature = "plot")]
pub mod plot;
pub mod profile;
pub mod synth;
pub mod tune;
