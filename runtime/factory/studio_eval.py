"""``flashnpc eval studio``: how FlashNPC speaks for a studio's own world, against playing back the
studio's own lines.

Given a studio's line file (docs/finetune.md's format), the kit:

1. holds out a seeded share of its (archetype, state, intent) *cells* entirely (every line of a
   held-out cell) and fine-tunes the base model on the rest (:func:`runtime.factory.finetune.finetune`,
   the documented defaults unless told otherwise) — or reuses ``--model``, a fine-tune of that
   training file;
2. asks the fine-tune, as a game would (:class:`runtime.client.generator.LineGenerator`, authored
   playback on), for one line per request: every held-out cell (*uncovered*: the writers wrote
   nothing there, as far as the model knows) and a seeded sample of the training cells
   (*covered*). A request's persona and context are those of one of the cell's own lines, drawn
   with the seed: that line is the *writers' line* for the request;
3. reports per side the share of lines served as authored playback (the cell's own lines, or
   a near state's lines for the move), generated and fallback,
   and the *wrong-move fallbacks*: a fallback that is a studio line written only for moves other
   than the request's (:func:`wrong_move`); the same for the model alone (playback off);
4. writes a blind sheet: per request, the candidates' distinct texts in a seeded order, with no
   source — FlashNPC as served, the model alone (playback off), the *rule pick* (:meth:`runtime.client.authored.AuthoredBook.rule_pick`
   over the training lines: what a game without a model plays back) and the writers' line.
   The rater fills ``rating`` (0 / 1 / 2 as :data:`runtime.factory.blind.RATING_SCALE`) on every
   row and ``best`` (x) on one row per request; the key, beside the sheet, maps each row to its
   sources.

``flashnpc eval unblind-studio SHEET`` (:func:`summarise_sheet`) reads a rated sheet against its
key: per side and source the shares, best-of counts, and FlashNPC against the rule pick
pair by pair.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.client.fallback import GENERIC
from runtime.factory.blind import RATING_SCALE, RATINGS, RatingsError
from runtime.factory.finetune import (
    FinetuneConfig,
    StudioLine,
    authored_book,
    finetune,
    read_lines,
    read_studio_lines,
)

SOURCES = ("served", "model", "rule", "writers")
"""Who a sheet row's line comes from: FlashNPC as served (playback where covered), the fine-tuned
model alone, the rule pick, the writers' own line for the request."""
SHEET_COLUMNS = ("id", "request", "line", "rating", "best")
SLOT_VALUES = {"player": "Sam", "location": "the north gate", "item": "the lantern"}
"""What a game fills the free-text slots with in the kit's requests (the sheet shows ``{slot}``)."""

Cell = tuple[str, str, str]


@dataclass(frozen=True)
class StudioRequest:
    """One request of the kit: a cell and the tags of the writers' line drawn for it."""

    side: str  # "covered" or "uncovered"
    writers: StudioLine

    @property
    def cell(self) -> Cell:
        return (self.writers.archetype, self.writers.state, self.writers.intent)

    def describe(self) -> str:
        w = self.writers
        ctx = ", ".join(f"{k.replace('_', ' ')}: {v.replace('_', ' ')}" for k, v in w.context)
        return (f"{w.archetype}, {w.state}; the player: {w.intent.replace('_', ' ')}; "
                f"persona: {', '.join(w.persona) or 'none'}; context: {ctx or 'none'}")


def split_cells(lines: Sequence[StudioLine], share: float, seed: int) -> tuple[list[StudioLine], set[Cell]]:
    """The training lines and the held-out cells: ``share`` of the file's cells (at least one),
    drawn with ``seed``; every line of a held-out cell is left out of training."""
    if not 0 < share < 1:
        raise ValueError(f"--holdout must be in (0, 1), got {share!r}")
    cells = sorted({(ln.archetype, ln.state, ln.intent) for ln in lines})
    held = set(random.Random(seed).sample(cells, max(1, round(share * len(cells)))))
    return [ln for ln in lines if (ln.archetype, ln.state, ln.intent) not in held], held


def draw_requests(lines: Sequence[StudioLine], held: set[Cell], n_covered: int, seed: int) -> list[StudioRequest]:
    """One request per held-out cell and ``n_covered`` for training cells, each on the tags of
    one of its cell's lines (drawn with ``seed``)."""
    rng = random.Random(seed + 1)
    by_cell: dict[Cell, list[StudioLine]] = {}
    for ln in lines:
        by_cell.setdefault((ln.archetype, ln.state, ln.intent), []).append(ln)
    covered = sorted(c for c in by_cell if c not in held)
    picked = rng.sample(covered, min(n_covered, len(covered)))
    out = [StudioRequest("uncovered", rng.choice(by_cell[c])) for c in sorted(held)]
    out += [StudioRequest("covered", rng.choice(by_cell[c])) for c in sorted(picked)]
    return out


def unwritten_cells(lines: Sequence[StudioLine], catalog: dict[str, Any]) -> list[str]:
    """The writers' to-do list: every (archetype, state, intent) of the file's archetypes, over
    the base's states and intents and the file's own, that no line of the file covers (the
    engine answers those from near states, the model or a fallback), as ``archetype/state/intent``."""
    states = list(dict.fromkeys([*catalog["states"], *(ln.state for ln in lines)]))
    intents = list(dict.fromkeys([*catalog["intents"], *(ln.intent for ln in lines)]))
    written = {(ln.archetype, ln.state, ln.intent) for ln in lines}
    archetypes = list(dict.fromkeys(ln.archetype for ln in lines))
    return [f"{a}/{s}/{i}" for a in archetypes for s in states for i in intents if (a, s, i) not in written]


def wrong_move(text: str, intent: str, by_text: dict[str, set[str]]) -> bool:
    """A fallback answers another move: ``text`` is a studio line and the studio wrote it only
    for moves other than ``intent``. The generic lines and the base's own lines are no studio
    line, so never count."""
    intents = by_text.get(text)
    return text not in GENERIC and intents is not None and intent not in intents


def _line_for(gen: Any, req: StudioRequest, seed: int) -> Any:
    w = req.writers
    return gen.generate(w.archetype, w.state, persona=list(w.persona), intent=w.intent,
                        context={**dict(w.context), **SLOT_VALUES}, seed=seed,
                        npc_id=("studio-eval", seed), player_id="rater")


def served_figures(lines: Sequence[Any], reqs: Sequence[StudioRequest], new_archetypes: set[str],
                   by_text: dict[str, set[str]]) -> dict[str, Any]:
    """Per side: requests, authored / generated / fallback shares, wrong-move fallbacks, and the
    fallback share of the studio's new archetypes."""
    out: dict[str, Any] = {}
    for side in ("covered", "uncovered"):
        rows = [(ln, r) for ln, r in zip(lines, reqs) if r.side == side]
        n = len(rows)
        fb = [(ln, r) for ln, r in rows if ln.fallback]
        new = [(ln, r) for ln, r in rows if r.writers.archetype in new_archetypes]
        out[side] = {
            "requests": n,
            "authored_pct": _pct(sum(ln.finish_reason == "authored" for ln, _ in rows), n),
            "authored_near_pct": _pct(sum(ln.finish_reason == "authored_near" for ln, _ in rows), n),
            "generated_pct": _pct(sum(not ln.fallback and not ln.finish_reason.startswith("authored")
                                      for ln, _ in rows), n),
            "fallback_pct": _pct(len(fb), n),
            "wrong_move_fallbacks": sum(wrong_move(ln.raw_text, r.writers.intent, by_text) for ln, r in fb),
            "new_archetype_requests": len(new),
            "new_archetype_fallback_pct": _pct(sum(ln.fallback for ln, _ in new), len(new)),
        }
    return out


def _pct(k: int, n: int) -> float | None:
    return None if n == 0 else round(100.0 * k / n, 1)


def run_studio_eval(lines_path: str | Path, out_dir: str | Path, *, base: str | Path | None = None,
                    model: str | Path | None = None, share: float = 0.15, n_covered: int = 40, seed: int = 0,
                    cfg: FinetuneConfig | None = None, progress: bool = True,
                    load: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Run the kit (module docstring) into ``out_dir``: ``train.jsonl``, ``model/`` (unless
    ``model`` is given), ``sheet.csv`` and its key ``sheet.key.json``, ``report.json``.
    ``load`` builds a generator from a model directory (default
    :meth:`runtime.client.generator.LineGenerator.load`)."""
    from runtime.client.generator import LineGenerator

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    load = load or LineGenerator.load
    base_dir = Path(base) if base is not None else None
    catalog = _catalog(base_dir)
    lines = read_lines(lines_path, catalog)
    train, held = split_cells(lines, share, seed)
    train_file = out / "train.jsonl"
    declared = {ln.archetype: ln.like for ln in lines if ln.like}
    with train_file.open("w", encoding="utf-8") as f:
        for ln in train:
            row = ln.to_json()
            if ln.archetype in declared:
                row["like"] = declared[ln.archetype]
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    report: dict[str, Any] = {"lines": str(lines_path), "seed": seed, "holdout_share": share,
                              "counts": {"lines": len(lines), "train_lines": len(train),
                                         "cells": len({(ln.archetype, ln.state, ln.intent) for ln in lines}),
                                         "heldout_cells": len(held)},
                              "unwritten_cells": unwritten_cells(lines, catalog)}
    if model is None:
        model = out / "model"
        ft = finetune(base_dir, train_file, model, cfg, progress=progress)
        report["finetune"] = {k: ft.get(k) for k in ("steps", "train_s", "wall_s", "exported")}
        report["finetune"]["router_ratio"] = ft["router_confidence"]["ratio"]
    else:
        trained = read_studio_lines(model)
        if trained is None or {ln.text for ln in trained} != {ln.text for ln in train}:
            raise ValueError(f"--model {model}: not a fine-tune of this file's training cells at --seed {seed} "
                             f"(its studio_lines.jsonl differs from {train_file}): its held-out cells would "
                             "not be held out")
        report["finetune"] = {"reused": str(model)}
    reqs = draw_requests(lines, held, n_covered, seed)
    base_archetypes = set(catalog["archetypes"])
    new_archetypes = {ln.archetype for ln in lines} - base_archetypes
    by_text: dict[str, set[str]] = {}
    for ln in train:
        by_text.setdefault(ln.text, set()).add(ln.intent)
    served_gen = load(model)
    model_gen = load(model, authored=None)
    try:
        served = [_line_for(served_gen, r, seed * 100_003 + i) for i, r in enumerate(reqs)]
        alone = [_line_for(model_gen, r, seed * 100_003 + i) for i, r in enumerate(reqs)]
    finally:
        served_gen.close()
        model_gen.close()
    report["served"] = served_figures(served, reqs, new_archetypes, by_text)
    report["model_alone"] = served_figures(alone, reqs, new_archetypes, by_text)
    book = authored_book(train)
    rng = np.random.default_rng(seed + 2)
    groups = []
    for i, r in enumerate(reqs):
        w = r.writers
        rule = book.rule_pick(w.archetype, w.state, w.intent, w.persona, dict(w.context), rng=rng,
                              slots=SLOT_VALUES)
        cands = {"served": served[i].raw_text, "model": alone[i].raw_text,
                 "rule": rule.text if rule is not None else "", "writers": w.text}
        groups.append((r, {k: v for k, v in cands.items() if v}))
    sheet = out / "sheet.csv"
    write_sheet(sheet, groups, seed)
    report["sheet"] = str(sheet)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _catalog(model_dir: str | Path | None) -> dict[str, Any]:
    from runtime.paths import DEFAULT_MODEL_DIR

    path = Path(model_dir or DEFAULT_MODEL_DIR) / "catalog.json"
    return json.loads(path.read_text(encoding="utf-8"))


def write_sheet(path: Path, groups: Sequence[tuple[StudioRequest, dict[str, str]]], seed: int) -> None:
    """The blind sheet and its key (``PATH.key.json``): requests in a seeded order, each
    request's distinct lines in a seeded order, no source anywhere in the sheet."""
    rng = random.Random(seed + 3)
    order = list(range(len(groups)))
    rng.shuffle(order)
    rows, key = [], {}
    for g, k in enumerate(order, 1):
        req, cands = groups[k]
        texts: dict[str, list[str]] = {}
        for source, text in cands.items():
            texts.setdefault(text, []).append(source)
        distinct = list(texts.items())
        rng.shuffle(distinct)
        for j, (text, sources) in enumerate(distinct):
            rid = f"{g}{'abcdefgh'[j]}"
            rows.append({"id": rid, "request": req.describe(), "line": text, "rating": "", "best": ""})
            key[rid] = {"group": g, "side": req.side, "sources": sorted(sources), "cell": list(req.cell)}
    with path.open("w", newline="", encoding="utf-8") as f:
        f.write(f"# rating: {RATING_SCALE}. best: put x on the one line of each request you would ship first.\n")
        writer = csv.DictWriter(f, fieldnames=SHEET_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    sheet_key(path).write_text(json.dumps({"rows": key}, indent=1) + "\n")


def sheet_key(sheet: str | Path) -> Path:
    p = Path(sheet)
    return p.with_name(f"{p.stem}.key.json")


def read_sheet(sheet: str | Path, key: str | Path | None = None) -> list[dict[str, Any]]:
    """The rated rows joined with the key; every problem raised at once as :class:`RatingsError`
    (``file:line: ...``): a missing or bad rating, more or less than one ``best`` in a request,
    an id not in the key, a row of the key missing."""
    sheet = Path(sheet)
    key_doc = json.loads(Path(key or sheet_key(sheet)).read_text(encoding="utf-8"))["rows"]
    text = sheet.read_text(encoding="utf-8").splitlines(keepends=True)
    body = [ln for ln in text if not ln.startswith("#")]
    offset = len(text) - len(body)
    problems, rows, seen = [], [], set()
    for n, row in enumerate(csv.DictReader(body), 2 + offset):
        where = f"{sheet}:{n}"
        rid = (row.get("id") or "").strip()
        if rid not in key_doc:
            problems.append(f"{where}: id {rid!r} is not in the key")
            continue
        seen.add(rid)
        raw = (row.get("rating") or "").strip()
        if raw not in ("0", "1", "2"):
            problems.append(f"{where}: rating {raw!r}: expected 0, 1 or 2")
            continue
        rows.append({**key_doc[rid], "id": rid, "rating": int(raw),
                     "best": bool((row.get("best") or "").strip())})
    problems += [f"{sheet}: id {rid} of the key is missing" for rid in sorted(set(key_doc) - seen)]
    best: dict[int, int] = {}
    for r in rows:
        best[r["group"]] = best.get(r["group"], 0) + r["best"]
    problems += [f"{sheet}: request {g}: {k} lines marked best (one expected)" for g, k in sorted(best.items())
                 if k != 1]
    if problems:
        raise RatingsError(problems)
    return rows


def summarise_sheet(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per side and source: lines, shares of each rating, best-of count; and FlashNPC as served
    against the rule pick per request (won, tied, lost: by the best mark where one of the two
    has it, else by rating)."""
    out: dict[str, Any] = {}
    for side in ("covered", "uncovered"):
        per: dict[str, Any] = {}
        for source in SOURCES:
            mine = [r for r in rows if r["side"] == side and source in r["sources"]]
            if not mine:
                continue
            ratings = [r["rating"] for r in mine]
            per[source] = {"lines": len(mine),
                           **{f"{RATINGS[k]}_pct": _pct(ratings.count(k), len(mine)) for k in (2, 1, 0)},
                           "best": sum(r["best"] for r in mine)}
        won = tied = lost = 0
        for g in sorted({r["group"] for r in rows if r["side"] == side}):
            group = [r for r in rows if r["group"] == g]
            s = next((r for r in group if "served" in r["sources"]), None)
            u = next((r for r in group if "rule" in r["sources"]), None)
            if s is None or u is None:
                continue
            if s is u:
                tied += 1
            elif s["best"] or u["best"]:
                won, lost = won + s["best"], lost + u["best"]
            else:
                won += s["rating"] > u["rating"]
                lost += s["rating"] < u["rating"]
                tied += s["rating"] == u["rating"]
        per["served_vs_rule"] = {"won": won, "tied": tied, "lost": lost,
                                 "won_or_tied_pct": _pct(won + tied, won + tied + lost),
                                 "won_of_decided_pct": _pct(won, won + lost)}
        out[side] = per
    return out


def format_summary(summary: dict[str, Any]) -> str:
    lines = []
    for side, per in summary.items():
        lines.append(f"{side}:")
        for source in SOURCES:
            if source in per:
                s = per[source]
                lines.append(f"  {source:8s} {s['lines']:4d} lines  ship {s['shippable_pct']}%  "
                             f"clumsy {s['clumsy_pct']}%  garbled {s['garbled_pct']}%  best {s['best']}")
        v = per["served_vs_rule"]
        lines.append(f"  served vs rule pick: won {v['won']}, tied {v['tied']}, lost {v['lost']}")
    return "\n".join(lines)


__all__ = [
    "SOURCES",
    "StudioRequest",
    "draw_requests",
    "format_summary",
    "read_sheet",
    "run_studio_eval",
    "split_cells",
    "summarise_sheet",
    "write_sheet",
    "wrong_move",
]
