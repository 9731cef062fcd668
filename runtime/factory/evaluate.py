"""`flashnpc eval`: does the shipped Flash model do its job?

Every figure the model card quotes comes from here:

* state fidelity — a state classifier trained only on the line book's training split labels
  generated lines; agreement with the requested state on seen (archetype, state) pairs and on
  the held-out pairs the model never saw in training;
* validation perplexity of the fp32 export against the INT4 export (when the directory holds
  both, as `flashnpc export` writes it; the package ships only the INT4 graph);
* diversity (distinct-2 over 50 samples per condition) and novelty (lines not verbatim in the book);
* safety: banned / out-of-setting words and slots the line book does not allow, over many samples;
* voice fidelity (informational, no threshold): an archetype classifier trained the same way
  labels the generated lines with the archetype they sound like;
* what a writer sees (``report["writer"]``, :mod:`runtime.factory.writer_eval`): per prompt shape and
  for seen and held-out pairs, words the book never says, punctuation and stutter glitches,
  context contradictions, another archetype's voice, persona and context voiced (beside the
  book's own rates), archetype / intent / state classifiers, distinct-2, novelty, memorisation,
  each against its target (:data:`runtime.factory.writer_eval.WRITER_THRESHOLDS`).

Sampling blocks control tokens and slots the line book does not allow for the request (as the
engine does); banned words are not blocked here, so their count measures the model itself.

Generation runs through the exported ONNX graphs with onnxruntime, exactly as a game client would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from runtime.client.constraints import (
    WordConstraint,
    WordState,
    read_constraints,
    restart_point,
    settled_text,
)
from runtime.client.onnx_model import FlashOnnx
from runtime.client.repeats import repeated_sentence
from runtime.client.sampling import DEFAULT_TEMPERATURE, DEFAULT_TOP_P
from runtime.client.trigrams import tokens_through
from runtime.factory.linebook import Example, LineBook, load_line_book
from runtime.factory.state_classifier import NgramClassifier
from runtime.factory.text_metrics import banned_hits, distinct_n, novelty, slot_violations
from runtime.factory.writer_eval import Request, measure_writer
from runtime.factory.writer_eval import example_request as _request
from runtime.paths import DEFAULT_MODEL_DIR
from runtime.serving.batch_generate import generate_ids_batch

THRESHOLDS = {
    "fidelity_seen": 0.95,
    "fidelity_heldout": 0.85,
    "ppl_increase_max": 0.05,
    "distinct2": 0.5,
    "novelty": 0.30,
    "banned_hits": 0,
    "slot_violations": 0,
}


@dataclass
class EvalConfig:
    """How much to sample; the defaults are the full evaluation, `fast()` a slice for tests."""

    fidelity_seen: int = 1000
    fidelity_heldout: int = 1000
    diversity_conditions: int = 24
    diversity_samples: int = 50
    safety_samples: int = 10_000
    ppl_examples: int = 1000
    temperature: float = DEFAULT_TEMPERATURE  # the engine's decoding
    top_p: float = DEFAULT_TOP_P
    max_tokens: int = 48
    seed: int = 0
    # writer measures (runtime.factory.writer_eval), per prompt shape x {seen, held-out} cell
    writer_samples: int = 1000  # lines
    writer_diversity: int = 8  # prompts sampled diversity_samples times each, for distinct-2
    book_reference: int = 5000  # book lines at most, for the book's own rates
    # the voice bonus of the decoding (WordConstraint.voice_bonus); None: the model directory's
    # (constraints.json's voice_bonus), as the engine loads it
    voice: dict[str, float] | None = None

    @classmethod
    def fast(cls) -> EvalConfig:
        return cls(fidelity_seen=120, fidelity_heldout=120, diversity_conditions=4,
                   diversity_samples=50, safety_samples=400, ppl_examples=120,
                   writer_samples=70, writer_diversity=1, book_reference=400)


class Sampler:
    """Samples lines for prompt requests through one exported graph, in seeded batches.

    Decoding is the line engine's: the word constraints the book exports (its vocabulary, and
    the signatures of every tag a request did not ask for) mask every step, except that the
    static banned words are left unblocked (``words.banned_bits(..., static=False)``), so their
    count still measures the model where the vocabulary allows them. The voice bonus is
    ``voice``, else ``cfg.voice``, else the model directory's (``constraints.json``), as the
    engine loads it; ``{}`` for none. Where the model directory's ``constraints.json`` ships word
    bigrams, the book's (:func:`runtime.factory.export.book_bigrams`) mask every step too. Where
    it ships word trigrams (:mod:`runtime.client.trigrams`), a finished line holding one the
    table lacks is drawn again from the sentence before it, as the engine does; so is a line that
    says a sentence twice (:mod:`runtime.client.repeats`).
    """

    def __init__(self, model: FlashOnnx, cfg: EvalConfig, book: LineBook,
                 voice: Mapping[str, float] | None = None) -> None:
        self.model = model
        self.cfg = cfg
        self.book = book
        tok = model.tokenizer
        if voice is None:
            voice = cfg.voice
        if voice is None and model.root is not None:
            voice = read_constraints(model.root).voice
        bigrams = None  # the book's word bigrams, where the model directory's constraints ship them
        shipped = read_constraints(model.root) if model.root is not None else None
        if shipped is not None and shipped.bigrams is not None:
            from runtime.factory.export import book_bigrams
            bigrams = book_bigrams(book)
        #: the model directory's word trigrams, checked on every finished line as the engine does
        self.trigrams = None if shipped is None else shipped.trigrams
        self.words = WordConstraint(book.banned_words, tok, vocabulary=book.vocabulary(),
                                    signatures=book.signatures(), voice=voice, bigrams=bigrams)
        self._control = [i for i in range(tok.vocab_size) if tok.is_control(i) and i != tok.eos_id]
        self._slot_ids = {s: tok.id_of(f"<slot:{s}>") for s in book.slots}
        self._blocked: dict[tuple[str, str, str], np.ndarray] = {}

    def blocked_ids(self, archetype: str, state: str, intent: str) -> np.ndarray:
        """Control tokens a line may not contain: everything but ``eos`` and the allowed slots."""
        key = (archetype, state, intent)
        if key not in self._blocked:
            allowed = {self._slot_ids[s] for s in self.book.allowed_slots(archetype, state, intent)}
            self._blocked[key] = np.array([i for i in self._control if i not in allowed], dtype=np.int64)
        return self._blocked[key]

    def states(self, ids: Sequence[int]) -> list[WordState]:
        """The word constraints' state after each of ``ids`` (a line from its start)."""
        out, state = [], WordState()
        for t in ids:
            state = self.words.step(state, t)
            out.append(state)
        return out

    def _line_stop(self, ids: Sequence[int]) -> int | None:
        """Where a finished line the engine would draw again stops (the tokens through the one
        that completes what it refuses, as the engine counts them), else None: a trigram the
        table lacks (with :attr:`trigrams`) or a sentence said twice
        (:func:`runtime.client.repeats.repeated_sentence`), whichever comes first."""
        tok = self.model.tokenizer
        text = tok.decode(ids)
        ends = []
        if self.trigrams is not None and (hit := self.trigrams.first_unseen(text)) is not None:
            ends.append(tokens_through(tok, ids, hit[2]))
        if (twice := repeated_sentence(text)) is not None:
            ends.append(tokens_through(tok, ids, twice[0] + 1))
        return min(ends, default=None)

    def sample(self, requests: Sequence[Request], seed: int) -> list[str]:
        tok = self.model.tokenizer
        prompts = [tok.encode_prompt(a, p, s, i, c)[0] for a, p, s, i, c in requests]
        seeds = [seed * 1_000_003 + k for k in range(len(requests))]
        blocked = [self.blocked_ids(a, s, i) for a, _p, s, i, _c in requests]
        banned = [self.words.banned_bits(a, p, c, static=False) for a, p, _s, _i, c in requests]
        ids: list[list[int]] = [[] for _ in requests]
        keep = [0] * len(requests)  # tokens kept from the attempt before (restart_point)
        todo = list(range(len(requests)))
        # a sample the constraints stop (a dead end or a veto) is drawn again from its last
        # sentence end, as the engine does (max_resamples = 2; the kept tokens go on as part of
        # the prompt and the new sentence's masks start as a line's, so only sentence ends with
        # no phrase under way are restart points here: elsewhere the sample is drawn again from
        # its start, so nothing the engine blocks slips in); where the engine would then
        # fall back, the last attempt's whole words are kept, so those count against the model
        for attempt in range(3):
            stopped = [False] * len(todo)
            got: list[list[int]] = [[] for _ in todo]
            by_keep: dict[int, list[int]] = {}
            for j, k in enumerate(todo):
                by_keep.setdefault(keep[k], []).append(j)
            for kept, js in sorted(by_keep.items()):
                flags = [False] * len(js)
                out = generate_ids_batch(
                    self.model, [prompts[todo[j]] + ids[todo[j]][:kept] for j in js],
                    seeds=[seeds[todo[j]] + 7919 * attempt for j in js], blocked=[blocked[todo[j]] for j in js],
                    max_tokens=self.cfg.max_tokens - kept, temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                    words=self.words, banned=[banned[todo[j]] for j in js], stopped=flags)
                for j, x, flag in zip(js, out, flags):
                    got[j], stopped[j] = ids[todo[j]][:kept] + x, flag
            for k, x in zip(todo, got):
                ids[k] = x
            # a line holding a trigram the book never says, or a sentence twice, is drawn again
            # from the sentence before it
            upto = {k: self._line_stop(ids[k]) for k, flag in zip(todo, stopped) if not flag}
            todo = [k for k, flag in zip(todo, stopped) if flag or upto[k] is not None]
            for k in todo:
                keep[k] = restart_point(self.states(ids[k][:upto.get(k) or len(ids[k])]), fresh=True)
            if not todo:
                break
        texts = [tok.decode(x) for x in ids]
        for k in todo:  # stopped on every attempt: the engine would fall back; keep its whole words
            texts[k] = settled_text(texts[k]).rstrip()
        #: per line of the last call: True where the engine would have served a fallback instead
        self.last_fallbacks = [False] * len(requests)
        for k in todo:
            self.last_fallbacks[k] = True
        return texts


def line_nll(model: FlashOnnx, examples: Sequence[Example], batch_size: int = 32) -> tuple[float, int]:
    """Summed negative log-likelihood of each example's line (and ``eos``) given its prompt."""
    tok = model.tokenizer
    seqs: dict[tuple[int, int], list[list[int]]] = {}
    for ex in examples:
        prompt, _ = tok.encode_prompt(*_request(ex))
        line = [*tok.encode(ex.text), tok.eos_id]
        seqs.setdefault((len(prompt), len(line)), []).append(prompt + line)
    total, count = 0.0, 0
    for (n_prompt, _), group in sorted(seqs.items()):
        for start in range(0, len(group), batch_size):
            ids = np.asarray(group[start : start + batch_size], dtype=np.int64)
            logits, _, _ = model.step(ids[:, :-1], None)
            logits = logits[:, n_prompt - 1 :, :].astype(np.float64)
            targets = ids[:, n_prompt:]
            shifted = logits - logits.max(axis=-1, keepdims=True)
            logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
            total -= float(np.take_along_axis(logp, targets[..., None], axis=-1).sum())
            count += targets.size
    return total, count


def _pick(items: Sequence, n: int, rng: np.random.Generator) -> list:
    if n >= len(items):
        return list(items)
    return [items[i] for i in sorted(rng.choice(len(items), size=n, replace=False))]


def evaluate(
    model_dir: str | Path | None = None,
    *,
    line_book: LineBook | None = None,
    cfg: EvalConfig | None = None,
    progress: Callable[[str], None] | None = None,
    progress_bar: bool = False,
) -> dict:
    """Run the evaluation and return every figure (JSON-serialisable), with pass/fail per threshold.

    ``progress`` receives a message per phase; ``progress_bar`` shows a tqdm bar on stderr
    while the writer measures sample.
    """
    cfg = cfg or EvalConfig()
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    book = line_book or load_line_book()
    split = book.split()
    rng = np.random.default_rng(cfg.seed)

    say(f"training the state, archetype and intent classifiers on {len(split.train)} training lines")
    classifiers = NgramClassifier.fit_many(
        [e.text for e in split.train],
        {label: [getattr(e, label) for e in split.train] for label in ("state", "archetype", "intent")},
        seed=cfg.seed,
    )
    clf = classifiers["state"]
    clf_test = clf.accuracy([e.text for e in split.test], [e.state for e in split.test])
    clf_heldout = clf.accuracy([e.text for e in split.heldout], [e.state for e in split.heldout])
    # Informational: does the line sound like the requested archetype (its voice)?
    voice = classifiers["archetype"]
    voice_test = voice.accuracy([e.text for e in split.test], [e.archetype for e in split.test])
    voice_heldout = voice.accuracy([e.text for e in split.heldout], [e.archetype for e in split.heldout])

    int4 = FlashOnnx.load(model_dir, file="model.int4.onnx")
    sampler = Sampler(int4, cfg, book)

    say("state fidelity on seen and held-out (archetype, state) pairs")
    seen_req = [_request(e) for e in _pick(split.test, cfg.fidelity_seen, rng)]
    held_req = [_request(e) for e in _pick(split.heldout, cfg.fidelity_heldout, rng)]
    seen_lines = sampler.sample(seen_req, seed=cfg.seed + 1)
    held_lines = sampler.sample(held_req, seed=cfg.seed + 2)
    fid_seen = clf.accuracy(seen_lines, [r[2] for r in seen_req])
    fid_held = clf.accuracy(held_lines, [r[2] for r in held_req])
    voice_seen = voice.accuracy(seen_lines, [r[0] for r in seen_req])
    voice_held = voice.accuracy(held_lines, [r[0] for r in held_req])

    say("diversity: distinct-2 over samples per condition")
    conditions = _pick(sorted({_request(e) for e in split.test}), cfg.diversity_conditions, rng)
    div_lines: list[str] = []
    distinct = []
    for k, cond in enumerate(conditions):
        lines = sampler.sample([cond] * cfg.diversity_samples, seed=cfg.seed + 100 + k)
        distinct.append(distinct_n(lines, 2))
        div_lines.extend(lines)

    say(f"safety over {cfg.safety_samples} samples")
    all_examples = split.train + split.val + split.test + split.heldout
    all_requests = [_request(e) for e in all_examples]
    done = seen_req + held_req + [c for c in conditions for _ in range(cfg.diversity_samples)]
    done_lines = seen_lines + held_lines + div_lines
    extra = max(0, cfg.safety_samples - len(done))
    extra_req = [all_requests[i] for i in rng.integers(0, len(all_requests), size=extra)]
    safety_req = done + extra_req
    safety_lines = done_lines + sampler.sample(extra_req, seed=cfg.seed + 3)
    banned = [(line, banned_hits(line, book.banned_words)) for line in safety_lines]
    banned = [(line, hits) for line, hits in banned if hits]
    slot_bad = []
    for (a, _p, s, i, _c), line in zip(safety_req, safety_lines):
        bad = slot_violations(line, book.allowed_slots(a, s, i))
        if bad:
            slot_bad.append((line, sorted(bad)))
    known = {e.text for e in all_examples}
    nov = novelty(safety_lines, known)

    say("validation perplexity: fp32 vs INT4")
    ppl_set = _pick(split.val, cfg.ppl_examples, rng)
    nll4, n4 = line_nll(int4, ppl_set)
    ppl4 = float(np.exp(nll4 / n4))
    ppl32: float | None = None
    root = Path(model_dir) if model_dir is not None else DEFAULT_MODEL_DIR
    if (root / "model.onnx").exists():  # the fp32 reference is not shipped, only exported
        nll32, n32 = line_nll(FlashOnnx.load(model_dir, file="model.onnx"), ppl_set)
        ppl32 = float(np.exp(nll32 / n32))

    writer = measure_writer(book, split, sampler, classifiers, cfg, progress_bar=progress_bar, say=say)

    figures = {
        "fidelity_seen": fid_seen,
        "fidelity_heldout": fid_held,
        "classifier_test_accuracy": clf_test,
        "classifier_heldout_accuracy": clf_heldout,
        "voice_fidelity_seen": voice_seen,
        "voice_fidelity_heldout": voice_held,
        "voice_classifier_test_accuracy": voice_test,
        "voice_classifier_heldout_accuracy": voice_heldout,
        "ppl_fp32": ppl32,
        "ppl_int4": ppl4,
        "ppl_increase": ppl4 / ppl32 - 1.0 if ppl32 is not None else None,
        "distinct2": float(np.mean(distinct)) if distinct else 0.0,
        "distinct2_min": float(np.min(distinct)) if distinct else 0.0,
        "novelty": nov,
        "banned_hits": len(banned),
        "slot_violations": len(slot_bad),
        "samples": len(safety_lines),
    }
    checks = {
        "fidelity_seen": fid_seen >= THRESHOLDS["fidelity_seen"],
        "fidelity_heldout": fid_held >= THRESHOLDS["fidelity_heldout"],
        "ppl_increase": (
            None if ppl32 is None else figures["ppl_increase"] <= THRESHOLDS["ppl_increase_max"]
        ),
        "distinct2": figures["distinct2"] >= THRESHOLDS["distinct2"],
        "novelty": nov >= THRESHOLDS["novelty"],
        "banned_hits": len(banned) == 0,
        "slot_violations": len(slot_bad) == 0,
    }
    examples = [
        {"archetype": a, "persona": list(p), "state": s, "intent": i, "context": dict(c), "line": line}
        for (a, p, s, i, c), line in list(zip(seen_req, seen_lines))[:10] + list(zip(held_req, held_lines))[:10]
    ]
    return {
        "model_dir": str(model_dir) if model_dir else "shipped default",
        "config": asdict(cfg),
        "thresholds": THRESHOLDS,
        "figures": figures,
        "checks": checks,
        "passed": all(v is not False for v in checks.values()) and writer["passed"],
        "not_measured": [k for k, v in checks.items() if v is None],
        "banned_examples": banned[:20],
        "slot_violation_examples": slot_bad[:20],
        "sample_lines": examples,
        "heldout_pairs": [list(p) for p in split.heldout_pairs],
        "writer": writer,
        "seconds": time.perf_counter() - started,
    }
