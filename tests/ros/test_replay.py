"""selectinfer_replay against the real node, on bags written by the
third-party `rosbags` package: MCAP and sqlite3, Prompt and std_msgs/String;
every prompt accounted for; bad bags give clear errors."""

import json
import subprocess
import sys

import pytest
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from conftest import ROOT

REPLAY = ROOT / "target" / "release" / "selectinfer_replay"


def make_bag(path, storage, kind, count):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_bag.py"), str(path),
                    "--count", str(count), "--storage", storage, "--type", kind,
                    "--rate", "4", "--max-new-tokens", "6"], check=True)


def replay(bag, *args, timeout=300):
    return subprocess.run([str(REPLAY), str(bag), *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("storage,kind", [("mcap", "prompt"), ("sqlite3", "string")])
def test_replay_accounts_for_every_prompt(node_proc, tmp_path, storage, kind):
    bag = tmp_path / f"{storage}-{kind}"
    make_bag(bag, storage, kind, 6)
    out = tmp_path / "report.json"
    timing = ["--timing", "recorded", "--speed", "4"] if kind == "prompt" else ["--timing", "fast"]
    p = replay(bag, *timing, "--json", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["requests"] == 6
    assert r["lost"] == 0 and r["answered"] == 6
    assert r["succeeded"] + r["rejected"] + r["failed"] == 6
    assert r["succeeded"] >= 1
    ids = [rec["request_id"] for rec in r["records"]]
    if kind == "prompt":
        assert ids == [f"bag-{i:04d}" for i in range(6)]
    assert len(set(ids)) == 6
    for rec in r["records"]:
        if rec["success"]:
            assert rec["latency_s"] > 0 and rec["ttft_s"] is not None
            assert rec["ttft_s"] <= rec["latency_s"]
    assert "| requests |" in p.stdout
    # Progress on stderr while it runs; the last line is the final count.
    progress = [l for l in p.stderr.splitlines() if l.startswith("[")]
    assert progress and "sent 6/6, replied 6 " in progress[-1], p.stderr


def test_bad_bags_give_clear_errors(tmp_path):
    good = tmp_path / "good"
    make_bag(good, "mcap", "prompt", 3)
    mcap = next(good.glob("*.mcap"))

    truncated = tmp_path / "truncated.mcap"
    truncated.write_bytes(mcap.read_bytes()[: len(mcap.read_bytes()) // 2])
    p = replay(truncated)
    assert p.returncode == 2 and "truncated" in p.stderr, p.stderr
    assert "panicked" not in p.stderr

    garbage = tmp_path / "garbage.db3"
    garbage.write_bytes(b"not a bag at all" * 10)
    p = replay(garbage)
    assert p.returncode == 2 and "neither MCAP nor sqlite3" in p.stderr, p.stderr

    p = replay(tmp_path / "missing")
    assert p.returncode == 2 and "does not exist" in p.stderr, p.stderr

    # A bag of another message type.
    store = get_typestore(Stores.ROS2_JAZZY)
    Int32 = store.types["std_msgs/msg/Int32"]
    other = tmp_path / "ints"
    with Writer(other, version=8, storage_plugin=StoragePlugin.SQLITE3) as w:
        conn = w.add_connection("/numbers", Int32.__msgtype__, typestore=store)
        w.write(conn, 1, store.serialize_cdr(Int32(data=7), Int32.__msgtype__))
    p = replay(other)
    assert p.returncode == 2 and "std_msgs/msg/Int32" in p.stderr and "/numbers" in p.stderr, p.stderr

    # A Prompt topic whose bytes are not a Prompt.
    corrupt = tmp_path / "corrupt"
    with Writer(corrupt, version=8, storage_plugin=StoragePlugin.MCAP) as w:
        conn = w.add_connection("/selectinfer_node/prompt", "std_msgs/msg/String", typestore=store)
        w.write(conn, 1, b"\x00\x01\x00\x00\xff\xff\xff\x7f")
    p = replay(corrupt)
    assert p.returncode == 2 and "not a valid std_msgs/msg/String" in p.stderr, p.stderr
