"""The node as a user starts it: a catalog model by name, from any folder,
with no parameters file. The model resolves in the models home
($SELECTINFER_MODELS, which scripts/test.sh sets), its preset
(config/models/NAME.yaml) sets the method's knobs, a parameter given wins
over the preset, and a folder that does not exist is refused naming the
folder it was resolved against.
"""

from pathlib import Path

import yaml
from selectinfer_msgs.srv import Generate

from conftest import NS, ROOT, start_node, stop_node, wait_ready
from test_node import call

NAME = "smollm2-135m-instruct"


def _preset():
    text = (ROOT / "config" / "models" / f"{NAME}.yaml").read_text()
    return yaml.safe_load(text)["/**"]["ros__parameters"]


def _serve(tmp_path, *overrides):
    log = tmp_path / "node.log"
    proc = start_node(log, *overrides, params=None, cwd=tmp_path)
    try:
        wait_ready(proc, log, timeout=180)
    except BaseException:
        stop_node(proc)
        raise
    return proc, log


def test_a_catalog_name_serves_from_any_folder_with_its_preset(tmp_path, client):
    preset = _preset()
    proc, log = _serve(tmp_path, f"model:={NAME}")
    try:
        text = log.read_text()
        line = next(l for l in text.splitlines() if "configure: loading" in l)
        assert f"preset {ROOT}/config/models/{NAME}.yaml" in line, line
        assert f"mode {preset['mode']}" in line, line
        assert f"{preset['dtype'].capitalize()}, cpu" in line, line
        gen = client.create_client(Generate, f"{NS}/generate")
        res = call(client, gen, Generate.Request(prompt="Name a colour.", max_new_tokens=8))
        assert res.success and res.text.strip(), res
    finally:
        assert stop_node(proc) == 0, log.read_text()[-2000:]


def test_a_parameter_given_wins_over_the_preset(tmp_path):
    other = "load-only" if _preset()["mode"] == "dense" else "dense"
    proc, log = _serve(tmp_path, f"model:={NAME}", f"mode:={other}", "dtype:=q8")
    try:
        line = next(l for l in log.read_text().splitlines() if "configure: loading" in l)
        assert f"mode {other}" in line and "Q8, cpu" in line, line
    finally:
        assert stop_node(proc) == 0


def test_a_missing_folder_names_the_folder_it_was_resolved_against(tmp_path):
    log = tmp_path / "bad.log"
    proc = start_node(log, "model:=models/" + NAME, params=None, cwd=tmp_path)
    try:
        code = proc.wait(timeout=60)
    finally:
        stop_node(proc)
    text = log.read_text()
    assert code == 78, text  # EX_CONFIG: launch does not restart it
    assert f"{tmp_path}/models/{NAME}" in text and f"working directory {tmp_path}" in text, text
    assert "panicked" not in text
