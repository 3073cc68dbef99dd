#!/usr/bin/env python3
"""A planner calling selectinfer_node's ~/generate service: the robot's next
step as JSON under a schema (a system turn, the conversation so far, the new
observation), then the same step as a tool call among the robot's skills.
Needs a running node (scripts/run_node.sh). tests/ros/test_examples.py runs it.

    source .ros/env.sh && python examples/planner_service.py [--node /selectinfer_node]
"""

import argparse
import json
import sys

import rclpy
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


SKILLS = [
    {"name": "navigate_to", "description": "Drive to a numbered station.",
     "parameters": {"type": "object", "required": ["station"],
                    "properties": {"station": {"type": "integer", "minimum": 0, "maximum": 9}}}},
    {"name": "dock", "description": "Dock at the charger to charge the battery.",
     "parameters": {"type": "object", "properties": {}}},
]


def ask(node, client, req, what):
    """The service's reply to `req`; exits naming `what` when it fails."""
    future = client.call_async(req)
    rclpy.spin_until_future_complete(node, future, timeout_sec=120)
    r = future.result()
    if r is None or not r.success:
        sys.exit(f"no {what}: {r.error if r else 'no reply within 120 s'}")
    return r


def plan(node, args):
    service = f"{args.node}/generate"
    client = node.create_client(Generate, service)
    if not client.wait_for_service(timeout_sec=30):
        sys.exit(f"no service {service}: is the node running?")
    history = [
        ChatMessage(role="system", content="You plan a delivery robot's next step."),
        ChatMessage(role="user", content="A parcel waits at station 7."),
        ChatMessage(role="assistant", content='{"action": "pick", "station": 7}'),
    ]
    req = Generate.Request(request_id="plan-1", messages=history, prompt=args.prompt,
                           json_schema=json.dumps(PLAN_SCHEMA), max_new_tokens=64)
    r = ask(node, client, req, "plan")
    step = json.loads(r.text)  # always parses: the schema constrained decoding
    print(f"plan: {step}  ({r.generated_tokens} tokens, TTFT {r.ttft_s:.2f} s)")

    # The same step as a tool call: the robot's skills offered as functions;
    # a call always names one of them, with arguments valid under its schema.
    req = Generate.Request(request_id="plan-2", prompt=args.prompt, tool_choice="required",
                           tools=json.dumps(SKILLS), max_new_tokens=64)
    r = ask(node, client, req, "call")
    for call in r.tool_calls:
        print(f"call: {call.name}({json.loads(call.arguments)})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", default="The battery is at 4 %. The charger is at station 3.")
    ap.add_argument("--node", default="/selectinfer_node", help="the node's name (its namespace too)")
    args = ap.parse_args()
    rclpy.init()
    node = rclpy.create_node("planner_example")
    plan(node, args)
    node.destroy_node()
    rclpy.shutdown()


if __name__ == "__main__":
    main()
