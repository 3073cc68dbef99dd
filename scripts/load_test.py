#!/usr/bin/env python3
"""Load harness for selectinfer_node: many planners, mixed interfaces, faults;
every request accounted for.

    source .ros/env.sh
    python scripts/load_test.py [--clients 8] [--requests 1000] [--inflight 2]
        [--mix service=4,prompt=3,action=3,string=1] [--cancel 0.3] [--vanish 1]
        [--max-new-tokens 4] [--backoff 0.5] [-p name:=value ...]
        [--kill-cycles 0 [--kill-every 6] [--launch "ros2 launch ..."]]
        [--sigint-after 0] [--json out.json]

It starts the node (target/release/selectinfer_node with config/node.yaml and
the `-p` overrides) on a private ROS domain, loopback only, or, with
`--launch CMD`, runs CMD in its own session and finds the node among CMD's
processes (a launch with respawn). Then K client processes (one rclpy node
each, default QoS everywhere: depth 10, reliable) keep `--inflight` requests
outstanding until `--requests` are sent in all, each one drawn from the mix:

- service: `~/generate`; the reply is the call's response;
- prompt: `selectinfer_msgs/Prompt` on `~/prompt`, answered on `~/response`
  under its request id;
- action: a `~/generate_stream` goal; a `--cancel` share is cancelled at a
  random point (0-1.5 s after acceptance); a rejected goal's reason arrives
  on `~/response`;
- string: `std_msgs/String` on the instruction topic. A String carries no id,
  so only client 0 sends them and the node-made ids on `~/response` are
  matched to them in order (count-exact; their latencies are approximate).

`--vanish N` clients exit abruptly (os._exit, no cleanup) after half a share,
with a long action goal (2048 tokens) of theirs running or queued: their
requests are "abandoned", not lost, and the node must cancel those goals
once DDS reports the client gone (its lease, 20 s with Fast DDS) and keep
serving the others.

Every request ends as: answered, rejected (with the node's reason), cancelled,
failed (success false, not a rejection), abandoned (its client vanished), cut
(unanswered, and the node was killed between its send and being back plus
`--rediscovery` s, while the client may still be matched to the dead node;
or logged by the node as ended in the two seconds before a kill, whose reply
the kill took with it), late
(answered after the client's `--request-timeout`: seen by the client, or
logged by the node as ended after it), undelivered (logged as ended in time,
yet no reply arrived), or LOST (never answered). Replies that arrive twice for one id are counted as duplicates.

Faults (no String instructions then: their replies are matched by order,
which a restart breaks): `--kill-cycles N` kills the node with SIGKILL every `--kill-every`
seconds of load and waits until it serves again: restarted by the harness
after `--respawn-delay` (as launch's respawn does), or by the launch given
with `--launch`. Time to serve = from the kill to the first reply of a probe
call (any reply, a queue-full rejection included) and to the first answer
any client gets. `--sigint-after N` sends SIGINT once N requests have ended:
everything already queued must still be answered or cancelled, and the node
must exit 0.

`--transport udp` runs node and clients without Fast DDS's shared-memory
transport (FASTDDS_BUILTIN_TRANSPORTS=UDPv4): Fast DDS 2.14 has open reports
of peers of a SIGKILLed participant that no longer hear its successor over
shared memory (eProsima/Fast-DDS#5053, #5469); CI's kill and vanish cases run on UDP.
A planner that cannot send its share before `--deadline` reports which
interfaces it never discovered.

Prints progress every 5 s, then the accounting, latency percentiles (send to
reply, per kind), throughput and node RSS (after the first 100 requests, at
the end, max). Exit status 1 when a request was LOST or undelivered, a
planner died unplanned, fewer than `--requests` were accounted for, a reply
came twice, a rejection had no reason, a vanished planner's goal was not
cancelled, the node crashed (died unkilled), RSS grew beyond
`--max-rss-growth`, or the node did not exit 0 on SIGINT.
"""

import argparse
import calendar
import json
import multiprocessing as mp
import os
import queue
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NODE_BIN = ROOT / "target" / "release" / "selectinfer_node"
PARAMS = ROOT / "config" / "node.yaml"
# Laid over PARAMS: SmolLM2 f32 load-only, the configuration of the figures.
TEST_PARAMS = ROOT / "tests" / "ros" / "node-test.yaml"
NS = "/selectinfer_node"
KINDS = ("service", "prompt", "action", "string")
PROMPTS = [
    "Name a colour.",
    "What is a robot arm?",
    "Say hello to the operator.",
    "Which way is north?",
    "Give one word for fast.",
    "What does a lidar measure?",
]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=1000, help="in all, over the clients")
    ap.add_argument("--inflight", type=int, default=2, help="outstanding per client")
    ap.add_argument("--backoff", type=float, default=0.5,
                    help="seconds a client waits before its next send after a rejection")
    ap.add_argument("--mix", default="service=4,prompt=3,action=3,string=1")
    ap.add_argument("--cancel", type=float, default=0.3, help="share of goals cancelled")
    ap.add_argument("--vanish", type=int, default=1, help="clients that exit abruptly")
    ap.add_argument("--max-new-tokens", type=int, default=4)
    ap.add_argument("-p", "--param", action="append", default=[],
                    help="node parameter override name:=value (repeatable)")
    ap.add_argument("--request-timeout", type=float, default=60.0)
    ap.add_argument("--deadline", type=float, default=1800.0, help="whole run, seconds")
    ap.add_argument("--transport", choices=["default", "udp"], default="default",
                    help="udp: Fast DDS without its shared-memory transport (node and clients)")
    ap.add_argument("--kill-cycles", type=int, default=0)
    ap.add_argument("--kill-every", type=float, default=6.0, help="seconds of load between kills")
    ap.add_argument("--respawn-delay", type=float, default=1.0)
    ap.add_argument("--rediscovery", type=float, default=10.0,
                    help="seconds after the node is back during which a client may "
                         "still send to the dead one (not yet matched to the new)")
    ap.add_argument("--launch", default="", help="start the node with this command instead")
    ap.add_argument("--sigint-after", type=int, default=0, help="SIGINT after N ended")
    ap.add_argument("--max-rss-growth", type=float, default=1.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--domain", type=int, default=0, help="ROS_DOMAIN_ID (0 = random)")
    ap.add_argument("--log", default="", help="node log file (default: a temp file)")
    ap.add_argument("--json", default="", help="write the report here too")
    a = ap.parse_args(argv)
    a.weights = {}
    for part in a.mix.split(","):
        k, _, w = part.partition("=")
        if k not in KINDS or not w:
            ap.error(f"--mix: {part!r} is not kind=weight with kind in {KINDS}")
        a.weights[k] = float(w)
    if a.kill_cycles and a.sigint_after:
        ap.error("--kill-cycles and --sigint-after do not combine")
    if a.kill_cycles and a.weights.pop("string", 0):
        # Their replies are matched by order; a restart breaks the order.
        print("note: no String instructions with --kill-cycles (they carry no id)")
    return a


# ---------------------------------------------------------------- clients


class Pending:
    __slots__ = ("rid", "kind", "sent", "cancel_at", "handle", "reason", "long")

    def __init__(self, rid, kind):
        self.rid, self.kind, self.sent = rid, kind, time.time()
        self.cancel_at, self.handle, self.reason, self.long = None, None, None, False


def client_main(idx, cfg, quota, out, start, stop):
    """One planner process; puts ("done", idx, rid, kind, outcome, reason,
    sent, ended) per request, ("vanish", idx, [rids]) if it vanishes and
    ("end", idx, duplicates) at the end."""
    import rclpy
    from rclpy.action import ActionClient
    from rclpy.node import Node
    from selectinfer_msgs.action import Generate as GenerateAction
    from selectinfer_msgs.msg import Prompt, Response
    from selectinfer_msgs.srv import Generate
    from std_msgs.msg import String

    rng = random.Random(cfg["seed"] * 1000 + idx)
    rclpy.init()
    node = Node(f"load_client_{idx}")
    srv = node.create_client(Generate, f"{NS}/generate")
    act = ActionClient(node, GenerateAction, f"{NS}/generate_stream")
    prompt_pub = node.create_publisher(Prompt, f"{NS}/prompt", 10)
    string_pub = node.create_publisher(String, cfg["instruction_topic"], 10)
    pending, finished, strings, timed_out = {}, set(), [], {}
    dups = [0]
    hold = [0.0]  # no send before this time (backoff after a rejection)
    kinds = [k for k in KINDS if cfg["weights"].get(k, 0) > 0 and (k != "string" or idx == 0)]
    weights = [cfg["weights"][k] for k in kinds]
    mnt = cfg["max_new_tokens"]

    def end(p, outcome, reason=""):
        if p.rid in finished:
            if timed_out.pop(p.rid, None) is not None and outcome != "timeout":
                out.put(("late", idx, p.rid, outcome, time.time()))
            elif outcome != "timeout":
                dups[0] += 1
            return
        finished.add(p.rid)
        if outcome == "timeout":
            timed_out[p.rid] = p
        pending.pop(p.rid, None)
        if outcome == "rejected":
            hold[0] = time.time() + cfg["backoff"]
        out.put(("done", idx, p.rid, p.kind, outcome, reason, p.sent, time.time()))

    def on_response(m):
        if m.request_id.startswith("req-"):  # a String instruction's reply
            if idx != 0:
                return
            if m.request_id in finished:
                dups[0] += 1
            elif strings:
                p = strings.pop(0)
                finished.add(m.request_id)
                end(p, *outcome_of(m))
            return
        p = pending.get(m.request_id) or timed_out.get(m.request_id)
        if p is None:
            if m.request_id in finished and m.request_id.startswith(f"c{idx}-prompt"):
                dups[0] += 1
            return
        if p.kind == "prompt":
            end(p, *outcome_of(m))
        elif p.kind == "action":
            p.reason = m.error  # a rejected goal's reason

    node.create_subscription(Response, f"{NS}/response", on_response, 10)

    def outcome_of(r):
        if r.success:
            return ("cancelled" if r.stop_reason == "cancelled" else "answered", "")
        if r.error.startswith("rejected"):
            return ("rejected", r.error)
        if "cancel" in r.error:
            return ("cancelled", r.error)
        return ("failed", r.error)

    def ready(kind):
        if kind == "service":
            return srv.service_is_ready()
        if kind == "action":
            return act.server_is_ready()
        pub = prompt_pub if kind == "prompt" else string_pub
        return pub.get_subscription_count() > 0 and \
            node.count_publishers(f"{NS}/response") > 0

    def send(kind, k):
        rid = f"c{idx}-{kind}{k}"
        p = Pending(rid, kind)
        text = f"{rng.choice(PROMPTS)} ({rid})"
        pending[rid] = p
        if kind == "service":
            fut = srv.call_async(Generate.Request(request_id=rid, prompt=text, max_new_tokens=mnt))
            fut.add_done_callback(lambda f, p=p: end(p, *outcome_of(f.result())))
        elif kind == "prompt":
            prompt_pub.publish(Prompt(request_id=rid, prompt=text, max_new_tokens=mnt))
        elif kind == "string":
            strings.append(p)
            string_pub.publish(String(data=text))
        else:
            if rng.random() < cfg["cancel"]:
                p.cancel_at = rng.uniform(0.0, 1.5)
            # A vanisher's goals are long: still running when it goes.
            n, t = mnt, text
            if vanish_at is not None and k >= vanish_at:
                n, t = cfg["vanish_tokens"], f"Write a long story about a delivery robot. ({rid})"
                p.long, p.cancel_at = True, None
            goal = GenerateAction.Goal(request_id=rid, prompt=t, max_new_tokens=n)
            act.send_goal_async(goal).add_done_callback(lambda f, p=p: on_goal(p, f))

    def on_goal(p, fut):
        h = fut.result()
        if not h.accepted:
            p.handle = False  # rejected: its reason follows on ~/response
            return
        p.handle = h
        if p.cancel_at is not None:
            p.cancel_at += time.time()
        h.get_result_async().add_done_callback(lambda f, p=p: on_result(p, f))

    def on_result(p, fut):
        r = fut.result().result
        if r.status == 5:
            end(p, "cancelled", r.error)
        else:
            end(p, *outcome_of(r))

    for _ in range(200):  # discovery (the service first; the rest follow)
        rclpy.spin_once(node, timeout_sec=0.05)
        if all(ready(k) for k in kinds):
            break
    start.wait(120)
    # A vanisher sends its (half) quota, then long goals until one runs.
    vanish_at = quota if idx in cfg["vanishers"] else None
    # A vanisher goes on sending goals past its quota until one is running.
    limit = quota if vanish_at is None else quota + 100
    sent, deadline = 0, time.time() + cfg["deadline"]
    rejected_goals = {}
    while time.time() < deadline:
        now = time.time()
        while sent < limit and len(pending) < cfg["inflight"] and not stop.is_set() \
                and now >= hold[0]:
            kind = rng.choices(kinds, weights)[0]
            if vanish_at is not None and sent >= vanish_at:
                kind = "action"  # to vanish with a goal of ours running or queued
            if not ready(kind):
                break
            send(kind, sent)
            sent += 1
        rclpy.spin_once(node, timeout_sec=0.01)
        for p in list(pending.values()):
            if p.kind == "action" and p.handle is False:
                # A rejected goal: wait up to 5 s for its reason.
                first = rejected_goals.setdefault(p.rid, now)
                if p.reason is not None or now - first > 5:
                    end(p, "rejected", p.reason or "")
            elif p.cancel_at is not None and p.handle and now >= p.cancel_at:
                p.cancel_at = None
                p.handle.cancel_goal_async()
            elif now - p.sent > cfg["request_timeout"]:
                end(p, "timeout")
        if vanish_at is not None and sent >= vanish_at and any(
                p.long and p.handle for p in pending.values()):
            out.put(("vanish", idx, sorted(pending),
                     sorted(p.rid for p in pending.values() if p.long and p.handle)))
            out.close()
            out.join_thread()  # the message must leave before the process does
            os._exit(0)  # no other cleanup, as a crashed planner
        if (sent >= limit or stop.is_set()) and not pending:
            break
    for p in list(pending.values()):
        end(p, "timeout")
    # A planner that could not send its share says which interfaces it
    # never found (discovery of a restarted node), for the report.
    unsent = limit - sent if vanish_at is None else 0
    not_ready = [k for k in kinds if not ready(k)] if unsent else []
    t = time.time() + 2.0  # late duplicates
    while time.time() < t:
        rclpy.spin_once(node, timeout_sec=0.05)
    out.put(("end", idx, dups[0], unsent, not_ready))
    act.destroy()
    node.destroy_node()
    rclpy.shutdown()


# ---------------------------------------------------------------- the node


class NodeRunner:
    """The node under test: started here (and restarted after a kill, as
    launch's respawn does) or found among a launch command's processes."""

    def __init__(self, a, log_path):
        self.a, self.log_path = a, Path(log_path)
        self.proc, self.launch = None, None
        self.log = open(self.log_path, "a")
        self.starts = 0
        self.exits = []  # (time, returncode, killed_by_us)

    def start(self):
        if self.a.launch:
            self.launch = subprocess.Popen(shlex.split(self.a.launch), cwd=ROOT, stdout=self.log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        else:
            self._spawn()
        self.wait_serving(1, 180)

    def _spawn(self):
        args = [str(NODE_BIN), "--ros-args", "--params-file", str(PARAMS),
                "--params-file", str(TEST_PARAMS)]
        for o in self.a.param:
            args += ["-p", o]
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)

    def pid(self):
        if not self.a.launch:
            return self.proc.pid if self.proc and self.proc.poll() is None else None
        sid = self.launch.pid
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")[0]
                if cmd.endswith(b"selectinfer_node") and os.getsid(int(d.name)) == sid:
                    return int(d.name)
            except (OSError, ProcessLookupError):
                continue
        return None

    def serving_count(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace").count("serving ~/generate")

    def wait_serving(self, n, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if self.serving_count() >= n and self.pid():
                return
            if not self.a.launch and self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}; log {self.log_path}")
            time.sleep(0.1)
        raise TimeoutError(f"node not serving after {timeout} s; log {self.log_path}")

    def kill(self):
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        if not self.a.launch:
            self.proc.wait()
            self.exits.append((time.time(), self.proc.returncode, True))
            time.sleep(self.a.respawn_delay)
            self._spawn()

    def rss_mib(self):
        pid = self.pid()
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except (OSError, TypeError):
            pass
        return None

    def crashed(self):
        """The node died without us killing it (harness-started only)."""
        if self.a.launch or self.proc is None:
            return False
        rc = self.proc.poll()
        return rc is not None and rc != 0

    def stop(self, timeout=60):
        """SIGINT (to the launch's session, or the node); returns its code."""
        target = self.launch if self.a.launch else self.proc
        if target.poll() is None:
            if self.a.launch:
                os.killpg(self.launch.pid, signal.SIGINT)
            else:
                self.proc.send_signal(signal.SIGINT)
            try:
                target.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(target.pid, signal.SIGKILL) if self.a.launch else target.kill()
                target.wait()
                return None
        return target.returncode


class Probe:
    """Calls ~/generate (1 token) every 0.5 s from one rclpy node until any
    call gets a reply (a queue-full rejection included): when the node
    serves again."""

    def __init__(self):
        import rclpy
        from selectinfer_msgs.srv import Generate

        self.rclpy, self.Generate = rclpy, Generate
        self.node = rclpy.create_node(f"load_probe_{os.getpid()}")
        self.cli = self.node.create_client(Generate, f"{NS}/generate")
        self.n = 0

    def until_reply(self, timeout=120):
        futures, end, next_call = [], time.time() + timeout, 0.0
        while time.time() < end:
            if time.time() >= next_call and self.cli.service_is_ready():
                self.n += 1
                futures.append(self.cli.call_async(self.Generate.Request(
                    request_id=f"probe-{self.n}", prompt="Say ok.", max_new_tokens=1)))
                next_call = time.time() + 0.5
            self.rclpy.spin_once(self.node, timeout_sec=0.02)
            if any(f.done() for f in futures):
                return time.time()
        return None


# ---------------------------------------------------------------- report


def pct(values, p):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(p / 100 * (len(v) - 1)))))]


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def main(argv=None):
    a = parse_args(argv)
    os.environ["ROS_DOMAIN_ID"] = str(a.domain or random.Random(os.getpid()).randint(1, 101))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if a.transport == "udp":
        # Node and clients (spawned, they inherit it) on UDP over loopback only.
        os.environ["FASTDDS_BUILTIN_TRANSPORTS"] = "UDPv4"
    if not a.launch and not NODE_BIN.exists():
        sys.exit(f"{NODE_BIN} missing: cargo build --release --features ros --bins")
    mnt = f"max_new_tokens:={a.max_new_tokens}"
    if not any(p.startswith("max_new_tokens:=") for p in a.param):
        a.param.append(mnt)
    log_path = a.log or f"/tmp/load_test_node_{os.getpid()}.log"
    Path(log_path).write_text("")
    runner = NodeRunner(a, log_path)
    t0 = time.time()
    runner.start()
    print(f"node up in {time.time() - t0:.1f} s (pid {runner.pid()}, log {log_path}, "
          f"ROS_DOMAIN_ID {os.environ['ROS_DOMAIN_ID']})", flush=True)

    import rclpy

    rclpy.init()
    probe = Probe()
    ctx = mp.get_context("spawn")
    out, start, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    rng = random.Random(a.seed)
    cfg = {
        "weights": a.weights, "cancel": a.cancel, "inflight": a.inflight,
        "backoff": a.backoff, "vanish_tokens": 2048,
        "max_new_tokens": a.max_new_tokens, "request_timeout": a.request_timeout,
        "deadline": a.deadline, "seed": a.seed, "instruction_topic": f"{NS}/instructions",
        "vanishers": set(rng.sample(range(1, a.clients), min(a.vanish, a.clients - 1))),
    }
    # Vanishers send half a share before they go; the others share the rest,
    # so that at least --requests are sent in all.
    half = a.requests // a.clients // 2
    staying = [i for i in range(a.clients) if i not in cfg["vanishers"]]
    rest = a.requests - half * (a.clients - len(staying))
    quotas = [half] * a.clients
    for j, i in enumerate(staying):
        quotas[i] = rest // len(staying) + (j < rest % len(staying))
    procs = [ctx.Process(target=client_main, args=(i, cfg, quotas[i], out, start, stop))
             for i in range(a.clients)]
    for p in procs:
        p.start()
    time.sleep(5.0)  # discovery between the clients and the node
    t_start = time.time()
    start.set()

    done, vanished, ended, dups, late, orphans, died = [], {}, set(), 0, {}, [], []
    rss = []  # (t, ended requests, MiB)
    kills = []  # dicts: kill, reply, answer
    sigint = {"sent": None, "code": None}
    next_kill = t_start + a.kill_every if a.kill_cycles else None
    last_progress, last_rss = t_start, 0.0

    def drain(block_s):
        nonlocal dups
        try:
            msg = out.get(timeout=block_s)
        except queue.Empty:
            return
        while True:
            if msg[0] == "done":
                done.append(msg[1:])
            elif msg[0] == "late":
                late[msg[2]] = (msg[3], msg[4])
            elif msg[0] == "vanish":
                vanished[msg[1]] = msg[2]
                orphans.extend(msg[3])
            else:
                ended.add(msg[1])
                dups += msg[2]
                if msg[3]:
                    print(f"client {msg[1]}: {msg[3]} requests of its share unsent at the "
                          f"deadline; not discovered: {' '.join(msg[4]) or 'none'}", flush=True)
            try:
                msg = out.get_nowait()
            except queue.Empty:
                return

    while len(ended) + len(vanished) < a.clients and time.time() - t_start < a.deadline + 60:
        drain(0.2)
        for i, p in enumerate(procs):
            if p.exitcode is not None and i not in ended and i not in vanished:
                drain(1.0)  # its last messages may still be in the pipe
                if i not in ended and i not in vanished:
                    print(f"client {i} died (exit {p.exitcode}) without reporting", flush=True)
                    died.append(i)
                    vanished[i] = []
        now = time.time()
        if now - last_rss >= 0.5:
            last_rss = now
            r = runner.rss_mib()
            if r is not None:
                rss.append((now - t_start, len(done), r))
        if runner.crashed():
            print(f"node CRASHED: exit {runner.proc.returncode}", flush=True)
            break
        if next_kill and now >= next_kill and len(kills) < a.kill_cycles:
            k = {"kill": time.time()}
            runner.kill()
            k["reply"] = probe.until_reply()
            kills.append(k)
            print(f"kill {len(kills)}: node back, first reply after "
                  f"{fmt(k['reply'] and k['reply'] - k['kill'])} s", flush=True)
            next_kill = time.time() + a.kill_every
        if a.sigint_after and sigint["sent"] is None and len(done) >= a.sigint_after:
            sigint["sent"] = time.time()
            stop.set()
            print(f"SIGINT after {len(done)} ended", flush=True)
            threading.Thread(target=lambda: sigint.update(code=runner.stop()), daemon=True).start()
        if now - last_progress >= 5.0:
            last_progress = now
            c = {}
            for d in done:
                c[d[3]] = c.get(d[3], 0) + 1
            print(f"[{now - t_start:6.1f} s] {len(done)}/{a.requests} ended "
                  + " ".join(f"{k} {v}" for k, v in sorted(c.items()))
                  + f"; rss {fmt(rss[-1][2] if rss else None, '.0f')} MiB", flush=True)
    stop.set()  # a crash or the deadline: clients stop sending and report
    drain(1.0)
    t_end = time.time()
    for p in procs:
        p.join(a.request_timeout + 15)
        if p.exitcode is None:
            print(f"client {procs.index(p)} did not end; terminated", flush=True)
            p.terminate()
            p.join(5)
            if p.exitcode is None:
                # rclpy handles SIGTERM itself: a client stuck in its C code
                # would keep this process from exiting (multiprocessing
                # joins its children at exit), so it is killed.
                print(f"client {procs.index(p)} ignored SIGTERM; killed", flush=True)
                p.kill()
                p.join(5)
            died.append(procs.index(p))
    drain(0.5)
    rss_end = runner.rss_mib()
    code = None
    if sigint["sent"] is None:
        code = runner.stop()
    else:
        deadline = time.time() + 60
        while sigint["code"] is None and time.time() < deadline:
            time.sleep(0.2)
        code = sigint["code"]
    rclpy.shutdown()

    report = account(a, done, vanished, orphans, died, dups, late, kills, rss, rss_end, runner, sigint, code,
                     t_end - t_start, log_path)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    sys.exit(0 if report["ok"] else 1)


def account(a, done, vanished, orphans, died, dups, late, kills, rss, rss_end, runner, sigint, code, wall, log_path):
    """Classifies every request, prints the report; returns it as a dict."""
    # Windows in which an unanswered request was cut by a kill: from
    # request_timeout before the kill until the node answered again, plus
    # the time a client needs to match the new node (until then its sends
    # still go to the dead one, whose endpoints DDS keeps for its lease).
    windows = [(k["kill"] - a.request_timeout, (k["reply"] or float("inf")) + a.rediscovery)
               for k in kills]
    text = Path(log_path).read_text(errors="replace")
    # When the node logged each request as ended ("request <id>: N (..."
    # or "request <id> rejected/cancelled"), to tell a reply that came
    # after the client stopped waiting (late) from one never delivered.
    logged = {}
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)  # launch colours the log
    # ROS's console format ("[INFO] [1764975071.123456789] [selectinfer_node]:
    # request ..."), or env_logger's (whole seconds) of older builds.
    for stamp, epoch, rid in re.findall(r"(?:(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)Z\s+\w+\s+selectinfer::serve::\S+"
                                        r"|\[\w+\] \[(\d+\.\d+)\] \[[^\]]*\]:)\s+request (\S+?)"
                                        r"(?:: \d+ \(| rejected| cancelled)", plain):
        logged[rid] = float(epoch) if epoch else calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    final = {}
    vanished_rids = {rid for rids in vanished.values() for rid in rids}
    for idx, rid, kind, outcome, reason, sent, t in done:
        if outcome == "timeout" and rid in late:
            outcome = "late"  # the reply came after the client's timeout
        elif outcome == "timeout" and rid in logged and any(
                logged[rid] <= k["kill"] <= logged[rid] + 2 for k in kills):
            # Logged as ended in the second before a SIGKILL: the node logs
            # a request when its generation ends and the reply then leaves
            # through the pacer thread, so the kill can take the reply with
            # it (seen once in CI). Cut, as any request the kill caught.
            outcome = "cut"
        elif outcome == "timeout" and rid in logged:
            # Ended by the node before the client gave up (1 s log
            # resolution): a reply that never arrived.
            outcome = "late" if logged[rid] >= sent + a.request_timeout - 1 else "undelivered"
        elif outcome == "timeout":
            if any(lo <= sent <= hi for lo, hi in windows):
                outcome = "cut"
            elif sigint["sent"] and sent >= sigint["sent"]:
                outcome = "after-stop"
            elif rid in vanished_rids:
                outcome = "abandoned"
            else:
                outcome = "LOST"
        final[rid] = (kind, outcome, reason, t - sent, t)
    for idx, rids in vanished.items():
        for rid in rids:
            if rid not in final:
                final[rid] = ("?", "abandoned", "", None, None)
    outcomes = {}
    for kind, outcome, *_ in final.values():
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    reasons = {}
    for _, o, r, *_rest in final.values():
        if o == "rejected" and r:
            reasons[r] = reasons.get(r, 0) + 1
    no_reason = [rid for rid, (_, o, r, *_rest) in final.items() if o == "rejected" and not r]
    lost = [rid for rid, v in final.items() if v[1] in ("LOST", "undelivered")]
    answered = [v for v in final.values() if v[1] == "answered"]
    lat = {k: [v[3] for v in answered if v[0] == k] for k in KINDS}
    lat["all"] = [v[3] for v in answered]
    rejected_lat = [v[3] for v in final.values() if v[1] == "rejected" and v[3] is not None]
    left = text.count("its client left the graph")
    # A vanished client's running goal must be cancelled by the node, not
    # run to its 2048 tokens (a killed node never got the chance).
    # (One that ended by length first, on a fast machine, freed it too.)
    not_freed = [rid for rid in orphans if f"goal {rid}: its client left the graph" not in text
                 and not re.search(rf"request {re.escape(rid)}: .*\((length|eos)\)", text)
                 and not kills]
    after100 = next((r for _, n, r in rss if n >= 100), None)
    rss_max = max((r for *_, r in rss), default=None)
    growth = rss_end / after100 if rss_end and after100 and not kills else None
    crashed = runner.crashed() and sigint["sent"] is None
    mix = ",".join(f"{k}={w:g}" for k, w in a.weights.items())
    print()
    print(f"requests: {len(final)} from {a.clients} clients in {wall:.1f} s; "
          f"mix {mix}; max_new_tokens {a.max_new_tokens}; inflight {a.inflight}/client; "
          f"backoff {a.backoff} s; node -p {' '.join(a.param)}")
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    if lost:
        print(f"LOST: {' '.join(sorted(lost)[:20])}")
        # When each was sent and logged as ended against the kills, to tell
        # a reply the kill took from one DDS dropped (times from the first send).
        sent_at = {rid: sent for _, rid, _, _, _, sent, _ in done}
        t0 = min(sent_at.values())
        kill_at = " ".join(f"{k['kill'] - t0:.1f}" for k in kills) or "none"
        for rid in sorted(lost)[:5]:
            ended = f"{logged[rid] - t0:.1f} s" if rid in logged else "never"
            print(f"  {rid}: sent at {sent_at[rid] - t0:.1f} s, logged as ended at {ended}; "
                  f"kills at {kill_at} s")
    print(f"vanished clients {len(vanished)} (with {sum(map(len, vanished.values()))} requests "
          f"in flight); " f"LOST {len(lost)}; duplicate replies {dups}; rejections without a reason "
          f"{len(no_reason)}; goals cancelled by the node as their client left: {left}"
          f" (of {len(orphans)} running; not freed: {' '.join(not_freed) or 'none'})")
    for k in list(KINDS) + ["all"]:
        v = lat[k]
        if v:
            print(f"latency answered {k:7s} n={len(v):4d} p50 {fmt(pct(v, 50))} s  "
                  f"p90 {fmt(pct(v, 90))} s  p99 {fmt(pct(v, 99))} s  max {fmt(max(v))} s")
    if rejected_lat:
        print(f"latency rejected n={len(rejected_lat)} p50 {fmt(pct(rejected_lat, 50))} s "
              f"p99 {fmt(pct(rejected_lat, 99))} s")
    for r, n in sorted(reasons.items(), key=lambda x: -x[1]):
        print(f"rejected {n}: {r}")
    print(f"throughput: {len(answered) / wall:.2f} answered/s, {len(final) / wall:.2f} ended/s")
    print(f"node RSS MiB: after 100 requests {fmt(after100, '.1f')}, end {fmt(rss_end, '.1f')}, "
          f"max {fmt(rss_max, '.1f')}; end/after-100 {fmt(growth, '.3f')}")
    serve = [k["reply"] - k["kill"] for k in kills if k["reply"]]
    answer_after = []
    for k in kills:
        ts = [v[4] for v in answered if v[4] and v[4] > k["kill"]]
        answer_after.append(min(ts) - k["kill"] if ts else None)
    if kills:
        aa = [x for x in answer_after if x is not None]
        print(f"kills: {len(kills)}; back (first reply) p50 {fmt(statistics.median(serve) if serve else None)} s"
              f" max {fmt(max(serve) if serve else None)} s; first answer to a client p50 "
              f"{fmt(statistics.median(aa) if aa else None)} s max {fmt(max(aa) if aa else None)} s; "
              f"never back {len(kills) - len(serve)}")
    if sigint["sent"]:
        print(f"SIGINT: node exit code {code}")
    else:
        print(f"node exit code on SIGINT at the end: {code}")
    short = len(final) < a.requests and not sigint["sent"]
    if died:
        print(f"clients died without reporting: {died}")
    if short:
        print(f"only {len(final)} of {a.requests} requests accounted for")
    ok = (not lost and dups == 0 and not no_reason and not crashed and not not_freed
          and not died and not short
          and (growth is None or growth <= a.max_rss_growth)
          and len(serve) == len(kills) and code == 0)
    print("PASS" if ok else "FAIL")
    return {
        "ok": ok, "requests": len(final), "outcomes": outcomes, "lost": lost, "duplicates": dups,
        "rejections_without_reason": no_reason, "rejection_reasons": reasons, "goals_cancelled_client_left": left,
        "vanished_goals_not_freed": not_freed,
        "latency_answered_s": {k: {"n": len(v), "p50": pct(v, 50), "p99": pct(v, 99)}
                               for k, v in lat.items()},
        "throughput_answered_per_s": len(answered) / wall, "wall_s": wall,
        "rss_mib": {"after_100": after100, "end": rss_end, "max": rss_max, "growth": growth,
                    "samples": rss},
        "kills": [{"back_s": (k["reply"] - k["kill"]) if k["reply"] else None,
                   "first_answer_s": x} for k, x in zip(kills, answer_after)],
        "crashed": crashed, "exit_code": code, "clients_died": died,
    }


if __name__ == "__main__":
    main()
