//! SelectInfer: selective neuron loading and computation for serving LLMs
//! on small hardware, as a ROS 2 node.
//!
//! The library works without ROS: [`prepare`] fetches and [`convert`]s real
//! weights, [`model`] is the Llama/Qwen2 transformer, [`generate`] drives it,
//! [`bench`] measures it, [`server`] queues requests for a front end such as
//! the ROS 2 node (`node`, feature `ros`). Binaries in `src/bin` are thin
//! shells over these.

pub mod bag;
pub mod bench;
pub mod convert;
pub mod data;
pub mod device;
pub mod eval;
pub mod generate;
pub mod gguf;
pub mod hugepages;
pub mod kernels;
pub mod metrics;
pub mod model;
#[cfg(feature = "ros")]
pub mod node;
pub mod plan;
pub mod prepare;
pub mod profile;
pub mod ranking;
pub mod replay;
pub mod rowread;
pub mod selective;
pub mod server;
pub mod spec;
pub mod spin_pool;
pub mod synth;
pub mod sysinfo;
pub mod text;
