"""selectinfer_node against rclpy clients: service, topics, streaming,
load, bad input, runtime parameters, diagnostics, start-up refusals."""

import time
from pathlib import Path
import uuid

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import DescribeParameters, GetParameters, SetParameters
from rclpy.executors import MultiThreadedExecutor
from rclpy.qos import QoSProfile
from selectinfer_msgs.msg import Prompt, Response, Token
from selectinfer_msgs.srv import Generate
from std_msgs.msg import String

from conftest import NS, ROOT, start_node, stop_node

QOS_DEEP = 1000


def call(node, client, request, timeout=120):
    assert client.wait_for_service(timeout_sec=20), "service not available"
    future = client.call_async(request)
    rclpy.spin_until_future_complete(node, future, timeout_sec=timeout)
    assert future.done(), "no service response within the timeout"
    return future.result()


def call_again_until_answered(node, client, request, attempts=8, each=15):
    """An idempotent call to a node that replaced a killed one (kill -9, as
    respawn follows): the dead server's endpoint stays in the graph for a
    while, so wait_for_service passes at once and a request sent before the
    new server is matched is never delivered. Asks again until answered."""
    for _ in range(attempts):
        assert client.wait_for_service(timeout_sec=20), "service not available"
        future = client.call_async(request)
        rclpy.spin_until_future_complete(node, future, timeout_sec=each)
        if future.done():
            return future.result()
        client.remove_pending_request(future)
    raise AssertionError(f"no service response in {attempts} attempts of {each} s")


def spin_until(node, predicate, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        rclpy.spin_once(node, timeout_sec=0.05)
    return predicate()


def wait_subscribed(node, publisher, timeout=20):
    assert spin_until(node, lambda: publisher.get_subscription_count() > 0, timeout), \
        "the node never subscribed"


def set_param(node, name, value, ns=NS):
    if isinstance(value, float):
        pv = ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=value)
    elif isinstance(value, int):
        pv = ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=value)
    else:
        pv = ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=value)
    client = node.create_client(SetParameters, f"{ns}/set_parameters")
    res = call(node, client, SetParameters.Request(parameters=[Parameter(name=name, value=pv)]))
    return res.results[0]


class TokenLog:
    """Collects ~/tokens messages per request id."""

    def __init__(self, node):
        self.by_id = {}
        node.create_subscription(Token, f"{NS}/tokens", self._on, QOS_DEEP)

    def _on(self, m):
        self.by_id.setdefault(m.request_id, []).append(m)

    def done(self, rid):
        return any(t.done for t in self.by_id.get(rid, []))

    def text(self, rid):
        toks = sorted((t for t in self.by_id[rid] if not t.done), key=lambda t: t.index)
        assert [t.index for t in toks] == list(range(len(toks))), "token indices not contiguous"
        return "".join(t.text for t in toks)


def test_service_returns_text_and_stats_and_streams_tokens(node_proc, client):
    tokens = TokenLog(client)
    gen = client.create_client(Generate, f"{NS}/generate")
    rid = f"svc-{uuid.uuid4()}"
    # Let the token subscription match before the request.
    assert gen.wait_for_service(timeout_sec=20)
    spin_until(client, lambda: client.count_publishers(f"{NS}/tokens") > 0, 20)
    time.sleep(0.5)
    res = call(client, gen, Generate.Request(request_id=rid, prompt="What is the capital of France?"))
    assert res.success, res.error
    assert res.request_id == rid
    assert res.text.strip()
    assert 0 < res.generated_tokens <= 16  # the fixture's max_new_tokens default
    assert res.prompt_tokens > 5
    assert res.ttft_s > 0 and res.tokens_per_s > 0
    assert 0 < res.compute_ratio < 1  # selectinfer: a fraction of the FFN
    assert res.stop_reason in ("eos", "length")
    assert spin_until(client, lambda: tokens.done(rid), 20), "no final token message"
    assert tokens.text(rid) == res.text


def test_topic_prompt_gets_response_with_same_id(node_proc, client):
    tokens = TokenLog(client)
    responses = []
    client.create_subscription(Response, f"{NS}/response", responses.append, QOS_DEEP)
    pub = client.create_publisher(Prompt, f"{NS}/prompt", QOS_DEEP)
    wait_subscribed(client, pub)
    spin_until(client, lambda: client.count_publishers(f"{NS}/response") > 0, 20)
    time.sleep(0.5)
    rid = f"topic-{uuid.uuid4()}"
    pub.publish(Prompt(request_id=rid, prompt="Name a colour.", max_new_tokens=8))
    assert spin_until(client, lambda: any(r.request_id == rid for r in responses), 60)
    r = next(r for r in responses if r.request_id == rid)
    assert r.success, r.error
    assert 0 < r.generated_tokens <= 8
    assert spin_until(client, lambda: tokens.done(rid), 20)
    assert tokens.text(rid) == r.text


def test_plain_string_instruction_is_answered(node_proc, client):
    responses = []
    client.create_subscription(Response, f"{NS}/response", responses.append, QOS_DEEP)
    pub = client.create_publisher(String, f"{NS}/instructions", QOS_DEEP)
    wait_subscribed(client, pub)
    spin_until(client, lambda: client.count_publishers(f"{NS}/response") > 0, 20)
    time.sleep(0.5)
    before = len(responses)
    pub.publish(String(data="Say hello to the operator."))
    assert spin_until(client, lambda: len(responses) > before, 60)
    r = responses[-1]
    assert r.success, r.error
    assert r.request_id  # made up by the node
    assert r.text.strip()


def test_load_every_request_answered(node_proc):
    """4 clients x 10 concurrent service calls + 20 topic prompts."""
    nodes = [rclpy.create_node(f"load_client_{i}_{uuid.uuid4().hex[:6]}") for i in range(4)]
    watcher = rclpy.create_node(f"load_watch_{uuid.uuid4().hex[:6]}")
    executor = MultiThreadedExecutor(num_threads=4)
    for n in nodes + [watcher]:
        executor.add_node(n)
    responses = {}
    watcher.create_subscription(Response, f"{NS}/response",
                                lambda m: responses.setdefault(m.request_id, m), QOS_DEEP)
    pub = watcher.create_publisher(Prompt, f"{NS}/prompt", QOS_DEEP)
    # Fast DDS delivers every reply of a service to every client's reader;
    # a burst of 40 replies overflows rclpy's default history (10).
    deep = QoSProfile(depth=100)
    clients = [n.create_client(Generate, f"{NS}/generate", qos_profile=deep) for n in nodes]
    for c in clients:
        assert c.wait_for_service(timeout_sec=20)
    end = time.time() + 20
    while pub.get_subscription_count() == 0 or watcher.count_publishers(f"{NS}/response") == 0:
        assert time.time() < end
        executor.spin_once(timeout_sec=0.05)
    time.sleep(0.5)

    futures = []
    for ci, c in enumerate(clients):
        for k in range(10):
            futures.append(c.call_async(Generate.Request(
                request_id=f"load-{ci}-{k}", prompt=f"Count to {k + 2}.", max_new_tokens=4)))
    topic_ids = [f"load-topic-{k}" for k in range(20)]
    for rid in topic_ids:
        pub.publish(Prompt(request_id=rid, prompt="Give one word.", max_new_tokens=4))

    end = time.time() + 240
    while time.time() < end:
        if all(f.done() for f in futures) and all(r in responses for r in topic_ids):
            break
        executor.spin_once(timeout_sec=0.05)
    missing = [i for i, f in enumerate(futures) if not f.done()]
    assert not missing, f"{len(missing)} service calls never answered"
    lost = [r for r in topic_ids if r not in responses]
    assert not lost, f"topic prompts without a response: {lost}"

    answers = [f.result() for f in futures] + [responses[r] for r in topic_ids]
    ok = [a for a in answers if a.success]
    rejected = [a for a in answers if not a.success]
    for a in rejected:
        assert "rejected" in a.error and "queue" in a.error, a.error
    for a in ok:
        assert a.text.strip() and a.generated_tokens > 0
    assert len(ok) >= 8, f"only {len(ok)} of 60 served"
    assert {a.request_id for a in answers} == {f"load-{c}-{k}" for c in range(4) for k in range(10)} | set(topic_ids)
    print(f"load: {len(ok)} served, {len(rejected)} rejected (queue full)")

    # Alive after.
    alive = call(nodes[0], clients[0], Generate.Request(prompt="Are you there?", max_new_tokens=4))
    assert alive.success, alive.error
    for n in nodes + [watcher]:
        executor.remove_node(n)
        n.destroy_node()


def test_bad_requests_get_errors_and_node_keeps_serving(node_proc, client):
    gen = client.create_client(Generate, f"{NS}/generate")
    cases = [
        (dict(prompt=""), "prompt is empty"),
        (dict(prompt="   \n"), "prompt is empty"),
        (dict(prompt="hi", task="cooking"), "unknown task"),
        (dict(prompt="hi", max_new_tokens=0), "max_new_tokens"),
        (dict(prompt="hi", max_new_tokens=10**9), "max_new_tokens"),
        (dict(prompt="word " * 6000), "exceeds the context"),
        (dict(prompt="hi", top_p=1.5), "top_p"),
    ]
    for fields, expected in cases:
        res = call(client, gen, Generate.Request(request_id="bad", **fields))
        assert not res.success, fields
        assert expected in res.error, (fields, res.error)
        assert res.request_id == "bad"
    ok = call(client, gen, Generate.Request(prompt="Hello!", max_new_tokens=4))
    assert ok.success, ok.error


def test_runtime_phi_change_applies_to_next_response(node_proc, client):
    gen = client.create_client(Generate, f"{NS}/generate")
    before = call(client, gen, Generate.Request(prompt="Hello!", max_new_tokens=4))
    assert before.success, before.error

    refused = set_param(client, "compute_ratio", 0.9)  # > load_ratio 0.7
    assert not refused.successful and "load_ratio" in refused.reason, refused.reason
    refused = set_param(client, "mode", "dense")
    assert not refused.successful and "start-up" in refused.reason, refused.reason
    assert "conversion failed" not in refused.reason, refused.reason
    still = call(client, gen, Generate.Request(prompt="Hello!", max_new_tokens=4))
    assert still.success and abs(still.compute_ratio - before.compute_ratio) < 1e-6

    try:
        assert set_param(client, "compute_ratio", 0.6).successful
        after = call(client, gen, Generate.Request(prompt="Hello!", max_new_tokens=4))
        assert after.success, after.error
        assert after.compute_ratio > before.compute_ratio + 0.1, (before.compute_ratio, after.compute_ratio)
    finally:
        assert set_param(client, "compute_ratio", 0.4).successful


def test_describe_parameters_gives_ranges_and_read_only(node_proc, client):
    desc = client.create_client(DescribeParameters, f"{NS}/describe_parameters")
    names = ["compute_ratio", "max_new_tokens", "temperature", "mode", "model", "threads"]
    res = call(client, desc, DescribeParameters.Request(names=names))
    d = {x.name: x for x in res.descriptors}
    assert sorted(d) == sorted(names), d
    phi = d["compute_ratio"]
    assert phi.type == ParameterType.PARAMETER_DOUBLE and not phi.read_only
    # phi lies between static_ratio and load_ratio as loaded (0.2 and 0.7 here).
    assert [(r.from_value, r.to_value) for r in phi.floating_point_range] == [(0.2, 0.7)]
    assert "phi" in phi.description
    tokens = d["max_new_tokens"]
    assert not tokens.read_only and tokens.integer_range[0].from_value == 1
    assert d["temperature"].floating_point_range[0].to_value == 10.0
    mode = d["mode"]
    assert mode.read_only and "load-only" in mode.additional_constraints, mode
    assert d["model"].read_only and not d["model"].integer_range
    assert d["threads"].read_only and d["threads"].integer_range[0].to_value == 1024

    # Out-of-range sets are refused naming the parameter and the range;
    # the value stays what it was.
    get = client.create_client(GetParameters, f"{NS}/get_parameters")
    before = call(client, get, GetParameters.Request(names=["temperature"])).values[0]
    refused = set_param(client, "temperature", 50.0)
    assert not refused.successful and "temperature must be in [0, 10]" in refused.reason, refused
    refused = set_param(client, "max_new_tokens", 0)
    assert not refused.successful and "max_new_tokens must be in [1," in refused.reason, refused
    refused = set_param(client, "top_p", -0.5)
    assert not refused.successful and "top_p must be in [0.001, 1]" in refused.reason, refused
    assert not refused.reason.startswith("Parameter"), refused.reason  # not "conversion failed"
    after = call(client, get, GetParameters.Request(names=["temperature"])).values[0]
    assert after.double_value == before.double_value


def test_runtime_task_change_swaps_the_base_set(node_proc, client):
    gen = client.create_client(Generate, f"{NS}/generate")
    refused = set_param(client, "task", "navigation")
    assert not refused.successful and "unknown task" in refused.reason, refused.reason
    before = call(client, gen, Generate.Request(prompt="Name a colour.", max_new_tokens=6))
    assert before.success, before.error
    try:
        assert set_param(client, "task", "translation").successful
        swapped = call(client, gen, Generate.Request(prompt="Name a colour.", max_new_tokens=6))
        assert swapped.success, swapped.error
        named = call(client, gen, Generate.Request(prompt="Name a colour.", task="summarization",
                                                   max_new_tokens=6))
        assert named.success, named.error
    finally:
        assert set_param(client, "task", "qa").successful
    again = call(client, gen, Generate.Request(prompt="Name a colour.", max_new_tokens=6))
    assert again.success and again.text == before.text, (before.text, again.text)
    log = Path(node_proc.log_path).read_text()
    assert "task qa -> translation" in log and "task translation -> summarization" in log, log[-2000:]


def test_diagnostics_report_queue_and_memory(node_proc, client):
    msgs = []
    client.create_subscription(DiagnosticArray, "/diagnostics", msgs.append, 10)
    assert spin_until(client, lambda: msgs, 20), "no /diagnostics message"
    values = {kv.key: kv.value for kv in msgs[-1].status[0].values}
    for key in ("queue_depth", "queue_capacity", "tokens_per_s", "rss_bytes", "rejected"):
        assert key in values, values
    assert int(values["queue_capacity"]) == 8
    assert int(values["rss_bytes"]) > 100 * 2**20


def _startup_fails(tmp_path, *overrides):
    log = tmp_path / "bad.log"
    proc = start_node(log, *overrides)
    try:
        code = proc.wait(timeout=120)
    finally:
        stop_node(proc)
    return code, log.read_text()


def test_startup_refuses_bad_configuration(tmp_path):
    code, log = _startup_fails(tmp_path, "model:=models/does-not-exist")
    assert code == 78 and "does-not-exist" in log and "does not exist" in log, log
    code, log = _startup_fails(
        tmp_path, "ranking:=rankings/qwen2.5-coder-0.5b-instruct.ranking.safetensors")
    assert code == 78 and "ranking" in log, log
    code, log = _startup_fails(tmp_path, "compute_ratio:=0.95")  # > load_ratio
    assert code == 78 and "compute_ratio" in log, log
    code, log = _startup_fails(tmp_path, "mode:=fastest")
    assert code == 78 and "mode" in log, log
    code, log = _startup_fails(tmp_path, "prefill_chunk:=0")
    assert code == 78 and "prefill_chunk" in log, log
    code, log = _startup_fails(tmp_path, "memory_budget_mb:=-1")
    assert code == 78 and "memory_budget_mb must be >= 0" in log, log
    code, log = _startup_fails(tmp_path, "memory_budget_mb:=60")
    assert code == 78 and "memory budget 60 MiB is below the floor of" in log, log
    code, log = _startup_fails(tmp_path, "threads:=-2")
    assert code == 78 and "threads must be in [0, 1024], got -2" in log, log
    code, log = _startup_fails(tmp_path, "no_such_parameter:=1")
    assert code == 78 and "unknown parameter" in log, log
    assert "panicked" not in log
    assert (ROOT / "config" / "node.yaml").exists()
