"""What a line book itself gives the model to learn: its archetype and intent classifiers on its
own test and held-out lines, and distinct-2 over 50 of its lines per condition. Books side by side.

    python bench/book_measures.py [BOOK ...] [--lines 3000] [--seed 0]

``BOOK``: a line-book directory or file (default: the shipped book); give two (e.g. a copy with
other compose weights) to compare them in one run. Per book: an n-gram classifier
(``runtime.factory.state_classifier.NgramClassifier``, as ``flashnpc eval`` trains it) fitted on
the book's training lines, its accuracy on up to ``--lines`` test lines and held-out-pair lines
(seeded pick), the mean distinct-2 of 50 lines drawn per (archetype, state, intent) (the
condition's expanded lines, for mixed prompts) and of up to 50 distinct lines the book writes for
one prompt (``LineBook.lines_for``, 8 prompts of each of ``flashnpc eval``'s prompt shapes on
seen pairs: the reference of the model's "distinct-2 within 50 seeds of one prompt",
``distinct2_prompt``), the book's archetype classifier being the other ceiling the model's figures
are read against (docs/model.md), and how often a line voices a requested persona trait / context value
(a signature of it, or a trait's voice marker, as ``flashnpc eval``'s writer table counts the book's own lines) over
``--lines`` lines of every shape (seeded pick), prompts without one not counted; and the share
of all lines that are a whole reply (``own_replies`` / ``trait_replies``, book v4) alone, and
that hold one (alone or composed with another part).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from runtime.factory.linebook import LineBook, _normalize, load_line_book
from runtime.factory.state_classifier import NgramClassifier
from runtime.factory.text_metrics import SignatureIndex, distinct_n
from runtime.factory.writer_eval import (
    SHAPES,
    cell_rng,
    draw_requests,
    pair_conditions,
    persona_pool,
)


def prompt_distinct2(book: LineBook, seed: int, per_shape: int = 8) -> float:
    """Mean distinct-2 of the book's own lines for one prompt (up to 50 distinct, ``lines_for``),
    over ``per_shape`` prompts of every shape on seen pairs, drawn as ``flashnpc eval`` draws its
    diversity prompts."""
    conditions, personas = pair_conditions(book, book.split(), "seen"), persona_pool(book)
    figures = []
    for shape in SHAPES:
        for j, (arch, persona, state, intent, context) in enumerate(
                draw_requests(book, conditions, shape, per_shape, cell_rng(seed, shape, "seen"), personas)):
            figures.append(distinct_n(book.lines_for(arch, state, intent, persona, context, n=50, seed=seed + j), 2))
    return float(np.mean(figures))


def whole_reply_shares(book: LineBook) -> tuple[float, float]:
    """The share of the book's lines that are one of their condition's whole replies (an own
    reply of the archetype, a trait reply of a trait of the prompt, as expanded with the
    archetype's voice), and the share that contain one."""
    cache: dict[tuple[str, str, str, str | None], set[str]] = {}

    def whole(arch: str, state: str, intent: str, trait: str | None) -> set[str]:
        key = (arch, state, intent, trait)
        if key not in cache:
            cells = book._own_replies if trait is None else book._trait_replies
            srcs = cells.get((arch if trait is None else trait, state, intent), [])
            cache[key] = {_normalize("".join(t)) for src in srcs for t in book._enumerate(src.template, arch, 4096)}
        return cache[key]

    alone = held = 0
    examples = book.examples()
    for e in examples:
        texts = whole(e.archetype, e.state, e.intent, None).union(
            *(whole(e.archetype, e.state, e.intent, t) for t in e.persona))
        alone += e.text in texts
        held += e.text in texts or any(t in e.text for t in texts)
    return alone / len(examples), held / len(examples)


def measure(book_path: str | None, lines: int, seed: int) -> dict[str, float]:
    started = time.perf_counter()
    book = load_line_book(book_path)
    split = book.split()
    labels = ("archetype", "intent")
    clf = NgramClassifier.fit_many([e.text for e in split.train],
                                   {k: [getattr(e, k) for e in split.train] for k in labels}, seed=seed)
    rng = np.random.default_rng(seed)
    out: dict[str, float] = {"examples": len(book.examples())}
    for side, pool in (("test", split.test), ("heldout", split.heldout)):
        picked = [pool[i] for i in rng.choice(len(pool), min(lines, len(pool)), replace=False)]
        for k in labels:
            out[f"{k}_{side}"] = clf[k].accuracy([e.text for e in picked], [getattr(e, k) for e in picked])
    by_condition: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for e in book.examples():
        by_condition[(e.archetype, e.state, e.intent)].append(e.text)
    out["distinct2"] = float(np.mean([distinct_n([v[i] for i in rng.choice(len(v), 50, replace=len(v) < 50)])
                                      for v in by_condition.values()]))
    out["distinct2_prompt"] = prompt_distinct2(book, seed)
    index = SignatureIndex(book.voiced_phrases())
    examples = book.examples()
    picked = [examples[i] for i in rng.choice(len(examples), min(lines, len(examples)), replace=False)]
    hits = [index.hits(e.text) for e in picked]
    out["persona_voiced"] = float(np.mean([any(f"persona:{t}" in h for t in e.persona)
                                           for e, h in zip(picked, hits) if e.persona]))
    out["context_voiced"] = float(np.mean([bool({f"context:{k}={v}" for k, v in e.context} & h)
                                           for e, h in zip(picked, hits) if e.context]))
    out["whole_alone"], out["whole_in"] = whole_reply_shares(book)
    out["seconds"] = time.perf_counter() - started
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("books", nargs="*", default=[None], help="line books (default: the shipped one)")
    ap.add_argument("--lines", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = [(b or "shipped", measure(b, args.lines, args.seed)) for b in args.books]
    keys = ("examples", "archetype_test", "archetype_heldout", "intent_test", "intent_heldout", "distinct2",
            "distinct2_prompt", "persona_voiced", "context_voiced", "whole_alone", "whole_in", "seconds")
    print(f"{'book':30s} " + " ".join(f"{k:>17s}" for k in keys))
    for name, m in rows:
        print(f"{name[-30:]:30s} " + " ".join(f"{m[k]:>17.3f}" if k != "examples" else f"{int(m[k]):>17d}" for k in keys))


if __name__ == "__main__":
    main()
