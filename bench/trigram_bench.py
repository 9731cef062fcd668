"""The word trigram check (runtime.client.trigrams): what it costs a line, peers side by side.

    python bench/trigram_bench.py [--model DIR] [--lines 300] [--requests 150] [--reps 2]

1. The check alone: book lines (default line book, seeded) fed token by token, as the engine
   feeds its decoded text (complete words only), read by a :class:`TrigramReader` (each token
   read once: the engine's way) against a whole-line re-read at every token (the peer).
2. In the engine: the same requests of every prompt shape (0-2 traits, 0-4 context slots,
   default sampling) through ``LineGenerator`` with the model's trigram table and without it,
   the two interleaved in alternating order, both engines warmed on other requests first:
   thread CPU per line (median), mean attempts (the redraws the check causes) and fallbacks.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from runtime.client.constraints import settled_text
from runtime.client.generator import LineGenerator, LineRequest
from runtime.client.trigrams import TrigramReader
from runtime.factory.export import book_lines
from runtime.factory.linebook import load_line_book


def check_cost(gen: LineGenerator, n_lines: int) -> None:
    tok, table = gen.tokenizer, gen.trigrams
    assert table is not None, "the model ships no trigram table"
    texts = random.Random(0).sample(book_lines(load_line_book()), n_lines)
    seqs = [tok.encode(t) for t in texts]

    def run(incremental: bool) -> float:
        t0 = time.thread_time()
        for ids in seqs:
            reader = TrigramReader()
            for n in range(1, len(ids) + 1):
                text = settled_text(tok.decode(ids[:n]))
                table.first_unseen(text, reader=reader if incremental else None, final=False)
            table.first_unseen(tok.decode(ids), reader=reader if incremental else None)
        return (time.thread_time() - t0) / len(seqs) * 1e3

    run(True)  # the table's memo warmed alike for both
    reader_ms = statistics.median(run(True) for _ in range(3))
    whole_ms = statistics.median(run(False) for _ in range(3))
    t0 = time.thread_time()
    for ids in seqs:
        for n in range(1, len(ids) + 1):
            settled_text(tok.decode(ids[:n]))
    decode_ms = (time.thread_time() - t0) / len(seqs) * 1e3
    tokens = sum(map(len, seqs)) / len(seqs)
    print(f"check alone ({n_lines} book lines, {tokens:.1f} tokens each, fed token by token): "
          f"reader {reader_ms:.3f} ms a line vs whole-line re-read {whole_ms:.3f} ms "
          f"({whole_ms / reader_ms:.2f}x); of each, the per-token decode + settled_text {decode_ms:.3f} ms")


def requests(gen: LineGenerator, n: int, seed: int) -> list[LineRequest]:
    cat = gen.catalog()
    rng = random.Random(seed)
    out = []
    for j in range(n):
        slots = rng.sample(sorted(cat["context"]), rng.randint(0, len(cat["context"])))
        out.append(LineRequest(rng.choice(cat["archetypes"]), rng.choice(cat["states"]),
                               persona=rng.sample(cat["persona_traits"], rng.randint(0, 2)),
                               intent=rng.choice(cat["intents"]),
                               context={s: rng.choice(cat["context"][s]) for s in slots},
                               seed=seed * 100_000 + j, npc_id=(seed, j)))
    return out


def engine_cost(model: Path | None, n: int, reps: int) -> None:
    peers = {"trigrams": LineGenerator.load(model), "no trigrams": LineGenerator.load(model, trigrams=None)}
    for gen in peers.values():  # every mask state both will meet, met once
        for r in requests(gen, n, seed=1):
            gen.generate_request(r)
    figures: dict[str, list[tuple[float, float, int]]] = {name: [] for name in peers}
    for rep in range(reps):
        order = list(peers) if rep % 2 == 0 else list(reversed(peers))
        for name in order:
            gen, cpu, attempts, fallbacks = peers[name], [], 0, 0
            for r in requests(gen, n, seed=10 + rep):
                t0 = time.thread_time()
                line = gen.generate_request(r)
                cpu.append((time.thread_time() - t0) * 1e3)
                attempts += line.attempts
                fallbacks += line.fallback
            figures[name].append((statistics.median(cpu), attempts / n, fallbacks))
    for name, runs in figures.items():
        cpu_ms = statistics.median(c for c, _, _ in runs)
        print(f"engine, {name:11s}: thread CPU p50 {cpu_ms:.2f} ms a line (runs "
              f"{', '.join(f'{c:.2f}' for c, _, _ in runs)}), mean attempts "
              f"{statistics.mean(a for _, a, _ in runs):.3f}, fallbacks {sum(f for _, _, f in runs)} of {n * reps}")
    with_ms = statistics.median(c for c, _, _ in figures["trigrams"])
    without_ms = statistics.median(c for c, _, _ in figures["no trigrams"])
    print(f"engine: {with_ms / without_ms:.3f}x the thread CPU of a line without the check "
          f"({n} requests of every prompt shape x {reps} reps, alternating order)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="model directory (default: the shipped one)")
    ap.add_argument("--lines", type=int, default=300)
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args(argv)
    check_cost(LineGenerator.load(args.model, warmup=False), args.lines)
    engine_cost(args.model, args.requests, args.reps)


if __name__ == "__main__":
    main()
