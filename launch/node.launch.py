"""Starts selectinfer_node with a parameters file (standard launch_ros API).

    ros2 launch selectinfer node.launch.py [params_file:=/path/to/node.yaml]

The default parameters file is the installed share/selectinfer/config/node.yaml.
Its `model` path is relative to the node's working directory; give an absolute
path (or run from the repository root) on a real install.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    params_file = DeclareLaunchArgument(
        "params_file",
        default_value=PathJoinSubstitution(
            [FindPackageShare("selectinfer"), "config", "node.yaml"]
        ),
        description="selectinfer_node parameters (YAML, ros__parameters)",
    )
    node = Node(
        package="selectinfer",
        executable="selectinfer_node",
        name="selectinfer_node",
        output="screen",
        emulate_tty=True,
        parameters=[LaunchConfiguration("params_file")],
    )
    return LaunchDescription([params_file, node])
