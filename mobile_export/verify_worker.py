"""The fresh-process half of ``flashnpc bundle verify``: load the bundle's ORT model, regenerate.

Run as ``python -m mobile_export.verify_worker BUNDLE REFERENCE_JSON``. Before importing
anything else it makes torch, onnx and the training/export code unimportable, then loads the
bundle as a game does (:meth:`runtime.client.generator.LineGenerator.load`: every check of
:mod:`runtime.client.bundle`, and the side files parsed as the engine parses them), generates one line per
archetype and state with the reference's seeds and settings, and prints one JSON object:
``{"ok", "cases", "mismatches", "onnxruntime", "forbidden_loaded", "load_ms", "generate_ms"}``.
Exit status 0 when every case's tokens match, 1 otherwise.
"""

from __future__ import annotations

import importlib.abc
import sys

FORBIDDEN = ("torch", "onnx", "onnxscript", "runtime.factory", "runtime.serving", "runtime.cli")


class _Forbid(importlib.abc.MetaPathFinder):
    """Makes the modules a game client must not need fail to import, loudly."""

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if any(fullname == name or fullname.startswith(name + ".") for name in FORBIDDEN):
            raise ImportError(f"{fullname} may not be imported when verifying a bundle (client-side code only)")
        return None


def main(argv: list[str] | None = None) -> int:
    sys.meta_path.insert(0, _Forbid())
    import json
    import time
    from pathlib import Path

    import onnxruntime as ort

    from mobile_export.reference import compare_cases, generate_cases
    from runtime.client.generator import LineGenerator

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m mobile_export.verify_worker BUNDLE REFERENCE_JSON", file=sys.stderr)
        return 2
    bundle_path, reference_path = args
    result: dict = {"ok": False, "onnxruntime": ort.__version__}
    try:
        reference = json.loads(Path(reference_path).read_text(encoding="utf-8"))
        t0 = time.perf_counter()
        gen = LineGenerator.load(bundle_path, warmup=False)
        model = gen.model
        assert model is not None
        t1 = time.perf_counter()
        got = generate_cases(model, reference["settings"])
        t2 = time.perf_counter()
        gen.close()
        tok = model.tokenizer
        assert tok is not None
        every = {(a, s) for a in tok.catalog["archetypes"] for s in tok.catalog["states"]}
        missing = sorted(every - {(c["archetype"], c["state"]) for c in reference["cases"]})
        mismatches = [f"{a}/{s}: no reference line recorded" for a, s in missing]
        ties: list[str] = []
        mismatches += compare_cases(reference["cases"], got, model=model, ties=ties)
        result.update(cases=len(got), mismatches=mismatches, near_ties=ties, load_ms=round((t1 - t0) * 1e3, 1),
                      generate_ms=round((t2 - t1) * 1e3, 1),
                      example={"archetype": got[0]["archetype"], "state": got[0]["state"],
                               "text": got[0]["text"]} if got else None)
    except Exception as exc:  # reported to the parent as the reason, not a traceback
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["mismatches"] = []
    result["forbidden_loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "onnx")
                                        or any(m == name or m.startswith(name + ".") for name in FORBIDDEN))
    result["ok"] = "error" not in result and not result["mismatches"] and not result["forbidden_loaded"]
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
