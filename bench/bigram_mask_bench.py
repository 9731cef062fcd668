"""The per-token cost of the word-bigram masks in process, against the same word constraints
without them, in one run.

    python bench/bigram_mask_bench.py [--lines 80] [--rounds 9]

Lines are generated once with the book's word bigrams (runtime.client.bigrams; derived from the
default line book when the shipped constraints carry none); then each round replays every
line's tokens through ``mask_logits`` and ``step`` (what the engine does per token besides the
model), with and without the table, alternating, so the machine's noise hits both alike. The
first round meets the memos cold; figures are medians over the rounds after it, in microseconds
per token, and the ratio of the two in each round.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from runtime.client.constraints import WordState, read_constraints
from runtime.client.generator import LineGenerator, LineRequest


def replay(words, lines, row0: np.ndarray) -> float:
    """Seconds to mask and step through every line's tokens."""
    t = time.perf_counter()
    for tokens, banned in lines:
        state = WordState()
        for n, tok in enumerate(tokens):
            row = row0.copy()
            words.mask_logits(row, state, last=n + 1 >= 48, banned=banned)
            state = words.step(state, tok)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=80)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args(argv)
    table = read_constraints().bigrams
    if table is None:
        from runtime.factory.export import book_bigrams
        from runtime.factory.linebook import load_line_book

        table = book_bigrams(load_line_book())
    paired = LineGenerator.load(bigrams=table)
    plain = LineGenerator.load(bigrams=None)
    cat = paired.catalog()
    rng = np.random.default_rng(0)
    lines = []
    for j in range(args.lines):
        r = LineRequest(str(rng.choice(cat["archetypes"])), str(rng.choice(cat["states"])),
                        persona=[str(rng.choice(cat["persona_traits"]))], intent=str(rng.choice(cat["intents"])),
                        seed=j, npc_id=("bench", j))
        line = paired.generate_request(r)
        if line.tokens:
            closed = {k: v for k, v in (r.context or {}).items() if k in cat["context"]}
            lines.append((list(line.tokens), paired.mask.banned_bits(r.npc, r.persona, closed)))
    n_tok = sum(len(t) for t, _ in lines)
    row0 = np.random.default_rng(1).standard_normal(paired.tokenizer.vocab_size).astype(np.float32)
    with_us, without_us, ratios = [], [], []
    for _ in range(args.rounds):
        a = replay(paired.mask, lines, row0) / n_tok * 1e6
        b = replay(plain.mask, lines, row0) / n_tok * 1e6
        with_us.append(a)
        without_us.append(b)
        ratios.append(a / b)
    print(f"{len(lines)} lines, {n_tok} tokens; first round (cold memos): {with_us[0]:.1f} vs {without_us[0]:.1f} us/token")
    w, wo, r = (statistics.median(x[1:]) for x in (with_us, without_us, ratios))
    print(f"mask_logits + step per token, median of {args.rounds - 1} warm rounds: {w:.1f} us with the bigrams vs "
          f"{wo:.1f} us without (+{w - wo:.1f} us, {r:.3f}x same-round ratio; rounds {', '.join(f'{x:.3f}' for x in ratios[1:])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
