"""The managed (lifecycle) node through rclpy's lifecycle_msgs clients: a
node started with autostart:=false waits unconfigured; configure loads the
model, activate serves, deactivate refuses new work with the reason, cleanup
frees the model's memory, and it configures and serves again."""

from pathlib import Path

import pytest
from lifecycle_msgs.msg import Transition, TransitionEvent
from lifecycle_msgs.srv import ChangeState, GetAvailableTransitions, GetState
from selectinfer_msgs.srv import Generate

from conftest import NS, ROOT, module_node
from test_node import QOS_DEEP, call, spin_until

MODEL = ROOT / "models" / "smollm2-135m-instruct" / "model.safetensors"


def rss_bytes(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def node_proc(tmp_path_factory):
    """Started unconfigured: no model until configure."""
    yield from module_node(tmp_path_factory, "lifecycle", "autostart:=false", "max_new_tokens:=4")


def test_configure_activate_deactivate_cleanup_and_back(node_proc, client):
    change = client.create_client(ChangeState, f"{NS}/change_state")
    get = client.create_client(GetState, f"{NS}/get_state")
    available = client.create_client(GetAvailableTransitions, f"{NS}/get_available_transitions")
    gen = client.create_client(Generate, f"{NS}/generate")
    events = []
    client.create_subscription(TransitionEvent, f"{NS}/transition_event", events.append, QOS_DEEP)
    spin_until(client, lambda: client.count_publishers(f"{NS}/transition_event") > 0, 20)

    def state():
        return call(client, get, GetState.Request()).current_state.label

    def go(tid):
        return call(client, change, ChangeState.Request(transition=Transition(id=tid))).success

    def ask():
        return call(client, gen, Generate.Request(prompt="Hello!"))

    assert state() == "unconfigured"
    r = ask()
    assert not r.success and "unconfigured" in r.error, r.error
    assert not go(Transition.TRANSITION_ACTIVATE), "activate needs configure first"
    rss_empty = rss_bytes(node_proc.pid)

    assert go(Transition.TRANSITION_CONFIGURE)
    assert state() == "inactive"
    r = ask()
    assert not r.success and "inactive" in r.error, r.error
    rss_loaded = rss_bytes(node_proc.pid)
    assert rss_loaded - rss_empty > 0.4 * MODEL.stat().st_size, (rss_empty, rss_loaded)

    assert go(Transition.TRANSITION_ACTIVATE)
    assert state() == "active"
    labels = {t.transition.label for t in call(
        client, available, GetAvailableTransitions.Request()).available_transitions}
    assert labels == {"deactivate", "shutdown"}, labels
    r = ask()
    assert r.success and r.text, r.error

    assert go(Transition.TRANSITION_DEACTIVATE)
    r = ask()
    assert not r.success and "inactive" in r.error, r.error

    assert go(Transition.TRANSITION_CLEANUP)
    assert state() == "unconfigured"
    rss_clean = rss_bytes(node_proc.pid)
    # The model's memory is given back (the weights, KV cache, buffers).
    assert rss_loaded - rss_clean > 0.8 * (rss_loaded - rss_empty), (rss_empty, rss_loaded, rss_clean)
    print(f"RSS unconfigured {rss_empty >> 20} MiB, configured {rss_loaded >> 20} MiB, "
          f"after cleanup {rss_clean >> 20} MiB")

    assert go(Transition.TRANSITION_CONFIGURE) and go(Transition.TRANSITION_ACTIVATE)
    r = ask()
    assert r.success and r.text, r.error
    # Two events a transition, as rcl's state machine publishes them: into
    # the intermediate state, then out of it.
    assert spin_until(client, lambda: len(events) >= 12, 20), len(events)
    assert [e.goal_state.label for e in events[:12]] == [
        "configuring", "inactive", "activating", "active", "deactivating", "inactive",
        "cleaningup", "unconfigured", "configuring", "inactive", "activating", "active"]
    assert [e.transition.label for e in events[:4]] == [
        "configure", "transition_success", "activate", "transition_success"]
