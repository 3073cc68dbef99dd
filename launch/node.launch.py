"""Starts selectinfer_node with a parameters file (standard launch_ros API).

    ros2 launch selectinfer node.launch.py [model:=qwen2.5-coder-0.5b-instruct]
        [params_file:=/path/to/node.yaml]
        [respawn:=true] [respawn_delay:=1.0] [respawn_max_retries:=-1]

The default parameters file is the installed share/selectinfer/config/node.yaml.
`model` (a catalog name, or a model folder) overrides the file's: a catalog
model resolves in the models home ($SELECTINFER_MODELS, else
$XDG_DATA_HOME/selectinfer/models, else ~/.local/share/selectinfer/models),
is prepared there on first use, and brings its preset
(share/selectinfer/config/models/NAME.yaml); any key of `params_file` wins
over the preset's. Works from any working directory.

A node that dies (crash, kill -9, out of memory) is started again after
`respawn_delay` seconds while `respawn` is true (the default), at most
`respawn_max_retries` times (-1, the default: always; a node that cannot
start, a missing model say, then restarts every `respawn_delay`): callers whose
requests were in flight get no reply (their timeout fires); everything sent
after the node is back is served. SIGINT to the launch stops the node for
good: it answers or cancels what it had queued, then exits 0.

`respawn` is passed on as a substitution; launch's ExecuteProcess takes
`respawn_delay` only as a float and `respawn_max_retries` as an int, so the
node is built in an OpaqueFunction that converts them when the launch runs.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare


def _node(context):
    respawn_delay = float(LaunchConfiguration("respawn_delay").perform(context))
    max_retries = int(LaunchConfiguration("respawn_max_retries").perform(context))
    parameters = [LaunchConfiguration("params_file")]
    model = LaunchConfiguration("model").perform(context)
    if model:
        parameters.append({"model": model})
    return [
        Node(
            package="selectinfer",
            executable="selectinfer_node",
            name="selectinfer_node",
            output="screen",
            emulate_tty=True,
            parameters=parameters,
            respawn=LaunchConfiguration("respawn"),
            respawn_delay=respawn_delay,
            respawn_max_retries=max_retries,
        )
    ]


def generate_launch_description():
    params_file = DeclareLaunchArgument(
        "params_file",
        default_value=PathJoinSubstitution(
            [FindPackageShare("selectinfer"), "config", "node.yaml"]
        ),
        description="selectinfer_node parameters (YAML, ros__parameters)",
    )
    model = DeclareLaunchArgument(
        "model",
        default_value="",
        description="catalog model name or model folder ('' = the parameters file's)",
    )
    respawn = DeclareLaunchArgument(
        "respawn",
        default_value="true",
        description="start the node again when it dies (true|false)",
    )
    respawn_delay = DeclareLaunchArgument(
        "respawn_delay",
        default_value="1.0",
        description="seconds between the node's death and its restart",
    )
    max_retries = DeclareLaunchArgument(
        "respawn_max_retries",
        default_value="-1",
        description="restarts at most (-1: no limit)",
    )
    return LaunchDescription(
        [params_file, model, respawn, respawn_delay, max_retries,
         OpaqueFunction(function=_node)]
    )
