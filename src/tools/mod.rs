//! Tools around the engine (layer 6): the
//! evaluation harness ([`eval`], [`metrics`], [`data`]), the teacher-forced
//! [`fidelity`] instrument, benchmarks
//! ([`bench`]), synthetic models of real shapes ([`synth`]), candle's
//! quantized GGUF model as a baseline engine ([`gguf`]) and the CPU-vs-device
//! parity check ([`parity`]), a task hot-swap against a restart
//! ([`hotswap`]), the presets' tuner ([`tune`]), BFCL tool-call rows
//! ([`bfcl`]). The offline profiler and everything that reads rosbag2 bags
//! is the workspace's `selectinfer-bagtools` crate; the plots are the lab's.

pub mod bench;
pub(crate) mod bfcl;
pub mod data;
pub mod eval;
pub mod fidelity;
pub mod gguf;
pub mod hotswap;
pub mod metrics;
pub mod parity;
pub mod synth;
#[cfg(test)]
mod tests;
pub mod tune;
