//! SelectInfer: selective neuron loading and computation for serving LLMs
//! on small hardware, as a ROS 2 node.
//!
//! # Layers
//! Each top-level module is a layer; a layer imports only the layers below
//! it (`tests/layers.rs` fails on an upward import or a cycle):
//!
//! | # | layer | what it is for |
//! |---|---|---|
//! | 0 | [`sys`] | platform facts: devices and dtypes, huge pages, RSS, memory bandwidth |
//! | 1 | [`kernels`] | CPU decode kernels split by op, ISA back ends apart, the spin pool |
//! | 2 | [`model`] | the Llama/Qwen2 transformer and checkpoint reading; knows nothing of the method |
//! | 3 | [`method`] | SelectInfer: parameters, modes, rankings, load plans, prompt selection |
//! | 4 | [`engine`] | the one loader (every default), prefill + selection + decode loop, sampling, text |
//! | 5 | [`store`] | models by name in the models home, prepare/convert/quantize, installed rankings and presets |
//! | 6 | [`tools`] | tune, eval + metrics, bench, fidelity, synth, the GGUF baseline, device parity |
//! | 6 | [`serve`] | the request queue, the ROS 2 node (feature `ros`) |
//!
//! `tools` and `serve` sit side by side: neither imports the other. The
//! binaries in `src/bin` only parse arguments and print.
//!
//! This is the product crate of a workspace: what reads rosbag2 bags (the
//! offline profiler, replay) is `crates/bagtools`, the research bench is
//! `lab/`; both use this crate's public API, and this crate depends on
//! neither (nor on their mcap, rusqlite or plotters).

// The fuzz harness and fixtures of tests/fuzz/, shared by the integration
// tests and the crate's own tests, name the crate `selectinfer`.
#[cfg(test)]
extern crate self as selectinfer;

pub mod engine;
pub mod kernels;
pub mod method;
pub mod model;
pub mod serve;
pub mod store;
pub mod sys;
pub mod tools;
