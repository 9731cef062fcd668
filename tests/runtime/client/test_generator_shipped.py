"""LineGenerator on the shipped model (runtime/assets/flash): loads with no argument and speaks."""

from __future__ import annotations

import pytest

from runtime import LineGenerator
from runtime.factory.text_metrics import banned_hits, slot_violations
from runtime.paths import DEFAULT_MODEL_DIR

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL_DIR / "model.int4.onnx").is_file(),
                                reason="no shipped model in runtime/assets/flash")


@pytest.fixture(scope="module")
def gen():
    return LineGenerator.load()


def test_the_shipped_model_gives_model_lines_within_the_rules(gen):
    cat = gen.catalog()
    lines = []
    for i in range(30):
        arch, state = cat["archetypes"][i % len(cat["archetypes"])], cat["states"][i % len(cat["states"])]
        intent = cat["intents"][i % len(cat["intents"])]
        line = gen.generate(arch, state, intent=intent, seed=i, npc_id=i, context={"player": "Aria"})
        lines.append(line)
        assert banned_hits(line.raw_text, gen.banned_words) == []
        assert not slot_violations(line.raw_text, set(gen.slot_rules.allowed(arch, state, intent)))
        assert "{player}" not in line.text
    model_lines = [x for x in lines if not x.fallback]
    assert len(model_lines) >= 27  # a trained model is confident: its lines are kept
    assert all(x.mean_logprob > gen.min_mean_logprob for x in model_lines)
    # 30 distinct (archetype, state) prefixes: a first attempt never finds its prefix cached
    # (a fallback after redraws carries its last attempt's hit, so model lines only)
    assert not any(x.prefix_cache_hit for x in model_lines if x.attempts == 1)
    again = gen.generate(cat["archetypes"][0], cat["states"][0], seed=99, npc_id=99)
    assert again.prefix_cache_hit


def test_the_shipped_model_is_reproducible_and_streams_the_same_text(gen):
    # a sample drawn again after a veto can't be redrawn once streamed: compare first samples
    # (model v3.4 draws 8 of the first 12 seeds' lines twice or more: 32 seeds)
    compared = 0
    for seed in range(40, 72):
        a = gen.generate("innkeeper", "friendly", seed=seed, npc_id=("a", seed))
        stream = gen.generate_stream("innkeeper", "friendly", seed=seed, npc_id=("b", seed))
        pieces = "".join(stream)
        assert pieces == stream.line.text
        if a.attempts == 1 and stream.line.attempts == 1 and not a.fallback:
            assert pieces == a.text
            compared += 1
    assert compared >= 6


def test_a_stream_cut_after_what_it_showed_keeps_what_it_showed(gen):
    """A line whose last sample the constraints stop after its stream showed a mark ("...passing
    by on." then a trigram stop before the ".") ends at what was shown: the Line's text is the
    text the subtitle already holds, never shorter (seeds 63, 120, 275, 352 and 386 of these
    ended shorter before the fix)."""
    cat = gen.catalog()
    blocked = 0
    for seed in range(400):
        arch = cat["archetypes"][seed % len(cat["archetypes"])]
        state = cat["states"][seed % len(cat["states"])]
        stream = gen.generate_stream(arch, state, seed=seed, npc_id=("cut", seed), temperature=1.0)
        pieces = "".join(stream)
        assert pieces == stream.line.text, (seed, pieces, stream.line.text)
        blocked += stream.line.finish_reason == "blocked"
    assert blocked >= 3  # the path under test was taken


def test_a_slot_the_game_leaves_unfilled_reads_as_the_books_default(gen):
    # trade and ask_directions lines usually name the item / the place; without a value the
    # line says the book's default ("that one", "the square") instead of derailing around a
    # blocked slot, and a value the game gives always wins
    assert gen.slot_defaults == {"player": "friend", "location": "the square", "item": "that one"}
    model_lines = 0
    for seed in range(12):
        line = gen.generate("merchant", "working", intent="trade", seed=seed, npc_id=("m", seed))
        assert "{" not in line.text
        model_lines += not line.fallback
        if "{item}" in line.raw_text:
            assert "that one" in line.text.lower()
        given = gen.generate("merchant", "working", intent="trade", seed=seed, npc_id=("g", seed),
                             context={"item": "a lantern"})
        if "{item}" in given.raw_text:
            assert "a lantern" in given.text.lower()
    assert model_lines >= 10  # the model's lines, not authored fallbacks (11 of 12 at temperature 1.0)
