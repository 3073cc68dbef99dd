#!/usr/bin/env python3
"""Ask a running selectinfer_node through its ~/generate service (rclpy),
printing the streamed tokens as they arrive, then the answer's statistics.

    source .ros/env.sh
    python scripts/ask.py "What should a robot check before moving?" [--max-new-tokens 64]
"""

import argparse
import sys
import time
import uuid

import rclpy
from selectinfer_msgs.msg import Token
from selectinfer_msgs.srv import Generate


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prompt")
    ap.add_argument("--node", default="/selectinfer_node")
    ap.add_argument("--max-new-tokens", type=int, default=-1, help="-1: the node's default")
    ap.add_argument("--task", default="")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()

    rclpy.init()
    node = rclpy.create_node(f"selectinfer_ask_{uuid.uuid4().hex[:8]}")
    rid = f"ask-{uuid.uuid4().hex[:8]}"
    node.create_subscription(
        Token, f"{args.node}/tokens",
        lambda m: m.request_id == rid and print(m.text, end="", flush=True), 1000)
    client = node.create_client(Generate, f"{args.node}/generate")
    if not client.wait_for_service(timeout_sec=60):
        sys.exit(f"no service {args.node}/generate after 60 s: is the node running?")
    # Give the token subscription a moment to match the node's publisher.
    end = time.time() + 5
    while node.count_publishers(f"{args.node}/tokens") == 0 and time.time() < end:
        rclpy.spin_once(node, timeout_sec=0.1)
    future = client.call_async(Generate.Request(
        request_id=rid, prompt=args.prompt, task=args.task, max_new_tokens=args.max_new_tokens))
    rclpy.spin_until_future_complete(node, future, timeout_sec=args.timeout)
    res = future.result()
    rclpy.spin_once(node, timeout_sec=0.2)  # last streamed pieces
    print()
    if res is None:
        sys.exit(f"no answer within {args.timeout} s")
    if not res.success:
        sys.exit(f"error: {res.error}")
    print(f"-- {res.prompt_tokens} prompt + {res.generated_tokens} generated tokens, "
          f"TTFT {res.ttft_s * 1000:.0f} ms, {res.tokens_per_s:.1f} tok/s, "
          f"phi used {res.compute_ratio:.2f}, stop: {res.stop_reason}")
    node.destroy_node()
    rclpy.shutdown()


if __name__ == "__main__":
    main()
