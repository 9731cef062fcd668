"""The base-book regression check: two ``flashnpc eval --json`` files side by side.

    flashnpc eval --fast --json runs/shipped.eval.json
    flashnpc eval --fast --model runs/pirate_port --json runs/pirate_port.eval.json
    python examples/finetune/compare_eval.py runs/shipped.eval.json runs/pirate_port.eval.json

Both evals run on the base line book's prompts (the fine-tune's catalog holds the base's, so its
export takes them). For each writer measure of issue #12 the figure is pooled over every prompt
shape and both sides (seen / held-out pairs), i.e. over all the eval's model lines, because one
cell of ``--fast`` has 70 lines and moves 1.4 points per line. A measure *regresses* when it
moves against its target's direction (a ``max`` target: up; a ``min`` target: down) by more
than ``--points`` (default 2) percentage points; exit status 1 if any does.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# measures without a target in the eval's thresholds, and the direction that is better
EXTRA = {"novelty": "min", "memorisation": "max"}
TOP = {"fidelity_seen": "min", "fidelity_heldout": "min", "distinct2": "min", "novelty": "min"}


def pooled(report: Mapping[str, Any]) -> dict[str, float]:
    """Each writer measure over every (shape, side) cell, weighted by its lines; a cell whose
    figure is None (the measure does not apply to the shape) is left out."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for sides in report["writer"]["cells"].values():
        for cell in sides.values():
            for name, value in cell["model"].items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    sums[name] = sums.get(name, 0.0) + value * cell["lines"]
                    weights[name] = weights.get(name, 0.0) + cell["lines"]
    return {k: sums[k] / weights[k] for k in sums}


def directions(report: Mapping[str, Any]) -> dict[str, str]:
    """``min`` (higher is better) or ``max`` (lower is better) per writer measure."""
    out = dict(EXTRA)
    for name, rule in report["writer"]["thresholds"].items():
        out[name] = "max" if "max" in rule else "min"
    out["distinct2_min"] = "min"
    return out


def compare(base: Mapping[str, Any], tuned: Mapping[str, Any], points: float = 2.0) -> list[dict[str, Any]]:
    """Rows ``{measure, base, tuned, delta, better, regressed}`` (figures in percent)."""
    rows = []
    way = directions(base)
    a, b = pooled(base), pooled(tuned)
    pairs = [(f"writer {k}", a[k], b.get(k), way.get(k)) for k in a]
    pairs += [(k, base["figures"].get(k), tuned["figures"].get(k), d) for k, d in TOP.items()]
    for name, x, y, d in pairs:
        if x is None or y is None:
            continue
        delta = (y - x) * 100
        worse = -delta if d == "min" else delta if d == "max" else 0.0
        rows.append({"measure": name, "base": x * 100, "tuned": y * 100, "delta": delta,
                     "better": {"min": "higher", "max": "lower"}.get(d or "", "-"),
                     "regressed": worse > points})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="eval JSON of the base (shipped) model")
    parser.add_argument("tuned", type=Path, help="eval JSON of the fine-tune, same flags")
    parser.add_argument("--points", type=float, default=2.0, help="allowed regression in points (default 2)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    base, tuned = (json.loads(p.read_text()) for p in (args.base, args.tuned))
    rows = compare(base, tuned, args.points)
    if args.markdown:
        print("| measure (all shapes, both sides) | better | shipped | fine-tune | change (points) |")
        print("|---|---|---:|---:|---:|")
        for r in rows:
            flag = " **regressed**" if r["regressed"] else ""
            print(f"| {r['measure']} | {r['better']} | {r['base']:.1f} | {r['tuned']:.1f} | {r['delta']:+.1f}{flag} |")
    else:
        for r in rows:
            print(f"{r['measure']:<34} {r['better']:>6}  {r['base']:6.1f}  {r['tuned']:6.1f}  {r['delta']:+6.1f}"
                  f"{'  REGRESSED' if r['regressed'] else ''}")
    bad = [r["measure"] for r in rows if r["regressed"]]
    print(f"{len(bad)} measure(s) regressed by more than {args.points:g} points" + (f": {', '.join(bad)}" if bad else ""),
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
