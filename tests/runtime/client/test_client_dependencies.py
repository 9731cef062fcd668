"""A game client installs only the core dependencies: loading the shipped model and speaking a
line must not need torch, onnx or YAML (the line book is read at training time only), and runs
client-engine code only (tests/test_layout.py checks the import statements)."""

import json
import subprocess
import sys

CLIENT = """
import sys
for blocked in ("torch", "onnx", "yaml"):
    sys.modules[blocked] = None  # any import of these now raises ImportError
from runtime import LineGenerator
gen = LineGenerator.load()
line = gen.generate("guard", "alert", persona=["gruff"], intent="greet", seed=1)
assert line.text.strip() and not line.fallback, line
print("ok", line.text)
"""

# nothing blocked: whatever the client's closure imports ends up in sys.modules
CLOSURE = """
import json, sys
from runtime import LineGenerator
gen = LineGenerator.load()
line = gen.generate("guard", "alert", persona=["gruff"], intent="greet", seed=1)
gen.close()
print(json.dumps({"text": line.text, "fallback": line.fallback, "modules": sorted(sys.modules)}))
"""

# what a game client must never load, by package or module prefix
NOT_IN_A_CLIENT = ("torch", "onnx", "yaml", "tqdm", "runtime.factory", "runtime.serving", "runtime.cli",
                   "plugin", "server_sync", "mobile_export", "behavior_tree")


def test_shipped_model_speaks_without_torch_onnx_or_yaml():
    out = subprocess.run([sys.executable, "-c", CLIENT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ok ")


def test_a_game_clients_import_closure_is_the_client_engine_only():
    out = subprocess.run([sys.executable, "-c", CLOSURE], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["text"].strip() and not report["fallback"], report["text"]
    loaded = report["modules"]
    assert [m for m in loaded if any(m == p or m.startswith(p + ".") for p in NOT_IN_A_CLIENT)] == []
    ours = {m for m in loaded if m == "runtime" or m.startswith("runtime.")}
    assert "runtime.client.generator" in ours
    assert ours <= {"runtime", "runtime.paths", "runtime.tokenizer"} | {
        m for m in ours if m == "runtime.client" or m.startswith("runtime.client.")}
