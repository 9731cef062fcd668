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

One ``--fast`` eval is noisy: the shipped model against itself at ``--seed 1`` moves up to 2.9
points (v3 base, 2026-12-01), so a 2-point check on one seed flags noise. ``--also-base FILE`` /
``--also-tuned FILE`` (repeatable) pool more evals of the same model at other seeds into each
side (lines-weighted over every file), and with two or more base files the table gains the
base's own seed spread (max - min over its files) per measure, the size of a move that is noise:

    flashnpc eval --fast --seed 1 --json runs/shipped_s1.eval.json   # and the same for the fine-tune
    python examples/finetune/compare_eval.py runs/shipped.eval.json runs/pirate_port.eval.json \
        --also-base runs/shipped_s1.eval.json --also-tuned runs/pirate_port_s1.eval.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# measures without a target in the eval's thresholds, and the direction that is better
EXTRA = {"novelty": "min", "memorisation": "max"}
TOP = {"fidelity_seen": "min", "fidelity_heldout": "min", "distinct2": "min", "novelty": "min"}


def pooled(*reports: Mapping[str, Any]) -> dict[str, float]:
    """Each writer measure over every (shape, side) cell of every report, weighted by its lines;
    a cell whose figure is None (the measure does not apply to the shape) is left out."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for report in reports:
        for sides in report["writer"]["cells"].values():
            for cell in sides.values():
                for name, value in cell["model"].items():
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        sums[name] = sums.get(name, 0.0) + value * cell["lines"]
                        weights[name] = weights.get(name, 0.0) + cell["lines"]
    return {k: sums[k] / weights[k] for k in sums}


def top_figures(*reports: Mapping[str, Any]) -> dict[str, float]:
    """The eval's own headline figures (:data:`TOP`), the mean over ``reports`` (each has the
    same number of samples under the same flags); a figure missing from any report is left out."""
    return {k: sum(r["figures"][k] for r in reports) / len(reports) for k in TOP
            if all(r["figures"].get(k) is not None for r in reports)}


def directions(report: Mapping[str, Any]) -> dict[str, str]:
    """``min`` (higher is better) or ``max`` (lower is better) per writer measure."""
    out = dict(EXTRA)
    for name, rule in report["writer"]["thresholds"].items():
        out[name] = "max" if "max" in rule else "min"
    out["distinct2_min"] = "min"
    return out


def _figures(reports: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    return {**{f"writer {k}": v for k, v in pooled(*reports).items()}, **top_figures(*reports)}


def compare(base: Mapping[str, Any] | Sequence[Mapping[str, Any]],
            tuned: Mapping[str, Any] | Sequence[Mapping[str, Any]], points: float = 2.0) -> list[dict[str, Any]]:
    """Rows ``{measure, base, tuned, delta, better, regressed, spread}`` (figures in percent).
    ``base`` / ``tuned``: one eval report each, or several of one model (other seeds, same
    flags), pooled. ``spread``: max - min of the measure over the base's reports (None for one),
    what the base model moves against itself."""
    bases = [base] if isinstance(base, Mapping) else list(base)
    tuneds = [tuned] if isinstance(tuned, Mapping) else list(tuned)
    if not bases or not tuneds:
        raise ValueError("compare needs at least one eval report on each side")
    configs = {json.dumps({k: v for k, v in r["config"].items() if k != "seed"}, sort_keys=True)
               for r in bases + tuneds}
    if len(configs) > 1:
        raise ValueError("the eval reports were run with different flags (config other than seed); "
                         "compare evals of one kind (all --fast or none)")
    way = directions(bases[0])
    way.update({f"writer {k}": v for k, v in list(way.items())})
    way.update(TOP)
    a, b = _figures(bases), _figures(tuneds)
    each = [_figures([r]) for r in bases] if len(bases) > 1 else []
    rows = []
    for name, x in a.items():
        y, d = b.get(name), way.get(name)
        if y is None:
            continue
        delta = (y - x) * 100
        worse = -delta if d == "min" else delta if d == "max" else 0.0
        spread = (max(f[name] for f in each) - min(f[name] for f in each)) * 100 if each else None
        rows.append({"measure": name, "base": x * 100, "tuned": y * 100, "delta": delta,
                     "better": {"min": "higher", "max": "lower"}.get(d or "", "-"),
                     "regressed": worse > points, "spread": spread})
    return rows


def _read(path: Path) -> dict[str, Any]:
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"compare_eval: error: {path}: {e}") from None
    if not isinstance(report, dict) or "writer" not in report or "config" not in report:
        raise SystemExit(f"compare_eval: error: {path}: not a `flashnpc eval --json` report")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="eval JSON of the base (shipped) model")
    parser.add_argument("tuned", type=Path, help="eval JSON of the fine-tune, same flags")
    parser.add_argument("--also-base", type=Path, action="append", default=[], metavar="FILE",
                        help="another eval JSON of the base model (another --seed), pooled; repeatable")
    parser.add_argument("--also-tuned", type=Path, action="append", default=[], metavar="FILE",
                        help="another eval JSON of the fine-tune (another --seed), pooled; repeatable")
    parser.add_argument("--points", type=float, default=2.0, help="allowed regression in points (default 2)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    bases = [_read(p) for p in (args.base, *args.also_base)]
    tuneds = [_read(p) for p in (args.tuned, *args.also_tuned)]
    try:
        rows = compare(bases, tuneds, args.points)
    except ValueError as e:
        raise SystemExit(f"compare_eval: error: {e}") from None
    spread = len(bases) > 1
    if args.markdown:
        print("| measure (all shapes, both sides) | better | shipped | fine-tune | change (points) |"
              + (" shipped seed spread |" if spread else ""))
        print("|---|---|---:|---:|---:|" + ("---:|" if spread else ""))
        for r in rows:
            flag = " **regressed**" if r["regressed"] else ""
            print(f"| {r['measure']} | {r['better']} | {r['base']:.1f} | {r['tuned']:.1f} | {r['delta']:+.1f}{flag} |"
                  + (f" {r['spread']:.1f} |" if spread else ""))
    else:
        for r in rows:
            print(f"{r['measure']:<34} {r['better']:>6}  {r['base']:6.1f}  {r['tuned']:6.1f}  {r['delta']:+6.1f}"
                  + (f"  (spread {r['spread']:.1f})" if spread else "")
                  + ("  REGRESSED" if r["regressed"] else ""))
    bad = [r["measure"] for r in rows if r["regressed"]]
    print(f"{len(bad)} measure(s) regressed by more than {args.points:g} points" + (f": {', '.join(bad)}" if bad else ""),
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
