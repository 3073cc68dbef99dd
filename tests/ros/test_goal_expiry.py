"""A finished ~/generate_stream goal expires `goal_result_timeout_s` after it
ends: get_result then answers STATUS_UNKNOWN, the goal leaves the action's
status list, and the idle node stays idle. r2r 0.9.7 never expired a goal
(third_party/r2r/PATCH.md, fix 5): a node serving goals for days kept every
result and listed every goal it ever served on the status topic."""

import os
import time
import uuid
from pathlib import Path

import pytest
import rclpy
from action_msgs.msg import GoalStatus, GoalStatusArray
from rclpy.action import ActionClient
from rclpy.executors import SingleThreadedExecutor
from selectinfer_msgs.action import Generate
from unique_identifier_msgs.msg import UUID

from conftest import NS, module_node
from test_action import Goal, spin_until

RESULT_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def expiring_node(tmp_path_factory):
    yield from module_node(tmp_path_factory, "expiry",
                           f"goal_result_timeout_s:={RESULT_TIMEOUT_S}", "mode:=dense")


def cpu_seconds(pid):
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_finished_goal_expires_after_goal_result_timeout_s(expiring_node):
    node = rclpy.create_node(f"expiry_test_{uuid.uuid4().hex[:8]}")
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    statuses = []
    node.create_subscription(GoalStatusArray, f"{NS}/generate_stream/_action/status",
                             statuses.append, 100)
    client = ActionClient(node, Generate, f"{NS}/generate_stream")
    get_result = node.create_client(Generate.Impl.GetResultService,
                                    f"{NS}/generate_stream/_action/get_result")
    try:
        assert client.wait_for_server(timeout_sec=20)
        assert get_result.wait_for_service(timeout_sec=20)

        def result_status(goal_id):
            fut = get_result.call_async(Generate.Impl.GetResultService.Request(goal_id=goal_id))
            assert spin_until(executor, fut.done, 20), "get_result unanswered"
            return fut.result().status

        def listed(goal_id):
            last = statuses[-1].status_list if statuses else []
            return bytes(goal_id.uuid) in [bytes(s.goal_info.goal_id.uuid) for s in last]

        # A goal id the node never had: answered, not left hanging.
        assert result_status(UUID(uuid=list(os.urandom(16)))) == GoalStatus.STATUS_UNKNOWN

        first = Goal(client, "expiry-1", "Say hello.", 2)
        assert spin_until(executor, lambda: first.finished, 60), first
        assert first.result.status == GoalStatus.STATUS_SUCCEEDED, first
        first_id = UUID(uuid=list(first.handle.goal_id.uuid))
        # Within the timeout the result is still there.
        assert result_status(first_id) == GoalStatus.STATUS_SUCCEEDED
        ended = time.time()

        # Past it, the node has let the goal go, and it stays idle meanwhile.
        spin_until(executor, lambda: False, RESULT_TIMEOUT_S + 1.0)
        busy_from = cpu_seconds(expiring_node.pid)
        spin_until(executor, lambda: False, 2.0)
        idle_cpu = cpu_seconds(expiring_node.pid) - busy_from
        print(f"idle node, 2 s after the goal expired: {idle_cpu:.2f} s of CPU")
        # A diagnostics message per second, and an idle decode pool that
        # parks: well under a tenth of a core.
        assert idle_cpu < 0.2, f"idle node used {idle_cpu:.2f} s of CPU in 2 s"
        assert result_status(first_id) == GoalStatus.STATUS_UNKNOWN, \
            f"goal still known {time.time() - ended:.1f} s after it ended"

        # The status list of a later goal no longer carries the first.
        second = Goal(client, "expiry-2", "Say hello.", 2)
        assert spin_until(executor, lambda: second.finished, 60), second
        second_id = second.handle.goal_id
        assert spin_until(executor, lambda: listed(second_id), 10), "second goal never listed"
        assert not listed(first_id), "the expired goal is still on the status topic"
    finally:
        client.destroy()
        executor.remove_node(node)
        node.destroy_node()
