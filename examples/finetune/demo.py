"""The pirate port's NPCs speak: lines from a fine-tuned model directory, through the engine.

    python examples/finetune/demo.py runs/pirate_port         # after the commands in README.md
    python examples/finetune/demo.py runs/pirate_port --heldout  # also: archetype classifier on held-out prompts
    python examples/finetune/demo.py runs/pirate_port --sheet ratings.csv   # lines to rate by hand
    python examples/finetune/demo.py --summary ratings.csv    # a rated sheet's figures

``--sheet`` writes one line for each of ``--prompts`` prompts (default 72) spread over the new
archetypes, all eight states, the seven intents and the tide (low, high, none), in the shapes a
game sends (no persona or one trait; no context, the tide alone, or the tide with the time of
day); fill its ``rating`` column with 2 (a writer would ship it), 1 (understandable but clumsy)
or 0 (garbled, contradictory or wrong for the state), as in issue #12's blind reading, and
``contradiction`` with 1 where the line says the other tide (or the water's height without a
tide in the prompt). ``--summary`` prints the shares.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import random
from pathlib import Path

from runtime import LineGenerator

SCENES = [
    ("quartermaster", "working", "trade", {"tide": "low"}, ["gruff"]),
    ("quartermaster", "alert", "approach", {"tide": "high", "time_of_day": "night"}, []),
    ("quartermaster", "friendly", "greet", {}, ["kind"]),
    ("smuggler", "idle", "ask_rumors", {"tide": "high"}, ["sly"]),
    ("smuggler", "alert", "threaten", {"tide": "low"}, []),
    ("smuggler", "flee", "approach", {}, ["nervous"]),
    ("harbormaster", "working", "greet", {"tide": "high"}, ["proud"]),
    ("harbormaster", "patrol", "ask_directions", {}, []),
    ("harbormaster", "rest", "farewell", {"tide": "low"}, ["weary"]),
    ("guard", "alert", "greet", {"time_of_day": "night"}, ["gruff"]),
]


def heldout_accuracy(gen: LineGenerator, model_dir: Path, seeds: int = 3) -> dict[str, float]:
    """A classifier trained on the studio's training lines, on model lines for the held-out prompts."""
    from runtime.factory.state_classifier import NgramClassifier

    rows = [json.loads(x) for x in (model_dir / "studio_lines.jsonl").read_text().splitlines()]
    train = [r for r in rows if not r["heldout"]]
    held = [r for r in rows if r["heldout"]]
    clf = NgramClassifier.fit([r["line"] for r in train], [r["archetype"] for r in train], min_count=1)
    lines, labels = [], []
    for r in held:
        for seed in range(seeds):
            line = gen.generate(r["archetype"], r["state"], persona=r["persona"], intent=r["intent"],
                                context=r["context"], seed=seed)
            lines.append(line.text)
            labels.append(r["archetype"])
    return {"model": clf.accuracy(lines, labels), "authored": clf.accuracy([r["line"] for r in held],
                                                                           [r["archetype"] for r in held]),
            "prompts": len(held), "lines": len(lines)}


NEW = ("quartermaster", "smuggler", "harbormaster")
STATES = ("working", "idle", "patrol", "friendly", "rest", "alert", "combat", "flee")
INTENTS = ("approach", "greet", "ask_directions", "ask_rumors", "trade", "threaten", "farewell")
TRAITS = ("gruff", "sly", "weary", "cheerful", "nervous", "kind", "greedy", "proud", "brave")
FIELDS = ("archetype", "state", "intent", "persona", "context", "line", "fallback", "rating", "contradiction")


def rating_prompts(n: int, seed: int = 0) -> list[tuple[str, str, str, list[str], dict[str, str]]]:
    """``n`` prompts: the archetype turns every prompt, the state every three (so 72 prompts hold
    each archetype x state three times) and the tide with the state (low / high / none: each
    archetype meets every state x tide pairing once in 72); the intents round-robin; a persona
    trait on a third of the prompts, placed so that each archetype gets the same share of them
    (8 of 24 in 72), on every state and tide value, and the time of day on every fourth.

    The previous design put the trait on every third prompt and the tide round-robin, so the
    trait and the tide each followed the archetype (every harbormaster prompt had a trait, every
    quartermaster prompt the low tide); this one does not confound them."""
    rng = random.Random(seed)
    intents = itertools.cycle(INTENTS)
    out = []
    for i in range(n):
        a, k = i % len(NEW), i // len(NEW)
        arch, state, tide = NEW[a], STATES[k % len(STATES)], ("low", "high", None)[k % 3]
        context = {"tide": tide} if tide else {}
        if i % 4 == 3:
            context["time_of_day"] = rng.choice(("dawn", "day", "dusk", "night"))
        persona = [rng.choice(TRAITS)] if (k + a + k // 3) % 3 == 0 else []
        out.append((arch, state, next(intents), persona, context))
    return out


def write_sheet(gen: LineGenerator, path: Path, prompts: int, seed: int) -> None:
    """The rating sheet: one engine line per prompt, with empty rating columns."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for i, (arch, state, intent, persona, context) in enumerate(rating_prompts(prompts, seed)):
            line = gen.generate(arch, state, persona=persona, intent=intent, context={**context, "player": "Mara"},
                                seed=seed * 1000 + i)
            w.writerow({"archetype": arch, "state": state, "intent": intent, "persona": ";".join(persona),
                        "context": ";".join(f"{k}={v}" for k, v in context.items()), "line": line.text,
                        "fallback": int(line.fallback), "rating": "", "contradiction": ""})


def summary(path: Path) -> dict[str, object]:
    """Shares of 2 / 1 / 0 and of contradictions in a rated sheet: all lines, the model lines
    (authored fallbacks counted apart), the model lines with and without a persona trait in
    their prompt, and per archetype (all lines)."""
    rows = list(csv.DictReader(path.open(newline="")))
    missing = [i + 2 for i, r in enumerate(rows) if r["rating"].strip() not in ("0", "1", "2")]
    if missing:
        raise SystemExit(f"{path}: rows {missing[:10]} have no rating 0, 1 or 2")

    def shares(rs: list[dict[str, str]]) -> dict[str, float]:
        n = max(len(rs), 1)
        return {"lines": len(rs), **{f"rated_{k}": sum(r["rating"].strip() == k for r in rs) / n for k in "210"},
                "contradictions": sum(r["contradiction"].strip() == "1" for r in rs) / n}

    model = [r for r in rows if r["fallback"] != "1"]
    return {"all": shares(rows), "model_lines": shares(model),
            "model_lines_with_trait": shares([r for r in model if r["persona"].strip()]),
            "model_lines_without_trait": shares([r for r in model if not r["persona"].strip()]),
            "authored_fallbacks": sum(r["fallback"] == "1" for r in rows),
            **{a: shares([r for r in rows if r["archetype"] == a]) for a in sorted({r["archetype"] for r in rows})}}


def unseen_trigrams(path: Path, model_dir: Path,
                    book: frozenset[tuple[str, ...]] | None = None) -> dict[str, dict[str, object]]:
    """For each rating of a rated sheet's model lines: how many hold a word trigram (within one
    sentence, the player's name read as the slot) that neither the base line book nor the
    studio's lines of ``model_dir`` say, and those lines. Would a trigram check at decoding
    catch the garbled lines, and what would it cost the shippable ones? ``book``: the base book's
    phrases (default :func:`runtime.factory.finetune.book_phrases`, the shipped line book)."""
    from runtime.factory.finetune import _grams, book_phrases, phrases

    studio = [json.loads(x)["line"] for x in (model_dir / "studio_lines.jsonl").read_text().splitlines()]
    known = (book_phrases() if book is None else book) | phrases(studio)
    rows = [r for r in csv.DictReader(path.open(newline="")) if r["fallback"] != "1"]
    out: dict[str, dict[str, object]] = {}
    for k in "210":
        rated = [r["line"] for r in rows if r["rating"].strip() == k]
        hit = [t for t in rated if any(len(g) == 3 and g not in known for g in _grams(t.replace("Mara", "{player}")))]
        out[k] = {"lines": len(rated), "with_unseen_trigram": len(hit), "examples": hit}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, nargs="?", help="the fine-tuned model directory")
    parser.add_argument("--seeds", type=int, default=2, help="lines per scene")
    parser.add_argument("--heldout", action="store_true", help="measure the held-out archetype classifier")
    parser.add_argument("--sheet", type=Path, help="write a rating sheet here instead of the scenes")
    parser.add_argument("--prompts", type=int, default=72, help="prompts on the rating sheet")
    parser.add_argument("--seed", type=int, default=0, help="the rating sheet's seed")
    parser.add_argument("--summary", type=Path, help="print the figures of a rated sheet")
    parser.add_argument("--trigrams", action="store_true",
                        help="with --summary and the model directory: lines with an unseen word trigram, by rating")
    args = parser.parse_args()
    if args.summary:
        print(json.dumps(summary(args.summary), indent=2))
        if args.trigrams:
            if args.model is None:
                parser.error("--trigrams needs the model directory the sheet was written from")
            print(json.dumps(unseen_trigrams(args.summary, args.model), indent=2))
        return
    if args.model is None:
        parser.error("the model directory is required (unless --summary)")
    with LineGenerator.load(args.model) as gen:
        if args.sheet:
            write_sheet(gen, args.sheet, args.prompts, args.seed)
            print(f"wrote {args.sheet}: {args.prompts} lines to rate")
            return
        for arch, state, intent, context, persona in SCENES:
            tags = ", ".join([*persona, *(f"{k}={v}" for k, v in context.items())])
            print(f"[{arch} / {state} / {intent}{' / ' + tags if tags else ''}]")
            for seed in range(args.seeds):
                line = gen.generate(arch, state, persona=persona, intent=intent,
                                    context={**context, "player": "Mara"}, seed=seed)
                print(f"  {line.text}{'   (authored fallback)' if line.fallback else ''}")
        if args.heldout:
            print(json.dumps(heldout_accuracy(gen, args.model), indent=2))


if __name__ == "__main__":
    main()
