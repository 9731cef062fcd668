"""Two line books' own lines in one blind sheet: the same prompt mix, shuffled together, so one
reader rates both in the same sitting (docs/linebook.md, "Book v5").

    python bench/book_sheet.py BOOK_A BOOK_B --lines 120 --seed 1601 --out docs/ratings/blind_book_v5.csv
    python bench/book_sheet.py --summary docs/ratings/blind_book_v5.csv    # once rated

``BOOK_A`` / ``BOOK_B``: line-book directories (e.g. the shipped one and a copy with other
compose patterns from ``runtime.factory.linebook.book_with_compose``); each gives ``--lines``
lines as ``flashnpc eval blind`` draws book lines (every prompt shape, seen and held-out pairs),
its source in the key named after the directory. ``--summary`` prints shippable / clumsy /
garbled per source of a rated sheet and writes them beside it (``.summary.json``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from runtime.factory.blind import read_ratings, write_blind, write_sheet
from runtime.factory.linebook import load_line_book


def write_books_sheet(books: list[str], lines: int, seed: int, out: Path) -> None:
    items = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, path in enumerate(books):
            key = write_blind(Path(tmp) / f"{k}.csv", book=load_line_book(path), sampler=None,
                              model_lines=0, book_lines=lines, seed=seed)
            items += [{**item, "source": f"book:{Path(path).name or path}#{k}"} for item in key["items"]]
    write_sheet(out, items, np.random.default_rng([seed, 9]), seed=seed, books=books)

def summary(sheet: Path) -> dict[str, dict[str, float]]:
    rated = read_ratings(sheet)
    out = {}
    for source in sorted({r.item["source"] for r in rated}):
        ratings = [r.rating for r in rated if r.item["source"] == source]
        out[source] = {"n": len(ratings), **{name: ratings.count(v) / len(ratings)
                                             for v, name in ((2, "shippable"), (1, "clumsy"), (0, "garbled"))}}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("books", nargs="*", help="line-book directories (two to compare)")
    ap.add_argument("--lines", type=int, default=120, help="lines per book (default 120)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="the CSV to write (its key beside it)")
    ap.add_argument("--summary", metavar="SHEET", help="summarise a rated sheet instead")
    args = ap.parse_args(argv)
    if args.summary:
        result = summary(Path(args.summary))
        Path(args.summary).with_suffix(".summary.json").write_text(json.dumps(result, indent=1))
        for source, s in result.items():
            print(f"{source:40s} {s['n']:4d}  shippable {s['shippable']:.1%}  clumsy {s['clumsy']:.1%}  "
                  f"garbled {s['garbled']:.1%}")
        return 0
    if not args.books or not args.out:
        ap.error("give one or more BOOK directories and --out, or --summary SHEET")
    write_books_sheet(args.books, args.lines, args.seed, Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
