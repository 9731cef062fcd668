"""A blind-rating kit: model lines and book lines, shuffled, for writers to rate unseen.

``flashnpc eval blind --out FILE.csv`` writes ``FILE.csv`` (columns ``id``, ``prompt``,
``line``, ``rating``) and a hidden key ``FILE.key.json`` (each id's source, prompt shape, side
and prompt). Both sources are drawn over the same mix of prompts: every prompt shape of
:data:`runtime.factory.writer_eval.SHAPES` on seen and on held-out (archetype, state) pairs, in turn.
Lines keep their ``{slot}`` markers, as both sources write them. The rater fills ``rating``:

* 0 — garbled, contradictory, or wrong for the state;
* 1 — understandable but clumsy or stitched;
* 2 — a writer could ship it as is.

``flashnpc eval unblind FILE.csv`` checks every row against the key (a missing or invalid
rating, an unknown or repeated id, a row missing: each reported as ``file:line: ...``) and
summarises the ratings per source, per prompt shape and per side.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.factory.writer_eval import (
    SHAPES,
    SIDES,
    cell_rng,
    draw_requests,
    example_request,
    pair_conditions,
    persona_pool,
    shape_pools,
)

if TYPE_CHECKING:
    from runtime.factory.evaluate import Sampler
    from runtime.factory.linebook import LineBook
    from runtime.factory.writer_eval import Request

COLUMNS = ("id", "prompt", "line", "rating")
RATINGS = {0: "garbled", 1: "clumsy", 2: "shippable"}
RATING_SCALE = ("0 = garbled, contradictory or wrong for the state; 1 = understandable but clumsy "
                "or stitched; 2 = a writer could ship it as is")
SOURCES = ("model", "versus", "book")
"""Who wrote a line: the model rated, a second model on the very same prompts (``--versus``:
a blind A/B of two models), the line book."""


class RatingsError(ValueError):
    """A rated file that cannot be unblinded; ``problems`` lists every ``file:line: ...``."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def key_path(csv_path: str | Path) -> Path:
    """Where the hidden key of a rating file lives: ``FILE.csv`` -> ``FILE.key.json``."""
    path = Path(csv_path)
    return path.with_name(f"{path.stem}.key.json")


def describe_prompt(request: Request) -> str:
    """A prompt as a rater reads it."""
    archetype, persona, state, intent, context = request
    ctx = ", ".join(f"{slot.replace('_', ' ')}: {value.replace('_', ' ')}" for slot, value in context)
    return (f"archetype: {archetype}; state: {state}; intent: {intent.replace('_', ' ')}; "
            f"persona: {', '.join(persona) or 'none'}; context: {ctx or 'none'}")


def _cells(n: int) -> list[tuple[str, str]]:
    """``n`` (shape, side) cells, every shape on each side in turn."""
    every = [(shape, side) for side in SIDES for shape in SHAPES]
    return [every[k % len(every)] for k in range(n)]


def write_blind(
    out: str | Path,
    *,
    book: LineBook,
    sampler: Sampler,
    model_lines: int,
    book_lines: int,
    seed: int = 0,
    model_name: str = "shipped default",
    versus: Sampler | None = None,
    versus_name: str | None = None,
) -> dict[str, Any]:
    """Write the rating CSV and its key; returns the key. Book lines of a shape the book does not
    have are drawn from the shapes it has (their key entries say which). ``versus``: a second
    model's sampler, which writes a line for every prompt the model got, with the same sampling
    seed (source ``versus``), so the two read side by side in one blind reading."""
    if model_lines < 0 or book_lines < 0:
        raise ValueError("--model-lines and --book-lines must be >= 0")
    split = book.split()
    personas = persona_pool(book)
    pools = shape_pools(book, split)
    items: list[dict[str, Any]] = []

    wanted: dict[tuple[str, str], int] = {}
    for cell in _cells(model_lines):
        wanted[cell] = wanted.get(cell, 0) + 1
    for k, ((shape, side), n) in enumerate(sorted(wanted.items())):
        rng = cell_rng(seed, shape, side, purpose=2)
        requests = draw_requests(book, pair_conditions(book, split, side), shape, n, rng, personas)
        for source, writer in (("model", sampler), ("versus", versus)):
            if writer is None:
                continue
            lines = writer.sample(requests, seed=seed * 1000 + 500 + k)
            falls = getattr(writer, "last_fallbacks", None) or [False] * len(lines)
            for request, line, falls_back in zip(requests, lines, falls):
                items.append({**_item(source, shape, side, request, line),
                              "engine_falls_back": bool(falls_back)})

    have = [cell for cell in _cells(len(SHAPES) * len(SIDES)) if pools[(*cell, "text")]]
    if book_lines and not have:
        raise ValueError("the line book has no line of any prompt shape to rate")
    wanted = {}
    for k in range(book_lines):
        cell = have[k % len(have)]
        wanted[cell] = wanted.get(cell, 0) + 1
    for (shape, side), n in sorted(wanted.items()):
        rng = cell_rng(seed, shape, side, purpose=3)
        pool = pools[(shape, side, "text")]
        picks = rng.choice(len(pool), size=n, replace=n > len(pool))
        for i in picks:
            items.append(_item("book", shape, side, example_request(pool[int(i)]), pool[int(i)].text))

    extra: dict[str, Any] = {"model": model_name}
    if versus is not None:
        extra["versus"] = versus_name or "second model"
    return write_sheet(out, items, np.random.default_rng([seed, 4]), seed=seed, **extra)


def write_sheet(out: str | Path, items: Sequence[dict[str, Any]], rng: np.random.Generator, **key_fields: Any
                ) -> dict[str, Any]:
    """Shuffle ``items`` (each with ``prompt``, ``line`` and its hidden fields: ``source``, ...)
    with ``rng``, number them ``r001``..., write the rating CSV (``id, prompt, line, rating``) to
    ``out`` and the key (``key_fields``, the rating scale, the items) beside it; returns the key.
    Every blind sheet of the project is written here, so ``flashnpc eval unblind`` reads them all."""
    order = rng.permutation(len(items))
    width = len(str(len(items)))
    shuffled = [{**items[int(i)], "id": f"r{n:0{width}d}"} for n, i in enumerate(order, start=1)]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for item in shuffled:
            writer.writerow([item["id"], item["prompt"], item["line"], ""])
    key = {"csv": out.name, **key_fields, "rating_scale": RATING_SCALE, "items": shuffled}
    key_path(out).write_text(json.dumps(key, indent=1))
    return key


def _item(source: str, shape: str, side: str, request: Request, line: str) -> dict[str, Any]:
    archetype, persona, state, intent, context = request
    return {"source": source, "shape": shape, "side": side, "archetype": archetype,
            "persona": list(persona), "state": state, "intent": intent, "context": dict(context),
            "prompt": describe_prompt(request), "line": line}


@dataclass(frozen=True)
class Rated:
    id: str
    rating: int
    item: dict[str, Any]  # the key's entry: source, shape, side, prompt, line


def read_ratings(csv_path: str | Path, key: str | Path | None = None) -> list[Rated]:
    """The rated rows joined with the key; raises :class:`RatingsError` listing every problem."""
    csv_path = Path(csv_path)
    kpath = Path(key) if key is not None else key_path(csv_path)
    if not kpath.exists():
        raise RatingsError([f"{kpath}: the key file is missing (written beside the CSV by `flashnpc eval blind`)"])
    items = {item["id"]: item for item in json.loads(kpath.read_text())["items"]}
    problems: list[str] = []
    rated: list[Rated] = []
    seen: dict[str, int] = {}
    with csv_path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise RatingsError([f"{csv_path}:1: header: missing column(s) {', '.join(missing)}; "
                                f"expected {','.join(COLUMNS)}"])
        for row in reader:
            where = f"{csv_path}:{reader.line_num}"
            rid = (row.get("id") or "").strip()
            if rid not in items:
                problems.append(f"{where}: id: {rid!r} is not in the key {kpath.name}")
                continue
            if rid in seen:
                problems.append(f"{where}: id: {rid} repeats line {seen[rid]}")
                continue
            seen[rid] = reader.line_num
            value = (row.get("rating") or "").strip()
            if value not in ("0", "1", "2"):
                problem = "missing" if not value else f"{value!r} is not a rating"
                problems.append(f"{where}: rating: {problem} (write 0, 1 or 2: {RATING_SCALE})")
                continue
            rated.append(Rated(rid, int(value), items[rid]))
    absent = [rid for rid in items if rid not in seen]
    if absent:
        shown = ", ".join(absent[:10]) + (f" and {len(absent) - 10} more" if len(absent) > 10 else "")
        problems.append(f"{csv_path}: rows missing for id(s) {shown} of the key")
    if problems:
        raise RatingsError(problems)
    return rated


def _shares(ratings: Sequence[int]) -> dict[str, Any]:
    n = len(ratings)
    out: dict[str, Any] = {"n": n}
    for value, name in sorted(RATINGS.items(), reverse=True):
        out[name] = sum(r == value for r in ratings) / n if n else None
    out["mean"] = float(np.mean(ratings)) if n else None
    return out


def summarise(rated: Sequence[Rated]) -> dict[str, Any]:
    """Shippable / clumsy / garbled shares per source (``model`` and ``book``; ``versus`` when the
    kit has one), and per source and shape or side. A model's ``as_served`` share leaves out the
    lines the engine would have replaced by an authored fallback (the key's ``engine_falls_back``:
    stopped on every attempt; the kit keeps their whole words so that they count against the
    model in ``all``); ``fallbacks`` counts them."""
    out: dict[str, Any] = {}
    for source in SOURCES:
        mine = [r for r in rated if r.item["source"] == source]
        if source == "versus" and not mine:
            continue
        out[source] = {
            "all": _shares([r.rating for r in mine]),
            "by_shape": {s: _shares([r.rating for r in mine if r.item["shape"] == s]) for s in SHAPES},
            "by_side": {s: _shares([r.rating for r in mine if r.item["side"] == s]) for s in SIDES},
        }
        if source != "book":
            out[source]["as_served"] = _shares([r.rating for r in mine if not r.item.get("engine_falls_back")])
            out[source]["fallbacks"] = sum(bool(r.item.get("engine_falls_back")) for r in mine)
    return out


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a readable table (percent of the lines rated in each group)."""
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}"

    rows = [f"{'source':8s} {'group':12s} {'lines':>6s} {'shippable':>10s} {'clumsy':>8s} {'garbled':>8s}"]
    for source in (s for s in SOURCES if s in summary):
        groups = [("all", summary[source]["all"])]
        groups += [(s, v) for s, v in summary[source]["by_shape"].items()]
        groups += [(s, v) for s, v in summary[source]["by_side"].items()]
        if summary[source].get("fallbacks"):
            groups.append(("as served", summary[source]["as_served"]))
        for name, g in groups:
            if g["n"] or name == "all":
                rows.append(f"{source:8s} {name:12s} {g['n']:>6d} {pct(g['shippable']):>10s} "
                            f"{pct(g['clumsy']):>8s} {pct(g['garbled']):>8s}")
    for source in ("model", "versus"):
        if summary.get(source, {}).get("fallbacks"):
            rows.append(f"({source} as served: without the {summary[source]['fallbacks']} lines the "
                        f"engine would have replaced by an authored fallback)")
    return "\n".join(rows)
