"""FlashNPC runtime: line book, tokenizer, the Flash model, training, export and engines.

``from runtime import LineGenerator`` is resolved lazily, so ``import runtime`` stays cheap
(onnxruntime and numpy load on first use of the engine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

_LAZY = {
    "LineGenerator": "runtime.generator",
    "Line": "runtime.generator",
    "LineRequest": "runtime.generator",
    "LineStream": "runtime.generator",
    "ModelLoadError": "runtime.generator",
    "PrefixCache": "runtime.prefix_cache",
    "FallbackBook": "runtime.fallback",
    "EngineMetrics": "runtime.metrics",
}

if TYPE_CHECKING:
    from runtime.fallback import FallbackBook
    from runtime.generator import Line, LineGenerator, LineRequest, LineStream, ModelLoadError
    from runtime.metrics import EngineMetrics
    from runtime.prefix_cache import PrefixCache


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


__all__ = ["EngineMetrics", "FallbackBook", "Line", "LineGenerator", "LineRequest", "LineStream",
           "ModelLoadError", "PrefixCache"]
