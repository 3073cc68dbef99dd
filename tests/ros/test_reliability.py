"""Reliability under bursts: independent planners (one process each, as
other teams' nodes are) with ROS's default client QoS keep 10 calls in
flight against a queue of 8; every call gets its reply: an answer, or a
rejection that says why. Without the node's reply pacing a default-QoS
client loses replies to the others' burst (lab/scripts/dds_reply_burst.py
shows it with a plain rclpy server). By hand, the A/B against an unpaced
node: SELECTINFER_REPLY_PACE_MS=0 python -m pytest tests/ros/test_reliability.py -s
(it then fails, printing how many replies were lost)."""

import multiprocessing as mp
import os
import time

import pytest

from conftest import NS, module_node

CLIENTS = 8
INFLIGHT = 10


@pytest.fixture(scope="module")
def node_proc(tmp_path_factory):
    pace = os.environ.get("SELECTINFER_REPLY_PACE_MS", "5.0")
    yield from module_node(tmp_path_factory, "reliability", "max_new_tokens:=2",
                           "queue_depth:=8", f"reply_pace_ms:={float(pace)}")


def _planner(idx, start, results):
    """One planner process: a node with a default-QoS client, INFLIGHT calls
    at once; puts (idx, [(success, error, request_id) or None per call])."""
    import rclpy
    from rclpy.node import Node
    from selectinfer_msgs.srv import Generate

    rclpy.init()
    node = Node(f"planner_{idx}")
    client = node.create_client(Generate, f"{NS}/generate")  # default QoS: depth 10
    ready = client.wait_for_service(timeout_sec=60)
    start.wait(90)
    futures = [
        client.call_async(Generate.Request(request_id=f"p{idx}-{k}",
                                           prompt=f"Name a colour. ({idx}.{k})",
                                           max_new_tokens=2))
        for k in range(INFLIGHT)
    ]
    end = time.time() + 120
    while time.time() < end and not all(f.done() for f in futures):
        rclpy.spin_once(node, timeout_sec=0.02)
    out = []
    for f in futures:
        r = f.result() if f.done() else None
        out.append(None if r is None else (r.success, r.error, r.request_id))
    results.put((idx, ready, out))
    node.destroy_node()
    rclpy.shutdown()


def test_a_burst_from_default_qos_planners_loses_no_reply(node_proc):
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_planner, args=(i, start, results)) for i in range(CLIENTS)]
    for p in procs:
        p.start()
    time.sleep(4.0)  # discovery between the planners and the node
    start.set()
    got = [results.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(30)
    assert all(ready for _, ready, _ in got), "a planner never saw the service"
    replies = [r for _, _, out in got for r in out]
    lost = sum(r is None for r in replies)
    answered = [r for r in replies if r is not None and r[0]]
    rejected = [r for r in replies if r is not None and not r[0]]
    print(f"{len(answered)} answered, {len(rejected)} rejected, {lost} lost")
    assert lost == 0, f"{lost} of {len(replies)} replies never arrived"
    assert answered, "nothing was answered"
    for _, error, rid in rejected:
        assert "rejected" in error and "queue" in error, (rid, error)
    # Each reply is its own call's.
    ids = sorted(r[2] for r in replies)
    assert ids == sorted(f"p{i}-{k}" for i in range(CLIENTS) for k in range(INFLIGHT))
