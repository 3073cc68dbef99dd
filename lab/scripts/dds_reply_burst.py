#!/usr/bin/env python3
"""Where do service replies go missing? A minimal rclpy server and K client
processes, no model, no selectinfer code: the burst the node produces when
a full queue rejects most of a wave of calls.

    source .ros/env.sh
    python lab/scripts/dds_reply_burst.py [--clients 8] [--inflight 10]
        [--server-depth 1000] [--client-depth 10] [--burst all|each]
        [--rounds 3] [--pace-ms 0]

The server (std_srvs/Trigger on /repro/call) answers either every call as
it arrives (`--burst each`) or holds them until all K x inflight have
arrived and answers them in one loop (`--burst all`, the worst case: what a
rejection storm looks like on the wire). Each client process is one node
with one client of default QoS (or `--client-depth`) that keeps `inflight`
calls outstanding and counts its replies for `--wait` seconds. The server
logs how many it answered (rcl's send_response succeeded for each), so a
reply that the client never sees was lost after the server handed it to
the middleware. Prints one line per round: answered by the server, received
by the clients, lost per client.
"""

import argparse
import multiprocessing as mp
import os
import sys
import time


def qos(depth):
    from rclpy.qos import QoSProfile, ReliabilityPolicy, HistoryPolicy, DurabilityPolicy

    return QoSProfile(
        depth=depth,
        history=HistoryPolicy.KEEP_LAST,
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.VOLATILE,
    )


def server(args, ready, done):
    import rclpy
    from rclpy.node import Node
    from std_srvs.srv import Trigger

    rclpy.init()
    node = Node("repro_server")
    held = []
    answered = [0]
    total = args.clients * args.inflight

    def on_call(req, resp):
        # rclpy's service callback returns the response; to hold a call we
        # answer through the service handle ourselves (as r2r's node does,
        # from a worker, after the callback returned).
        return None

    srv = node.create_service(Trigger, "/repro/call", on_call, qos_profile=qos(args.server_depth))

    # Take requests by hand so replies can be sent whenever we choose.
    def drain():
        while True:
            with srv.handle:
                request, header = srv.handle.service_take_request(srv.srv_type.Request)
            if header is None:
                return
            held.append(header)

    ready.set()
    end = time.time() + args.wait + 30
    while time.time() < end and not done.is_set():
        drain()
        if args.burst == "each" or len(held) >= total:
            for header in held:
                resp = Trigger.Response(success=True, message="x" * 64)
                srv.send_response(resp, header)
                answered[0] += 1
                if args.pace_ms > 0:
                    time.sleep(args.pace_ms / 1000)
            held.clear()
        time.sleep(0.001)
    print(f"server: answered {answered[0]}", flush=True)
    node.destroy_node()
    rclpy.shutdown()


def client(args, idx, start, results):
    import rclpy
    from rclpy.node import Node
    from std_srvs.srv import Trigger

    rclpy.init()
    node = Node(f"repro_client_{idx}")
    cli = node.create_client(Trigger, "/repro/call", qos_profile=qos(args.client_depth))
    cli.wait_for_service(timeout_sec=30)
    start.wait()
    futures = [cli.call_async(Trigger.Request()) for _ in range(args.inflight)]
    end = time.time() + args.wait
    while time.time() < end and not all(f.done() for f in futures):
        rclpy.spin_once(node, timeout_sec=0.05)
    results.put((idx, sum(f.done() for f in futures)))
    node.destroy_node()
    rclpy.shutdown()


def one_round(args):
    ctx = mp.get_context("spawn")
    ready, done, start = ctx.Event(), ctx.Event(), ctx.Event()
    results = ctx.Queue()
    srv = ctx.Process(target=server, args=(args, ready, done))
    srv.start()
    ready.wait(30)
    clients = [ctx.Process(target=client, args=(args, i, start, results)) for i in range(args.clients)]
    for c in clients:
        c.start()
    time.sleep(3.0)  # discovery
    start.set()
    got = dict(results.get(timeout=args.wait + 60) for _ in clients)
    for c in clients:
        c.join(30)
    done.set()
    srv.join(60)
    return got


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--inflight", type=int, default=10)
    p.add_argument("--server-depth", type=int, default=1000)
    p.add_argument("--client-depth", type=int, default=10)
    p.add_argument("--burst", choices=["all", "each"], default="all")
    p.add_argument("--wait", type=float, default=15.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pace-ms", type=float, default=0.0, help="server: at least this long between two replies")
    args = p.parse_args()
    for r in range(args.rounds):
        got = one_round(args)
        total = args.clients * args.inflight
        received = sum(got.values())
        lost = [args.inflight - got[i] for i in sorted(got)]
        print(
            f"round {r + 1}: server_depth={args.server_depth} client_depth={args.client_depth} "
            f"burst={args.burst} pace_ms={args.pace_ms}: sent {total}, received {received}, lost per client {lost}",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
