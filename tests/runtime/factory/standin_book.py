"""A small hand-made stand-in for a line book, and a sampler that writes lines without a model.

It has what the writer measures and the blind kit read from a :class:`runtime.factory.linebook.LineBook`
(catalog lists, ``examples()``, ``split()``, ``vocabulary()``, ``signatures()``), with examples
of every prompt shape, so their logic is tested on figures that can be worked out by hand.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from runtime.factory.linebook import Example, Split

VOICE = {"guard": "citizen", "sailor": "matey"}
STATE = {"alert": "Halt there", "rest": "Long day"}
INTENT = {"greet": "well met", "trade": "coin first"}
MOOD = {"gruff": "hmph", "kind": "dear"}
CONTEXT = {
    "time_of_day": {"day": "sunny", "night": "dark"},
    "weather": {"rain": "wet", "snow": "cold"},
    "reputation": {"hostile": "scoundrel", "friendly": "pal"},
    "recent_event": {"none": "quiet", "fire": "smoke"},
}


def standin_line(request) -> str:
    """The line the stand-in book writes for a request: every tag it asks for, voiced."""
    archetype, persona, state, intent, context = request
    words = [STATE[state] + ",", VOICE[archetype] + "!", INTENT[intent].capitalize()]
    words += [MOOD[t] for t in persona] + [CONTEXT[s][v] for s, v in context]
    return " ".join(words) + "."


class StandinBook:
    def __init__(self) -> None:
        self.archetypes = ["guard", "sailor"]
        self.persona_traits = ["gruff", "kind"]
        self.states = ["alert", "rest"]
        self.intents = ["greet", "trade"]
        self.context = {slot: list(values) for slot, values in CONTEXT.items()}
        self.slots = ["player"]
        self.banned_words = ["phone"]
        self.heldout_pairs = [("sailor", "rest")]

    def examples(self) -> list[Example]:
        personas = [(), ("gruff",), ("kind",), ("gruff", "kind")]
        slots = list(CONTEXT)
        subsets = [c for n in range(len(slots) + 1) for c in itertools.combinations(slots, n)]
        out = []
        for arch, state, intent in itertools.product(self.archetypes, self.states, self.intents):
            for k, (persona, chosen) in enumerate(itertools.product(personas, subsets)):
                ctx = tuple(sorted((s, list(CONTEXT[s])[(k + i) % 2]) for i, s in enumerate(chosen)))
                request = (arch, persona, state, intent, ctx)
                out.append(Example(arch, persona, state, intent, ctx, standin_line(request)))
        return out

    def split(self, seed: int = 0) -> Split:
        held = [e for e in self.examples() if (e.archetype, e.state) in self.heldout_pairs]
        rest = [e for e in self.examples() if (e.archetype, e.state) not in self.heldout_pairs]
        train = [e for i, e in enumerate(rest) if i % 4 != 3]
        test = [e for i, e in enumerate(rest) if i % 4 == 3]
        return Split(train, [], test, held, list(self.heldout_pairs))

    def vocabulary(self) -> list[str]:
        from runtime.factory.text_metrics import words

        return sorted({w for e in self.examples() for w in words(e.text)})

    def signatures(self) -> dict[str, list[str]]:
        out = {f"archetype:{a}": [w] for a, w in VOICE.items()}
        out["archetype:sailor"].append("sea legs")
        out.update({f"persona:{t}": [w] for t, w in MOOD.items()})
        out.update({f"context:{s}={v}": [w] for s, vs in CONTEXT.items() for v, w in vs.items()})
        return out

    def voice_markers(self) -> dict[str, list[str]]:
        return {}  # the stand-in's traits have no whole replies

    def lines_for(self, archetype: str, state: str, intent: str, persona=(), context=(), n: int = 50,
                  seed: int = 0) -> list[str]:
        """The stand-in writes one line per prompt (:func:`standin_line`)."""
        return [standin_line((archetype, tuple(persona), state, intent, tuple(context)))][:n]

    def allowed_slots(self, archetype: str, state: str, intent: str) -> set[str]:
        return {"player"}


class StandinSampler:
    """Writes the stand-in book's line for each request, with a doubled comma (a glitch) in
    every row ``k`` where ``(seed + k) % 3 == 0``."""

    def __init__(self) -> None:
        self.calls = 0

    def sample(self, requests: Sequence, seed: int) -> list[str]:
        self.calls += 1
        out = []
        for k, request in enumerate(requests):
            line = standin_line(request)
            if (seed + k) % 3 == 0:
                line = line.replace(",", ",,")
            out.append(line)
        return out
