"""A blind sheet of lines *as served* for the requests games send: the engine's own output
(``LineGenerator``: constraints, redraws, fallbacks, everything a game gets), not the model alone.

    python bench/served_sheet.py --model runs/new_export --versus runtime/assets/flash \
        --lines 60 --book-lines 30 --seed 1701 --out docs/ratings/served_game_v5.csv

Requests are of the shape a game sends (issue #30, "game shapes"): any archetype, state and
intent of the catalogue (held-out pairs included: a game asks for them too), **no persona**, and
no context slot or one (half each). Every request gets one line from ``--model`` (source
``model``) and, with ``--versus``, one from a second engine with the same seed (``versus``);
``--book-lines`` of the requests also get a line the line book writes for that very prompt
(``LineBook.lines_for``, source ``book``), so the book is rated in the same sitting. The CSV
(``id, prompt, line, rating``) is shuffled; its key (``.key.json`` beside it) is the format of
``flashnpc eval blind``'s, so ``flashnpc eval unblind FILE`` reads it. A line the engine served
as a fallback is marked ``engine_falls_back`` in the key (it is rated as it reads: that is what
the player sees).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from runtime.client.generator import LineGenerator
from runtime.factory.blind import describe_prompt, key_path, write_sheet
from runtime.factory.linebook import load_line_book

Request = tuple[str, tuple[str, ...], str, str, tuple[tuple[str, str], ...]]


def game_requests(catalog: dict, heldout: set[tuple[str, str]], n: int, seed: int) -> list[tuple[Request, str]]:
    """``n`` seeded game-shaped requests with their side (``seen`` / ``heldout`` pair)."""
    rng = np.random.default_rng([seed, 30])
    context = catalog["context"]
    slots = sorted(context)
    out = []
    for _ in range(n):
        archetype = str(rng.choice(catalog["archetypes"]))
        state = str(rng.choice(catalog["states"]))
        intent = str(rng.choice(catalog["intents"]))
        ctx: tuple[tuple[str, str], ...] = ()
        if rng.random() < 0.5:
            slot = str(rng.choice(slots))
            ctx = ((slot, str(rng.choice(context[slot]))),)
        side = "heldout" if (archetype, state) in heldout else "seen"
        out.append(((archetype, (), state, intent, ctx), side))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model directory the engine serves (source 'model')")
    ap.add_argument("--versus", help="a second model directory, same requests and seeds (source 'versus')")
    ap.add_argument("--line-book", help="line book for the book's lines (default: the shipped one)")
    ap.add_argument("--lines", type=int, default=60, help="requests (default 60)")
    ap.add_argument("--book-lines", type=int, default=30, help="requests that also get a book line (default 30)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    book = load_line_book(args.line_book)
    catalog = book.catalog()
    requests = game_requests(catalog, set(book.heldout_pairs), args.lines, args.seed)
    items = []
    for source, model in (("model", args.model), ("versus", args.versus)):
        if model is None:
            continue
        gen = LineGenerator.load(model)
        for k, (request, side) in enumerate(requests):
            archetype, persona, state, intent, ctx = request
            line = gen.generate(archetype, state, intent=intent, context=dict(ctx) or None,
                                seed=args.seed * 1000 + k)
            items.append({"source": source, "shape": "game", "side": side, "archetype": archetype,
                          "persona": [], "state": state, "intent": intent, "context": dict(ctx),
                          "prompt": describe_prompt(request), "line": line.raw_text,
                          "engine_falls_back": bool(line.fallback), "finish_reason": line.finish_reason})
        gen.close()
    for k, (request, side) in enumerate(requests[: args.book_lines]):
        archetype, persona, state, intent, ctx = request
        lines = book.lines_for(archetype, state, intent, persona, ctx, n=1, seed=args.seed * 1000 + k)
        if lines:
            items.append({"source": "book", "shape": "game", "side": side, "archetype": archetype,
                          "persona": [], "state": state, "intent": intent, "context": dict(ctx),
                          "prompt": describe_prompt(request), "line": lines[0]})
    key = write_sheet(args.out, items, np.random.default_rng([args.seed, 31]), seed=args.seed, model=args.model,
                      **({"versus": args.versus} if args.versus else {}))
    rows = key["items"]
    served = {s: sum(1 for r in rows if r["source"] == s) for s in ("model", "versus", "book")}
    print(f"{args.out}: {len(rows)} lines {served}; key {key_path(args.out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
