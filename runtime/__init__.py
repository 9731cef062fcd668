"""FlashNPC runtime: the line engine, in three subpackages by who runs the code.

* :mod:`runtime.client` - the client engine a game ships (:class:`LineGenerator`; onnxruntime
  and numpy only);
* :mod:`runtime.serving` - the servers' batched engines and dialogue service (PyTorch or
  onnxruntime);
* :mod:`runtime.factory` - the model factory: line book, model, training, quantisation, export,
  evaluation (torch, onnx, PyYAML);
* shared by all three: :mod:`runtime.tokenizer` and :mod:`runtime.paths`; the commands
  ``flashnpc train | eval | export`` (onnx) are in :mod:`runtime.cli`.

``from runtime import LineGenerator`` is resolved lazily, so ``import runtime`` stays cheap
(onnxruntime and numpy load on first use of the engine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

_LAZY = {
    "AsyncLineStream": "runtime.client.generator",
    "LineGenerator": "runtime.client.generator",
    "Line": "runtime.client.generator",
    "LineRequest": "runtime.client.generator",
    "LineStream": "runtime.client.generator",
    "ModelLoadError": "runtime.client.generator",
    "PrefixCache": "runtime.client.prefix_cache",
    "FallbackBook": "runtime.client.fallback",
    "EngineMetrics": "runtime.client.metrics",
}

if TYPE_CHECKING:
    from runtime.client.fallback import FallbackBook
    from runtime.client.generator import (
        AsyncLineStream,
        Line,
        LineGenerator,
        LineRequest,
        LineStream,
        ModelLoadError,
    )
    from runtime.client.metrics import EngineMetrics
    from runtime.client.prefix_cache import PrefixCache


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = ["AsyncLineStream", "EngineMetrics", "FallbackBook", "Line", "LineGenerator", "LineRequest", "LineStream",
           "ModelLoadError", "PrefixCache"]
