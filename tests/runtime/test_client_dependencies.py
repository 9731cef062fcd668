"""A game client installs only the core dependencies: loading the shipped model and speaking a
line must not need torch, onnx or YAML (the line book is read at training time only)."""

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


def test_shipped_model_speaks_without_torch_onnx_or_yaml():
    out = subprocess.run([sys.executable, "-c", CLIENT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ok ")
