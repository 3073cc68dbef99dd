//! Serving (layer 5): requests and replies ([`request`]), the request
//! queue any front end drives ([`server`]) and the ROS 2 node on top of it
//! ([`node`], feature `ros`). Replaying rosbag2 bags against a running node
//! is the workspace's `selectinfer-bagtools` crate.

#[cfg(feature = "ros")]
pub mod node;
pub mod request;
pub mod server;
