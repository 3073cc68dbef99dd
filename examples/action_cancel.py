#!/usr/bin/env python3
"""Streams a free-text plan from selectinfer_node's ~/generate_stream action
and cancels the goal once it has enough (the robot moved on): generation
stops within one decode step and the result, CANCELED, holds the partial
text. Needs a running node (scripts/run_node.sh). tests/ros/test_examples.py
runs it.

    source .ros/env.sh && python examples/action_cancel.py [--stop-after 20] [--node /selectinfer_node]
"""

import argparse
import sys

import rclpy
from rclpy.action import ActionClient
from selectinfer_msgs.action import Generate as GenerateAction

STATUS = {4: "SUCCEEDED", 5: "CANCELED", 6: "ABORTED"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", default="List the steps a mobile robot takes to dock at its charger.")
    ap.add_argument("--stop-after", type=int, default=20, help="cancel after this many pieces of text")
    ap.add_argument("--node", default="/selectinfer_node", help="the node's name (its namespace too)")
    args = ap.parse_args()
    rclpy.init()
    node = rclpy.create_node("action_example")
    client = ActionClient(node, GenerateAction, f"{args.node}/generate_stream")
    if not client.wait_for_server(timeout_sec=30):
        sys.exit(f"no action server {args.node}/generate_stream: is the node running?")
    pieces = []

    def on_feedback(msg):
        pieces.append(msg.feedback.text)
        print(msg.feedback.text, end="", flush=True)

    goal = GenerateAction.Goal(request_id="stream-1", prompt=args.prompt, max_new_tokens=200)
    sent = client.send_goal_async(goal, feedback_callback=on_feedback)
    rclpy.spin_until_future_complete(node, sent)
    handle = sent.result()
    if not handle.accepted:
        sys.exit("goal rejected: the node's queue is full (the reason is on ~/response)")
    result = handle.get_result_async()
    while not result.done() and len(pieces) < args.stop_after:
        rclpy.spin_once(node, timeout_sec=0.1)
    if not result.done():
        handle.cancel_goal_async()
    rclpy.spin_until_future_complete(node, result)
    r = result.result().result
    print(f"\n-- {STATUS.get(r.status, r.status)}: {r.generated_tokens} tokens, "
          f"text of {len(r.text)} chars (streamed {len(''.join(pieces))})")
    client.destroy()
    node.destroy_node()
    rclpy.shutdown()


if __name__ == "__main__":
    main()
