//! `selectinfer_node`: the ROS 2 node (see `selectinfer::serve::node`). Start it
//! with `scripts/run_node.sh` here or `ros2 launch selectinfer node.launch.py`.

fn main() -> std::process::ExitCode {
    selectinfer::serve::node::main()
}
