#!/usr/bin/env python3
"""Records a rosbag2 bag of prompts from the dev JSONL files with the
third-party `rosbags` package (PyPI), so our reader is tested against bags we
did not write ourselves.

    source .ros/env.sh
    python scripts/make_bag.py runs/bags/mix100 --count 100 [--storage mcap|sqlite3]
        [--type prompt|string] [--rate 0.5] [--seed 0] [--max-new-tokens 48]

Prompts cycle through the tasks (translation, summarization, qa) with the
task templates of config/profile.yaml; arrival times are a seeded Poisson
process with `--rate` prompts per second. `--type prompt` writes
selectinfer_msgs/msg/Prompt on <node>/prompt (request ids bag-0000...),
`--type string` std_msgs/msg/String on <node>/instructions. Summarization
documents are cut to --max-doc-chars so every prompt fits the context.
"""

import argparse
import json
import random
import shutil
from pathlib import Path

import yaml
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

ROOT = Path(__file__).resolve().parents[1]
PROMPT_MSG = ROOT / "msg" / "msg" / "Prompt.msg"


def prompts(count, max_doc_chars, seed):
    cfg = yaml.safe_load((ROOT / "config" / "profile.yaml").read_text())
    tasks = []
    for d in cfg["datasets"]:
        if not d.get("template"):
            continue  # tool-call rows (task tools) are conversations, not instructions
        rows = [json.loads(l) for l in (ROOT / d["path"]).read_text().splitlines() if l.strip()]
        random.Random(seed).shuffle(rows)
        tasks.append((d["task"], d["template"], rows))
    out = []
    for i in range(count):
        task, template, rows = tasks[i % len(tasks)]
        row = dict(rows[(i // len(tasks)) % len(rows)])
        if "document" in row:
            row["document"] = row["document"][:max_doc_chars]
        out.append((task, template.format(**row)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="bag folder to create (replaced if it exists)")
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--storage", choices=["mcap", "sqlite3"], default="mcap")
    ap.add_argument("--type", choices=["prompt", "string"], default="prompt")
    ap.add_argument("--node", default="/selectinfer_node")
    ap.add_argument("--rate", type=float, default=0.5, help="mean prompts per second")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-doc-chars", type=int, default=1500)
    args = ap.parse_args()

    store = get_typestore(Stores.ROS2_JAZZY)
    call = PROMPT_MSG.with_name("ToolCall.msg")
    store.register(get_types_from_msg(call.read_text(), "selectinfer_msgs/msg/ToolCall"))
    chat = PROMPT_MSG.with_name("ChatMessage.msg")
    store.register(get_types_from_msg(chat.read_text(), "selectinfer_msgs/msg/ChatMessage"))
    store.register(get_types_from_msg(PROMPT_MSG.read_text(), "selectinfer_msgs/msg/Prompt"))
    Prompt = store.types["selectinfer_msgs/msg/Prompt"]
    String = store.types["std_msgs/msg/String"]

    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plugin = StoragePlugin.MCAP if args.storage == "mcap" else StoragePlugin.SQLITE3
    rng = random.Random(args.seed)
    t_ns = 1_700_000_000 * 10**9
    with Writer(args.out, version=8, storage_plugin=plugin) as writer:
        if args.type == "prompt":
            conn = writer.add_connection(f"{args.node}/prompt", Prompt.__msgtype__, typestore=store)
        else:
            conn = writer.add_connection(f"{args.node}/instructions", String.__msgtype__, typestore=store)
        for i, (task, text) in enumerate(prompts(args.count, args.max_doc_chars, args.seed)):
            if args.type == "prompt":
                msg = Prompt(request_id=f"bag-{i:04d}", prompt=text, task=task,
                             max_new_tokens=args.max_new_tokens, temperature=-1.0, top_p=-1.0, seed=-1,
                             messages=[], stop=[], json_schema="", grammar="",
                             tools="", tool_choice="", parallel_tool_calls=True)
            else:
                msg = String(data=text)
            writer.write(conn, t_ns, store.serialize_cdr(msg, msg.__msgtype__))
            t_ns += int(rng.expovariate(args.rate) * 1e9)
    print(f"wrote {args.count} {args.type} messages to {args.out} ({args.storage})")


if __name__ == "__main__":
    main()
