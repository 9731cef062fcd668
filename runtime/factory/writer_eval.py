"""What a writer sees in the model's lines: the figures `flashnpc eval` adds per prompt shape.

A prompt has a *shape*: how many persona traits and context slots it carries (:data:`SHAPES`).
For every shape, and for seen and held-out (archetype, state) pairs, the evaluation samples
lines over every archetype x state x intent of that side (seen: the pairs of the book's test
split; held-out: ``split.heldout_pairs``), with persona traits and context values drawn by a
seeded generator, and measures each line (:class:`LineJudge`):

* **non-word**: a word the line book never says (``book.vocabulary()``; slot markers aren't
  words);
* **unseen bigram**: two words (or a word and a ``{slot}`` marker) next to each other inside one
  sentence piece that the book never puts next to each other
  (:func:`runtime.client.bigrams.piece_words` reads pieces and words; the table is
  :func:`runtime.factory.export.book_bigrams`, what the decoding's bigram masks keep to when
  ``constraints.json`` ships one). The book's own figure is 0 by construction on every line the
  table comes from, held-out pairs included; so on held-out pairs the book's figure is taken
  against a table of the other lines only (what the rule would refuse of lines it never saw);
* **glitch**: doubled punctuation, a doubled word, a word stutter, a space before punctuation
  or a lower-case sentence start (:func:`runtime.factory.text_metrics.glitches` defines each);
* **context contradiction**: a signature phrase (``book.signatures()``) of another value of a
  context slot the prompt set (``"rain"`` asked, a line about the snow);
* **another archetype's voice**: a signature of an archetype other than the requested one;
* **persona / context voiced**: a signature of a requested trait / context value (for a trait,
  or one of its voice markers, ``book.voice_markers()``: its whole replies' recurring phrases); set beside
  the book's own rate on its lines of the same shape, since the book does not voice every
  trait and value in every line either;
* the archetype, intent and state a classifier trained on the book's training lines hears
  (accuracy against the request; the book's own test / held-out lines of the same shape beside
  it), distinct-2 within 50 seeds of one prompt (beside it the book's own over up to 50
  distinct lines it writes for each of the same prompts, :meth:`LineBook.lines_for`: what one
  NPC asked the same thing again and again would hear from the book), novelty (not verbatim in
  the book) and memorisation (verbatim a training line).

Book reference figures come from book lines of the same shape: the training, validation and
test lines for the text measures on seen pairs (the held-out lines for held-out pairs), and only
test (held-out) lines for the classifiers, which were trained on the training lines.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.client.bigrams import bigram_pairs
from runtime.factory.text_metrics import (
    GLITCH_KINDS,
    SignatureIndex,
    distinct_n,
    glitches,
    nonwords,
    novelty,
    unseen_bigrams,
)

if TYPE_CHECKING:
    from runtime.factory.evaluate import EvalConfig, Sampler
    from runtime.factory.linebook import Example, LineBook, Split
    from runtime.factory.state_classifier import NgramClassifier

# shape -> (what it is, persona traits (None: 1 or 2), context slots (None: every slot))
SHAPES: dict[str, tuple[str, int | None, int | None]] = {
    "full": ("1-2 persona traits, every context slot", None, None),
    "no_persona": ("no persona trait, every context slot", 0, None),
    "ctx0": ("1-2 persona traits, no context slot", None, 0),
    "ctx1": ("1-2 persona traits, one context slot", None, 1),
    "ctx3": ("1-2 persona traits, three context slots", None, 3),
}
SIDES = ("seen", "heldout")

# figure -> target. "max"/"min": the bound; "min_heldout": the bound on held-out pairs where it
# differs; "min_book": also at least the book's own rate on lines of the same shape.
WRITER_THRESHOLDS: dict[str, dict[str, Any]] = {
    "nonword_rate": {"max": 0.0},
    "glitch_rate": {"max": 0.003},
    "contradiction_rate": {"max": 0.005},
    "other_archetype_rate": {"max": 0.01},
    "persona_voiced": {"min": 0.15, "min_book": True},
    "context_voiced": {"min": 0.15, "min_book": True},
    "archetype_accuracy": {"min": 0.45, "min_heldout": 0.30},
    "intent_accuracy": {"min": 0.60},
    "state_fidelity": {"min": 0.95, "min_heldout": 0.90},
    "distinct2": {"min": 0.55},
}

# (figure, label) in table order; glitch kinds follow the glitch rate
FIGURES: tuple[tuple[str, str], ...] = (
    ("nonword_rate", "non-word lines"),
    ("unseen_bigram_rate", "unseen bigram lines"),
    ("glitch_rate", "glitch lines"),
    *((f"glitch.{k}", f"  {k}") for k in GLITCH_KINDS),
    ("contradiction_rate", "context contradictions"),
    ("other_archetype_rate", "another archetype's voice"),
    ("persona_voiced", "persona voiced"),
    ("context_voiced", "context voiced"),
    ("archetype_accuracy", "archetype classifier"),
    ("intent_accuracy", "intent classifier"),
    ("state_fidelity", "state fidelity"),
    ("distinct2", "distinct-2, 50 seeds"),
    ("fallback_rate", "served as a fallback"),
    ("novelty", "novelty"),
    ("memorisation", "memorised (a training line)"),
)
CLASSIFIED = {"archetype_accuracy": "archetype", "intent_accuracy": "intent", "state_fidelity": "state"}


def prompt_shape(persona: Sequence[str], context: Sequence[Any], n_slots: int) -> str | None:
    """The shape of a prompt with these persona traits and context pairs (None: none of SHAPES)."""
    traits, slots = len(persona), len(context)
    for name, (_, want_traits, want_slots) in SHAPES.items():
        traits_ok = traits == want_traits if want_traits is not None else traits in (1, 2)
        slots_ok = slots == (n_slots if want_slots is None else want_slots)
        if traits_ok and slots_ok:
            return name
    return None


Request = tuple[str, tuple[str, ...], str, str, tuple[tuple[str, str], ...]]


def example_request(ex: Example) -> Request:
    """The prompt a book example answers: (archetype, persona, state, intent, context)."""
    return (ex.archetype, ex.persona, ex.state, ex.intent, ex.context)


def example_shape(ex: Example, n_slots: int) -> str | None:
    return prompt_shape(ex.persona, ex.context, n_slots)


# ---------------------------------------------------------------- judging one line


@dataclass
class Verdict:
    """What one line does wrong and voices. ``None``: not applicable to the prompt."""

    nonwords: list[str]
    glitches: list[str]
    contradictions: list[str]  # signature tags of other values of requested context slots
    other_archetypes: list[str]  # signature tags of archetypes other than the requested one
    persona_voiced: bool | None  # None when the prompt has no persona trait
    context_voiced: bool | None  # None when the prompt has no context value
    unseen_bigrams: list[str] = field(default_factory=list)  # "word word" the book never joins in a piece

    @property
    def fluent(self) -> bool:
        return not (self.nonwords or self.glitches or self.contradictions or self.other_archetypes)

    def problems(self) -> list[str]:
        """The fluency problems, readable (empty for a fluent line)."""
        out = [f"non-word {w!r}" for w in self.nonwords]
        out += [f"glitch {g}" for g in self.glitches]
        out += [f"contradicts the request: {t}" for t in self.contradictions]
        out += [f"voice of {t}" for t in self.other_archetypes]
        return out


class LineJudge:
    """Judges lines against a line book's vocabulary, signatures and word bigrams
    (:class:`Verdict`). ``bigrams``: the (word, word) pairs a piece may hold (default: those of
    every line of the book's, :func:`runtime.factory.export.book_lines`, as the export's table)."""

    def __init__(self, book: LineBook, bigrams: set[tuple[str, str]] | None = None) -> None:
        self.vocabulary = frozenset(book.vocabulary())
        self.signatures = SignatureIndex(book.signatures())
        self.voiced = SignatureIndex(book.voice_markers())  # a trait's recurring whole-reply phrases
        self.n_slots = len(book.context)
        self.bigrams = book_pairs(book) if bigrams is None else bigrams

    def verdict(self, request: Request, line: str) -> Verdict:
        archetype, persona, _state, _intent, context = request
        tags = self.signatures.hits(line)
        asked = {f"context:{slot}={value}" for slot, value in context}
        slots = {slot for slot, _ in context}
        contradictions = sorted(
            t for t in tags
            if t.startswith("context:") and t not in asked and t[8:].split("=", 1)[0] in slots
        )
        others = sorted(t for t in tags if t.startswith("archetype:") and t != f"archetype:{archetype}")
        return Verdict(
            nonwords=nonwords(line, self.vocabulary),
            glitches=glitches(line, self.vocabulary),
            contradictions=contradictions,
            other_archetypes=others,
            persona_voiced=bool({f"persona:{t}" for t in persona} & (tags | self.voiced.hits(line)))
            if persona else None,
            context_voiced=bool(asked & tags) if context else None,
            unseen_bigrams=unseen_bigrams(line, self.bigrams),
        )


def book_pairs(book: LineBook, leave_out: Collection[str] = ()) -> set[tuple[str, str]]:
    """The word bigrams of the book's lines (:func:`runtime.factory.export.book_lines`), but
    those of the lines in ``leave_out``."""
    from runtime.factory.export import book_lines

    return {pair for text in book_lines(book) if text not in leave_out for pair in bigram_pairs(text)}


def _rate(flags: Sequence[bool | None]) -> float | None:
    """Share of True among the applicable (not None) flags; None when none applies."""
    applicable = [f for f in flags if f is not None]
    return float(np.mean(applicable)) if applicable else None


def text_figures(judge: LineJudge, requests: Sequence[Request], lines: Sequence[str]) -> dict[str, Any]:
    """The per-line text measures of ``lines`` (answers to ``requests``) as rates."""
    verdicts = [judge.verdict(r, line) for r, line in zip(requests, lines)]
    return {
        "nonword_rate": _rate([bool(v.nonwords) for v in verdicts]),
        "unseen_bigram_rate": _rate([bool(v.unseen_bigrams) for v in verdicts]),
        "glitch_rate": _rate([bool(v.glitches) for v in verdicts]),
        "glitch": {k: _rate([k in v.glitches for v in verdicts]) for k in GLITCH_KINDS},
        "contradiction_rate": _rate([bool(v.contradictions) if r[4] else None
                                     for r, v in zip(requests, verdicts)]),
        "other_archetype_rate": _rate([bool(v.other_archetypes) for v in verdicts]),
        "persona_voiced": _rate([v.persona_voiced for v in verdicts]),
        "context_voiced": _rate([v.context_voiced for v in verdicts]),
        "_verdicts": verdicts,
    }


# ---------------------------------------------------------------- drawing prompts


def pair_conditions(book: LineBook, split: Split, side: str) -> list[tuple[str, str, str]]:
    """Every (archetype, state, intent) of a side: seen pairs from the test split, or held-out."""
    if side == "seen":
        pairs = sorted({(e.archetype, e.state) for e in split.test})
    elif side == "heldout":
        pairs = sorted((a, s) for a, s in split.heldout_pairs)
    else:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    return [(a, s, i) for a, s in pairs for i in book.intents]


def persona_pool(book: LineBook) -> list[tuple[str, ...]]:
    """The 1- and 2-trait personas the book's prompts use (so trait exclusions hold)."""
    pool = sorted({e.persona for e in book.examples() if len(e.persona) in (1, 2)})
    return pool or [(t,) for t in book.persona_traits]


def draw_requests(
    book: LineBook,
    conditions: Sequence[tuple[str, str, str]],
    shape: str,
    n: int,
    rng: np.random.Generator,
    personas: Sequence[tuple[str, ...]],
) -> list[Request]:
    """``n`` prompts of ``shape``, cycling through ``conditions`` in a shuffled order.

    Persona traits come from ``personas``; the context slots (which ones, for a shape with
    fewer than all) and their values are drawn by ``rng``, so a seed fixes every prompt.
    """
    _, want_traits, want_slots = SHAPES[shape]
    slots = list(book.context)
    k_slots = len(slots) if want_slots is None else min(want_slots, len(slots))
    order = rng.permutation(len(conditions))
    out: list[Request] = []
    for k in range(n):
        archetype, state, intent = conditions[order[k % len(conditions)]]
        persona = () if want_traits == 0 else tuple(personas[int(rng.integers(len(personas)))])
        chosen = [slots[j] for j in sorted(rng.choice(len(slots), size=k_slots, replace=False))]
        context = tuple(sorted((s, book.context[s][int(rng.integers(len(book.context[s])))]) for s in chosen))
        out.append((archetype, persona, state, intent, context))
    return out


def cell_rng(seed: int, shape: str, side: str, purpose: int = 0) -> np.random.Generator:
    """The generator of one (shape, side) cell, independent of every other cell's."""
    return np.random.default_rng([seed, list(SHAPES).index(shape), SIDES.index(side), purpose])


def shape_pools(book: LineBook, split: Split) -> dict[tuple[str, str, str], list[Example]]:
    """Book lines by (shape, side, use): ``text`` for the text measures, ``clf`` for classifiers."""
    n_slots = len(book.context)
    sources = {
        ("seen", "text"): split.train + split.val + split.test,
        ("seen", "clf"): split.test,
        ("heldout", "text"): split.heldout,
        ("heldout", "clf"): split.heldout,
    }
    pools: dict[tuple[str, str, str], list[Example]] = {}
    for (side, use), examples in sources.items():
        for shape in SHAPES:
            pools[(shape, side, use)] = []
        for e in examples:
            shape = example_shape(e, n_slots)
            if shape is not None:
                pools[(shape, side, use)].append(e)
    return pools


def _pick(items: Sequence, n: int, rng: np.random.Generator) -> list:
    if n >= len(items):
        return list(items)
    return [items[i] for i in sorted(rng.choice(len(items), size=n, replace=False))]


# ---------------------------------------------------------------- the measures


def check(figure: str, side: str, value: float | None, book_value: float | None) -> bool | None:
    """Does ``value`` meet the figure's target (None: no target, or not applicable)?"""
    target = WRITER_THRESHOLDS.get(figure)
    if target is None or value is None:
        return None
    if "max" in target:
        return value <= target["max"]
    low = target.get(f"min_{side}", target["min"])
    if target.get("min_book") and book_value is not None:
        low = max(low, book_value)
    return value >= low


@dataclass
class _Cell:
    shape: str
    side: str
    requests: list[Request]
    diversity: list[Request]
    lines: list[str] = field(default_factory=list)
    fallbacks: list[bool] = field(default_factory=list)  # where the engine would serve an authored line
    distinct: list[float] = field(default_factory=list)
    book_distinct: list[float] = field(default_factory=list)


def measure_writer(
    book: LineBook,
    split: Split,
    sampler: Sampler,
    classifiers: Mapping[str, NgramClassifier],
    cfg: EvalConfig,
    *,
    progress_bar: bool = False,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Sample and measure every (shape, side) cell; JSON-serialisable, with pass/fail per figure.

    ``classifiers``: ``"archetype"``, ``"intent"`` and ``"state"`` classifiers trained on the
    book's training lines. ``cfg``: ``writer_samples`` lines per cell, ``writer_diversity``
    prompts per cell sampled ``diversity_samples`` times each, ``book_reference`` book lines
    at most per cell for the book's own rates, ``seed``.
    """
    say = say or (lambda _msg: None)
    judge = LineJudge(book)
    personas = persona_pool(book)
    pools = shape_pools(book, split)
    train_texts = {e.text for e in split.train}
    # what the bigram rule says of held-out lines when their own lines are not in its table
    outside = book_pairs(book, leave_out={e.text for e in split.heldout})
    known = {e.text for e in split.train + split.val + split.test + split.heldout}
    cells: list[_Cell] = []
    for side in SIDES:
        conditions = pair_conditions(book, split, side)
        for shape in SHAPES:
            rng = cell_rng(cfg.seed, shape, side)
            requests = draw_requests(book, conditions, shape, cfg.writer_samples, rng, personas)
            diversity = draw_requests(book, conditions, shape, cfg.writer_diversity, rng, personas)
            cells.append(_Cell(shape, side, requests, diversity))

    total = sum(len(c.requests) + len(c.diversity) * cfg.diversity_samples for c in cells)
    say(f"writer measures: {total} lines over {len(SHAPES)} prompt shapes x {len(SIDES)} sides")
    bar = _bar(total, progress_bar)
    for k, cell in enumerate(cells):
        cell.lines = sampler.sample(cell.requests, seed=cfg.seed + 1000 + k)
        cell.fallbacks = list(getattr(sampler, "last_fallbacks", None) or [False] * len(cell.lines))
        bar(len(cell.requests))
        for j, req in enumerate(cell.diversity):
            lines = sampler.sample([req] * cfg.diversity_samples, seed=cfg.seed + 10_000 + 100 * k + j)
            cell.distinct.append(distinct_n(lines, 2))
            archetype, persona, state, intent, context = req
            cell.book_distinct.append(distinct_n(book.lines_for(archetype, state, intent, persona, context,
                                                                n=cfg.diversity_samples, seed=cfg.seed + j), 2))
            bar(cfg.diversity_samples)
    bar(None)

    say("writer measures: judging the lines and the book's own lines")
    report_cells: dict[str, dict[str, Any]] = {shape: {} for shape in SHAPES}
    checks: dict[str, bool | None] = {}
    examples: dict[str, list[dict[str, Any]]] = {"nonword": [], "unseen_bigram": [], "glitch": [],
                                                 "contradiction": [], "other_archetype": []}
    for cell in cells:
        model = text_figures(judge, cell.requests, cell.lines)
        verdicts = model.pop("_verdicts")
        ref_rng = cell_rng(cfg.seed, cell.shape, cell.side, purpose=1)
        ref = _pick(pools[(cell.shape, cell.side, "text")], cfg.book_reference, ref_rng)
        book_fig = text_figures(judge, [example_request(e) for e in ref], [e.text for e in ref])
        book_fig.pop("_verdicts")
        if cell.side == "heldout":
            book_fig["unseen_bigram_rate"] = _rate([bool(unseen_bigrams(e.text, outside)) for e in ref])
        clf_ref = _pick(pools[(cell.shape, cell.side, "clf")], cfg.book_reference, ref_rng)
        for figure, label in CLASSIFIED.items():
            clf = classifiers[label]
            index = {"archetype": 0, "state": 2, "intent": 3}[label]
            model[figure] = clf.accuracy(cell.lines, [r[index] for r in cell.requests])
            book_fig[figure] = (clf.accuracy([e.text for e in clf_ref],
                                             [example_request(e)[index] for e in clf_ref])
                                if clf_ref else None)
        model["distinct2"] = float(np.mean(cell.distinct)) if cell.distinct else None
        model["distinct2_min"] = float(np.min(cell.distinct)) if cell.distinct else None
        model["fallback_rate"] = _rate(cell.fallbacks)
        model["novelty"] = novelty(cell.lines, known)
        model["memorisation"] = 1.0 - novelty(cell.lines, train_texts) if cell.lines else None
        # the book's own: up to 50 distinct lines it writes for each of the same prompts (LineBook.lines_for)
        book_fig["distinct2"] = float(np.mean(cell.book_distinct)) if cell.book_distinct else None
        book_fig["distinct2_min"] = float(np.min(cell.book_distinct)) if cell.book_distinct else None
        for figure in ("fallback_rate", "novelty", "memorisation"):
            book_fig[figure] = None
        cell_checks = {f: check(f, cell.side, model[f], book_fig.get(f)) for f in WRITER_THRESHOLDS}
        report_cells[cell.shape][cell.side] = {
            "lines": len(cell.lines),
            "book_lines": len(ref),
            "book_classified_lines": len(clf_ref),
            "model": model,
            "book": book_fig,
            "checks": cell_checks,
        }
        checks.update({f"{cell.shape}.{cell.side}.{f}": ok for f, ok in cell_checks.items()})
        _collect_examples(examples, cell, verdicts)
    return {
        "shapes": {name: what for name, (what, _, _) in SHAPES.items()},
        "thresholds": WRITER_THRESHOLDS,
        "cells": report_cells,
        "checks": checks,
        "passed": all(ok is not False for ok in checks.values()),
        "failed": sorted(k for k, ok in checks.items() if ok is False),
        "examples": examples,
    }


def _collect_examples(out: dict[str, list[dict[str, Any]]], cell: _Cell, verdicts: Sequence[Verdict],
                      per_cell: int = 3, limit: int = 30) -> None:
    kinds = {"nonword": lambda v: v.nonwords, "unseen_bigram": lambda v: v.unseen_bigrams, "glitch": lambda v: v.glitches,
             "contradiction": lambda v: v.contradictions, "other_archetype": lambda v: v.other_archetypes}
    for kind, what in kinds.items():
        found = [(r, line, what(v)) for r, line, v in zip(cell.requests, cell.lines, verdicts) if what(v)]
        for (a, p, s, i, c), line, detail in found[:per_cell]:
            if len(out[kind]) < limit:
                out[kind].append({"shape": cell.shape, "side": cell.side, "archetype": a, "persona": list(p),
                                  "state": s, "intent": i, "context": dict(c), "line": line,
                                  "found": list(detail)})


def _bar(total: int, enabled: bool) -> Callable[[int | None], None]:
    """``update(n)`` advances a tqdm bar on stderr (``update(None)`` closes it); a no-op if off."""
    if not enabled:
        return lambda _n: None
    from tqdm import tqdm  # a dependency of the train extra, which the line book needs anyway

    bar = tqdm(total=total, unit="line", desc="sampling", file=sys.stderr, dynamic_ncols=True)

    def update(n: int | None) -> None:
        if n is None:
            bar.close()
        else:
            bar.update(n)

    return update


# ---------------------------------------------------------------- the table


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _target(figure: str, side: str) -> str:
    target = WRITER_THRESHOLDS.get(figure)
    if target is None:
        return ""
    if "max" in target:
        return f"<= {100 * target['max']:g}%"
    low = f">= {100 * target.get(f'min_{side}', target['min']):g}%"
    return low + (" & book" if target.get("min_book") else "")


def format_writer_table(writer: Mapping[str, Any]) -> str:
    """The writer figures as two readable tables (seen and held-out pairs), in percent."""
    shapes = list(writer["cells"])
    width = 16  # "100.0 (100.0) !" and a space
    out = []
    for side in SIDES:
        head = f"{'writer figures, ' + side + ' pairs (%)':32s}" + "".join(f"{s:>{width - 2}s}  " for s in shapes)
        out += [head + f"{'target':>15s}", "-" * (len(head) + 15)]
        out.append(f"{'lines per shape':32s}" + "".join(
            f"{writer['cells'][s][side]['lines']:>{width - 2}d}  " for s in shapes))
        for figure, label in FIGURES:
            row = f"{label:32s}"
            for shape in shapes:
                cell = writer["cells"][shape][side]
                value, book = _lookup(cell["model"], figure), _lookup(cell["book"], figure)
                text = _pct(value) + (f" ({_pct(book)})" if book is not None else "")
                row += f"{text:>{width - 2}s}" + (" !" if cell["checks"].get(figure) is False else "  ")
            out.append(row + f"{_target(figure, side):>15s}")
        out.append("")
    out.append("(book's own figure on its lines of the same shape in brackets, for distinct-2 on its lines "
               "for the same prompts; ! misses its target; - not applicable)")
    return "\n".join(line.rstrip() for line in out)


def _lookup(figures: Mapping[str, Any], name: str) -> float | None:
    if name.startswith("glitch."):
        return figures["glitch"][name.split(".", 1)[1]]
    return figures.get(name)
