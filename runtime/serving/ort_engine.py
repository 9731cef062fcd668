"""Continuous batching over the shipped INT4 ONNX graph: the dialogue server's CPU engine.

:class:`OrtBatchedEngine` is a :class:`runtime.serving.batched_engine.BatchedEngine` (same requests,
results, admission, sampling, word-constraint masks and streaming; a request's tokens depend
only on its seed) whose forward pass is one onnxruntime call of the shipped graph
(``model.int4.onnx``: MatMulNBits attention, QMoE experts) instead of PyTorch eager.

Why: on a CPU, PyTorch eager reads the dequantized float32 weights (10M parameters, 40 MB)
and runs many small operators per step; the INT4 graph reads 4-bit weights through fused
kernels. In ``bench/serve_bench.py`` (both engines side by side, one thread) a step over 8 /
64 rows took 5.7 / 17.0 ms on PyTorch and 2.4 / 11.2 ms here, sampling included.

How the batch is kept: keys and values live in the graph's own layout, ``past`` arrays
[B, n_head, P, head_dim] with **left padding** and an ``attention_mask`` [B, P]; row ``i`` is
slot ``i``. A step runs the decoding rows (one token each, ``position_ids`` = each row's own
length) and, in a second call, the newly admitted prompts (left-padded together); the two
``present`` outputs are padded on the left to one length and stacked. Leading columns that
no row attends to any more are cut off after every step, so ``P`` stays the longest live
row's length instead of growing with the engine's uptime. No prefix block cache: a prompt is
~10 tokens and its prefill is one call for all new rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from runtime.client.constraints import WordConstraint
from runtime.client.onnx_model import FlashOnnx
from runtime.factory.model import FlashConfig
from runtime.serving.batched_engine import BatchedEngine, _Seq

__all__ = ["OrtBatchedEngine"]


class OrtBatchedEngine(BatchedEngine):
    """Continuous batching through onnxruntime; see the module docstring.

    ``threads``: onnxruntime intra-op threads (1 suits a small shared machine; the service
    sets the same for torch's sampling ops)."""

    def __init__(self, model: FlashOnnx, *, max_batch: int = 64, max_prefill_tokens: int | None = None,
                 banned_words: Sequence[str] = (), words: WordConstraint | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if model.tokenizer is None:
            raise ValueError("the ONNX model has no tokenizer (load it with FlashOnnx.load)")
        self.model = model
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        fields = FlashConfig.__dataclass_fields__
        self.config = FlashConfig(**{k: v for k, v in model.config.items() if k in fields})
        self.tokenizer = model.tokenizer
        if self.tokenizer.vocab_size != self.config.vocab_size:
            raise ValueError(f"tokenizer vocab {self.tokenizer.vocab_size} != model vocab "
                             f"{self.config.vocab_size}")
        self.n_moe = self.config.n_layer if self.config.n_expert > 1 else 0
        self.moe_impl = "ort-qmoe"
        self.cuda_graphs = False
        self._init_rows(max_batch, max_prefill_tokens, words or WordConstraint(banned_words, self.tokenizer))
        # the last step's outputs, stacked lazily (see _materialize); _order: compaction since
        self._groups: list[tuple[list[np.ndarray], np.ndarray]] = [
            (model.empty_past(0), np.zeros((0, 0), dtype=np.int64))]
        self._order: np.ndarray | None = None
        self._run_outputs = model._outputs
        self.calls = 0

    @classmethod
    def load(cls, model_dir: str | Path | None = None, *, threads: int = 1,
             **options: Any) -> OrtBatchedEngine:  # type: ignore[override]
        """The shipped model (or ``model_dir``) with its word constraints."""
        from runtime.client.constraints import read_constraints
        from runtime.paths import DEFAULT_MODEL_DIR

        root = Path(model_dir) if model_dir is not None else DEFAULT_MODEL_DIR
        model = FlashOnnx.load(root, threads=threads)
        if "words" not in options and "banned_words" not in options:
            assert model.tokenizer is not None
            options["words"] = read_constraints(root).word_constraint(model.tokenizer)
        return cls(model, **options)

    # ------------------------------------------------------------ forward

    def _call(self, ids: np.ndarray, past: list[np.ndarray], mask: np.ndarray, pos: np.ndarray
              ) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
        """One graph call (no length check against ``block_size``: the padded length may pass
        it while every row's own positions stay inside)."""
        m = self.model
        feeds = {"input_ids": ids, "position_ids": pos, "attention_mask": mask}
        feeds.update(zip(m._past_names, past))
        out = m.session.run(self._run_outputs, feeds)
        self.calls += 1
        return out[m._logits_at], [out[i] for i in m._present_at], out[m._router_at]

    def _run(self, n_dec: int, new: list[_Seq]) -> tuple[Tensor, Tensor | None]:
        logits: list[np.ndarray] = []
        confs: list[np.ndarray] = []
        groups: list[tuple[list[np.ndarray], np.ndarray]] = []
        if n_dec:
            past, mask = self._materialize()
            mask = np.concatenate([mask, np.ones((n_dec, 1), np.int64)], axis=1)
            pos = self._pos[:n_dec, None].copy()
            lg, present, router = self._call(self._next[:n_dec, None].copy(), past, mask, pos)
            logits.append(lg[:, -1])
            confs.append(router.reshape(router.shape[0], n_dec, -1).max(axis=-1).mean(axis=0))
            groups.append((present, mask))
            self._pos[:n_dec] += 1
        if new:
            lens = [len(seq.req.ids) for seq in new]
            t = max(lens)
            ids = np.zeros((len(new), t), np.int64)
            mask = np.zeros((len(new), t), np.int64)
            pos = np.zeros((len(new), t), np.int64)
            for j, (seq, n) in enumerate(zip(new, lens)):
                ids[j, t - n:] = seq.req.ids
                mask[j, t - n:] = 1
                pos[j, t - n:] = np.arange(n)
                self._pos[n_dec + j] = n
            lg, present, router = self._call(ids, self.model.empty_past(len(new)), mask, pos)
            logits.append(lg[:, -1])
            last = router.reshape(router.shape[0], len(new), t, -1)[:, :, -1]
            confs.append(last.max(axis=-1).mean(axis=0))
            groups.append((present, mask))
        self._groups = groups
        self._order = None
        lg_all = np.concatenate(logits) if len(logits) > 1 else logits[0]
        conf = np.concatenate(confs) if len(confs) > 1 else confs[0]
        return torch.from_numpy(np.ascontiguousarray(lg_all)), torch.from_numpy(conf.astype(np.float32))

    def _materialize(self) -> tuple[list[np.ndarray], np.ndarray]:
        """The running rows' past and mask as single arrays, built with one copy from the last
        step's outputs: the decode and prefill groups stacked (left-padded to one length), the
        rows compaction kept in their new order, and the leading columns no row attends to cut.
        The last step's arrays are reused as they are when nothing needs changing."""
        groups, order = self._groups, self._order
        if len(groups) == 1 and order is None:
            present, mask = groups[0]
            if not mask.size or mask[:, 0].any():
                return present, mask
        # where every running row comes from (group, row in group) and the first column it
        # attends to in the common frame, in the order compaction kept
        sizes = [m.shape[0] for _, m in groups]
        gid = np.repeat(np.arange(len(groups)), sizes)
        rid = np.concatenate([np.arange(k) for k in sizes])
        length = max(m.shape[1] for _, m in groups)
        starts = np.concatenate([length - m.shape[1] + m.argmax(axis=1) for _, m in groups])
        if order is not None:
            gid, rid, starts = gid[order], rid[order], starts[order]
        n = len(gid)
        first = int(starts.min()) if n else 0
        width = length - first
        mask = np.zeros((n, width), np.int64)
        h, d = self.n_head, self.head_dim
        past = [np.zeros((n, h, width, d), np.float32) for _ in range(2 * self.config.n_layer)]
        for g, (present, gmask) in enumerate(groups):
            dst = np.nonzero(gid == g)[0]
            if not len(dst):
                continue
            from_rows = rid[dst]
            off = length - gmask.shape[1] - first  # where this group's column 0 lands
            lo = max(0, -off)  # group columns before the cut are dropped
            mask[dst, off + lo:] = gmask[from_rows, lo:]
            for out, p in zip(past, present):
                out[dst, :, off + lo:] = p[from_rows, :, lo:]
        self._groups, self._order = [(past, mask)], None
        return past, mask

    # ------------------------------------------------------------ bookkeeping

    def _compact_kv(self, order: np.ndarray, dst: Tensor | None, src: Tensor | None,
                    movers: np.ndarray) -> None:
        # rows are gathered in their new order when the next step materializes them
        self._order = order if self._order is None else self._order[order]

    def fail_all(self) -> list[Any]:
        out = super().fail_all()
        self._groups = [(self.model.empty_past(0), np.zeros((0, 0), dtype=np.int64))]
        self._order = None
        return out

    @property
    def past(self) -> list[np.ndarray]:
        """The running rows' keys/values [B, n_head, P, head_dim] per layer (k, v), left-padded."""
        return self._materialize()[0]

    @property
    def mask(self) -> np.ndarray:
        """The running rows' attention mask [B, P] (0: padding)."""
        return self._materialize()[1]

    def describe(self) -> dict[str, Any]:
        return {"device": "cpu", "dtype": "int4 weights (onnxruntime)", "moe": self.moe_impl,
                "max_batch": self.max_batch, "block_cache": None, "cuda_graphs": False,
                "threads": self.model.session.get_session_options().intra_op_num_threads}

