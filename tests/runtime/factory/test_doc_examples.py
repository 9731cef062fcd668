"""The documented examples stay clean: every Python block in README.md and docs/*.md that calls
``.generate(`` runs with the shipped model over 20 seeds, and no line it prints may hold a word
the line book never says, a punctuation or stutter glitch, a contradiction of the requested
context, or another archetype's voice (runtime.factory.writer_eval.LineJudge).

The block's own ``seed=`` is replaced by each seed in turn and a ``deadline_ms=`` is dropped (the
test judges the model's words, not how busy the machine is). Blocks that need a server or torch
are not run; they show as skipped, with the reason, in pytest's summary.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from runtime import LineGenerator
from runtime.factory.linebook import load_line_book
from runtime.factory.writer_eval import LineJudge

_GENERATE = LineGenerator.generate  # the real one, whatever a test has patched since
ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SEEDS = range(20)
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_SEED = re.compile(r"\bseed=\d+")
_DEADLINE = re.compile(r"\bdeadline_ms=[\w.]+")
# what a block needs that this test does not bring up -> why it is not run
_NEEDS = (
    (re.compile(r"\bimport torch\b|\bfrom torch\b|device=\"cuda\"|BatchedEngine|DialogueService|"
                r"runtime\.train\b|runtime\.model\b"), "needs torch (GPU or training code)"),
    (re.compile(r"server_sync|SyncServer|\bClient\(|websockets|asyncio|\bserve\("), "needs a server"),
)


def doc_blocks() -> list[tuple[str, str]]:
    """(``file:line`` of the block, its code) for every Python block that calls ``.generate(``."""
    blocks = []
    for path in DOCS:
        text = path.read_text()
        for m in _BLOCK.finditer(text):
            if ".generate(" in m.group(1):
                line = text.count("\n", 0, m.start()) + 2  # the code's first line
                blocks.append((f"{path.relative_to(ROOT)}:{line}", m.group(1)))
    return blocks


def _param(where: str, code: str):
    reasons = [why for pattern, why in _NEEDS if pattern.search(code)]
    if not _SEED.search(code):
        reasons.append("passes no seed= to vary")
    marks = [pytest.mark.skip(reason=f"{where}: {'; '.join(reasons)}")] if reasons else []
    return pytest.param(code, id=where, marks=marks)


@pytest.fixture(scope="module")
def judge() -> LineJudge:
    return LineJudge(load_line_book())


def run_block(code: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple, str]]:
    """Run a block with ``seed``; returns every (request, raw line) its ``.generate(`` calls made."""
    calls: list[tuple[tuple, str]] = []

    def recording(self, npc, state, *, persona=None, intent="approach", context=None, **kwargs):
        line = _GENERATE(self, npc, state, persona=persona, intent=intent, context=context, **kwargs)
        closed = self.catalog()["context"]
        ctx = tuple(sorted((k, v) for k, v in (context or {}).items() if k in closed))
        calls.append(((npc, tuple(sorted(persona or ())), state, intent, ctx), line.raw_text))
        return line

    monkeypatch.setattr(LineGenerator, "generate", recording)
    source = _DEADLINE.sub("deadline_ms=None", _SEED.sub(f"seed={seed}", code))
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(source, "<doc block>", "exec"), {"__name__": "doc_block"})
    return calls


def test_the_readme_example_is_among_the_blocks():
    blocks = dict(doc_blocks())
    assert any(where.startswith("README.md:") for where in blocks), blocks
    assert all(".generate(" in code for code in blocks.values())


def test_blocks_that_need_a_server_or_torch_or_give_no_seed_are_skipped_with_a_reason():
    def reason(code):
        marks = _param("doc.md:1", code).marks
        return marks[0].kwargs["reason"] if marks else None

    assert reason('gen.generate("guard", "alert", seed=1)') is None
    assert "needs torch" in reason('import torch\nengine.generate("guard", "alert", seed=1)')
    assert "needs torch" in reason('BatchedEngine.load(device="cuda").generate(seed=1)')
    assert "needs a server" in reason('SyncServer(cfg)\ngen.generate("guard", "alert", seed=1)')
    assert reason('gen.generate("guard", "alert")') == "doc.md:1: passes no seed= to vary"


def test_block_runner_substitutes_the_seed_and_records_each_line(monkeypatch):
    code = ('from runtime import LineGenerator\n'
            'gen = LineGenerator.load()\n'
            'line = gen.generate("guard", "alert", persona=["gruff"], intent="greet",\n'
            '                    context={"weather": "rain", "player": "Aria"}, seed=1, deadline_ms=5)\n'
            'print(line.text)\n')
    first = run_block(code, 4, monkeypatch)
    again = run_block(code, 4, monkeypatch)
    assert first == again and len(first) == 1
    request, raw = first[0]
    assert request == ("guard", ("gruff",), "alert", "greet", (("weather", "rain"),))
    direct = LineGenerator.load().generate("guard", "alert", persona=["gruff"], intent="greet",
                                           context={"weather": "rain", "player": "Aria"}, seed=4)
    assert raw == direct.raw_text


@pytest.mark.parametrize("code", [_param(where, code) for where, code in doc_blocks()])
def test_documented_example_lines_are_clean(code, judge, monkeypatch):
    problems = []
    for seed in SEEDS:
        calls = run_block(code, seed, monkeypatch)
        assert calls, "the block made no .generate( call"
        for request, line in calls:
            for problem in judge.verdict(request, line).problems():
                problems.append(f"seed {seed}: {problem}: {line!r}")
    assert not problems, "\n".join(problems)
