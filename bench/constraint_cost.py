"""Where the word constraints' extra time goes: one session of ``runtime_bench``'s requests through
the shipped engine and through the same engine with the static banned words only (and no word
trigrams: ``runtime_bench``'s "no word cons." peer), every piece timed by thread CPU.

    python bench/constraint_cost.py [--model DIR] [--reps 3] [--lines 40] [--tokens 24] [--runs 1] [--json out.json]

Both engines get the bench's village and requests (``--reps`` blocks of ``--lines`` lines of
``--tokens`` tokens, ``min_tokens = max_tokens``) twice: *fresh* (new engines: every mask state
met for the first time) and *kept* (the same requests again with new npc ids: every state met),
block by block in turn, so the machine's other load hits both alike; ``--runs`` repeats it all
with new engines and reports medians. Per pass it reports the thread CPU of the lines and of their parts:

* ``model decode`` / ``model prefill``: ``FlashOnnx.step`` of one token / of a prompt (a redraw's
  prefill holds the tokens it keeps);
* ``masks kept``: ``WordConstraint.masked_row`` less the first meetings made inside it;
* ``first: ...``: the first meetings by kind: ``plan`` (``_plan``: a state's request-independent
  mask), ``bigram`` (``BigramMask._shared``: a bigram mask not kept yet), ``text rule`` (``_rule_part``),
  ``voice`` (``_make_voice``, one per ban set), ``ban part`` (``_ban_part``), ``step``
  (``_step_read``: a (state, token) not seen before);
* ``steps kept``: ``WordConstraint.step`` less its first meetings; ``sampling``: ``sample_next``;
* ``rest``: the lines' time less all of the above (the decode loop, prompts, fallbacks, slots).

Redraws: the tokens sampled in attempts that were thrown away (a veto, a dead end, a repeat:
the sampled tokens less those of the delivered model lines), the attempts and the fallbacks.
The pieces are timed by wrapping the engine's own methods (``time.thread_time`` around each
call); what a wrapper costs (measured at the start, a microsecond or so) is taken off every
figure for each wrapped call it holds, and the lines' total is the same less all of them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from runtime_bench import requests, village  # (bench/ is the script's directory: on sys.path)

import runtime.client.generator as generator_module
from runtime.client.constraints import WordConstraint
from runtime.client.generator import Line, LineGenerator, LineRequest
from runtime.client.onnx_model import DEFAULT_MODEL_DIR

FIRST = {"_plan": "plan", "_rule_part": "text rule", "_make_voice": "voice", "_ban_part": "ban part"}


class Clock:
    """Thread CPU per label, from wrappers set on the engine's objects (instance attributes)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.overhead = self._calibrate()

    def _calibrate(self, n: int = 20_000) -> float:
        """Seconds a wrapper adds to a call (the least of three tries), subtracted from the figures."""

        def noop() -> None:
            return None

        probe = SimpleNamespace(f=noop)
        self.wrap(probe, "f", "calibration")
        best = float("inf")
        for _ in range(3):
            t = time.thread_time()
            for _ in range(n):
                noop()
            bare = time.thread_time() - t
            t = time.thread_time()
            for _ in range(n):
                probe.f()
            best = min(best, (time.thread_time() - t - bare) / n)
        self.clear()
        return max(0.0, best)

    def wrap(self, obj: Any, name: str, label: str | Callable[[tuple[Any, ...]], str]) -> None:
        inner = getattr(obj, name)

        def timed(*args: Any, **kw: Any) -> Any:
            t = time.thread_time()
            try:
                return inner(*args, **kw)
            finally:
                key = label if isinstance(label, str) else label(args)
                self.cpu[key] += time.thread_time() - t
                self.calls[key] += 1

        setattr(obj, name, timed)

    def clear(self) -> None:
        self.cpu.clear()
        self.calls.clear()


def engine(model: Path, plain: bool) -> LineGenerator:
    """The shipped engine, or (``plain``) runtime_bench's "no word cons." peer: the static banned
    words only, no word trigrams."""
    if not plain:
        return LineGenerator.load(model)
    gen = LineGenerator.load(model, trigrams=None)
    gen.mask = WordConstraint(gen.banned_words, gen.tokenizer, text_rules=False)
    gen.mask.precompute()
    return gen


def instrument(gen: LineGenerator, clock: Clock) -> None:
    mask = gen.mask
    for name, label in FIRST.items():
        clock.wrap(mask, name, "first: " + label)
    clock.wrap(mask, "_step_read", "first: step")
    if mask._bigrams is not None:
        clock.wrap(mask._bigrams, "_shared", "first: bigram")  # (called on a memo miss only)
    clock.wrap(mask, "masked_row", "masked_row")
    clock.wrap(mask, "step", "step")
    assert gen.model is not None
    clock.wrap(gen.model, "step", lambda a: "model prefill" if a[1] is None or a[0].shape[1] > 1 else "model decode")


class Pass:
    """One engine's figures over one pass of the requests (thread CPU, seconds, summed over blocks)."""

    def __init__(self, gen: LineGenerator, clock: Clock) -> None:
        self.gen, self.clock = gen, clock
        self.total = 0.0
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.lines: list[Line] = []
        self.sampled = 0
        self.resamples = 0

    def block(self, reqs: list[LineRequest]) -> None:
        """Run ``reqs`` and add their figures."""
        clock, gen = self.clock, self.gen
        clock.clear()
        sampled = [0]
        inner = generator_module.sample_next

        def sample(*args: Any, **kw: Any) -> int:
            t = time.thread_time()
            try:
                return inner(*args, **kw)
            finally:
                clock.cpu["sampling"] += time.thread_time() - t
                clock.calls["sampling"] += 1
                sampled[0] += 1

        generator_module.sample_next = sample
        resamples = gen.stats()["resamples"]
        t0 = time.thread_time()
        try:
            for r in reqs:
                self.lines.append(gen.generate_request(r))
        finally:
            generator_module.sample_next = inner
        self.total += time.thread_time() - t0
        self.resamples += gen.stats()["resamples"] - resamples
        self.sampled += sampled[0]
        for k, v in clock.cpu.items():
            self.cpu[k] += v
        for k, n in clock.calls.items():
            self.calls[k] += n

    def figures(self) -> dict[str, Any]:
        """The pass's figures (ms): the lines' total, its parts (see the module docstring), redraws."""
        cpu, calls, o = self.cpu, self.calls, self.clock.overhead

        def own(label: str) -> float:  # (a label's time less its wrappers' cost)
            return cpu.get(label, 0.0) - o * calls.get(label, 0)

        first = {k: own(k) for k in cpu if k.startswith("first: ")}
        in_masks = sum(v + o * calls[k] for k, v in first.items() if k != "first: step")
        parts = {"model decode": own("model decode"), "model prefill": own("model prefill"),
                 "masks kept": own("masked_row") - in_masks, **first,
                 "steps kept": own("step") - cpu.get("first: step", 0.0), "sampling": own("sampling")}
        total = self.total - o * sum(calls.values())
        parts["rest"] = total - sum(parts.values())
        delivered = sum(len(line.tokens) for line in self.lines if not line.fallback)
        return {"total_ms": total * 1e3, "parts_ms": {k: v * 1e3 for k, v in parts.items()},
                "wrapper_us": o * 1e6,
                "calls": dict(self.calls), "lines": len(self.lines), "sampled_tokens": self.sampled,
                "thrown_tokens": self.sampled - delivered, "attempts": len(self.lines) + self.resamples,
                "resampled": sum(line.attempts > 1 for line in self.lines),
                "fallbacks": sum(line.fallback for line in self.lines)}


def one_run(model: Path, reps: int, lines: int, tokens: int) -> dict[str, dict[str, Any]]:
    """Fresh engines, then their fresh and kept passes, the two engines' blocks interleaved."""
    gens, load_ms = {}, {}
    for name, plain in (("with", False), ("without", True)):
        t = time.perf_counter()
        gens[name] = engine(model, plain)
        load_ms[name] = (time.perf_counter() - t) * 1e3
    npcs = village(gens["with"])
    warm = [LineRequest(n["npc"], s, persona=n["persona"]) for n in npcs for s in gens["with"].catalog()["states"]]
    passes: dict[str, Pass] = {}
    for name, gen in gens.items():
        gen.warm_prefixes(warm)
        clock = Clock()
        instrument(gen, clock)
        for tag in ("fresh", "kept"):
            passes[f"{name} {tag}"] = Pass(gen, clock)
    for tag in ("fresh", "kept"):
        for rep in range(reps):
            reqs = [replace(r, npc_id=(tag, *r.npc_id))
                    for r in requests(gens["with"], npcs, lines, tokens, seed=rep + 1)]
            for name in gens:
                passes[f"{name} {tag}"].block(reqs)
    out = {k: p.figures() for k, p in passes.items()}
    for name in gens:
        out[f"{name} fresh"]["load_ms"] = load_ms[name]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="exported model directory")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lines", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--runs", type=int, default=1, help="fresh engines this many times: medians of the runs")
    ap.add_argument("--json", type=Path, default=None, help="also write every run's figures here")
    args = ap.parse_args(argv)
    if min(args.reps, args.lines, args.tokens, args.runs) < 1:
        ap.error("--reps, --lines, --tokens and --runs must be >= 1")

    runs = [one_run(args.model, args.reps, args.lines, args.tokens) for _ in range(args.runs)]
    cols = list(runs[0])
    labels = list(dict.fromkeys(k for run in runs for f in run.values() for k in f["parts_ms"]))
    med = statistics.median
    print(f"thread CPU of {args.reps * args.lines} lines of {args.tokens} tokens, ms, median of {len(runs)} run(s) "
          "(with: the shipped word constraints; without: the static banned words only)")
    print(f"{'':<18}" + "".join(f"{c:>15}" for c in cols) + f"{'extra fresh':>14}{'extra kept':>12}")

    def row(label: str, get: Callable[[dict[str, Any]], float]) -> None:
        vals = [med(get(run[c]) for run in runs) for c in cols]
        extra = [med(get(run[a]) - get(run[b]) for run in runs)
                 for a, b in (("with fresh", "without fresh"), ("with kept", "without kept"))]
        print(f"{label:<18}" + "".join(f"{v:>15.1f}" for v in vals) + f"{extra[0]:>14.1f}{extra[1]:>12.1f}")

    row("lines (total)", lambda f: f["total_ms"])
    for label in labels:
        row(label, lambda f, k=label: f["parts_ms"].get(k, 0.0))
    for key in ("sampled_tokens", "thrown_tokens", "attempts", "resampled", "fallbacks"):
        row(key.replace("_", " "), lambda f, k=key: float(f[k]))
    ratio = [med(run[a]["total_ms"] / run[b]["total_ms"] for run in runs)
             for a, b in (("with fresh", "without fresh"), ("with kept", "without kept"))]
    print(f"ratio with / without (totals, not p50s): fresh {ratio[0]:.3f}, kept {ratio[1]:.3f}; "
          f"load() {med(run['with fresh']['load_ms'] for run in runs):.0f} vs "
          f"{med(run['without fresh']['load_ms'] for run in runs):.0f} ms; a wrapper's "
          f"{med(run['with fresh']['wrapper_us'] for run in runs):.2f} us per call taken off")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
