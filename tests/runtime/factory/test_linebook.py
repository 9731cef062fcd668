"""The default line book: size, coverage, determinism, split and fallbacks."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from runtime.factory.linebook import Example, LineBook, LineBookError, load_line_book
from runtime.factory.text_metrics import SignatureIndex

SLOT_RE = re.compile(r"\{(\w+)\}")


@pytest.fixture(scope="module")
def book() -> LineBook:
    return load_line_book()


@pytest.fixture(scope="module")
def examples(book: LineBook) -> list[Example]:
    return book.examples()


def test_catalog_covers_the_required_vocabulary(book: LineBook) -> None:
    cat = book.catalog()
    assert set(cat) == {"archetypes", "persona_traits", "states", "intents", "context", "slots"}
    assert len(cat["archetypes"]) >= 10
    assert {
        "guard",
        "merchant",
        "innkeeper",
        "blacksmith",
        "farmer",
        "priest",
        "thief",
        "noble",
        "child",
        "sailor",
    } <= set(cat["archetypes"])
    assert len(cat["states"]) >= 8
    assert len(cat["intents"]) >= 6
    assert {
        "approach",
        "greet",
        "ask_directions",
        "ask_rumors",
        "trade",
        "threaten",
        "farewell",
    } <= set(cat["intents"])
    assert {"time_of_day", "weather", "reputation", "recent_event"} <= set(cat["context"])
    assert cat["slots"] == ["player", "location", "item"]
    assert 10 <= len(cat["persona_traits"]) <= 16


def test_default_book_expands_to_at_least_20000_distinct_whole_lines(examples: list[Example]) -> None:
    # book v5 draws whole authored lines only (05_compose.yaml): 21,284 distinct, against 50,000+
    # when fragments were stitched together (docs/linebook.md, "Book v5")
    assert len({e.text for e in examples}) >= 20_000


def test_no_text_is_used_for_two_states(examples: list[Example]) -> None:
    states: dict[str, set[str]] = defaultdict(set)
    for e in examples:
        states[e.text].add(e.state)
    assert all(len(s) == 1 for s in states.values())


def test_every_condition_is_covered(book: LineBook, examples: list[Example]) -> None:
    counts = Counter((e.archetype, e.state, e.intent) for e in examples)
    for arch in book.archetypes:
        for state in book.states:
            for intent in book.intents:
                assert counts[(arch, state, intent)] >= 50, (arch, state, intent)


def test_lines_are_short_clean_and_use_only_allowed_slots(
    book: LineBook, examples: list[Example]
) -> None:
    banned = re.compile(
        r"(?<![a-z])(?:" + "|".join(map(re.escape, book.banned_words)) + r")(?![a-z])"
    )
    allowed_cache: dict[tuple[str, str, str], set[str]] = {}
    for e in examples:
        assert 3 <= len(e.text.split()) <= 24, e.text
        assert not re.search(r"[\[\]()|]", e.text), e.text
        lower = e.text.lower()
        assert not banned.search(lower), e.text
        key = (e.archetype, e.state, e.intent)
        if key not in allowed_cache:
            allowed_cache[key] = book.allowed_slots(*key)
        assert set(SLOT_RE.findall(e.text)) <= allowed_cache[key], e


def test_examples_carry_sorted_persona_and_any_subset_of_the_context(
    book: LineBook, examples: list[Example]
) -> None:
    for e in examples[::97]:
        assert 0 <= len(e.persona) <= 2
        assert list(e.persona) == sorted(e.persona)
        assert all(t in book.persona_traits for t in e.persona)
        keys = [k for k, _ in e.context]
        assert keys == sorted(keys) and set(keys) <= set(book.context)
        assert all(v in book.context[k] for k, v in e.context)
    # every prompt shape the games send is trained: 0, 1 and 2 traits; 0 to 4 context slots
    assert {len(e.persona) for e in examples} == {0, 1, 2}
    assert {len(e.context) for e in examples} == set(range(len(book.context) + 1))


def test_a_prompt_without_a_slot_gets_no_line_that_voices_it(
    book: LineBook, examples: list[Example]
) -> None:
    # "voices" as flashnpc eval measures it (text_metrics.SignatureIndex), on every 13th line
    index = SignatureIndex(book.signatures())
    for e in examples[::13]:
        asked = {f"context:{k}={v}" for k, v in e.context} | {f"persona:{t}" for t in e.persona}
        unasked = {tag for tag in index.hits(e.text) if not tag.startswith("archetype:") and tag not in asked}
        assert not unasked, (e, unasked)


def test_context_fragments_match_the_example_context(v4_examples: list[Example]) -> None:
    # "Snow again, look." is written only for weather=snow; "Quiet night so far." only for night.
    snow = [e for e in v4_examples if "Snow again, look." in e.text]
    night = [e for e in v4_examples if "Quiet night so far." in e.text]
    assert snow and night
    assert all(dict(e.context)["weather"] == "snow" for e in snow)
    assert all(dict(e.context)["time_of_day"] == "night" for e in night)


@pytest.fixture(scope="module")
def v4_book(tmp_path_factory: pytest.TempPathFactory) -> LineBook:
    """The default book with book v4's compose patterns (``book_with_compose``)."""
    from runtime.factory.linebook import book_with_compose

    return load_line_book(book_with_compose(tmp_path_factory.mktemp("book_v4") / "book"))


@pytest.fixture(scope="module")
def v4_examples(v4_book: LineBook) -> list[Example]:
    """Book v4's lines: a book that composes fragments (moods, context remarks, mottos), where
    the writer's marks decide what may stand beside what. The default book (v5) draws whole
    lines only, so the marks are pinned here."""
    return v4_book.examples()


def test_the_default_book_draws_whole_lines_only_and_its_v4_copy_composes_them(
        book: LineBook, examples: list[Example], v4_book: LineBook, v4_examples: list[Example],
        tmp_path: Path) -> None:
    from runtime.factory.linebook import book_with_compose

    # book v5: every pattern is one whole authored line, nothing stitched to it
    assert [sorted(p.refs) for p in book._patterns] == [["own_reply"], ["trait_reply"], ["reply"]]
    assert set().union(*(p.refs for p in v4_book._patterns)) >= {"own_reply", "trait_reply", "mood", "ctx"}
    assert len(v4_examples) == 112_000
    # a condition has fewer distinct whole lines than the 200 it asks for, and none is drawn twice
    per_condition = Counter((e.archetype, e.persona, e.state, e.intent, e.context) for e in examples)
    assert 80_000 <= len(examples) < 112_000 and max(per_condition.values()) <= 200
    with pytest.raises(LineBookError, match=r"no 05_compose\.yaml"):
        book_with_compose(tmp_path / "b", path=tmp_path)


def test_a_trait_reply_is_drawn_only_for_a_prompt_carrying_its_trait(v4_book: LineBook,
                                                                      v4_examples: list[Example]) -> None:
    """Book v4's whole replies in a persona trait's voice ([trait_reply]): every trait's are drawn,
    and a line that is one of a trait's replies for its (state, intent) carries that trait."""
    from runtime.factory.linebook import _normalize

    book, examples = v4_book, v4_examples

    owners: dict[tuple[str, str, str, str], set[str]] = defaultdict(set)
    for (trait, state, intent), srcs in book._trait_replies.items():
        for arch in book.archetypes:
            for src in srcs:
                for parts in book._enumerate(src.template, arch, 64):
                    owners[(arch, state, intent, _normalize("".join(parts)))].add(trait)
    drawn: Counter[str] = Counter()
    for e in examples:
        traits = owners.get((e.archetype, e.state, e.intent, e.text))
        if traits:
            assert traits & set(e.persona), e
            drawn.update(traits & set(e.persona))
    assert set(drawn) == set(book.persona_traits) and min(drawn.values()) > 500, drawn


@pytest.mark.parametrize(("fragment", "intents"), [
    ("My scales never lie.", {"trade"}),
    ("The gate closes for no rogue.", {"threaten"}),
    ("The sea calls, always.", {"farewell"}),
    ("I never lift a finger for free.", {"trade"}),
    ("Show me the silver first.", {"trade"}),
])
def test_a_motto_or_a_greedy_aside_closes_only_the_moves_it_fits(v4_examples: list[Example], fragment: str,
                                                                   intents: set[str]) -> None:
    """Book v3.4: an archetype's motto signs off the intents it answers (a merchant's "My scales
    never lie." after a price, not after directions), and greedy's asking for coin stays with trade
    (not before directions the NPC then gives for free)."""
    said = Counter(e.intent for e in v4_examples if fragment in e.text)
    assert said and set(said) <= intents, said


def test_archetype_voice_reaches_every_state(examples: list[Example]) -> None:
    sailor_states = {e.state for e in examples if e.archetype == "sailor" and "matey" in e.text}
    assert len(sailor_states) == 8


def test_split_is_deterministic_disjoint_and_holds_out_pairs(book: LineBook) -> None:
    a, b = book.split(seed=0), book.split(seed=0)
    assert [e.text for e in a.train[:200]] == [e.text for e in b.train[:200]]
    assert len(a.train) == len(b.train)
    pairs = set(a.heldout_pairs)
    assert 8 <= len(pairs) <= 12
    assert {(e.archetype, e.state) for e in a.heldout} == pairs
    seen = a.train + a.val + a.test
    assert not any((e.archetype, e.state) in pairs for e in seen)
    heldout_texts = {e.text for e in a.heldout}
    assert not heldout_texts & {e.text for e in seen}
    train_texts = {e.text for e in a.train}
    assert not train_texts & {e.text for e in a.val}
    assert not train_texts & {e.text for e in a.test}
    n = len(seen)
    assert 0.85 < len(a.train) / n < 0.95
    other = book.split(seed=1)
    assert {e.text for e in other.val} != {e.text for e in a.val}


def test_training_split_still_covers_every_archetype_and_state(book: LineBook) -> None:
    split = book.split()
    pairs = {(e.archetype, e.state) for e in split.train}
    for arch in book.archetypes:
        assert sum((arch, s) in pairs for s in book.states) >= len(book.states) - 2
    for state in book.states:
        assert sum((a, state) in pairs for a in book.archetypes) >= len(book.archetypes) - 3


def test_fallback_lines_exist_for_every_archetype_and_state(book: LineBook) -> None:
    fallbacks = book.fallback_lines()
    assert set(fallbacks) == {(a, s) for a in book.archetypes for s in book.states}
    for key, lines in fallbacks.items():
        assert lines, key
        for line in lines:
            assert not re.search(r"[\[\]()|]", line), line
            assert 1 <= len(line.split()) <= 12, line
    assert any("matey" in line for line in fallbacks[("sailor", "alert")])
    assert fallbacks[("child", "combat")][0] == "Take that! And that!"


def test_allowed_slots_follow_the_intent(book: LineBook) -> None:
    assert "location" in book.allowed_slots("guard", "patrol", "ask_directions")
    assert "item" in book.allowed_slots("merchant", "working", "trade")
    assert "item" not in book.allowed_slots("merchant", "working", "greet")
    with pytest.raises(ValueError, match=r"unknown archetype 'gaurd'; known: guard"):
        book.allowed_slots("gaurd", "patrol", "greet")


def test_expansion_is_deterministic_across_loads(examples: list[Example]) -> None:
    again = load_line_book().examples()
    assert again == examples


# the 22 book lines read clumsy (1) in the blind reading docs/ratings/blind_v3c (issue #12): a
# fragment that clashes with the reply beside it, or two parts that say the same thing
CLUMSY_V3C = [
    "Walk in the light. Fair and friendly, that's my way: {item} for a smile and a coin.",
    'Whee, what a to-do! {location} can wait! Just get away from here!',
    "Anchors aweigh! I'll not send any passer-by toward {location} without knowing why.",
    "Hello later, if we're still standing! Right now, keep swinging! Missed you, but not like this!",
    "Taking my ease on the bench outside the smithy. Forgive the bare feet, I'm taking my ease.",
    "Mind the laws of the village. Mind how you go; I'll carry on here.",
    "Work's stacked up high as a haystack. The only news here is work piling up, I'm afraid.",
    "I see the same faces every lap; yours I'll mark well. Oh, don't stare...",
    "Threats? I've no time for such things; I've a job to finish. My talents are wasted here.",
    "{location}? Stick to the hedges, and never take the open road! Every coin I have is yours, just don't hurt me!",
    "Tell your friends about my stall! Come to loaf with me? There's not much to it, I promise.",
    "Save your threats for someone busy; I've nothing to lose but time. Mind the stairs, love.",
    "Please, don't stare... This round, a shutter was left swinging near {location}; that's all the news I have.",
    "Buying, selling, all of it can wait. I'm resting. The taps can wait; I'm sitting down and staying down.",
    "Oh, you've come to see me? How thoughtful! Keep the faith.",
    'Get to the point. Safe roads to you; my beat goes on.',
    "Smile, we'll laugh about this later! Good riddance. I'll be watching you.",
    "Always another way out, heh! I won't take {item} till I know who had it last.",
    "Changing the gate guard takes a moment. Wait here, traveler. Oh, you've come just as I'm busiest with watching the gate.",
    "Others could learn from me. For {item}, I'll pause a moment. What's your price?",
    "Come round where I can hear you; I can't look up from this just now. Wanna play tag?",
    "I must know everything. Is that the best you've got? A sleeping cat is more frightening.",
]


def test_the_book_lines_read_clumsy_in_the_v3c_blind_reading_are_no_longer_drawn(examples: list[Example]) -> None:
    texts = {e.text for e in examples}
    assert [t for t in CLUMSY_V3C if t in texts] == []


def test_marked_fragments_keep_to_the_intents_and_places_they_fit(v4_examples: list[Example]) -> None:
    examples = v4_examples
    point = [e for e in examples if e.text.startswith("Get to the point.")]
    assert point and "farewell" not in {e.intent for e in point}
    assert not any("Get to the point." in e.text and not e.text.startswith("Get to the point.") for e in examples)
    stall = [e for e in examples if "Tell your friends about my stall!" in e.text]
    assert stall and {e.intent for e in stall} == {"trade", "farewell"}
    assert all(e.text.endswith("Tell your friends about my stall!") for e in stall)
    begging = [e for e in examples if "Every coin I have is yours, just don't hurt me!" in e.text]
    assert begging and not {e.intent for e in begging} & {"ask_directions", "ask_rumors", "trade", "farewell"}
