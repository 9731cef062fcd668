"""Per-token latency of the Flash MoE graph variants, side by side, on one intra-op thread.

    python bench/moe_bench.py [--model CHECKPOINT_DIR] [--reps 7] [--steps 32] [--prompt 12] [--val 200]

Builds every variant from the same weights (a checkpoint's, or the default FlashConfig
randomly initialised with seed 0), then, round-robin across variants so machine noise hits
them alike, prefills a ``--prompt``-token prompt and decodes ``--steps`` tokens one at a time
with the KV cache, timing each ``session.run``. Prints medians (ms per decoded token, ms per
prefill) and each variant's ratio to the shipped variant (int4 qmoe at the exported accuracy
level), plus file size and quality against the PyTorch model (QAT fake-quant for INT4
variants): max relative logit error and greedy top-1 agreement over random sequences.

Variants:
  int4/qmoe    com.microsoft.QMoE over INT4 experts: truly sparse (the shipped one)
  int4/gather  GatherBlockQuantized of the selected experts' INT4 weights + MatMul: truly sparse
  int4/dense   all experts via one stacked MatMulNBits each way, gated: not sparse
  fp32/moe     com.microsoft.MoE, fp32 experts: sparse
  fp32/gather  Gather of the selected experts' fp32 weights + MatMul: sparse
  fp32/dense   all experts, fp32, gated: not sparse
INT4 variants run at accuracy_level 4 and 0.

Then the MoE block of layer 0 alone (``runtime.factory.export.build_moe_block``), one token per call:
the per-token cost of the expert computation itself, without attention and lm_head.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
import torch

from runtime.client.onnx_model import FlashOnnx, session_options
from runtime.factory.export import ExportOptions, build_moe_block, build_onnx, load_checkpoint
from runtime.factory.model import Flash, FlashConfig


@dataclass
class Variant:
    name: str
    options: ExportOptions
    sparse: bool
    model: FlashOnnx | None = None
    size: int = 0


def variants() -> list[Variant]:
    out = []
    for level in (4, 0):
        out += [
            Variant(f"int4/qmoe  acc{level}", ExportOptions("int4", "qmoe", level), True),
            Variant(f"int4/gather acc{level}", ExportOptions("int4", "gather", level), True),
            Variant(f"int4/dense acc{level}", ExportOptions("int4", "dense", level), False),
        ]
    out += [
        Variant("fp32/moe", ExportOptions("fp32", "moe"), True),
        Variant("fp32/gather", ExportOptions("fp32", "gather"), True),
        Variant("fp32/dense", ExportOptions("fp32", "dense"), False),
    ]
    return out


def decode_times(model: FlashOnnx, prompt: np.ndarray, steps: int) -> tuple[float, list[float]]:
    """(prefill seconds, per-step seconds) for greedy decoding of ``steps`` tokens."""
    t0 = time.perf_counter()
    logits, past, _ = model.step(prompt, None)
    prefill = time.perf_counter() - t0
    per_step = []
    for _ in range(steps):
        nxt = logits[:, -1].argmax(-1)[:, None]
        t0 = time.perf_counter()
        logits, past, _ = model.step(nxt, past)
        per_step.append(time.perf_counter() - t0)
    return prefill, per_step


def quality(torch_model: Flash, model: FlashOnnx, int4: bool, seqs: np.ndarray) -> tuple[float, float]:
    torch_model.set_qat(int4)
    with torch.no_grad():
        ref = torch_model(torch.from_numpy(seqs)).logits.numpy()
    got, _, _ = model.step(seqs, None)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    agree = float((got.argmax(-1) == ref.argmax(-1)).mean())
    return err, agree


def validation_sequences(model_dir: str, n: int) -> list[tuple[list[int], int]]:
    """(prompt + line + eos ids, prompt length) for the first ``n`` validation examples."""
    from pathlib import Path

    from runtime.factory.linebook import load_line_book
    from runtime.tokenizer import Tokenizer

    tok = Tokenizer.load(Path(model_dir) / "tokenizer.json")
    out = []
    for ex in load_line_book().split(seed=0).val[:n]:
        prompt, _ = tok.encode_prompt(ex.archetype, ex.persona, ex.state, ex.intent, ex.context)
        out.append(([*prompt, *tok.encode(ex.text), tok.eos_id], len(prompt)))
    return out


def line_nll(logits_fn, seqs: list[tuple[list[int], int]]) -> float:
    """Mean negative log-likelihood per line token (line + eos) given the prompt."""
    total, count = 0.0, 0
    for ids, n_prompt in seqs:
        logits = logits_fn(np.asarray([ids[:-1]], dtype=np.int64))[0, n_prompt - 1:].astype(np.float64)
        targets = np.asarray(ids[n_prompt:])
        z = logits - logits.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        total -= float(logp[np.arange(len(targets)), targets].sum())
        count += len(targets)
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint directory (default: random init)")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=12)
    parser.add_argument("--val", type=int, default=0, help="validation examples for the NLL column")
    parser.add_argument("--only", nargs="*", default=None, help="variant name prefixes to run")
    args = parser.parse_args()

    if args.model:
        sd, cfg_dict = load_checkpoint(args.model)
        cfg = FlashConfig(**{k: v for k, v in cfg_dict.items() if k in FlashConfig.__dataclass_fields__})
        source = args.model
    else:
        torch.manual_seed(0)
        cfg = FlashConfig()
        sd = Flash(cfg).state_dict()
        source = "random init (seed 0)"
    torch_model = Flash(cfg).eval()
    torch_model.load_state_dict(sd)
    print(f"weights: {source}; config: d={cfg.n_embd} layers={cfg.n_layer} experts={cfg.n_expert}x"
          f"{cfg.expert_hidden} top{cfg.top_k} vocab={cfg.vocab_size}")
    print(f"onnxruntime {ort.__version__}, 1 intra-op thread, no spinning, ORT_ENABLE_ALL; "
          f"prompt {args.prompt} tokens, {args.steps} decode steps x {args.reps} reps (round-robin)")

    chosen = [v for v in variants() if not args.only or any(v.name.startswith(p) for p in args.only)]
    config = {k: getattr(cfg, k) for k in FlashConfig.__dataclass_fields__}
    for v in chosen:
        graph = build_onnx(sd, cfg, v.options)
        blob = graph.SerializeToString()
        v.size = len(blob)
        session = ort.InferenceSession(blob, session_options(1), providers=["CPUExecutionProvider"])
        v.model = FlashOnnx(session, config)

    rng = np.random.default_rng(0)
    prompt = rng.integers(0, cfg.vocab_size, size=(1, args.prompt))
    seqs = rng.integers(0, cfg.vocab_size, size=(4, min(32, cfg.block_size)))
    prefill: dict[str, list[float]] = {v.name: [] for v in chosen}
    step: dict[str, list[float]] = {v.name: [] for v in chosen}
    for v in chosen:  # warm-up
        decode_times(v.model, prompt, 4)
    for _ in range(args.reps):
        for v in chosen:
            p, s = decode_times(v.model, prompt, args.steps)
            prefill[v.name].append(p)
            step[v.name].extend(s)

    val = validation_sequences(args.model, args.val) if args.model and args.val else []
    if val:
        for qat in (False, True):
            torch_model.set_qat(qat)
            with torch.no_grad():
                nll = line_nll(lambda ids: torch_model(torch.from_numpy(ids)).logits.numpy(), val)
            print(f"PyTorch {'QAT (INT4 fake-quant)' if qat else 'fp32'}: val NLL/token {nll:.4f}")

    base = next((v.name for v in chosen if v.name.startswith("int4/qmoe  acc4")), chosen[0].name)
    base_ms = statistics.median(step[base]) * 1e3
    print(f"\n{'variant':18s} {'sparse':>6s} {'ms/token':>9s} {'x ' + base.split()[0]:>12s} "
          f"{'prefill ms':>10s} {'MB':>6s} {'max rel err':>11s} {'top1 agree':>10s}"
          + (f" {'val NLL':>8s}" if val else ""))
    for v in chosen:
        ms = statistics.median(step[v.name]) * 1e3
        err, agree = quality(torch_model, v.model, v.options.weights == "int4", seqs)
        print(f"{v.name:18s} {'yes' if v.sparse else 'no':>6s} {ms:9.3f} {ms / base_ms:12.2f} "
              f"{statistics.median(prefill[v.name]) * 1e3:10.2f} {v.size / 1e6:6.2f} "
              f"{err:11.2e} {agree:10.3f}"
              + (f" {line_nll(lambda ids, m=v.model: m.step(ids, None)[0], val):8.4f}" if val else ""))
    print(f"\nratios are ms/token divided by {base}'s {base_ms:.3f} ms")

    # the MoE block alone, one token per call
    blocks = {}
    for v in chosen:
        blob = build_moe_block(sd, cfg, 0, v.options).SerializeToString()
        blocks[v.name] = ort.InferenceSession(blob, session_options(1), providers=["CPUExecutionProvider"])
    xs = rng.standard_normal((args.steps, 1, 1, cfg.n_embd)).astype(np.float32)
    times: dict[str, list[float]] = {name: [] for name in blocks}
    for _ in range(args.reps + 1):  # the first round warms up and is dropped
        for name, sess in blocks.items():
            for x in xs:
                t0 = time.perf_counter()
                sess.run(None, {"x": x})
                times[name].append(time.perf_counter() - t0)
    block_base = statistics.median(times[base][args.steps:]) * 1e6
    print(f"\nMoE block of layer 0 alone, 1 token per call:\n{'variant':18s} {'us/token':>9s} {'ratio':>6s}")
    for name in blocks:
        us = statistics.median(times[name][args.steps:]) * 1e6
        print(f"{name:18s} {us:9.1f} {us / block_base:6.2f}")


if __name__ == "__main__":
    main()
