//! What reads rosbag2 bags, apart from the product crate so that the node's
//! build does not compile the bag readers (mcap, rusqlite): the bag reader
//! itself ([`bag`]), the offline profiler that ranks neurons on task data or
//! on a robot's recorded prompts ([`profile`], binary `selectinfer_profile`)
//! and the replay of a bag of prompts against a running node ([`replay`],
//! binary `selectinfer_replay`, feature `ros`). Uses only `selectinfer`'s
//! public API.

pub mod bag;
pub mod profile;
pub mod replay;
