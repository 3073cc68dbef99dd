"""Starts selectinfer_node as a lifecycle node (standard launch_ros API).

    ros2 launch selectinfer node.launch.py [model:=qwen2.5-coder-0.5b-instruct]
        [namespace:=/robot1] [autostart:=true] [log_level:=info]
        [use_sim_time:=false] [params_file:=/path/to/node.yaml]
        [runtime_params_file:=/path/kept.yaml]
        [respawn:=true] [respawn_delay:=1.0] [respawn_max_retries:=5]

The default parameters file is the installed share/selectinfer/config/node.yaml.
`model` (a catalog name, or a model folder) overrides the file's: a catalog
model resolves in the models home ($SELECTINFER_MODELS, else
$XDG_DATA_HOME/selectinfer/models, else ~/.local/share/selectinfer/models),
is prepared there on first use, and brings its preset
(share/selectinfer/config/models/NAME.yaml); any key of `params_file` wins
over the preset's. Works from any working directory.

The node is a `LifecycleNode`: with `autostart:=true` (the default) launch
configures it as soon as its process starts and activates it once
configure has succeeded (launch events: ChangeState on process start,
OnStateTransition configuring -> inactive); with `autostart:=false` it stays
unconfigured until `ros2 lifecycle set <node> configure`. A configure that
fails (a model file that will not load) leaves the node unconfigured, with
the error in its log and on /rosout.

A node that dies (crash, kill -9, out of memory) is started again after
`respawn_delay` seconds while `respawn` is true (the default), at most
`respawn_max_retries` times (default 5; -1: always), and configured and
activated again, with the parameters set at runtime before it died (kept in
`runtime_params_file`, by default one file per launch in the temporary
folder): callers whose requests were in flight get no reply (their timeout
fires); everything sent after the node is back is served.
A node that cannot start because of its configuration (an unknown or
invalid parameter, a model or ranking path that does not exist) exits with
code 78 and is not restarted: launch ends with one message, after the
node's own error naming the path and the folder it was resolved against.
SIGINT to the launch stops the node for good: it answers or cancels what it
had queued, then exits 0.

`respawn` is passed on as a substitution; launch's ExecuteProcess takes
`respawn_delay` only as a float and `respawn_max_retries` as an int, so the
node is built in an OpaqueFunction that converts them when the launch runs.
"""

import os
import tempfile

import lifecycle_msgs.msg
from launch import LaunchDescription
from launch.actions import (DeclareLaunchArgument, EmitEvent, LogInfo, OpaqueFunction,
                            RegisterEventHandler, TimerAction)
from launch.event_handlers import OnProcessExit, OnProcessStart
from launch.events import Shutdown
from launch.events.matchers import matches_action
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from launch_ros.substitutions import FindPackageShare

# The node's exit code for a configuration it cannot start with
# (sysexits' EX_CONFIG; src/serve/node/mod.rs).
EXIT_CONFIG = 78
# Seconds from a respawned node's start to its configure request: its
# services discovered (milliseconds on one machine), its dead predecessor's
# still listed (launch_ros would call that one).
RESPAWN_DISCOVERY_S = 2.0


def _truthy(context, name):
    return LaunchConfiguration(name).perform(context).strip().lower() in ("true", "1", "yes")


def _runtime_params_file(context):
    """The file the node keeps runtime parameter changes in: the argument,
    else one for this launch (its pid), so a respawn keeps them and the next
    launch starts from the parameters files."""
    given = LaunchConfiguration("runtime_params_file").perform(context)
    if given:
        return given
    ns = LaunchConfiguration("namespace").perform(context).strip("/").replace("/", ".") or "root"
    return os.path.join(tempfile.gettempdir(), f"selectinfer-{os.getuid()}",
                        f"{ns}.selectinfer_node.{os.getpid()}.yaml")


def _node(context):
    respawn_delay = float(LaunchConfiguration("respawn_delay").perform(context))
    max_retries = int(LaunchConfiguration("respawn_max_retries").perform(context))
    # Launch drives the lifecycle: the node's own autostart stays off.
    overrides = {"autostart": False, "use_sim_time": _truthy(context, "use_sim_time"),
                 "runtime_params_file": _runtime_params_file(context)}
    model = LaunchConfiguration("model").perform(context)
    if model:
        overrides["model"] = model
    node = LifecycleNode(
        package="selectinfer",
        executable="selectinfer_node",
        name="selectinfer_node",
        namespace=LaunchConfiguration("namespace"),
        output="screen",
        emulate_tty=True,
        parameters=[LaunchConfiguration("params_file"), overrides],
        ros_arguments=["--log-level", LaunchConfiguration("log_level")],
        respawn=LaunchConfiguration("respawn"),
        respawn_delay=respawn_delay,
        respawn_max_retries=max_retries,
    )

    def change(transition):
        return EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(node),
                                           transition_id=transition))

    def on_exit(event, _context):
        if event.returncode == EXIT_CONFIG:
            return [LogInfo(msg="selectinfer_node cannot start with this configuration "
                                "(its error above names the parameter or path); not restarting it"),
                    EmitEvent(event=Shutdown(reason="selectinfer_node: configuration error"))]
        return None

    starts = []

    def on_start(_event, _context):
        # Configure on every start, respawns included. After a respawn the
        # dead process's change_state service is still on the graph until
        # its DDS lease ends, so launch_ros would call it at once and wait
        # forever for an answer: wait until the new process has been
        # discovered instead.
        starts.append(1)
        configure = change(lifecycle_msgs.msg.Transition.TRANSITION_CONFIGURE)
        if len(starts) == 1:
            return [configure]
        return [TimerAction(period=RESPAWN_DISCOVERY_S, actions=[configure])]

    actions = [node, RegisterEventHandler(OnProcessExit(target_action=node, on_exit=on_exit))]
    if _truthy(context, "autostart"):
        actions += [
            RegisterEventHandler(OnProcessStart(target_action=node, on_start=on_start)),
            RegisterEventHandler(OnStateTransition(
                target_lifecycle_node=node, start_state="configuring", goal_state="inactive",
                entities=[change(lifecycle_msgs.msg.Transition.TRANSITION_ACTIVATE)])),
        ]
    return actions


def generate_launch_description():
    args = [
        DeclareLaunchArgument(
            "params_file",
            default_value=PathJoinSubstitution(
                [FindPackageShare("selectinfer"), "config", "node.yaml"]),
            description="selectinfer_node parameters (YAML, ros__parameters)"),
        DeclareLaunchArgument(
            "model", default_value="",
            description="catalog model name or model folder ('' = the parameters file's)"),
        DeclareLaunchArgument(
            "namespace", default_value="",
            description="the node's namespace (its topics, services and action under it)"),
        DeclareLaunchArgument(
            "autostart", default_value="true",
            description="configure and activate the lifecycle node once it starts (true|false)"),
        DeclareLaunchArgument(
            "log_level", default_value="info",
            description="the node's log level (debug|info|warn|error|fatal)"),
        DeclareLaunchArgument(
            "use_sim_time", default_value="false",
            description="stamp replies and diagnostics with /clock (true|false)"),
        DeclareLaunchArgument(
            "runtime_params_file", default_value="",
            description="file runtime parameter changes are kept in across respawns "
                        "('' = one per launch in the temporary folder)"),
        DeclareLaunchArgument(
            "respawn", default_value="true",
            description="start the node again when it dies (true|false)"),
        DeclareLaunchArgument(
            "respawn_delay", default_value="1.0",
            description="seconds between the node's death and its restart"),
        DeclareLaunchArgument(
            "respawn_max_retries", default_value="5",
            description="restarts at most (-1: no limit)"),
    ]
    return LaunchDescription(args + [OpaqueFunction(function=_node)])
