"""Tool calls through rclpy, on the node as a user starts it with the
Qwen2.5-Coder-0.5B catalog model (its preset): the service offers a
robot's skills as functions; a call comes back in `tool_calls`, valid
under its function's schema (the node holds calls to the schemas while
they are generated); `tool_choice: none` gets text; a malformed schema is
refused naming the tool; a parallel request gets several calls; the
call's result goes back as a `tool` turn and the model answers in text;
the action carries the same."""

import json

import pytest
from rclpy.action import ActionClient
from selectinfer_msgs.action import Generate as GenerateAction
from selectinfer_msgs.msg import ChatMessage, ToolCall
from selectinfer_msgs.srv import Generate

from conftest import NS, start_node, stop_node, wait_ready
from test_node import call, spin_until

MODEL = "qwen2.5-coder-0.5b-instruct"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "navigate_to",
            "description": "Drive the robot to a numbered station.",
            "parameters": {
                "type": "object",
                "properties": {"station": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["station"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "set_gripper",
            "description": "Open or close the gripper.",
            "parameters": {
                "type": "object",
                "properties": {"open": {"type": "boolean"}},
                "required": ["open"],
            },
        },
    },
]


def valid_call(c):
    """The offered schemas, checked by hand (no jsonschema in ROS's Python)."""
    args = json.loads(c.arguments)
    assert isinstance(args, dict), c
    if c.name == "navigate_to":
        assert set(args) == {"station"} and isinstance(args["station"], int), c
        assert 0 <= args["station"] <= 9, c
    elif c.name == "set_gripper":
        assert set(args) == {"open"} and isinstance(args["open"], bool), c
    else:
        raise AssertionError(f"a call of a function not offered: {c}")
    return args


@pytest.fixture(scope="module")
def node_proc(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tools")
    log = tmp / "node.log"
    proc = start_node(log, f"model:={MODEL}", "max_new_tokens:=96", params=None, cwd=tmp)
    proc.log_path = log
    try:
        wait_ready(proc, log, timeout=240)
        yield proc
    finally:
        code = stop_node(proc)
        print(log.read_text()[-3000:])
        assert code == 0, f"node exit code {code}"


def ask(client, prompt, **fields):
    gen = client.create_client(Generate, f"{NS}/generate")
    fields.setdefault("tools", json.dumps(TOOLS))
    return call(client, gen, Generate.Request(prompt=prompt, **fields), timeout=180)


def test_two_tools_give_a_valid_call(node_proc, client):
    res = ask(client, "Drive to station 4.")
    assert res.success, res.error
    assert len(res.tool_calls) >= 1, res
    first = res.tool_calls[0]
    assert first.name == "navigate_to" and valid_call(first) == {"station": 4}, res
    assert first.id == "call_0" and res.stop_reason == "tool_calls", res
    assert "<tool_call>" not in res.text, res.text


def test_tool_choice_none_gets_text(node_proc, client):
    res = ask(client, "Drive to station 4.", tool_choice="none", max_new_tokens=32)
    assert res.success, res.error
    assert res.tool_calls == [] and res.text.strip(), res
    assert "<tool_call>" not in res.text and res.stop_reason in ("eos", "length"), res


def test_required_and_a_named_function_force_a_call(node_proc, client):
    res = ask(client, "Good morning!", tool_choice="required")
    assert res.success and len(res.tool_calls) >= 1, res
    for c in res.tool_calls:
        valid_call(c)
    res = ask(client, "Drive to station 4.", tool_choice="set_gripper")
    assert res.success and [c.name for c in res.tool_calls][:1] == ["set_gripper"], res
    valid_call(res.tool_calls[0])


def test_a_malformed_schema_is_refused_naming_the_tool(node_proc, client):
    bad = [TOOLS[0], {"name": "lift", "parameters": {"type": "object",
                                                     "properties": {"height": {"type": "meters"}}}}]
    res = ask(client, "Lift the box.", tools=json.dumps(bad))
    assert not res.success, res
    assert "lift" in res.error and "meters" in res.error, res.error
    res = ask(client, "Lift the box.", tools="[{not json")
    assert not res.success and "tools" in res.error, res.error
    res = ask(client, "Lift the box.", tool_choice="lift")
    assert not res.success and "not among the tools offered" in res.error, res.error
    # The node serves on.
    assert ask(client, "Drive to station 1.").success


def test_a_parallel_request_gets_several_calls(node_proc, client):
    res = ask(client, "Drive to station 2 and to station 5.", parallel_tool_calls=True)
    assert res.success, res.error
    assert len(res.tool_calls) >= 2, res
    assert [c.id for c in res.tool_calls] == [f"call_{i}" for i in range(len(res.tool_calls))]
    stations = {valid_call(c).get("station") for c in res.tool_calls}
    assert {2, 5} <= stations, res


def test_a_tool_result_goes_back_and_is_answered(node_proc, client):
    first = ask(client, "Drive to station 4.")
    assert first.success and first.tool_calls, first
    turns = [
        ChatMessage(role="user", content="Drive to station 4."),
        ChatMessage(role="assistant", content=first.text, tool_calls=list(first.tool_calls)),
        ChatMessage(role="tool", content=json.dumps({"arrived": True, "station": 4})),
    ]
    # The result is answered in text (tool_choice none: the 0.5B model
    # otherwise tends to repeat its call).
    res = ask(client, "", messages=turns, tool_choice="none", max_new_tokens=48)
    assert res.success, res.error
    assert res.text.strip() and not res.tool_calls, res
    # A tool turn must answer a call.
    orphan = [ChatMessage(role="user", content="hi"), ChatMessage(role="tool", content="42")]
    bad = ask(client, "", messages=orphan)
    assert not bad.success and "follows no assistant turn" in bad.error, bad.error


def test_the_action_carries_tools_and_calls(node_proc, client):
    ac = ActionClient(client, GenerateAction, f"{NS}/generate_stream")
    assert ac.wait_for_server(timeout_sec=20)
    goal = GenerateAction.Goal(prompt="Close the gripper.", tools=json.dumps(TOOLS))
    sent = ac.send_goal_async(goal)
    assert spin_until(client, sent.done, 30)
    handle = sent.result()
    assert handle.accepted
    result = handle.get_result_async()
    assert spin_until(client, result.done, 180)
    r = result.result().result
    assert r.success and r.tool_calls, r
    assert r.tool_calls[0].name == "set_gripper" and "open" in valid_call(r.tool_calls[0]), r
    assert isinstance(r.tool_calls[0], ToolCall)
