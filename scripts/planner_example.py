#!/usr/bin/env python3
"""A planner-side client of selectinfer_node. Default: asks ~/generate for the
robot's next step as JSON under a schema (a system turn, the conversation so
far, the new observation) and parses it. With --stream: streams a free-text
plan from the ~/generate_stream action and cancels once it has enough (the
robot moved on). Needs a running node (scripts/run_node.sh).

    source .ros/env.sh && python scripts/planner_example.py [--stream [--stop-after 20]]
"""

import argparse
import json
import sys

import rclpy
from rclpy.action import ActionClient
from selectinfer_msgs.action import Generate as GenerateAction
from selectinfer_msgs.msg import ChatMessage
from selectinfer_msgs.srv import Generate

PLAN_SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["dock", "navigate", "pick", "place", "wait"]},
        "station": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["action", "station"],
    "additionalProperties": False,
}


def plan(node, args):
    client = node.create_client(Generate, args.service)
    if not client.wait_for_service(timeout_sec=30):
        sys.exit(f"no service {args.service}: is the node running?")
    history = [
        ChatMessage(role="system", content="You plan a delivery robot's next step."),
        ChatMessage(role="user", content="A parcel waits at station 7."),
        ChatMessage(role="assistant", content='{"action": "pick", "station": 7}'),
    ]
    req = Generate.Request(request_id="plan-1", messages=history, prompt=args.prompt,
                           json_schema=json.dumps(PLAN_SCHEMA), max_new_tokens=64)
    future = client.call_async(req)
    rclpy.spin_until_future_complete(node, future, timeout_sec=120)
    r = future.result()
    if r is None or not r.success:
        sys.exit(f"no plan: {r.error if r else 'no reply within 120 s'}")
    step = json.loads(r.text)  # always parses: the schema constrained decoding
    print(f"plan: {step}  ({r.generated_tokens} tokens, TTFT {r.ttft_s:.2f} s)")


def stream(node, args):
    client = ActionClient(node, GenerateAction, args.action)
    if not client.wait_for_server(timeout_sec=30):
        sys.exit(f"no action server {args.action}: is the node running?")
    pieces = []

    def on_feedback(msg):
        pieces.append(msg.feedback.text)
        print(msg.feedback.text, end="", flush=True)

    goal = GenerateAction.Goal(request_id="plan-1", prompt=args.prompt, max_new_tokens=200)
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
    names = {4: "SUCCEEDED", 5: "CANCELED", 6: "ABORTED"}
    print(f"\n-- {names.get(r.status, r.status)}: {r.generated_tokens} tokens, "
          f"text of {len(r.text)} chars (streamed {len(''.join(pieces))})")
    client.destroy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", default="The battery is at 4 %. The charger is at station 3.")
    ap.add_argument("--stream", action="store_true", help="stream a free-text plan and cancel")
    ap.add_argument("--stop-after", type=int, default=20, help="--stream: cancel after this many pieces")
    ap.add_argument("--service", default="/selectinfer_node/generate")
    ap.add_argument("--action", default="/selectinfer_node/generate_stream")
    args = ap.parse_args()
    rclpy.init()
    node = rclpy.create_node("planner_example")
    if args.stream:
        if args.prompt == ap.get_default("prompt"):
            args.prompt = "List the steps a mobile robot takes to dock at its charger."
        stream(node, args)
    else:
        plan(node, args)
    node.destroy_node()
    rclpy.shutdown()


if __name__ == "__main__":
    main()
