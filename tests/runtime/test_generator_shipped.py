"""LineGenerator on the shipped model (runtime/assets/flash): loads with no argument and speaks."""

from __future__ import annotations

import pytest

from runtime import LineGenerator
from runtime.paths import DEFAULT_MODEL_DIR
from runtime.text_metrics import banned_hits, slot_violations

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
    assert not any(x.prefix_cache_hit for x in lines)  # 30 distinct (archetype, state) prefixes
    again = gen.generate(cat["archetypes"][0], cat["states"][0], seed=99, npc_id=99)
    assert again.prefix_cache_hit


def test_the_shipped_model_is_reproducible_and_streams_the_same_text(gen):
    a = gen.generate("innkeeper", "friendly", seed=42, npc_id="a")
    stream = gen.generate_stream("innkeeper", "friendly", seed=42, npc_id="b")
    assert "".join(stream) == a.text == stream.line.text
