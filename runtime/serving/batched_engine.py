"""The server's batched line engine: one PyTorch model, many sequences decoding together.

:class:`BatchedEngine` runs the Flash model (the same trained weights as the shipped INT4 file,
see :func:`load_flash`) over a continuously changing batch:

- **Continuous batching.** Requests wait in a FIFO; every :meth:`BatchedEngine.step` first
  admits waiting requests (up to ``max_batch`` running, and at most ``max_prefill_tokens`` new
  prompt tokens per step, so a burst of new sessions is spread over several steps instead of
  stalling the rows that are decoding), then runs one forward pass over the new prompts' tokens
  and every running row's next token together, samples one token per row, and retires the rows
  that finished. Results come back from ``step`` the moment a row finishes.
- **KV slots.** Keys and values live in one preallocated tensor
  ``[n_layer, 2, max_batch, n_head, block_size, head_dim]``; running rows always occupy slots
  ``0 .. n-1`` (a finished row's slot is refilled by the last row), so the decode attention
  reads a plain slice, never a gather.
- **Prefix blocks.** Full ``block_tokens``-sized blocks of every prompt are looked up in a
  :class:`runtime.serving.block_cache.BlockCache` (hash chain, L1 device / L2 host / L3 disk) and
  copied into the row's slot; only the rest of the prompt is computed, and its new full blocks
  are stored for the next session with the same archetype/persona/state (and intent/context).
- **Sparse experts.** The batch's tokens are sorted by their routed expert, and each selected
  expert runs one matrix product over exactly its tokens (``MoE.expert_forward``), or, on a
  CUDA device where it works, one ``torch._grouped_mm`` over all experts' groups at once.
  Unselected experts cost nothing.
- **CUDA graphs** (``cuda_graphs=True``, CUDA with grouped experts only): the decode forward
  is captured once per power-of-two batch size and replayed.

Sampling has the semantics of :func:`runtime.client.sampling.sample_next` (temperature, top-k, top-p,
greedy at temperature 0, the draw ``searchsorted(cdf, u * cdf[-1])`` over the id-ordered cdf)
vectorised over the batch in float64, and the same masks as the client engine, by the same
code (:meth:`runtime.client.constraints.WordConstraint.masked_row`, per row on the host, the rows
sent to the device once per step): the word constraints (vocabulary, banned words, the
signatures of the tags a request did not ask for, the text rules), the voice bonus of the tags
it asked for, per-request blocked slot tokens, the veto (ellipsis exemption included); then
``eos`` before ``min_tokens``. The uniform ``u`` of a row's ``n``-th token is a counter-based
hash of (request seed, n), so a request's line does not depend on which other requests share
its batch: batched output equals single-request output for the same seed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from runtime.client.constraints import WordConstraint, WordState
from runtime.client.sampling import DEFAULT_TEMPERATURE, DEFAULT_TOP_P
from runtime.factory.model import MLP, Flash, FlashConfig, MoE
from runtime.factory.quant import fake_quant_int4
from runtime.paths import DEFAULT_MODEL_DIR
from runtime.serving.block_cache import BlockCache
from runtime.tokenizer import Tokenizer

log = logging.getLogger("flashnpc.runtime")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class EngineLoadError(RuntimeError):
    """A model directory, checkpoint or ONNX file could not be turned into engine weights."""


# --------------------------------------------------------------------------- loading


def _int4_weight(inits: dict[str, np.ndarray], name: str, rows: int, k: int, block: int) -> Tensor:
    """Dequantize a MatMulNBits / QMoE initializer pair ``name.qweight`` / ``name.scales``."""
    from runtime.factory.export import unpack_int4

    packed, scales = inits.get(f"{name}.qweight"), inits.get(f"{name}.scales")
    if packed is None or scales is None:
        raise EngineLoadError(f"ONNX graph has no INT4 weight {name!r} (qweight and scales)")
    lead = packed.shape[:-1] if packed.ndim == 3 and name.split(".")[-1] in ("fc1", "fc2") else (rows,)
    w = unpack_int4(packed.reshape(*lead, k // 2), scales.reshape(*lead, k // block), block)
    return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))


def flash_from_onnx(onnx_path: str | Path, config: FlashConfig) -> Flash:
    """Rebuild PyTorch weights from a shipped INT4 graph (``moe`` variant qmoe or gather).

    Every INT4 initializer (MatMulNBits / QMoE / GatherBlockQuantized: ``q + 8`` two per byte,
    float32 block scales, see :mod:`runtime.factory.export`) is dequantized, which gives exactly the QAT
    weights; the fp16 token table becomes the embedding and the INT4 lm_head the (untied) output
    layer. The returned model has ``qat`` off: its weights are already the quantized ones.
    """
    import onnx
    from onnx import numpy_helper

    path = Path(onnx_path)
    if not path.is_file():
        raise EngineLoadError(f"{path}: no such ONNX file")
    try:
        proto = onnx.load(str(path))
    except Exception as exc:
        raise EngineLoadError(f"{path}: not a readable ONNX model ({exc})") from exc
    inits: dict[str, np.ndarray] = {}
    for t in proto.graph.initializer:
        base = t.name.rsplit("_", 1)[0] if t.name.rsplit("_", 1)[-1].isdigit() else t.name
        inits.setdefault(base, numpy_helper.to_array(t))
    cfg = FlashConfig(**{**vars(config), "qat": False})
    c, blk, v = cfg.n_embd, cfg.quant_block, cfg.vocab_size
    model = Flash(cfg)
    sd: dict[str, Tensor] = {}

    def plain(name: str) -> Tensor:
        if name not in inits:
            raise EngineLoadError(f"{path}: ONNX graph has no initializer {name!r}")
        return torch.from_numpy(np.array(inits[name], dtype=np.float32))

    wte_key = "wte_fp16" if "wte_fp16" in inits else "wte"
    lm_head = _int4_weight(inits, "lm_head", v, c, blk)
    wte = plain(wte_key) if wte_key in inits else lm_head.clone()
    sd["transformer.wpe.weight"] = plain("wpe")
    sd["transformer.ln_f.weight"] = plain("transformer.ln_f.weight")
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}"
        sd[f"{p}.ln_1.weight"] = plain(f"{p}.ln_1.weight")
        sd[f"{p}.ln_2.weight"] = plain(f"{p}.ln_2.weight")
        sd[f"{p}.attn.c_attn.weight"] = _int4_weight(inits, f"h{i}.c_attn", 3 * c, c, blk)
        sd[f"{p}.attn.c_proj.weight"] = _int4_weight(inits, f"h{i}.c_proj", c, c, blk)
        if cfg.is_moe_layer(i):
            sd[f"{p}.ffn.router.weight"] = plain(f"h{i}.router_t").T.contiguous()
            sd[f"{p}.ffn.w1"] = _int4_weight(inits, f"h{i}.fc1", 0, c, blk)
            sd[f"{p}.ffn.w2"] = _int4_weight(inits, f"h{i}.fc2", 0, cfg.expert_hidden, blk)
        else:
            sd[f"{p}.ffn.c_fc.weight"] = _int4_weight(inits, f"h{i}.c_fc", 4 * c, c, blk)
            sd[f"{p}.ffn.c_proj.weight"] = _int4_weight(inits, f"h{i}.mlp_proj", c, 4 * c, blk)
    # untie: the graph reads a half-precision table for inputs and INT4 weights for the output
    model.transformer.wte.weight = nn.Parameter(torch.empty(v, c))
    model.lm_head.weight = nn.Parameter(torch.empty(v, c))
    sd["transformer.wte.weight"] = wte
    sd["lm_head.weight"] = lm_head
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise EngineLoadError(f"{path}: rebuilt weights do not fit the config (missing {missing}, "
                              f"unexpected {unexpected})")
    return model.eval()


def load_flash(model_dir: str | Path | None = None, *, checkpoint: str | Path | None = None
               ) -> tuple[Flash, Tokenizer, Path]:
    """(model, tokenizer, model directory) for the engine.

    ``checkpoint``: a directory with ``model.pt`` as ``flashnpc train`` writes it (its
    ``tokenizer.json`` is used if present, else the model directory's). Otherwise the weights are
    rebuilt from ``model_dir/model.int4.onnx`` (default: the shipped ``runtime/assets/flash/``)
    with :func:`flash_from_onnx`.
    """
    root = Path(model_dir) if model_dir is not None else DEFAULT_MODEL_DIR
    if checkpoint is not None:
        from runtime.factory.train import load_checkpoint

        ck = Path(checkpoint)
        try:
            model, _ = load_checkpoint(ck)
        except FileNotFoundError as exc:
            raise EngineLoadError(str(exc)) from exc
        tok_path = (ck if ck.is_dir() else ck.parent) / "tokenizer.json"
        if not tok_path.is_file():
            tok_path = root / "tokenizer.json"
    else:
        cfg_path = root / "config.json"
        if not cfg_path.is_file():
            raise EngineLoadError(f"{cfg_path}: missing (a model directory needs config.json)")
        try:
            raw = json.loads(cfg_path.read_text(encoding="utf-8"))
            config = FlashConfig(**{k: raw[k] for k in raw if k in FlashConfig.__dataclass_fields__})
        except (ValueError, TypeError) as exc:
            raise EngineLoadError(f"{cfg_path}: not a Flash config ({exc})") from exc
        model = flash_from_onnx(root / "model.int4.onnx", config)
        tok_path = root / "tokenizer.json"
    if not tok_path.is_file():
        raise EngineLoadError(f"{tok_path}: missing tokenizer")
    return model, Tokenizer.load(tok_path), root


# --------------------------------------------------------------------------- sampling


_MASK63 = (1 << 63) - 1


def _signed(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


_C1, _C2, _GOLDEN = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB), _signed(0x9E3779B97F4A7C15)


def _srl(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 values."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def counter_uniform(seed: Tensor, counter: Tensor) -> Tensor:
    """float64 uniforms in [0, 1) from int64 (seed, counter) pairs: splitmix64 of
    ``seed + (counter + 1) * golden``. Integer-only, so identical on every device."""
    x = seed + (counter + 1) * _GOLDEN
    x = (x ^ _srl(x, 30)) * _C1
    x = (x ^ _srl(x, 27)) * _C2
    x = x ^ _srl(x, 31)
    return _srl(x, 11).double() / float(1 << 53)


def seed_key(seed: int, attempt: int = 0) -> int:
    """The 63-bit stream key of a request seed (and resample attempt)."""
    h = hashlib.blake2b(f"{int(seed)}:{int(attempt)}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & _MASK63


def sample_rows(logits: Tensor, u: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """One token per row of ``logits`` [B, V] (-inf = blocked; every row needs a finite value).

    Per row the semantics of :func:`runtime.client.sampling.sample_next` with ``rng.random() == u[b]``:
    temperature 0 is greedy (lowest id on ties); else softmax(logits / T) in float64, the
    ``top_k`` most likely (0 = all), the smallest most-likely set reaching ``top_p`` (the top
    token always kept), and the id-ordered cdf searched for ``u * cdf[-1]`` (side right).
    """
    b, v = logits.shape
    greedy = torch.argmax(logits, dim=-1)
    temp = temperature.double().clamp_min(1e-30).unsqueeze(1)
    # ordering the float32 logits orders z = logits / T: dividing by one positive temperature in
    # float64 keeps distinct float32 values distinct and in order, so z is only formed for the
    # candidates
    lf = torch.nan_to_num(logits.float(), nan=float("-inf"))
    k = top_k.long().unsqueeze(1)
    k_max = int(top_k.max()) if b else 0
    if bool((top_k > 0).all()) and k_max < v:
        # every row keeps at most k_max tokens: a partial sort is enough (ties between equal
        # finite logits, the only place topk and a stable sort could differ, do not occur in
        # practice; tied -inf entries get probability 0 either way)
        order = torch.topk(lf, k_max, dim=-1, sorted=True)[1]
    else:
        order = torch.sort(lf, dim=-1, descending=True, stable=True)[1]
    sz = lf.gather(1, order).double() / temp
    width = sz.shape[1]
    rank = torch.arange(width, device=logits.device).unsqueeze(0)
    keep = (k <= 0) | (rank < k)
    p = torch.exp(sz - sz[:, :1]) * keep
    p = p / p.sum(dim=-1, keepdim=True)
    tp = top_p.double().unsqueeze(1)
    cum_before = torch.cumsum(p, dim=-1) - p
    nucleus = keep & ((cum_before < tp) | (rank == 0))
    p = torch.where(tp < 1.0, p * nucleus, p)
    p = p / p.sum(dim=-1, keepdim=True)
    # the id-ordered cdf of sample_next, over the candidate ids only (the others have
    # probability 0 and add nothing to it): sort the candidates by id
    ids_sorted, perm = torch.sort(order, dim=-1)
    probs = p.gather(1, perm)
    cdf = torch.cumsum(probs, dim=-1)
    x = (u.double() * cdf[:, -1]).unsqueeze(1)
    idx = torch.searchsorted(cdf, x, right=True).clamp_max(width - 1)
    # like sample_next: step back to the last id with probability at or before idx
    cols = torch.arange(width, device=logits.device).unsqueeze(0).expand(b, width)
    prev_nz = torch.where(probs > 0, cols, torch.zeros_like(cols)).cummax(dim=-1).values
    picked = ids_sorted.gather(1, prev_nz.gather(1, idx)).squeeze(1)
    return torch.where(temperature <= 0, greedy, picked)


# --------------------------------------------------------------------------- requests


@dataclass
class GenRequest:
    """One sequence to generate. ``ids``: the prompt (e.g. ``Tokenizer.encode_prompt``'s ids);
    ``seed`` (with ``attempt``) keys the sampling stream; ``blocked_tokens``: ids never to sample
    (slot tokens the line may not use); ``banned``: the tags whose phrases the line may not say
    (:meth:`runtime.client.constraints.WordConstraint.banned_bits` of the request; None: the vocabulary
    and the static banned words only); ``on_token(token_id, time)``: called from the engine's
    thread after each sampled token (streaming); ``tag``: anything, returned with the result."""

    ids: Sequence[int]
    seed: int = 0
    attempt: int = 0
    max_tokens: int = 48
    min_tokens: int = 0
    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = 50
    top_p: float = DEFAULT_TOP_P
    blocked_tokens: Sequence[int] = ()
    banned: int | None = None
    on_token: Callable[[int, float], None] | None = None
    tag: Any = None


@dataclass
class GenResult:
    """A finished sequence. ``finish``: ``eos``, ``length``, ``cancelled``, ``error`` or
    ``blocked`` (the word constraints left no token inside a word: a dead end);
    ``cached_tokens``: prompt tokens whose keys/values came from the block cache;
    ``token_times``: perf_counter time of each sampled token (for inter-token latency);
    ``router_confidence``: mean top-1 router probability of the decoded tokens' MoE layers;
    ``mean_logprob``: mean log-probability (unmasked, temperature 1) of the sampled tokens."""

    request: GenRequest
    tokens: list[int]
    finish: str
    t_submit: float
    t_admit: float | None
    t_done: float
    token_times: list[float]
    cached_tokens: int = 0
    router_confidence: float | None = None
    mean_logprob: float | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.t_submit if self.token_times else None


@dataclass(eq=False)
class _Seq:
    """A request's identity; its decoding state lives in the engine's per-slot arrays."""

    req: GenRequest
    t_submit: float
    key: int
    budget: int
    t_admit: float | None = None
    cached: int = 0
    cancelled: bool = False


class Handle:
    """What :meth:`BatchedEngine.submit` returns: cancel it with :meth:`BatchedEngine.cancel`."""

    __slots__ = ("_seq",)

    def __init__(self, seq: _Seq) -> None:
        self._seq = seq


# --------------------------------------------------------------------------- engine


class _Layer:
    def __init__(self, block: nn.Module, cfg: FlashConfig, dtype: torch.dtype, device: torch.device) -> None:
        qat = cfg.qat

        def w(t: Tensor) -> Tensor:
            t = fake_quant_int4(t.detach().float(), cfg.quant_block) if qat else t.detach().float()
            return t.to(device=device, dtype=dtype).contiguous()

        self.ln1 = block.ln_1.weight.detach().to(device=device, dtype=dtype)
        self.ln2 = block.ln_2.weight.detach().to(device=device, dtype=dtype)
        self.c_attn = w(block.attn.c_attn.weight)
        self.c_proj = w(block.attn.c_proj.weight)
        self.moe: MoE | None = block.ffn if isinstance(block.ffn, MoE) else None
        if self.moe is not None:
            self.router = block.ffn.router.weight.detach().float().to(device)
            w1, w2 = w(block.ffn.w1), w(block.ffn.w2)
            self.experts = (w1.unbind(0), w2.unbind(0))
            self.w1t = w1.transpose(1, 2).contiguous()  # [E, C, H] for grouped matmuls
            self.w2t = w2.transpose(1, 2).contiguous()  # [E, H, C]
        else:
            assert isinstance(block.ffn, MLP)
            self.fc, self.fc_proj = w(block.ffn.c_fc.weight), w(block.ffn.c_proj.weight)


class BatchedEngine:
    """Continuous-batching generation over one Flash model; see the module docstring.

    Not thread-safe except :meth:`submit` and :meth:`cancel`, which any thread may call while
    one thread drives :meth:`step` (or :meth:`run_until_idle`).
    """

    def __init__(self, model: Flash, tokenizer: Tokenizer, *, device: str | torch.device = "cpu",
                 dtype: str | torch.dtype | None = None, max_batch: int = 256,
                 max_prefill_tokens: int | None = None, block_cache: BlockCache | None = None,
                 use_block_cache: bool = True, block_tokens: int = 2, banned_words: Sequence[str] = (),
                 words: WordConstraint | None = None, cuda_graphs: bool = False, moe: str = "auto",
                 namespace: str = "") -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if moe not in ("auto", "loop", "grouped_mm"):
            raise ValueError(f"moe must be 'auto', 'loop' or 'grouped_mm', got {moe!r}")
        self.device = torch.device(device)
        if dtype is None:
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        if isinstance(dtype, str):
            if dtype not in DTYPES:
                raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
            dtype = DTYPES[dtype]
        self.dtype = dtype
        cfg = model.config
        self.config = cfg
        self.tokenizer = tokenizer
        if tokenizer.vocab_size != cfg.vocab_size:
            raise ValueError(f"tokenizer vocab {tokenizer.vocab_size} != model vocab {cfg.vocab_size}")
        dev = self.device
        self.wte = model.transformer.wte.weight.detach().to(device=dev, dtype=dtype)
        self.wpe = model.transformer.wpe.weight.detach().to(device=dev, dtype=dtype)
        self.ln_f = model.transformer.ln_f.weight.detach().to(device=dev, dtype=dtype)
        lm = model.lm_head.weight.detach().float()
        self.lm_head = (fake_quant_int4(lm, cfg.quant_block) if cfg.qat else lm).to(device=dev, dtype=dtype)
        self.layers = [_Layer(b, cfg, dtype, dev) for b in model.transformer.h]
        self.n_moe = sum(1 for layer in self.layers if layer.moe is not None)
        self._init_rows(max_batch, max_prefill_tokens, words or WordConstraint(banned_words, tokenizer))
        self.kv = torch.zeros((cfg.n_layer, 2, max_batch, self.n_head, cfg.block_size, self.head_dim),
                              dtype=dtype, device=dev)
        if block_cache is None and use_block_cache:
            block_cache = BlockCache(block_tokens=block_tokens,
                                     block_shape=(cfg.n_layer, self.n_head, self.head_dim), dtype=dtype,
                                     device=dev, l1_blocks=16384 if dev.type == "cuda" else 4096,
                                     l2_blocks=65536,
                                     namespace=namespace or f"{id(model):x}:{dtype}")
        self.block_cache = block_cache if use_block_cache else None
        self.moe_impl = self._pick_moe(moe)
        self.cuda_graphs = bool(cuda_graphs and dev.type == "cuda" and self.moe_impl == "grouped_mm")
        if cuda_graphs and not self.cuda_graphs:
            log.warning("CUDA graphs need a CUDA device and grouped experts; running eagerly")
        self._graphs: dict[int, tuple[Callable[[], Any], Tensor, Tensor, Tensor]] = {}

    def _init_rows(self, max_batch: int, max_prefill_tokens: int | None, words: WordConstraint) -> None:
        """The per-row decoding state every engine shares (needs ``config``, ``tokenizer`` and
        ``device`` set): sampling masks, slot arrays, the waiting queue. ``words`` may be shared
        with other engines (it is thread-safe)."""
        cfg = self.config
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens or max(256, max_batch)
        self.n_head, self.head_dim = cfg.n_head, cfg.n_embd // cfg.n_head
        self.block_size = cfg.block_size
        self.block_cache: BlockCache | None = None
        if words.tokenizer.vocab_size != cfg.vocab_size:
            raise ValueError(f"word constraint vocab {words.tokenizer.vocab_size} != model vocab {cfg.vocab_size}")
        self.words = words
        words.precompute()
        # a step's rows with the word constraints applied (WordConstraint.masked_row), built on
        # the host and sent over at once
        self._masked = np.zeros((max_batch, cfg.vocab_size), dtype=np.float32)
        # per-slot decoding state (row i of the running batch is slot i)
        s = max_batch
        self._n = np.zeros(s, dtype=np.int64)          # tokens sampled
        self._budget = np.zeros(s, dtype=np.int64)
        self._min = np.zeros(s, dtype=np.int64)
        self._temp = np.zeros(s, dtype=np.float64)
        self._topk = np.zeros(s, dtype=np.int64)
        self._topp = np.zeros(s, dtype=np.float64)
        self._key = np.zeros(s, dtype=np.int64)
        self._state = np.empty(s, dtype=object)  # word-constraint state per row
        self._state[:] = [None] * s
        self._banned = np.full(s, None, dtype=object)  # the request's banned tags
        self._block = np.full(s, None, dtype=object)  # the request's own blocked ids (blocked_tokens)
        self._lp = np.zeros(s, dtype=np.float64)
        self._conf = np.zeros(s, dtype=np.float64)
        self._next = np.zeros(s, dtype=np.int64)       # input token of the next decode step
        self._pos = np.zeros(s, dtype=np.int64)        # tokens in the slot's KV
        self._cb = np.zeros(s, dtype=bool)             # has an on_token callback
        self._toks = np.zeros((s, cfg.block_size), dtype=np.int64)
        self._times = np.zeros((s, cfg.block_size), dtype=np.float64)
        self._slot_arrays = [self._n, self._budget, self._min, self._temp, self._topk, self._topp, self._key,
                             self._state, self._banned, self._block, self._lp, self._conf, self._next, self._pos, self._cb,
                             self._toks, self._times]
        self.eos = self.tokenizer.eos_id
        self._waiting: deque[_Seq] = deque()
        self._lock = threading.Lock()
        self.rows: list[_Seq] = []
        self.steps = 0
        self.tokens_generated = 0
        self.last_batch = 0

    @classmethod
    def load(cls, model_dir: str | Path | None = None, *, checkpoint: str | Path | None = None,
             **options: Any) -> BatchedEngine:
        """Load the model (see :func:`load_flash`) with the model directory's word constraints."""
        from runtime.client.constraints import read_constraints

        model, tok, root = load_flash(model_dir, checkpoint=checkpoint)
        if "words" not in options and "banned_words" not in options:
            options["words"] = read_constraints(root).word_constraint(tok)
        return cls(model, tok, **options)

    # ------------------------------------------------------------ requests

    def submit(self, request: GenRequest) -> Handle:
        """Queue ``request``; it joins the running batch at a coming step. Bad requests raise ValueError."""
        n = len(request.ids)
        if n < 1 or n >= self.block_size:
            raise ValueError(f"prompt length must be in [1, {self.block_size - 1}], got {n}")
        if any(not 0 <= int(t) < self.config.vocab_size for t in request.ids):
            raise ValueError(f"prompt ids must lie in [0, {self.config.vocab_size})")
        if request.max_tokens < 1 or not 0 <= request.min_tokens <= request.max_tokens:
            raise ValueError(f"need max_tokens >= 1 and 0 <= min_tokens <= max_tokens, got "
                             f"{request.max_tokens}, {request.min_tokens}")
        if request.temperature < 0 or not 0 < request.top_p <= 1 or request.top_k < 0:
            raise ValueError(f"bad sampling values temperature={request.temperature}, top_k={request.top_k}, "
                             f"top_p={request.top_p}")
        seq = _Seq(request, time.perf_counter(), seed_key(request.seed, request.attempt),
                   min(request.max_tokens, self.block_size - n))
        with self._lock:
            self._waiting.append(seq)
        return Handle(seq)

    def cancel(self, handle: Handle) -> None:
        """Stop a request: it finishes with ``finish="cancelled"`` at the next step."""
        handle._seq.cancelled = True

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self.rows)

    def has_work(self) -> bool:
        return bool(self.rows or self._waiting)

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        """Run ``requests`` to completion (continuous batching); results in request order."""
        handles = [self.submit(r) for r in requests]
        done: dict[int, GenResult] = {}
        while len(done) < len(handles):
            for res in self.step():
                done[id(res.request)] = res
        return [done[id(h._seq.req)] for h in handles]

    # ------------------------------------------------------------ the step

    def step(self) -> list[GenResult]:
        """Admit waiting requests, run one forward pass, sample one token per row; returns the rows
        that finished in this step."""
        finished: list[GenResult] = []
        new = self._admit(finished)
        n_dec = len(self.rows) - len(new)
        if not self.rows:
            return finished
        self.last_batch = len(self.rows)
        with torch.inference_mode():
            logits, conf = self._run(n_dec, new)
            self._store_blocks(new)
            toks, lps, veto = self._sample(logits)
        now = time.perf_counter()
        b = len(self.rows)
        cols = [toks.double(), lps.double(), veto.double()] + ([conf.double()] if conf is not None else [])
        out = torch.stack(cols, dim=1).cpu().numpy()
        self.steps += 1
        tok = out[:, 0].astype(np.int64)
        cancelled = np.fromiter((s.cancelled for s in self.rows), dtype=bool, count=b)
        emit = ~cancelled & (tok >= 0) & (tok != self.eos)
        # every token blocked inside a word: a dead end (at a word boundary it reads as eos)
        stuck = (tok < 0) & (np.fromiter((st.mode != 0 for st in self._state[:b]), dtype=bool, count=b)
                             | (out[:, 2] > 0))
        idx = np.nonzero(emit)[0]
        t_idx = tok[idx]
        n_idx = self._n[idx]
        self._toks[idx, n_idx] = t_idx
        self._times[idx, n_idx] = now
        self._lp[idx] += out[idx, 1]
        if conf is not None:
            self._conf[idx] += out[idx, 3]
        self._n[idx] = n_idx + 1
        self._next[idx] = t_idx
        step = self.words.step
        for i, t in zip(idx.tolist(), t_idx.tolist()):
            self._state[i] = step(self._state[i], t)
        self.tokens_generated += len(idx)
        for i in idx[self._cb[idx]]:
            try:
                self.rows[i].req.on_token(int(tok[i]), now)  # type: ignore[misc]
            except Exception:
                log.exception("on_token callback failed")
        full = emit & (self._n[:b] >= self._budget[:b])
        for i in np.nonzero(~emit | full)[0]:
            why = "cancelled" if cancelled[i] else ("length" if emit[i] else "blocked" if stuck[i] else "eos")
            finished.append(self._result(int(i), why, now))
        self._compact(np.nonzero(emit & ~full)[0])
        return finished

    def run_until_idle(self, on_result: Callable[[GenResult], None]) -> None:
        """Step until nothing is waiting or running, handing each result to ``on_result``."""
        while self.has_work():
            for res in self.step():
                on_result(res)

    def fail_all(self) -> list[GenResult]:
        """Finish every running and waiting row with ``finish="error"`` (after a model failure)."""
        now = time.perf_counter()
        with self._lock:
            waiting, self._waiting = list(self._waiting), deque()
        out = [self._result(i, "error", now) for i in range(len(self.rows))]
        out += [self._waiting_result(s, "error", now) for s in waiting]
        self.rows = []
        return out

    # ------------------------------------------------------------ admission

    def _admit(self, finished: list[GenResult]) -> list[_Seq]:
        new: list[_Seq] = []
        budget = self.max_prefill_tokens
        now = time.perf_counter()
        with self._lock:
            while self._waiting and len(self.rows) < self.max_batch:
                seq = self._waiting[0]
                if seq.cancelled:
                    self._waiting.popleft()
                    finished.append(self._waiting_result(seq, "cancelled", now))
                    continue
                if new and len(seq.req.ids) > budget:
                    break
                self._waiting.popleft()
                budget -= len(seq.req.ids)
                seq.t_admit = now
                self.rows.append(seq)
                new.append(seq)
        if not new:
            return new
        first_slot = len(self.rows) - len(new)
        sl = slice(first_slot, first_slot + len(new))
        reqs = [seq.req for seq in new]
        self._n[sl] = 0
        self._budget[sl] = [seq.budget for seq in new]
        self._min[sl] = [r.min_tokens for r in reqs]
        self._temp[sl] = [r.temperature for r in reqs]
        self._topk[sl] = [r.top_k for r in reqs]
        self._topp[sl] = [r.top_p for r in reqs]
        self._key[sl] = [seq.key for seq in new]
        for j in range(first_slot, first_slot + len(new)):
            self._state[j] = WordState()  # (a tuple: a slice assignment would unpack it)
        self._banned[sl] = [r.banned for r in reqs]
        self._lp[sl] = 0.0
        self._conf[sl] = 0.0
        self._pos[sl] = 0
        self._cb[sl] = [r.on_token is not None for r in reqs]
        for j, r in enumerate(reqs):
            self._block[first_slot + j] = (np.asarray([int(t) for t in r.blocked_tokens], dtype=np.int64)
                                           if len(r.blocked_tokens) else None)
        cache = self.block_cache
        if cache is None:
            return new
        bt = cache.block_tokens
        dst_slot: list[int] = []
        dst_pos: list[int] = []
        blocks: list[int] = []
        for j, seq in enumerate(new):
            ids = seq.req.ids
            usable = (len(ids) - 1) // bt
            got = cache.acquire(cache.hashes(ids)[:usable])
            for b, idx in enumerate(got):
                dst_slot.append(first_slot + j)
                dst_pos.append(b * bt)
                blocks.append(idx)
            seq.cached = len(got) * bt
            self._pos[first_slot + j] = seq.cached
        if blocks:
            pool = cache.pool[torch.as_tensor(blocks, device=self.device)]  # [P, L, 2, H, bt, D]
            pos = torch.as_tensor(dst_pos, device=self.device).unsqueeze(1) + torch.arange(bt, device=self.device)
            slots = torch.as_tensor(dst_slot, device=self.device).unsqueeze(1).expand_as(pos)
            view = self.kv.permute(2, 4, 0, 1, 3, 5)  # [S, T, L, 2, H, D]
            view[slots, pos] = pool.permute(0, 4, 1, 2, 3, 5)
            cache.release(blocks)
        return new

    def _store_blocks(self, new: list[_Seq]) -> None:
        """Store the new rows' computed full prompt blocks in the cache (one gather, one write)."""
        cache = self.block_cache
        if cache is None or not new:
            return
        bt = cache.block_tokens
        first_slot = len(self.rows) - len(new)
        todo: dict[bytes, tuple[int, int]] = {}
        for j, seq in enumerate(new):
            hashes = cache.hashes(seq.req.ids)
            for b in range(seq.cached // bt, len(hashes)):
                h = hashes[b]
                if h not in todo and not cache.in_l1(h):
                    todo[h] = (first_slot + j, b * bt)
        if not todo:
            return
        pos = torch.as_tensor([p for _, p in todo.values()], device=self.device).unsqueeze(1) \
            + torch.arange(bt, device=self.device)
        slots = torch.as_tensor([s for s, _ in todo.values()], device=self.device).unsqueeze(1).expand_as(pos)
        data = self.kv.permute(2, 4, 0, 1, 3, 5)[slots, pos].permute(0, 2, 3, 4, 1, 5)  # [P, L, 2, H, bt, D]
        placed = cache.insert_many(list(todo), data)
        cache.release([i for i in placed if i is not None])

    # ------------------------------------------------------------ forward

    def _run(self, n_dec: int, new: list[_Seq]) -> tuple[Tensor, Tensor | None]:
        """Logits [B, V] (float32) of each row's last fed token, and router confidence [B]."""
        dev = self.device
        dec_tok = self._next[:n_dec]
        dec_pos = self._pos[:n_dec]
        pre_tok: list[int] = []
        pre_pos: list[int] = []
        pre_slot: list[int] = []
        last_idx: list[int] = []
        for j, seq in enumerate(new):
            start = int(self._pos[n_dec + j])
            rest = list(seq.req.ids)[start:]
            pre_tok += rest
            pre_pos += range(start, start + len(rest))
            pre_slot += [n_dec + j] * len(rest)
            last_idx.append(len(pre_tok) - 1)
            self._pos[n_dec + j] += len(rest)
        outs: list[tuple[Tensor, Tensor | None]] = []
        if n_dec:
            graphed = None
            if self.cuda_graphs:
                try:
                    graphed = self._graph_decode(dec_tok, dec_pos)
                except Exception:
                    log.exception("CUDA graph decode failed; decoding eagerly from now on")
                    self.cuda_graphs = False
                    self._graphs.clear()
            if graphed is not None:
                outs.append(graphed)
            else:
                t = torch.as_tensor(dec_tok, device=dev)
                p = torch.as_tensor(dec_pos, device=dev)
                outs.append(self._forward(t, p, None, int(dec_pos.max()) + 1, torch.arange(n_dec, device=dev)))
            self._pos[:n_dec] += 1
        if new:
            t = torch.as_tensor(pre_tok, device=dev)
            p = torch.as_tensor(pre_pos, device=dev)
            sl = torch.as_tensor(pre_slot, device=dev)
            outs.append(self._forward(t, p, sl, max(pre_pos) + 1, torch.as_tensor(last_idx, device=dev)))
        logits = torch.cat([o[0] for o in outs]) if len(outs) > 1 else outs[0][0]
        confs = [o[1] for o in outs]
        conf = None if confs[0] is None else (torch.cat(confs) if len(confs) > 1 else confs[0])  # type: ignore[arg-type]
        return logits, conf

    def _forward(self, tok: Tensor, pos: Tensor, slot: Tensor | None, t_max: int, last: Tensor
                 ) -> tuple[Tensor, Tensor | None]:
        """Feed tokens ``tok`` at positions ``pos`` of KV slots ``slot`` (None: token i is slot i's
        next token, slots contiguous from 0); returns logits and router confidence at ``last``."""
        n = tok.shape[0]
        h_, d_ = self.n_head, self.head_dim
        x = self.wte[tok] + self.wpe[pos]
        keys = torch.arange(t_max, device=self.device)
        mask = (keys.unsqueeze(0) <= pos.unsqueeze(1)).view(n, 1, 1, t_max)
        conf = None
        slot_idx = torch.arange(n, device=self.device) if slot is None else slot
        for li, layer in enumerate(self.layers):
            h = F.layer_norm(x, (x.shape[-1],), layer.ln1)
            q, k, v = F.linear(h, layer.c_attn).split(x.shape[-1], dim=-1)
            cache_k, cache_v = self.kv[li, 0], self.kv[li, 1]
            cache_k[slot_idx, :, pos] = k.view(n, h_, d_)
            cache_v[slot_idx, :, pos] = v.view(n, h_, d_)
            if slot is None:
                ks, vs = cache_k[:n, :, :t_max], cache_v[:n, :, :t_max]
            else:
                ks, vs = cache_k[slot, :, :t_max], cache_v[slot, :, :t_max]
            y = F.scaled_dot_product_attention(q.view(n, h_, 1, d_), ks, vs, attn_mask=mask)
            x = x + F.linear(y.reshape(n, -1), layer.c_proj)
            h = F.layer_norm(x, (x.shape[-1],), layer.ln2)
            if layer.moe is not None:
                f, top = self._moe(layer, h)
                c = top[last]
                conf = c if conf is None else conf + c
            else:
                f = F.linear(F.silu(F.linear(h, layer.fc)), layer.fc_proj)
            x = x + f
        xl = F.layer_norm(x[last], (x.shape[-1],), self.ln_f)
        logits = F.linear(xl, self.lm_head).float()
        if conf is not None:
            conf = conf / self.n_moe
        return logits, conf

    def _moe(self, layer: _Layer, x: Tensor) -> tuple[Tensor, Tensor]:
        """Sparse experts: tokens grouped by expert, one matmul per selected expert (or one grouped
        matmul). Returns (output, top-1 router prob per token)."""
        moe = layer.moe
        assert moe is not None
        k = moe.top_k
        probs = torch.softmax(F.linear(x.float(), layer.router), dim=-1)
        top_p, top_e = probs.topk(k, dim=-1)
        if k > 1:
            top_p = top_p / top_p.sum(dim=-1, keepdim=True)
        expert_of = top_e.reshape(-1)
        order = torch.argsort(expert_of, stable=True)
        token_of = order // k
        weight_of = top_p.reshape(-1)[order].unsqueeze(1)
        # scatter_add, not bincount: bincount syncs with the host on CUDA (no graph capture)
        counts = torch.zeros(moe.n_expert, dtype=torch.long, device=x.device).scatter_add_(
            0, expert_of, torch.ones_like(expert_of))
        out = torch.zeros_like(x)
        grouped = self.moe_impl == "grouped_mm"
        if grouped:
            try:
                offs = torch.cumsum(counts, 0).to(torch.int32)
                xs = x[token_of]
                hmid = F.silu(torch._grouped_mm(xs, layer.w1t, offs=offs))
                y = torch._grouped_mm(hmid, layer.w2t, offs=offs)
                out.index_add_(0, token_of, (y.float() * weight_of).to(out.dtype))
            except RuntimeError:
                if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                    raise
                log.exception("grouped experts failed on a batch of %d tokens; looping over experts", x.shape[0])
                self.moe_impl = "loop"
                self.cuda_graphs = False
                grouped = False
        if not grouped:
            # tokens sorted by expert once; each selected expert reads a contiguous slice
            xs = x[token_of]
            ys = []
            start = 0
            for e, cnt in enumerate(counts.tolist()):
                if cnt:
                    ys.append(moe.expert_forward(e, xs[start:start + cnt], layer.experts))
                    start += cnt
            y = torch.cat(ys) if len(ys) > 1 else ys[0]
            out.index_add_(0, token_of, (y.float() * weight_of).to(out.dtype))
        return out, probs.max(dim=-1).values

    def _pick_moe(self, moe: str) -> str:
        if moe == "loop" or (moe == "auto" and self.device.type != "cuda"):
            return "loop"
        if not hasattr(torch, "_grouped_mm") or not any(lay.moe is not None for lay in self.layers):
            if moe == "grouped_mm":
                raise ValueError("moe='grouped_mm' needs torch._grouped_mm and an MoE layer")
            return "loop"
        layer = next(lay for lay in self.layers if lay.moe is not None)
        x = torch.randn(64, self.config.n_embd, device=self.device, dtype=self.dtype)
        try:
            self.moe_impl = "grouped_mm"
            got, _ = self._moe(layer, x)
            if self.moe_impl != "grouped_mm":  # it failed and fell back
                raise RuntimeError("torch._grouped_mm failed on the probe batch")
            self.moe_impl = "loop"
            want, _ = self._moe(layer, x)
            err = float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12))
            ok = err < 2e-2
        except Exception as exc:  # unsupported device / dtype / shape
            if moe == "grouped_mm":
                raise ValueError(f"torch._grouped_mm does not run here: {exc}") from exc
            log.info("grouped experts unavailable (%s); looping over experts", exc)
            return "loop"
        if not ok and moe == "grouped_mm":
            raise ValueError("torch._grouped_mm disagrees with the per-expert loop")
        return "grouped_mm" if ok else "loop"

    # ------------------------------------------------------------ CUDA graphs

    def _graph_decode(self, dec_tok: np.ndarray, dec_pos: np.ndarray) -> tuple[Tensor, Tensor | None]:
        n = len(dec_tok)
        bucket = 1
        while bucket < n:
            bucket *= 2
        bucket = min(bucket, self.max_batch)
        entry = self._graphs.get(bucket)
        if entry is None:
            entry = self._capture(bucket)
        replay, tok_buf, pos_buf, out = entry
        tok_buf.zero_()
        # padding rows write the last position of free or newly admitted slots, which every row
        # overwrites itself before it could attend to it
        pos_buf.fill_(self.block_size - 1)
        tok_buf[:n] = torch.as_tensor(dec_tok, device=self.device)
        pos_buf[:n] = torch.as_tensor(dec_pos, device=self.device)
        replay()
        logits = out[:n, :-1]
        return logits, out[:n, -1]

    def _capture(self, bucket: int) -> tuple[Callable[[], Any], Tensor, Tensor, Tensor]:
        tok_buf = torch.zeros(bucket, dtype=torch.long, device=self.device)
        # the warm-up runs execute: write only the last position, which every row overwrites
        # itself before it could attend to it (position 0 holds running rows' first keys)
        pos_buf = torch.full((bucket,), self.block_size - 1, dtype=torch.long, device=self.device)
        last = torch.arange(bucket, device=self.device)

        def run() -> Tensor:
            logits, conf = self._forward(tok_buf, pos_buf, None, self.block_size, last)
            c = conf if conf is not None else torch.ones(bucket, device=self.device)
            return torch.cat([logits, c.float().unsqueeze(1)], dim=1)

        replay: Callable[[], Any]
        if self.device.type == "cuda":
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    run()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = run()
            replay = graph.replay
        else:  # the same static buffers and padding, replayed eagerly (checks the bucketing on a CPU)
            out = run()

            def replay() -> None:
                out.copy_(run())

        self._graphs[bucket] = (replay, tok_buf, pos_buf, out)
        return self._graphs[bucket]

    # ------------------------------------------------------------ sampling

    def _sample(self, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(token per row, -1 where every token is blocked or the sample is vetoed; its
        log-probability; whether it was vetoed: the most likely token blocked and holding more
        than half of the probability outside an ellipsis: :func:`runtime.client.constraints.vetoed`).
        The masks, the voice bonus and the veto are the client engine's own
        (:meth:`runtime.client.constraints.WordConstraint.masked_row`, on the host); min_tokens
        and sampling run on the device."""
        b = len(self.rows)
        dev = self.device
        n = self._n[:b]
        host = np.stack([n + 1 >= self._budget[:b], n < self._min[:b], self._temp[:b],
                         self._topk[:b], self._topp[:b], n], axis=1).astype(np.float64)
        # the client engine's masks, voice bonus and veto, row by row on the host (one
        # implementation: WordConstraint.masked_row), sent to the device at once
        raw = logits.float().cpu().numpy()
        rows = self._masked[:b]
        veto_h = np.zeros(b, dtype=bool)
        masked_row = self.words.masked_row
        for i in range(b):
            rows[i], veto_h[i] = masked_row(raw[i], self._state[i], last=bool(host[i, 0]), banned=self._banned[i],
                                            block=self._block[i])
        keys = torch.as_tensor(self._key[:b], device=dev)
        hd = torch.as_tensor(host, device=dev)
        lse = torch.logsumexp(logits.float(), dim=-1)
        veto = torch.as_tensor(veto_h, device=dev)
        masked = torch.as_tensor(rows, device=dev)
        # judged (the veto) before min_tokens holds eos back: a line asked to go on is not derailing
        masked[:, self.eos] = masked[:, self.eos].masked_fill(hd[:, 1] > 0, float("-inf"))
        alive = torch.isfinite(masked).any(dim=-1) & ~veto
        u = counter_uniform(keys, hd[:, 5].long())
        tok = sample_rows(masked.masked_fill(~alive.unsqueeze(1), 0.0), u, hd[:, 2], hd[:, 3].long(), hd[:, 4])
        lp = logits.float().gather(1, tok.unsqueeze(1)).squeeze(1) - lse
        return torch.where(alive, tok, torch.full_like(tok, -1)), lp, veto

    # ------------------------------------------------------------ bookkeeping

    def _compact(self, keep: np.ndarray) -> None:
        """Keep rows ``keep`` (ascending) in slots 0..len(keep)-1: each hole left by a finished row
        is refilled by a kept row from beyond the end (its KV, masks and state move), so a step
        moves at most as many rows as finished."""
        b, n_keep = len(self.rows), len(keep)
        if n_keep == b:
            return
        kept = np.zeros(b, dtype=bool)
        kept[keep] = True
        holes = np.nonzero(~kept[:n_keep])[0]
        movers = keep[keep >= n_keep]
        order = np.arange(n_keep)
        dst = src = None
        if len(holes):
            order[holes] = movers
            dst = torch.as_tensor(holes, device=self.device)
            src = torch.as_tensor(movers, device=self.device)
            for arr in self._slot_arrays:
                arr[holes] = arr[movers]
        self._compact_kv(order, dst, src, movers)
        self.rows = [self.rows[i] for i in order]

    def _compact_kv(self, order: np.ndarray, dst: Tensor | None, src: Tensor | None,
                    movers: np.ndarray) -> None:
        """Keys/values after compaction (row ``i`` is old row ``order[i]``): here, copy the
        movers' slots ``src`` into the holes ``dst`` (None: nothing moves)."""
        if dst is None or src is None:
            return
        t = int(self._pos[movers].max())  # positions beyond a row's length hold nothing it reads
        self.kv[:, :, dst, :, :t] = self.kv[:, :, src, :, :t]

    def _result(self, i: int, finish: str, now: float) -> GenResult:
        """The result of running row ``i``."""
        seq = self.rows[i]
        n = int(self._n[i])
        return GenResult(seq.req, self._toks[i, :n].tolist(), finish, seq.t_submit, seq.t_admit, now,
                         self._times[i, :n].tolist(), seq.cached,
                         float(self._conf[i]) / n if n and self.n_moe else None,
                         float(self._lp[i]) / n if n else None)

    def _waiting_result(self, seq: _Seq, finish: str, now: float) -> GenResult:
        return GenResult(seq.req, [], finish, seq.t_submit, seq.t_admit, now, [], 0)

    def describe(self) -> dict[str, Any]:
        """Device, dtype, expert implementation and sizes (for logs and benchmark reports)."""
        return {"device": str(self.device), "dtype": str(self.dtype).replace("torch.", ""),
                "moe": self.moe_impl, "cuda_graphs": self.cuda_graphs, "max_batch": self.max_batch,
                "max_prefill_tokens": self.max_prefill_tokens,
                "block_tokens": None if self.block_cache is None else self.block_cache.block_tokens}


__all__ = ["BatchedEngine", "EngineLoadError", "GenRequest", "GenResult", "Handle", "counter_uniform",
           "flash_from_onnx", "load_flash", "sample_rows", "seed_key"]
