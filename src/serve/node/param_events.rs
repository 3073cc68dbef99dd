//! `/parameter_events`: what rclcpp nodes publish and `ros2 param`
//! watchers, rqt and launch listen to. At start-up every parameter is
//! announced as new; each accepted change follows as changed, naming the
//! node by its fully qualified name, stamped on the node's clock.

use super::clock::NodeClock;
use r2r::rcl_interfaces::msg::{Parameter, ParameterEvent};
use r2r::{ParameterValue, Publisher, QosProfile};

/// The node's publisher on `/parameter_events`.
pub(super) struct ParameterEvents {
    publisher: Publisher<ParameterEvent>,
    node: String,
    clock: NodeClock,
}

fn param(name: &str, v: &ParameterValue) -> Parameter {
    Parameter {
        name: name.into(),
        value: v.clone().into_parameter_value_msg(),
    }
}

impl ParameterEvents {
    pub(crate) fn new(node: &mut r2r::Node, clock: NodeClock) -> anyhow::Result<Self> {
        Ok(Self {
            publisher: node
                .create_publisher("/parameter_events", QosProfile::parameter_events())?,
            node: node.fully_qualified_name()?,
            clock,
        })
    }

    fn publish(&self, new: Vec<Parameter>, changed: Vec<Parameter>) {
        let event = ParameterEvent {
            stamp: self.clock.stamp(),
            node: self.node.clone(),
            new_parameters: new,
            changed_parameters: changed,
            deleted_parameters: Vec::new(),
        };
        if let Err(e) = self.publisher.publish(&event) {
            log::warn!("publishing on /parameter_events: {e}");
        }
    }

    /// Every parameter the node has, as new.
    pub(crate) fn announce<'a>(
        &self,
        params: impl IntoIterator<Item = (&'a String, &'a ParameterValue)>,
    ) {
        self.publish(
            params.into_iter().map(|(n, v)| param(n, v)).collect(),
            Vec::new(),
        );
    }

    /// One accepted change.
    pub(crate) fn changed(&self, name: &str, value: &ParameterValue) {
        self.publish(Vec::new(), vec![param(name, value)]);
    }
}
