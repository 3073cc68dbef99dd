//! Serving (layer 5): requests and replies ([`request`]), the request
//! queue any front end drives ([`server`]), the ROS 2 node on top of it ([`node`], feature `ros`), and
//! rosbag replay against a running node ([`replay`]).

#[cfg(feature = "ros")]
pub mod node;
pub mod replay;
pub mod request;
pub mod server;
