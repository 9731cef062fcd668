"""The converting half of ``flashnpc export mobile``: ONNX to ORT format with whichever
onnxruntime is first on this process's path (:mod:`mobile_export.toolchain` picks it).

Run as ``python -m mobile_export.convert_worker MODEL.onnx OUT_DIR TARGET_PLATFORM``. Writes
``OUT_DIR/model.ort`` and ``OUT_DIR/model.required_operators.config`` with onnxruntime's own
converter (optimisation style Fixed, for ``TARGET_PLATFORM``: ``arm`` or ``amd64``) and prints
one JSON object: ``{"onnxruntime": VERSION, "entries": [operator config lines]}``, or
``{"onnxruntime": VERSION, "error": REASON}``. Exit status 0 on success, 1 otherwise.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m mobile_export.convert_worker MODEL.onnx OUT_DIR TARGET_PLATFORM", file=sys.stderr)
        return 2
    import onnxruntime as ort
    from onnxruntime.tools.convert_onnx_models_to_ort import (
        OptimizationStyle,
        convert_onnx_models_to_ort,
    )

    model, out, target = Path(args[0]), Path(args[1]), args[2]
    result: dict = {"onnxruntime": ort.__version__}
    ort.set_default_logger_severity(3)  # the converter's NCHWc note for x86 is expected
    logging.getLogger("ort_format_model.utils").setLevel(logging.WARNING)  # it logs temp paths at INFO
    work = out / "work"
    try:
        work.mkdir(parents=True)
        shutil.copyfile(model, work / "model.onnx")
        with contextlib.redirect_stdout(io.StringIO()):
            convert_onnx_models_to_ort(work / "model.onnx", out, optimization_styles=[OptimizationStyle.Fixed],
                                       target_platform=target)
        lines = [ln.strip() for ln in (out / "model.required_operators.config").read_text().splitlines()]
        result["entries"] = [ln for ln in lines if ln and not ln.startswith("#")]
    except Exception as exc:  # reported to the exporter as the reason, not a traceback
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
