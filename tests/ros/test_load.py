"""The load harness (scripts/load_test.py), short runs: 8 default-QoS
planner processes mixing service calls, ~/prompt messages, String
instructions and action goals (some cancelled, one client vanishing with a
goal running), then kill -9 + respawn under load, then SIGINT under load,
then a burst of action goals.
Every request must be accounted for (none LOST, no reply twice, every
rejection with its reason). The long runs and their figures are in
docs/BENCHMARKS.md ("Reliability under load")."""

import json
import os
import subprocess
import sys

from conftest import ROOT

HARNESS = ROOT / "scripts" / "load_test.py"


def harness(tmp_path, *args, timeout=600):
    """Runs the harness; its own deadline (240 s) ends a stalled run with a
    report well before pytest's timeout kills it."""
    out = tmp_path / "report.json"
    # An id apart from the module nodes' one, within 1-101 (higher ids can
    # meet Linux's ephemeral ports).
    domain = str((int(os.environ["ROS_DOMAIN_ID"]) + 50) % 101 + 1)
    p = subprocess.run([sys.executable, str(HARNESS), "--domain", domain, "--json", str(out),
                        "--log", str(tmp_path / "node.log"), "--deadline", "240", *args],
                       capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    print(p.stdout[-4000:], p.stderr[-2000:])
    assert out.exists(), f"no report (exit {p.returncode})"
    return p, json.loads(out.read_text())


def test_mixed_load_from_eight_planners_loses_nothing(tmp_path):
    # The vanishing planner exits as a crash does (os._exit): on UDP, as
    # the kill case (Fast DDS's shared memory and peers that die abruptly).
    p, r = harness(tmp_path, "--clients", "8", "--requests", "160", "--vanish", "1",
                   "--transport", "udp")
    assert r["lost"] == [] and r["duplicates"] == 0, r
    assert r["rejections_without_reason"] == [], r
    o = r["outcomes"]
    assert o.get("answered", 0) >= 40, o
    assert o.get("abandoned", 0) >= 1, o  # the vanished client's requests
    # The vanished client's running goal was cancelled by the node.
    assert r["vanished_goals_not_freed"] == [] and r["goals_cancelled_client_left"] >= 1, r
    assert sum(o.values()) >= 160
    assert r["rss_mib"]["growth"] is not None and r["rss_mib"]["growth"] <= 1.05, r["rss_mib"]
    assert not r["crashed"] and r["exit_code"] == 0
    assert p.returncode == 0 and "PASS" in p.stdout


def test_killed_node_comes_back_under_load_and_nothing_is_answered_twice(tmp_path):
    p, r = harness(tmp_path, "--clients", "8", "--requests", "120", "--vanish", "0",
                   "--kill-cycles", "2", "--kill-every", "5", "--request-timeout", "20",
                   # Once in CI (Fast DDS 2.14, shared memory) the planners
                   # never heard the node again after the second kill; see
                   # the harness's --transport.
                   "--transport", "udp")
    assert len(r["kills"]) == 2 and all(k["back_s"] is not None for k in r["kills"]), r["kills"]
    assert all(k["back_s"] < 60 for k in r["kills"]), r["kills"]
    assert r["lost"] == [] and r["duplicates"] == 0, r
    assert r["outcomes"].get("answered", 0) >= 20, r["outcomes"]
    assert p.returncode == 0


def test_sigint_under_load_answers_or_cancels_everything_queued(tmp_path):
    p, r = harness(tmp_path, "--clients", "8", "--requests", "200", "--vanish", "0",
                   "--sigint-after", "50")
    assert r["exit_code"] == 0, r
    assert r["lost"] == [] and r["duplicates"] == 0, r
    assert r["rejections_without_reason"] == [], r
    assert p.returncode == 0


def test_a_burst_of_goals_from_default_qos_planners_loses_none(tmp_path):
    # 8 planners x 10 goals at once, no backoff: before the goal responses
    # were paced and r2r kept 1000 goal requests (not 10), 133 of 400 goals
    # never heard back.
    p, r = harness(tmp_path, "--clients", "8", "--requests", "240", "--inflight", "10",
                   "--backoff", "0", "--mix", "action=1", "--cancel", "0", "--vanish", "0",
                   "--request-timeout", "30")
    assert r["lost"] == [] and r["duplicates"] == 0, r
    assert r["outcomes"].get("answered", 0) >= 8 and r["outcomes"].get("rejected", 0) >= 40, r
    assert r["rejections_without_reason"] == [], r
    assert p.returncode == 0
