"""The minimal onnxruntime decoder for an exported Flash model (what eval and the engine build on).

A model directory (``flashnpc export onnx`` output; default: the shipped ``runtime/assets/flash/``)
holds ``model.int4.onnx`` (shipped), ``model.onnx`` (fp32 reference), ``tokenizer.json``,
``config.json`` and ``catalog.json``. The graph interface is documented in
:mod:`runtime.factory.export`; :meth:`FlashOnnx.step` is one call of it.

The session is tuned for a game client sharing the CPU: ``intra_op_num_threads=1`` by default,
no spinning thread pool (``session.intra_op.allow_spinning=0``), all graph optimisations.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from runtime.client.sampling import DEFAULT_TEMPERATURE, DEFAULT_TOP_P, sample_next
from runtime.paths import DEFAULT_MODEL_DIR

if TYPE_CHECKING:
    from runtime.client.bundle import Bundle
    from runtime.tokenizer import Tokenizer


def session_options(threads: int = 1) -> ort.SessionOptions:
    """Session options for a client: ``threads`` intra-op threads, no spinning, ORT_ENABLE_ALL."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def ort_session_options(threads: int = 1) -> ort.SessionOptions:
    """:func:`session_options` for an ORT-format model (a bundle's): ``session.load_model_format
    = ORT``, and no graph optimisation at load, since the converter already applied them for the
    bundle's target (re-optimising would rewrite the graph for the host, and a minimal mobile
    build has no optimisers: this way desktop runs exactly the graph a phone runs)."""
    so = session_options(threads)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.load_model_format", "ORT")
    return so


class FlashOnnx:
    """An exported Flash model in an onnxruntime session, with its tokenizer, config and catalog.

    ``past`` / ``present`` are lists of 2 * n_layer float32 arrays in graph order
    (key_0, value_0, key_1, value_1, ...), each [B, n_head, P, head_dim].
    """

    bundle: Bundle | None = None

    def __init__(self, session: ort.InferenceSession, config: Mapping[str, Any], *,
                 tokenizer: Tokenizer | None = None, catalog: Mapping[str, Any] | None = None) -> None:
        self.session = session
        self.root: Path | None = None  # the directory its files were opened from (open_files)
        self.config: dict[str, Any] = dict(config)
        self.tokenizer = tokenizer  # type: ignore[assignment]
        self.catalog: dict[str, Any] = dict(catalog or {})
        try:
            self.n_layer = int(self.config["n_layer"])
            self.n_head = int(self.config["n_head"])
            self.head_dim = int(self.config["n_embd"]) // self.n_head
            self.block_size = int(self.config["block_size"])
        except KeyError as exc:
            raise ValueError(f"model config is missing {exc.args[0]!r}") from exc
        inputs = {i.name for i in session.get_inputs()}
        want = {"input_ids", "position_ids", "attention_mask"}
        want |= {f"past_{k}_{i}" for i in range(self.n_layer) for k in ("key", "value")}
        if missing := sorted(want - inputs):
            raise ValueError(f"ONNX graph lacks inputs {missing}: not a Flash export for this config")
        self._outputs = [o.name for o in session.get_outputs()]
        self._present = [f"present_{k}_{i}" for i in range(self.n_layer) for k in ("key", "value")]
        self._past_names = [f"past_{k}_{i}" for i in range(self.n_layer) for k in ("key", "value")]
        self._logits_at = self._outputs.index("logits")
        self._router_at = self._outputs.index("router_probs")
        self._present_at = [self._outputs.index(n) for n in self._present]
        # read-only step inputs shared by every call (no allocation per step): positions, all-ones mask
        self._positions = np.arange(self.block_size, dtype=np.int64)
        self._positions.flags.writeable = False
        self._ones = np.ones(0, dtype=np.int64)

    @classmethod
    def load(cls, model_dir: str | Path | None = None, *, file: str = "model.int4.onnx",
             threads: int = 1) -> FlashOnnx:
        """Open ``model_dir/file`` (default: the shipped model) with its tokenizer/config/catalog.

        ``model_dir`` may also be a bundle from ``flashnpc export mobile`` (a directory with
        ``manifest.json``, or its zip): it is verified (:func:`runtime.client.bundle.open_bundle`:
        schema, format version, file sizes and hashes), ``file`` is ignored for the model the
        manifest names, and the ORT-format model opens with :func:`ort_session_options`.
        ``self.bundle`` is then the opened :class:`runtime.client.bundle.Bundle` (else None).
        """
        from runtime.client.bundle import is_bundle, open_bundle

        root = Path(model_dir) if model_dir is not None else DEFAULT_MODEL_DIR
        if is_bundle(root):
            bundle = open_bundle(root)
            model = cls.open_files(bundle.root, bundle.model_file, ort_session_options(threads))
            model.bundle = bundle
            return model
        return cls.open_files(root, file, session_options(threads))

    @classmethod
    def open_files(cls, root: Path, file: str, options: ort.SessionOptions) -> FlashOnnx:
        """Open ``root/file`` with ``options`` and the side files beside it, with no bundle check
        (what :meth:`load` does once it has chosen the file and options)."""
        for name in (file, "config.json", "tokenizer.json"):
            if not (root / name).is_file():
                raise FileNotFoundError(f"{root / name}: missing (export a model with `flashnpc export onnx`)")
        from runtime.tokenizer import Tokenizer

        config = json.loads((root / "config.json").read_text())
        catalog_path = root / "catalog.json"
        catalog = json.loads(catalog_path.read_text()) if catalog_path.is_file() else {}
        session = ort.InferenceSession(str(root / file), options, providers=["CPUExecutionProvider"])
        model = cls(session, config, tokenizer=Tokenizer.load(root / "tokenizer.json"), catalog=catalog)
        model.root = root
        return model

    def _all_ones(self, n: int) -> np.ndarray:
        """A read-only all-ones int64 vector of length ``n``: a view of a buffer grown on demand."""
        ones = self._ones
        if ones.size < n:
            ones = np.ones(max(n, 8 * self.block_size), dtype=np.int64)
            ones.flags.writeable = False
            self._ones = ones  # replaced whole, so a concurrent caller never sees a partial buffer
        return ones[:n]

    def empty_past(self, batch: int) -> list[np.ndarray]:
        """Past tensors of length 0 for ``batch`` rows."""
        shape = (batch, self.n_head, 0, self.head_dim)
        return [np.zeros(shape, np.float32) for _ in range(2 * self.n_layer)]

    def step(self, input_ids: np.ndarray, past: list[np.ndarray] | None, *,
             attention_mask: np.ndarray | None = None, position_ids: np.ndarray | None = None,
             ) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
        """Run ``input_ids`` [B, T] after ``past`` (None = nothing cached).

        Returns (logits [B, T, V], present (past for the next step), router_probs
        [n_moe_layers, B*T, n_expert]). Positions default to P + arange(T) and the mask to all
        ones; pass both for left-padded batches (see :mod:`runtime.factory.export`).
        """
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or ids.shape[1] == 0 or ids.dtype.kind not in "iu":
            raise ValueError(f"input_ids must be a non-empty integer [batch, time] array, got "
                             f"shape {ids.shape} dtype {ids.dtype}")
        b, t = ids.shape
        if past is None:
            past = self.empty_past(b)
        if len(past) != 2 * self.n_layer:
            raise ValueError(f"past has {len(past)} arrays, expected {2 * self.n_layer} (k, v per layer)")
        p = past[0].shape[2]
        if past[0].shape[0] != b:
            raise ValueError(f"past batch {past[0].shape[0]} != input_ids batch {b}")
        if p + t > self.block_size:
            raise ValueError(f"{p} cached + {t} new tokens exceed the context of {self.block_size}")
        if position_ids is None:
            position_ids = self._positions[None, p : p + t] if b == 1 else np.broadcast_to(
                self._positions[p : p + t], (b, t))
        if attention_mask is None:
            attention_mask = self._all_ones(b * (p + t)).reshape(b, p + t)
        if np.shape(attention_mask) != (b, p + t):
            raise ValueError(f"attention_mask shape {np.shape(attention_mask)} != (batch, past + new) "
                             f"= {(b, p + t)}")
        if np.shape(position_ids) != (b, t):
            raise ValueError(f"position_ids shape {np.shape(position_ids)} != input_ids shape {(b, t)}")
        feeds: dict[str, np.ndarray] = {
            "input_ids": ids.astype(np.int64, copy=False),
            "position_ids": np.ascontiguousarray(position_ids, dtype=np.int64),
            "attention_mask": np.ascontiguousarray(attention_mask, dtype=np.int64),
        }
        for name, array in zip(self._past_names, past):
            feeds[name] = array
        out = self.session.run(self._outputs, feeds)
        return out[self._logits_at], [out[i] for i in self._present_at], out[self._router_at]

    def generate_ids(self, prompt_ids: Sequence[int], *, max_tokens: int = 48,
                     temperature: float = DEFAULT_TEMPERATURE, top_k: int = 0, top_p: float = DEFAULT_TOP_P,
                     seed: int | None = None, eos_id: int | None = None) -> list[int]:
        """Sample a continuation of ``prompt_ids``: prefill once, then one token per step with the KV cache.

        Returns the new ids without the final ``eos``; stops at ``eos``, after
        ``max_tokens`` or when the context is full. Same seed + same prompt = same ids.
        """
        if len(prompt_ids) == 0:
            raise ValueError("prompt_ids is empty")
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if eos_id is None:
            if self.tokenizer is None:
                raise ValueError("no tokenizer loaded: pass eos_id")
            eos_id = self.tokenizer.eos_id
        rng = np.random.default_rng(seed)
        budget = min(max_tokens, self.block_size - len(prompt_ids))
        out: list[int] = []
        if budget <= 0:
            return out
        logits, past, _ = self.step(np.asarray([prompt_ids], dtype=np.int64), None)

        def pick(_row: int, row_logits: np.ndarray) -> tuple[int | None, bool]:
            nxt = sample_next(row_logits, rng, temperature=temperature, top_k=top_k, top_p=top_p)
            if nxt == eos_id:
                return None, False
            out.append(nxt)
            return nxt, len(out) < budget

        for _ in decode_rows(self, logits, past, 1, pick):
            pass
        return out

    def generate(self, archetype: str, state: str, *, persona: Sequence[str] = (),
                 intent: str = "approach",
                 context: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
                 seed: int | None = None, max_tokens: int = 48, temperature: float = DEFAULT_TEMPERATURE,
                 top_p: float = DEFAULT_TOP_P) -> str:
        """One line for the request; slot markers such as ``{player}`` are left in the text."""
        if self.tokenizer is None:
            raise ValueError("no tokenizer loaded: use FlashOnnx.load(model_dir)")
        ids, _ = self.tokenizer.encode_prompt(archetype, persona, state, intent, context or {})
        new = self.generate_ids(ids, max_tokens=max_tokens, temperature=temperature,
                                top_p=top_p, seed=seed)
        return self.tokenizer.decode(new)


def decode_rows(model: FlashOnnx, logits: np.ndarray, past: list[np.ndarray], n_rows: int,
                pick: Callable[[int, np.ndarray], tuple[int | None, bool]], *,
                attention_mask: np.ndarray | None = None, next_pos: np.ndarray | None = None,
                on_step: Callable[[list[int], np.ndarray], None] | None = None,
                overlap: Callable[[list[int]], Future[Any]] | None = None,
                ) -> Iterator[tuple[int, int]]:
    """The decode loop: ``n_rows`` sequences in lock step after their prefill, one token per step.

    ``logits`` [B, T, V] and ``past`` come from the prefill (the last position of each row is
    read). For every live row ``b``, ``pick(b, logits_row)`` returns ``(token, more)``: the token
    the row emits (None: none) and whether the row goes on, in which case the token is fed
    back. Rows that stop leave the batch (their keys/values are dropped). Left-padded batches
    pass their ``attention_mask`` [B, P] and each row's next position ``next_pos`` [B]; both grow
    with every step. ``on_step(rows, router_probs)`` is called after each step with the rows it
    ran. Yields ``(b, token)`` for every emitted token, in order.

    ``overlap(rows)``, called just before each step with the rows it runs, starts work that
    needs only the tokens fed (e.g. on a worker thread: the model releases the GIL while it
    computes) and returns its future; the step's logits go to ``pick`` once that work is done.
    An error in the work is raised after the step; an error in the step once the work is done.

    Used by :meth:`FlashOnnx.generate_ids`, :mod:`runtime.serving.batch_generate` and
    :class:`runtime.client.generator.LineGenerator`, each with its own ``pick``.
    """
    if (attention_mask is None) != (next_pos is None):
        raise ValueError("pass attention_mask and next_pos together (left-padded batches) or neither")
    live = list(range(n_rows))
    last = logits[:, -1, :]
    mask = attention_mask
    pos = None if next_pos is None else np.asarray(next_pos, dtype=np.int64).copy()
    while True:
        keep: list[int] = []
        feed: list[int] = []
        for i, b in enumerate(live):
            tok, more = pick(b, last[i])
            if tok is not None:
                yield b, tok
                if more:
                    keep.append(i)
                    feed.append(tok)
        if not keep:
            return
        if len(keep) < len(live):
            idx = np.asarray(keep)
            past = [p[idx] for p in past]
            if mask is not None and pos is not None:
                mask, pos = mask[idx], pos[idx]
            live = [live[i] for i in keep]
        ids = np.asarray(feed, dtype=np.int64)[:, None]
        job = None if overlap is None else overlap(live)
        try:
            if mask is None or pos is None:
                logits, past, router = model.step(ids, past)
            else:
                mask = np.concatenate([mask, np.ones((len(live), 1), dtype=np.int64)], axis=1)
                logits, past, router = model.step(ids, past, attention_mask=mask, position_ids=pos[:, None])
                pos += 1
        except BaseException:
            if job is not None:
                job.exception()  # waited for: the rows are not touched behind the caller's back
            raise
        if job is not None:
            job.result()
        if on_step is not None:
            on_step(live, router)
        last = logits[:, -1, :]


__all__ = ["DEFAULT_MODEL_DIR", "FlashOnnx", "decode_rows", "ort_session_options", "session_options"]
