//! The node's ROS clock, for every stamp the node writes (replies, tokens,
//! diagnostics, parameter and transition events): wall time, or `/clock`
//! when the node runs with `use_sim_time:=true` (`ros2 bag play --clock`;
//! 0 until the first `/clock` message, as in every ROS 2 node).

use r2r::builtin_interfaces::msg::Time;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A shared handle on the node's ROS clock (r2r attaches it to `/clock`
/// when `use_sim_time` is set).
#[derive(Clone)]
pub(super) struct NodeClock(Arc<Mutex<r2r::Clock>>);

impl NodeClock {
    pub(crate) fn of(node: &r2r::Node) -> Self {
        Self(node.get_ros_clock())
    }

    /// Time since the epoch (or since the simulation's start).
    pub(crate) fn now(&self) -> Duration {
        match self.0.lock().unwrap().get_now() {
            Ok(t) => t,
            Err(e) => {
                log::warn!("reading the node's clock: {e}");
                Duration::ZERO
            }
        }
    }

    pub(crate) fn stamp(&self) -> Time {
        r2r::Clock::to_builtin_time(&self.now())
    }
}
