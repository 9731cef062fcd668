"""How often a model closes a line with its archetype's motto after a move the book does not pair
the motto with ("...the square is past the mill. My scales never lie."), models side by side.

    python bench/motto_fit.py [MODEL ...] [--lines 600] [--seed 0]

``MODEL``: exported model directories (default: the shipped one). Every model answers the same
seeded requests in the prompt shapes games send (any archetype, state and intent; 0-2 persona
traits; 0-2 context slots). A *motto* is one of the archetype's ``tags`` in the line book; it
*misfits* when the book's marks (``only_with``, ``not_with``: book v3.4) would not draw it for the
request's state and intent. Prints,
per model, the lines that say a motto of their archetype, those that misfit, and a few examples.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

from runtime.client.generator import LineGenerator, LineRequest
from runtime.client.onnx_model import DEFAULT_MODEL_DIR
from runtime.factory.linebook import load_line_book


def mottos() -> dict[str, list[tuple[str, Any]]]:
    """Per archetype: (a motto's text, its fragment, whose ``fits(state, intent, None)`` says
    whether the book may draw it for a request)."""
    book = load_line_book()
    return {name: [(text, src) for src in book._tags[name]["calm"] for text in book._texts(src.template, name)]
            for name in book.archetypes}


def requests(gen: LineGenerator, n: int, seed: int) -> list[LineRequest]:
    cat = gen.catalog()
    rng = random.Random(seed)
    out = []
    for j in range(n):
        slots = rng.sample(sorted(cat["context"]), rng.randint(0, 2))
        out.append(LineRequest(rng.choice(cat["archetypes"]), rng.choice(cat["states"]),
                               persona=rng.sample(cat["persona_traits"], rng.randint(0, 2)),
                               intent=rng.choice(cat["intents"]),
                               context={s: rng.choice(cat["context"][s]) for s in slots},
                               seed=seed * 100_000 + j, npc_id=j))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", type=Path, default=[DEFAULT_MODEL_DIR])
    ap.add_argument("--lines", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    table = mottos()
    print(f"{'model':<40}{'lines':>7}{'motto':>7}{'misfit':>8}")
    for model in args.models:
        gen = LineGenerator.load(model)
        said = misfit = 0
        examples = []
        for r in requests(gen, args.lines, args.seed):
            line = gen.generate_request(r)
            hits = [src for text, src in table[r.npc] if text.lower() in line.raw_text.lower()]
            said += bool(hits)
            if any(not src.fits(r.state, r.intent, None) for src in hits):
                misfit += 1
                examples.append(f"  {r.npc}/{r.intent}: {line.raw_text}")
        print(f"{model!s:<40}{args.lines:>7}{said:>7}{misfit:>8}")
        print("\n".join(examples[:5]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
