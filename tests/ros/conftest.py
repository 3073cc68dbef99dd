"""Fixtures of the ROS 2 node tests: a real selectinfer_node on the real
SmolLM2 weights, on a private ROS domain, driven with rclpy.

Run through scripts/test.sh (which sets ROS 2 up and builds the node), or by
hand: `source .ros/env.sh && python -m pytest tests/ros -v`.
"""

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import rclpy

ROOT = Path(__file__).resolve().parents[2]
NODE_BIN = ROOT / "target" / "release" / "selectinfer_node"
PARAMS = ROOT / "config" / "node.yaml"
# Laid over PARAMS: the configuration the tests' figures rely on.
TEST_PARAMS = Path(__file__).resolve().parent / "node-test.yaml"
NS = "/selectinfer_node"


def start_node(log_path, *overrides, params=PARAMS, cwd=ROOT):
    """Starts the node binary in `cwd` with PARAMS and TEST_PARAMS (or
    `params` alone, or no file when it is None); returns the Popen (log in
    log_path)."""
    files = [PARAMS, TEST_PARAMS] if params == PARAMS else [params] if params else []
    args = [str(NODE_BIN), "--ros-args"]
    for f in files:
        args += ["--params-file", str(f)]
    for o in overrides:
        args += ["-p", o]
    log = open(log_path, "w")
    return subprocess.Popen(args, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(proc, log_path, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"node exited with {proc.returncode}:\n{Path(log_path).read_text()}")
        if "serving ~/generate" in Path(log_path).read_text():
            return
        time.sleep(0.2)
    raise TimeoutError(f"node not ready after {timeout} s:\n{Path(log_path).read_text()}")


def stop_node(proc, timeout=30):
    """SIGINT, as launch does; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError("node did not stop within 30 s of SIGINT")
    return proc.returncode


@pytest.fixture(scope="session", autouse=True)
def ros_domain():
    # A private DDS domain per test run, so parallel runs do not meet.
    os.environ["ROS_DOMAIN_ID"] = str(random.Random(os.getpid()).randint(1, 100))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    assert NODE_BIN.exists(), f"{NODE_BIN} missing: build with --features ros (scripts/test.sh)"
    rclpy.init()
    yield
    rclpy.shutdown()


def module_node(tmp_path_factory, name, *overrides):
    """A test module's node: started with `overrides`, ready, yielded (its
    log at `.log_path`), stopped with SIGINT and required to exit 0."""
    log = tmp_path_factory.mktemp(name) / "node.log"
    proc = start_node(log, *overrides)
    proc.log_path = log
    try:
        wait_ready(proc, log)
        yield proc
    finally:
        code = stop_node(proc)
        print(Path(log).read_text()[-3000:])
        assert code == 0, f"node exit code {code}"


@pytest.fixture(scope="module")
def node_proc(tmp_path_factory):
    """The node with the shipped parameters file; short answers for speed and
    the paper's ratios, which the tests' numbers rely on."""
    yield from module_node(tmp_path_factory, "node", "max_new_tokens:=16", "queue_depth:=8",
                           "mode:=selectinfer", "load_ratio:=0.7", "static_ratio:=0.2",
                           "compute_ratio:=0.4", "token_ratio:=0.2")


@pytest.fixture()
def client():
    node = rclpy.create_node(f"test_client_{os.getpid()}_{random.randint(0, 1 << 30)}")
    yield node
    node.destroy_node()
