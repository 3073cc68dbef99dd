"""The usage examples in examples/ run against the real node, as a user
runs them: each exits 0 and prints what it promises (a JSON plan and a tool
call from the service, a streamed answer equal to the topic's reply, a
cancelled action with its partial text). SmolLM2 on the tests' parameters:
the form of the answers is checked, not their wisdom."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT, module_node

EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    yield from module_node(tmp_path_factory, "examples", "max_new_tokens:=48")


def run(script, *args):
    out = subprocess.run([sys.executable, str(EXAMPLES / script), *args],
                         capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert out.returncode == 0, f"{script}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout


def test_planner_service_gets_a_json_plan_and_a_tool_call(node):
    out = run("planner_service.py")
    assert "plan: {'action': " in out, out
    assert "call: navigate_to(" in out or "call: dock(" in out, out


def test_topic_stream_streams_the_answer_it_gets(node):
    out = run("topic_stream.py", "Name one thing a robot checks before it moves.")
    assert "the stream equals the answer" in out, out


def test_action_cancel_cancels_with_the_partial_text(node):
    out = run("action_cancel.py", "--stop-after", "3",
              "--prompt", "Write a long list of the steps a robot takes to dock at its charger.")
    assert "-- CANCELED: " in out, out
