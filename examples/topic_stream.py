#!/usr/bin/env python3
"""Asks selectinfer_node over topics: publishes a Prompt on ~/prompt, prints
the reply's text as ~/tokens streams it, and reads the answer on ~/response
by its request id (a full queue answers there too, with the reason). Needs a
running node (scripts/run_node.sh). tests/ros/test_examples.py runs it.

    source .ros/env.sh && python examples/topic_stream.py ["prompt"] [--node /selectinfer_node]
"""

import argparse
import sys
import time
import uuid

import rclpy
from rclpy.qos import QoSProfile, ReliabilityPolicy
from selectinfer_msgs.msg import Prompt, Response, Token


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prompt", nargs="?", default="Name two things a robot checks before it moves.")
    ap.add_argument("--node", default="/selectinfer_node", help="the node's name (its namespace too)")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args()
    rclpy.init()
    node = rclpy.create_node("topic_example")
    qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
    request_id = f"topic-{uuid.uuid4().hex[:8]}"
    pieces, answer, done = {}, [], []

    def on_token(t):
        if t.request_id == request_id:
            pieces[t.index] = t.text
            print(t.text, end="", flush=True)
            if t.done:
                done.append(True)

    def on_response(r):
        if r.request_id == request_id:
            answer.append(r)

    node.create_subscription(Token, f"{args.node}/tokens", on_token, qos)
    node.create_subscription(Response, f"{args.node}/response", on_response, qos)
    pub = node.create_publisher(Prompt, f"{args.node}/prompt", qos)
    # Publish once the node has subscribed, or the prompt is lost.
    end = time.time() + args.timeout
    while pub.get_subscription_count() == 0 and time.time() < end:
        rclpy.spin_once(node, timeout_sec=0.1)
    if pub.get_subscription_count() == 0:
        sys.exit(f"nobody subscribes to {args.node}/prompt: is the node running?")
    pub.publish(Prompt(request_id=request_id, prompt=args.prompt, max_new_tokens=48))
    while not answer and time.time() < end:
        rclpy.spin_once(node, timeout_sec=0.1)
    if not answer:
        sys.exit(f"no answer on {args.node}/response within {args.timeout:.0f} s")
    r = answer[0]
    if not r.success:
        sys.exit(f"refused: {r.error}")
    # Tokens and the response travel on two topics: let the last pieces in.
    settle = time.time() + 2.0
    while not done and time.time() < settle:
        rclpy.spin_once(node, timeout_sec=0.05)
    streamed = "".join(pieces[i] for i in sorted(pieces))
    print(f"\n-- {r.stop_reason}: {r.generated_tokens} tokens, TTFT {r.ttft_s:.2f} s; "
          f"the stream {'equals' if streamed == r.text else 'differs from'} the answer")
    node.destroy_node()
    rclpy.shutdown()


if __name__ == "__main__":
    main()
