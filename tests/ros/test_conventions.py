"""The node as a ROS 2 citizen: started from another folder under a
namespace, its log reaches /rosout under its logger name and honours
--log-level; parameter changes go out on /parameter_events; the
diagnostics name carries the namespace; under use_sim_time its stamps
follow /clock; what `ros2 param dump` writes starts a node with the same
values; a node that cannot start exits with EX_CONFIG (78), which launch
does not restart."""

import subprocess
import time
from pathlib import Path

import rclpy
import yaml
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.msg import TransitionEvent
from lifecycle_msgs.srv import ChangeState
from rcl_interfaces.msg import Log, ParameterEvent
from rcl_interfaces.srv import GetParameters, ListParameters
from rclpy.parameter import parameter_value_to_python
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from selectinfer_msgs.srv import Generate

from conftest import NODE_BIN, ROOT, stop_node, wait_ready
from test_node import call, call_again_until_answered, set_param, spin_until

MODEL = str(ROOT / "models" / "smollm2-135m-instruct")
SIM_START = 1000  # seconds of the simulated clock


def start(log_path, cwd, *ros_args):
    log = open(log_path, "w")
    return subprocess.Popen([str(NODE_BIN), "--ros-args", *ros_args], cwd=cwd,
                            stdout=log, stderr=subprocess.STDOUT)


def dump(node, fqn):
    """What `ros2 param dump FQN` writes (ros2param's dump verb: list, get,
    parameter_value_to_python, yaml.dump)."""
    names = call(node, node.create_client(ListParameters, f"{fqn}/list_parameters"),
                 ListParameters.Request()).result.names
    values = call(node, node.create_client(GetParameters, f"{fqn}/get_parameters"),
                  GetParameters.Request(names=names)).values
    params = {n: parameter_value_to_python(v) for n, v in zip(names, values)}
    return yaml.dump({fqn: {"ros__parameters": params}}, default_flow_style=False), params


def test_a_namespaced_node_logs_to_rosout_publishes_events_and_follows_sim_time(tmp_path, client):
    fqn = "/robot7/selectinfer_node"
    rosout, events, diags, transitions = [], [], [], []
    latched = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)
    client.create_subscription(Log, "/rosout", rosout.append, latched)
    client.create_subscription(ParameterEvent, "/parameter_events", events.append, 1000)
    client.create_subscription(DiagnosticArray, "/diagnostics", diags.append, 100)
    client.create_subscription(TransitionEvent, f"{fqn}/transition_event", transitions.append, 100)
    clock = client.create_publisher(Clock, "/clock", 10)

    log = tmp_path / "robot7.log"
    # From another folder, a model by absolute path, unconfigured at first
    # so the lifecycle's events can be seen.
    proc = start(log, tmp_path, "-r", "__ns:=/robot7", "-p", f"model:={MODEL}", "-p", "dtype:=q4",
                 "-p", "use_sim_time:=true", "-p", "autostart:=false", "-p", "max_new_tokens:=4",
                 "--log-level", "info")
    try:
        wait_ready(proc, log)
        change = client.create_client(ChangeState, f"{fqn}/change_state")
        for transition in (1, 3):  # configure, activate
            req = ChangeState.Request()
            req.transition.id = transition
            assert call(client, change, req).success
        assert spin_until(client, lambda: len(transitions) >= 4, timeout=20), transitions
        seen = [(t.transition.label, t.start_state.label, t.goal_state.label) for t in transitions]
        assert seen[:4] == [("configure", "unconfigured", "configuring"),
                            ("transition_success", "configuring", "inactive"),
                            ("activate", "inactive", "activating"),
                            ("transition_success", "activating", "active")], seen

        # /rosout: the node's records under its logger name; info, no debug.
        ours = lambda: [m for m in rosout if m.name == "robot7.selectinfer_node"]  # noqa: E731
        assert spin_until(client, lambda: any("serving ~/generate" in m.msg for m in ours()), 20), \
            [(m.name, m.msg) for m in rosout][-10:]
        assert all(m.level >= Log.INFO for m in ours()), [(m.level, m.msg) for m in ours()]

        # A parameter change is an event naming the node.
        assert set_param(client, "temperature", 0.5, ns=fqn).successful
        assert spin_until(client, lambda: any(
            e.node == fqn and [p.name for p in e.changed_parameters] == ["temperature"]
            and e.changed_parameters[0].value.double_value == 0.5 for e in events), 20), events

        # Diagnostics: named after the fully qualified name.
        assert spin_until(client, lambda: any(
            s.name.startswith(fqn) and "robot7" in s.name for d in diags for s in d.status), 20), \
            [s.name for d in diags for s in d.status]

        # Simulated time: replies are stamped on /clock, not the wall.
        def tick():
            clock.publish(Clock(clock=Time(sec=SIM_START, nanosec=500_000_000)))
            return False
        spin_until(client, tick, timeout=1.0)
        gen = client.create_client(Generate, f"{fqn}/generate")
        future = gen.call_async(Generate.Request(prompt="Hello!"))
        assert spin_until(client, lambda: tick() or future.done(), timeout=120)
        reply = future.result()
        assert reply.success, reply.error
        assert reply.stamp.sec == SIM_START, reply.stamp
        assert any(d.header.stamp.sec == SIM_START for d in diags[-3:]) or spin_until(
            client, lambda: tick() or any(d.header.stamp.sec == SIM_START for d in diags[-3:]), 10)

        # ros2 param dump -> --params-file: the same values.
        text, before = dump(client, fqn)
        (tmp_path / "dump.yaml").write_text(text)
    finally:
        assert stop_node(proc) == 0, log.read_text()[-3000:]

    # The dumped file starts the node again (a respawn keeping what was
    # set at runtime), here at debug level: the debug record shows.
    again = tmp_path / "again.log"
    proc = start(again, tmp_path, "-r", "__ns:=/robot7", "--params-file", str(tmp_path / "dump.yaml"),
                 "--log-level", "debug")
    try:
        wait_ready(proc, again)
        _, after = dump(client, fqn)
        assert after == before, {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
                                 if before.get(k) != after.get(k)}
        assert after["temperature"] == 0.5 and after["layer_drop"] == []
        assert spin_until(client, lambda: any(
            m.name == "robot7.selectinfer_node" and m.level == Log.DEBUG and "interfaces under /robot7"
            in m.msg for m in rosout), 20)
    finally:
        assert stop_node(proc) == 0, again.read_text()[-3000:]


def test_a_node_that_cannot_start_exits_with_ex_config_naming_the_path(tmp_path):
    log = tmp_path / "missing.log"
    proc = start(log, tmp_path, "-p", "model:=models/nowhere")
    try:
        code = proc.wait(timeout=60)
    finally:
        stop_node(proc)
    text = log.read_text()
    assert code == 78, text
    assert f"{tmp_path}/models/nowhere" in text and "[ERROR]" in text, text
    assert text.count("[ERROR]") == 1, text


def test_a_respawned_node_keeps_what_was_set_at_runtime(tmp_path, client):
    """kill -9, then the same command (as launch's respawn runs it): the
    runtime change is back, read from runtime_params_file; a load-time key
    put in that file by hand is refused naming the file."""
    kept = tmp_path / "kept" / "robot8.yaml"
    fqn = "/robot8/selectinfer_node"
    args = ["-r", "__ns:=/robot8", "-p", f"model:={MODEL}", "-p", "dtype:=q4",
            "-p", f"runtime_params_file:={kept}"]
    log = tmp_path / "first.log"
    proc = start(log, tmp_path, *args)
    try:
        wait_ready(proc, log)
        assert set_param(client, "temperature", 0.25, ns=fqn).successful
        assert set_param(client, "max_new_tokens", 7, ns=fqn).successful
        assert kept.exists(), log.read_text()[-2000:]
    finally:
        proc.kill()
        proc.wait()
    log = tmp_path / "respawned.log"
    proc = start(log, tmp_path, *args)
    try:
        wait_ready(proc, log)
        get = client.create_client(GetParameters, f"{fqn}/get_parameters")
        request = GetParameters.Request(names=["temperature", "max_new_tokens"])
        values = call_again_until_answered(client, get, request).values
        assert [parameter_value_to_python(v) for v in values] == [0.25, 7], log.read_text()[-2000:]
        assert f"runtime parameters kept in {kept}" in log.read_text()
    finally:
        assert stop_node(proc) == 0
    kept.write_text(kept.read_text() + "    mode: dense\n")
    log = tmp_path / "bad.log"
    proc = start(log, tmp_path, *args)
    try:
        code = proc.wait(timeout=60)
    finally:
        stop_node(proc)
    text = log.read_text()
    assert code == 78 and str(kept) in text and "`mode` is not a runtime parameter" in text, text
