"""Reference generations: one greedy line per archetype and state, as token ids.

Greedy (temperature 0) so that a port in another language can replay them without numpy's
random generator, and so that another onnxruntime version, whose kernels round differently in
the last bits, still reproduces them: a sampled token flips when the random draw falls within
rounding error of a boundary between two tokens, a greedy one only at an exact tie. (Bundles
exported before 2026-12-01 recorded sampled lines at temperature 0.8; their ``settings`` say
so and they are replayed as recorded.)

The exporter records them from the Python runtime (:class:`runtime.client.onnx_model.FlashOnnx` on
the source INT4 model) in the bundle's ``reference.json``; ``flashnpc bundle verify``
regenerates them from the bundle's ORT model in a fresh process and compares. Imports only
the runtime's onnxruntime decoder (no torch, no training code).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.client.onnx_model import FlashOnnx

SEED = 20261130
INTENT = "approach"
MAX_TOKENS = 16
TEMPERATURE = 0.0  # greedy: see the module docstring
TOP_P = 0.95


def reference_settings() -> dict[str, Any]:
    """The sampling settings reference lines use (stored in ``reference.json``)."""
    return {"seed": SEED, "intent": INTENT, "max_tokens": MAX_TOKENS, "temperature": TEMPERATURE,
            "top_p": TOP_P, "seed_rule": "seed + index, index = a * n_states + s"}


def generate_cases(model: FlashOnnx, settings: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """One case per (archetype, state) in catalog order: prompt ids, generated ids and text.

    Case ``index = a * n_states + s`` is sampled with seed ``settings["seed"] + index``.
    """
    s = dict(settings or reference_settings())
    tok = model.tokenizer
    if tok is None:
        raise ValueError("the model has no tokenizer")
    states = tok.catalog["states"]
    cases = []
    for a, arch in enumerate(tok.catalog["archetypes"]):
        for j, state in enumerate(states):
            index = a * len(states) + j
            prompt, _ = tok.encode_prompt(arch, (), state, s["intent"], {})
            ids = model.generate_ids(prompt, max_tokens=int(s["max_tokens"]),
                                     temperature=float(s["temperature"]), top_p=float(s["top_p"]),
                                     seed=int(s["seed"]) + index)
            cases.append({"archetype": arch, "state": state, "seed": int(s["seed"]) + index,
                          "prompt_ids": prompt, "ids": ids, "text": tok.decode(ids)})
    return cases


TIE_TOLERANCE = 0.1
"""How close, in logits, the two tokens where a replayed line parts from its reference may be for
that to count as a near tie rather than a mismatch: the ORT-format conversion and other
onnxruntime builds round the last bits differently, so a greedy line flips where its two best
tokens are this close. How far apart the builds drift depends on the CPU's kernels: on an
AVX2-only AMD EPYC (no AVX-512), onnxruntime 1.32 and 1.27 on the shipped model v3.2, over the
80 reference lines' 1,306 positions, moved the margin between a position's two best tokens by
0.0077 (median), 0.0415 (p99), 0.065 (max), and the farmer/patrol line parted at a margin of
0.0047 under 1.32 and 0.0185 under 1.27 (session 10; the earlier 0.01 had been set on a machine
with AVX-512, where a fine-tune's sailor/alert line parted at 0.0023). 0.1 sits above that
drift; a model that is really different (other weights, a wrong operator) parts from its
reference by whole logits, and at its first tokens."""


def _near_tie(model: FlashOnnx, case: Mapping[str, Any], at: int, got: list[int], tolerance: float) -> bool:
    """Whether ``model``'s logits after the reference's first ``at`` tokens put the token the
    reference took there and the one the replay took (``eos`` where a line ended) within
    ``tolerance``."""
    import numpy as np

    tok = model.tokenizer
    assert tok is not None
    want = list(case["ids"])
    prefix = [*case["prompt_ids"], *want[:at]]
    logits, _, _ = model.step(np.asarray([prefix], dtype=np.int64), None)
    row = logits[0, -1]
    a = want[at] if at < len(want) else tok.eos_id
    b = got[at] if at < len(got) else tok.eos_id
    return bool(abs(float(row[a]) - float(row[b])) <= tolerance)


def compare_cases(expected: list[Mapping[str, Any]], got: list[Mapping[str, Any]], *,
                  model: FlashOnnx | None = None, tolerance: float = TIE_TOLERANCE,
                  ties: list[str] | None = None) -> list[str]:
    """One message per case whose ids differ (or that one side lacks); empty when all match.
    ``model``: the model that replayed ``got``; a case that parts from its reference where that
    model's logits for the two tokens are within ``tolerance`` is a near tie
    (:data:`TIE_TOLERANCE`), not a mismatch, and is named in ``ties`` when given."""
    problems: list[str] = []
    want = {(c["archetype"], c["state"]): c for c in expected}
    have = {(c["archetype"], c["state"]): c for c in got}
    for key in sorted(set(want) | set(have)):
        if key not in want:
            problems.append(f"{key[0]}/{key[1]}: no reference line recorded")
        elif key not in have:
            problems.append(f"{key[0]}/{key[1]}: not generated")
        elif list(want[key]["ids"]) != list(have[key]["ids"]):
            w, h = list(want[key]["ids"]), list(have[key]["ids"])
            at = next((i for i, (x, y) in enumerate(zip(w, h)) if x != y), min(len(w), len(h)))
            if model is not None and _near_tie(model, want[key], at, h, tolerance):
                if ties is not None:
                    ties.append(f"{key[0]}/{key[1]} from position {at}")
                continue
            problems.append(f"{key[0]}/{key[1]} (seed {want[key]['seed']}): tokens differ from "
                            f"position {at}: expected {w[at:at + 4]}..., got {h[at:at + 4]}...")
    return problems


__all__ = ["INTENT", "MAX_TOKENS", "SEED", "TIE_TOLERANCE", "compare_cases", "generate_cases", "reference_settings"]
