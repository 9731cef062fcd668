"""Training loop for the Flash line model.

Read it top to bottom like nanoGPT's train.py: examples -> token sequences ->
padded batches in a seeded order -> AdamW with warmup + cosine decay and gradient
clipping -> INT4 quantization-aware training for the final ``qat_fraction`` of the
steps -> periodic checkpoints that a later run resumes from.

The loss covers only the line tokens and the final eos: the prompt (archetype,
persona, state, intent, context) is control input the model never has to produce.

Checkpoint directory layout (``out_dir``):
    model.pt         {"config", "model", "optimizer", "step", "train_config", "qat_start_step", ...}
    config.json      the FlashConfig as a dict
    tokenizer.json   the tokenizer (trained here unless one already exists in out_dir)
    catalog.json     LineBook.catalog()
    train_log.json   per-step records, validation losses and the final summary
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from runtime.factory.model import Flash, FlashConfig

IGNORE = -100


class ExampleLike(Protocol):
    """The fields of runtime.factory.linebook.Example the trainer reads."""

    archetype: str
    persona: tuple[str, ...]
    state: str
    intent: str
    context: tuple[tuple[str, str], ...]
    text: str


@dataclass
class TrainConfig:
    """Optimisation settings. The defaults are the ~20-minute CPU run of the default model.

    Measured 2026-11-30 on the 2-core project machine while other jobs shared it (load
    average ~3): 800 steps of 32 examples took 338 s including evaluation, 2,514 line-book
    tokens/s, with QAT steps no slower than the others; on a quiet moment single steps
    took ~0.2 s. 3000 steps (~2 epochs of the training split) therefore take ~21 minutes
    under that load and ~12 when the machine is idle, inside the 30-minute budget. The
    same schedule on one H200 (bf16 autocast, ~200 s a run) reached a validation
    cross-entropy of 0.929 (0.930 with the INT4 weights) at lr 1e-3, 0.938 at 2e-3 and
    1.73 at 4e-3 (unstable), still falling at the end: more steps help when there is time.
    """

    steps: int = 3000
    batch_size: int = 32
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    qat_fraction: float = 0.25  # INT4 fake quantization over the last quarter of the steps
    eval_interval: int = 250
    eval_examples: int = 512
    checkpoint_interval: int = 500
    log_interval: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_interval", "eval_examples",
                     "checkpoint_interval", "log_interval"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"TrainConfig: {name} must be a positive int, got {value!r}")
        if not 0.0 <= self.qat_fraction <= 1.0:
            raise ValueError(f"TrainConfig: qat_fraction must be in [0, 1], got {self.qat_fraction!r}")
        if self.warmup_steps < 0:
            raise ValueError(f"TrainConfig: warmup_steps must be >= 0, got {self.warmup_steps!r}")

    @property
    def qat_start_step(self) -> int:
        """First step trained with INT4 fake quantization (== steps when QAT is off)."""
        return self.steps - round(self.steps * self.qat_fraction)


def split_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a flat dict of settings into FlashConfig and TrainConfig keyword arguments."""
    model_keys = {f.name for f in fields(FlashConfig)}
    train_keys = {f.name for f in fields(TrainConfig)}
    model_kw, train_kw = {}, {}
    for key, value in overrides.items():
        if key in model_keys:
            model_kw[key] = value
        elif key in train_keys:
            train_kw[key] = value
        else:
            known = ", ".join(sorted(model_keys | train_keys))
            raise ValueError(f"unknown setting {key!r}; known settings: {known}")
    return model_kw, train_kw


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class TrainSeq:
    """One training sequence: prompt + line + eos token ids, and where the line starts."""

    ids: tuple[int, ...]
    line_start: int  # index of the first line token in ids (== prompt length)


def encode_example(tokenizer: Any, ex: ExampleLike) -> TrainSeq:
    prompt, _prefix_len = tokenizer.encode_prompt(ex.archetype, ex.persona, ex.state, ex.intent, ex.context)
    line = tokenizer.encode(ex.text)
    return TrainSeq(tuple(prompt) + tuple(line) + (tokenizer.eos_id,), len(prompt))


def encode_examples(tokenizer: Any, examples: Sequence[ExampleLike], block_size: int) -> tuple[list[TrainSeq], int]:
    """Encode examples; returns (sequences, number dropped for not fitting block_size + 1 tokens)."""
    out: list[TrainSeq] = []
    dropped = 0
    for ex in examples:
        seq = encode_example(tokenizer, ex)
        if len(seq.ids) > block_size + 1:
            dropped += 1
            continue
        out.append(seq)
    return out, dropped


def collate(seqs: Sequence[TrainSeq], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded (inputs, targets, loss_mask), each [B, T] with T = longest sequence - 1.

    targets[b, t] = ids[t + 1]; loss_mask is true where that target is a line token or
    the final eos. Right padding needs no attention mask: under the causal mask, real
    tokens never attend to the pads that follow them.
    """
    T = max(len(s.ids) for s in seqs) - 1
    x = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    y = torch.full((len(seqs), T), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.bool)
    for b, s in enumerate(seqs):
        ids = torch.tensor(s.ids, dtype=torch.long)
        n = len(s.ids) - 1
        x[b, :n] = ids[:-1]
        y[b, :n] = ids[1:]
        mask[b, s.line_start - 1:n] = True
    return x, y, mask


def batch_indices(n_examples: int, batch_size: int, step: int, seed: int,
                  lengths: Sequence[int] | None = None, group: int = 64) -> list[int]:
    """Example indices of the batch at ``step``: a pure function of its arguments.

    The data is walked in epochs, each a fresh permutation seeded by (seed, epoch), so a
    resumed run sees exactly the batches an uninterrupted run would have seen. With
    ``lengths``, each run of ``group`` consecutive batches is drawn as one pool, sorted
    by length, cut into batches of similar length and served in a seeded order: a third
    less padding on the line book than fully random batches, still randomly mixed.
    """
    if n_examples <= 0:
        raise ValueError("no training examples")
    if lengths is None:
        return _stream(n_examples, seed, step * batch_size, batch_size)
    pool_id, slot = divmod(step, group)
    pool = _stream(n_examples, seed, pool_id * group * batch_size, group * batch_size)
    pool.sort(key=lambda i: (lengths[i], i))
    g = torch.Generator().manual_seed(seed * 1_000_003 + 7919 * pool_id + 1)
    chunk = int(torch.randperm(group, generator=g)[slot])
    return pool[chunk * batch_size:(chunk + 1) * batch_size]


def _stream(n: int, seed: int, start: int, count: int) -> list[int]:
    """``count`` indices from position ``start`` of the endless stream of epoch permutations."""
    out: list[int] = []
    pos = start
    while len(out) < count:
        epoch, offset = divmod(pos, n)
        perm = _epoch_permutation(n, seed, epoch)
        take = min(count - len(out), n - offset)
        out.extend(perm[offset:offset + take])
        pos += take
    return out


_perm_cache: dict[tuple[int, int, int], list[int]] = {}


def _epoch_permutation(n: int, seed: int, epoch: int) -> list[int]:
    key = (n, seed, epoch)
    if key not in _perm_cache:
        if len(_perm_cache) > 2:  # a pool spans at most two epochs
            _perm_cache.clear()
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        _perm_cache[key] = torch.randperm(n, generator=g).tolist()
    return _perm_cache[key]


# --------------------------------------------------------------------------- schedule


BUDGET_PROBE_STEPS = 20
_PROBE_SKIP = 5
# an evaluation's forward-only batches, counted at half a training step each (measured: a third to a half)
_EVAL_BATCH_COST = 1 / 2


def steps_for_budget(budget_s: float, step_s: float, cfg: TrainConfig) -> int:
    """The most steps of ``step_s`` seconds each, with ``cfg``'s periodic and final
    validations, that fit in ``budget_s`` seconds (at most ``cfg.steps``, at least 1)."""
    eval_s = -(-cfg.eval_examples // cfg.batch_size) * step_s * _EVAL_BATCH_COST
    per_step = step_s + eval_s / cfg.eval_interval
    fit = int((budget_s - 3 * eval_s) / per_step)  # the two final validations, and a margin of one
    return max(1, min(cfg.steps, fit))


def _fit_budget(cfg: TrainConfig, left_s: float, step_s: float) -> tuple[TrainConfig, dict[str, Any]]:
    """``cfg`` cut to the steps that fit in ``left_s`` more seconds after the probe."""
    steps = BUDGET_PROBE_STEPS + steps_for_budget(left_s, step_s, cfg) if left_s > 0 else BUDGET_PROBE_STEPS
    steps = min(cfg.steps, steps)
    cut = cfg if steps == cfg.steps else replace(cfg, steps=steps,
                                                 warmup_steps=min(cfg.warmup_steps, max(1, steps // 10)))
    return cut, {"left_s_after_probe": left_s, "probe_steps": BUDGET_PROBE_STEPS, "step_s": step_s,
                 "steps_asked": cfg.steps, "steps": steps}


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to ``lr``, then cosine decay to ``min_lr`` at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


# --------------------------------------------------------------------------- checkpoints


def save_checkpoint(out_dir: Path, model: Flash, optimizer: torch.optim.Optimizer, step: int,
                    train_cfg: TrainConfig, log: dict[str, Any]) -> None:
    """Write model.pt, config.json and train_log.json atomically (temp file + rename)."""
    state = {
        "config": asdict(model.config),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "train_config": asdict(train_cfg),
        "qat_start_step": train_cfg.qat_start_step,
        "num_params": model.num_params(),
    }
    _atomic(out_dir / "model.pt", lambda p: torch.save(state, p))
    _write_json(out_dir / "config.json", asdict(model.config))
    _write_json(out_dir / "train_log.json", log)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[Flash, dict[str, Any]]:
    """Load ``model.pt`` (or the directory holding it); returns (model in eval mode, raw checkpoint dict)."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.pt"
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    ckpt = torch.load(path, map_location=map_location, weights_only=False)
    model = Flash(FlashConfig(**ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    return model.eval(), ckpt


def _atomic(path: Path, write: Callable[[Path], None]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def _write_json(path: Path, obj: Any) -> None:
    _atomic(path, lambda p: p.write_text(json.dumps(obj, indent=2) + "\n"))


# --------------------------------------------------------------------------- training


@torch.no_grad()
def evaluate(model: Flash, seqs: Sequence[TrainSeq], pad_id: int, device: torch.device,
             batch_size: int = 64) -> float:
    """Mean cross-entropy per line token (eos included) over ``seqs``."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(seqs), batch_size):
        x, y, mask = (t.to(device) for t in collate(seqs[i:i + batch_size], pad_id))
        with _autocast(device):
            out = model(x, y, loss_mask=mask)
        n = int(mask.sum())
        total += float(out.ce_loss) * n
        count += n
    model.train(was_training)
    return total / max(count, 1)


def _autocast(device: torch.device) -> torch.autocast:
    # bf16 on GPUs; on CPU plain fp32 is faster for a model this small
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def train(
    out_dir: str | Path,
    *,
    train_examples: Sequence[ExampleLike],
    val_examples: Sequence[ExampleLike],
    tokenizer: Any,
    catalog: dict[str, Any],
    model_config: FlashConfig | None = None,
    train_config: TrainConfig | None = None,
    device: str = "cpu",
    resume: bool = False,
    init_from: Flash | None = None,
    progress: bool = True,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    budget_s: float | None = None,
) -> dict[str, Any]:
    """Train a Flash model into ``out_dir`` and return the final train log.

    ``tokenizer`` must already be trained (the CLI trains or loads it); the model's
    vocab_size is set to the tokenizer's. With ``resume`` and a ``model.pt`` in
    ``out_dir`` training continues from the saved step with the saved model config and
    optimizer state (``train_config``, when given, still applies, e.g. more steps).
    ``on_step(step, record)`` is called after every optimiser step. ``model_config.qat`` is
    ignored: QAT is switched on at ``train_config.qat_start_step``.

    ``init_from``: a trained model to start from (a warm start, :func:`initial_model`), used
    when there is no checkpoint to resume: its config replaces ``model_config``, its weights the
    random init; the optimizer and the schedule (``train_config``) start fresh. ``tokenizer``
    must be the one it was trained with.

    ``budget_s``: fit the run to about this many seconds of training loop (for a machine lent
    for a fixed time). The first :data:`BUDGET_PROBE_STEPS` steps are timed and the schedule is
    cut to the steps that fit (:func:`steps_for_budget`, never more than ``train_config.steps``
    and never fewer than the probe); the cosine decay and the QAT phase follow the cut
    schedule, and the log's ``budget`` says what was measured and chosen. A resumed run's
    schedule is not cut.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(device)
    ckpt_path = out / "model.pt"
    ckpt: dict[str, Any] | None = None
    if resume and ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model_cfg = FlashConfig(**ckpt["config"])
        tcfg = train_config or TrainConfig(**ckpt["train_config"])
    elif init_from is not None:
        model_cfg = FlashConfig(**asdict(init_from.config))
        tcfg = train_config or TrainConfig()
    else:
        model_cfg = FlashConfig(**asdict(model_config or FlashConfig()))
        tcfg = train_config or TrainConfig()
    if model_cfg.vocab_size != tokenizer.vocab_size:
        if init_from is not None and ckpt is None:
            raise ValueError(f"init model vocab_size {model_cfg.vocab_size} != tokenizer vocab_size "
                             f"{tokenizer.vocab_size}: a warm start needs the model's own tokenizer")
        if ckpt is not None:
            raise ValueError(
                f"checkpoint vocab_size {model_cfg.vocab_size} != tokenizer vocab_size {tokenizer.vocab_size} in {out}"
            )
        model_cfg.vocab_size = tokenizer.vocab_size

    torch.manual_seed(tcfg.seed)
    model_cfg.qat = False
    model = Flash(model_cfg).to(dev)
    optimizer = model.configure_optimizer(tcfg.lr, tcfg.weight_decay, (tcfg.beta1, tcfg.beta2))
    start_step = 0
    log: dict[str, Any] = {"records": [], "val": []}
    if ckpt is None and init_from is not None:
        model.load_state_dict(init_from.state_dict())
        log["init_from"] = getattr(init_from, "source", None)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_step = int(ckpt["step"])
        log_path = out / "train_log.json"
        if log_path.exists():
            log = json.loads(log_path.read_text())
            log["records"] = [r for r in log.get("records", []) if r["step"] < start_step]
            log["val"] = [v for v in log.get("val", []) if v["step"] <= start_step]
        log["resumed_at"] = [*log.get("resumed_at", []), start_step]

    tokenizer.save(out / "tokenizer.json")
    _write_json(out / "catalog.json", catalog)

    train_seqs, dropped_train = encode_examples(tokenizer, train_examples, model_cfg.block_size)
    val_seqs, dropped_val = encode_examples(tokenizer, val_examples, model_cfg.block_size)
    val_seqs = val_seqs[:: max(1, len(val_seqs) // tcfg.eval_examples)][: tcfg.eval_examples]  # spread over the split
    if not train_seqs:
        raise ValueError(f"no training example fits block_size {model_cfg.block_size}")
    log.update({
        "model_config": asdict(model_cfg),
        "train_config": asdict(tcfg),
        "num_params": model.num_params(),
        "train_examples": len(train_seqs),
        "dropped_too_long": dropped_train + dropped_val,
        "device": str(dev),
        "threads": torch.get_num_threads(),
    })

    lengths = [len(s.ids) for s in train_seqs]
    model.train()
    pad_id = tokenizer.pad_id
    bar = _progress(initial=start_step, total=tcfg.steps, enabled=progress)
    tokens_seen, t0 = 0, time.perf_counter()
    t_probe = t0
    completed = start_step  # optimiser steps applied so far
    probe_end = start_step + BUDGET_PROBE_STEPS if budget_s is not None and ckpt is None else None
    try:
        step = start_step
        while step < tcfg.steps:
            if step == start_step + _PROBE_SKIP:
                t_probe = time.perf_counter()  # the first steps warm caches and kernels up
            if step == probe_end:
                now = time.perf_counter()
                tcfg, log["budget"] = _fit_budget(tcfg, budget_s - (now - t0),
                                                  (now - t_probe) / (step - start_step - _PROBE_SKIP))
                bar.total = tcfg.steps
                if step >= tcfg.steps:
                    break
            if step >= tcfg.qat_start_step and not model.config.qat:
                model.set_qat(True)
            lr = learning_rate(step, tcfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            order = batch_indices(len(train_seqs), tcfg.batch_size, step, tcfg.seed, lengths)
            batch = [train_seqs[i] for i in order]
            x, y, mask = (t.to(dev) for t in collate(batch, pad_id))
            with _autocast(dev):
                result = model(x, y, loss_mask=mask)
            optimizer.zero_grad(set_to_none=True)
            result.loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
            optimizer.step()
            completed = step + 1

            tokens_seen += int((x != pad_id).sum())
            elapsed = time.perf_counter() - t0
            record = {
                "step": step,
                "loss": result.loss.item(),
                "ce": result.ce_loss.item(),
                "aux": result.aux_loss.item(),
                "lr": lr,
                "grad_norm": float(grad_norm),
                "qat": model.config.qat,
                "tokens_per_s": tokens_seen / max(elapsed, 1e-9),
                "elapsed_s": elapsed,
            }
            if step % tcfg.log_interval == 0 or step == tcfg.steps - 1:
                log["records"].append(record)
            if progress and step % tcfg.log_interval == 0:
                bar.set_postfix(loss=f"{record['ce']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}",
                                qat=int(record["qat"]))
            if completed % tcfg.eval_interval == 0 or completed == tcfg.steps:
                val_ce = evaluate(model, val_seqs, pad_id, dev)
                log["val"].append({"step": completed, "val_ce": val_ce, "qat": model.config.qat})
            if completed % tcfg.checkpoint_interval == 0 and completed != tcfg.steps:
                save_checkpoint(out, model, optimizer, completed, tcfg, log)
            if on_step is not None:
                on_step(step, record)
            bar.update(1)
            step += 1
    except KeyboardInterrupt:
        save_checkpoint(out, model, optimizer, completed, tcfg, log)  # so --resume picks up here
        raise
    finally:
        bar.close()

    final_step = max(start_step, tcfg.steps)
    qat_on = model.config.qat
    model.set_qat(False)
    fp32_val = evaluate(model, val_seqs, pad_id, dev)
    model.set_qat(True)
    int4_val = evaluate(model, val_seqs, pad_id, dev)
    model.set_qat(qat_on)
    log["final"] = {
        "step": final_step,
        "val_ce_fp32": fp32_val,
        "val_ce_int4": int4_val,
        "train_ce_last": log["records"][-1]["ce"] if log["records"] else None,
        "wall_s_this_run": time.perf_counter() - t0,
        "tokens_per_s_this_run": tokens_seen / max(time.perf_counter() - t0, 1e-9),
    }
    save_checkpoint(out, model, optimizer, final_step, tcfg, log)
    return log


def initial_model(path: str | Path) -> tuple[Flash, Any]:
    """(model, tokenizer) to warm-start training from (``train(init_from=...)``).

    ``path`` is a checkpoint directory (``model.pt``, as ``flashnpc train`` writes it) or an
    exported model directory (``model.int4.onnx``: its weights are rebuilt exactly, see
    :func:`runtime.serving.batched_engine.flash_from_onnx`). The model's output layer is tied to
    its embedding again (the graph stores them apart, the INT4 head beside the fp16 table; the
    fp16 table is kept), so the result trains and saves like any Flash model.
    """
    from runtime.serving.batched_engine import load_flash

    root = Path(path)
    if (root / "model.pt").is_file():
        model, tok, _ = load_flash(root, checkpoint=root)
    else:
        model, tok, _ = load_flash(root)
    model.lm_head.weight = model.transformer.wte.weight
    model.source = str(root)
    return model.float(), tok


def _progress(it: range | None = None, *, initial: int, total: int, enabled: bool) -> Any:
    """A tqdm bar over ``it``, or one updated by hand when ``it`` is None (a schedule that a
    budget may cut)."""
    from tqdm import tqdm

    return tqdm(it, initial=initial, total=total, desc="train", unit="step", dynamic_ncols=True,
                disable=not enabled)
