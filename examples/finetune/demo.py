"""The pirate port's NPCs speak: lines from a fine-tuned model directory, through the engine.

    python examples/finetune/demo.py runs/pirate_port         # after the commands in README.md
    python examples/finetune/demo.py runs/pirate_port --heldout  # also: archetype classifier on held-out prompts
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="the fine-tuned model directory")
    parser.add_argument("--seeds", type=int, default=2, help="lines per scene")
    parser.add_argument("--heldout", action="store_true", help="measure the held-out archetype classifier")
    args = parser.parse_args()
    with LineGenerator.load(args.model) as gen:
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
