"""The server-side prefix KV cache: fixed-size blocks named by a hash chain, in three tiers.

The batched engine (:mod:`runtime.serving.batched_engine`) keeps the keys and values of prompt tokens
in blocks of ``block_tokens`` consecutive tokens. Block ``i`` of a prompt is named by

    h_i = blake2b(namespace, h_{i-1}, tokens[i*bt : (i+1)*bt])      (h_{-1} = b"")

so a name covers every token before the block too (a block's keys depend on all of them), and
two prompts that share their first ``n`` blocks share those blocks' names, whatever follows
(the scheme of vLLM's automatic prefix caching and SGLang's radix cache). Only full blocks are
cached. ``namespace`` keeps models apart (give it a fingerprint of the weights and dtype).

Tiers, each bounded in blocks, each an LRU:

    L1  device memory: one preallocated pool tensor; blocks in use are pinned by reference counts
    L2  host memory: blocks evicted from L1
    L3  disk: blocks evicted from L2, one file each, ``<hash>.pt`` (optional; survives restarts)

A lookup walks a prompt's chain from the start and stops at the first block no tier holds;
blocks found in L2 or L3 are promoted back to L1. Eviction demotes L1 -> L2 -> L3 -> gone, and
never touches a block whose reference count is above zero. Counters are per tier, in tokens
(``hits["l1"]``, ...), so a dashboard shows where hits come from.

A block's tensor is ``[n_layer, 2, n_head, block_tokens, head_dim]`` (keys then values).
Thread-safe.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

log = logging.getLogger("flashnpc.runtime")

TIERS = ("l1", "l2", "l3")


def chain_hashes(tokens: Sequence[int], block_tokens: int, namespace: str = "") -> list[bytes]:
    """The hash-chain names of the full blocks of ``tokens`` (see the module docstring)."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    out: list[bytes] = []
    parent = b""
    ns = namespace.encode()
    raw = np.asarray(tokens, dtype="<u4").tobytes()
    step = 4 * block_tokens
    for start in range(0, 4 * len(tokens) - step + 1, step):
        h = hashlib.blake2b(ns, digest_size=16)
        h.update(parent)
        h.update(raw[start:start + step])
        parent = h.digest()
        out.append(parent)
    return out


@dataclass
class BlockCacheStats:
    """Counters since the cache was made. Token counts: ``queried_tokens`` (cacheable prompt tokens
    looked up), ``hits`` per tier; block counts: ``evictions`` per tier (blocks leaving that tier),
    ``promotions`` (L2/L3 -> L1), ``inserted``, ``dropped`` (evicted from the last tier)."""

    queried_tokens: int = 0
    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    evictions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    promotions: int = 0
    inserted: int = 0
    dropped: int = 0

    @property
    def hit_rate(self) -> float:
        return sum(self.hits.values()) / self.queried_tokens if self.queried_tokens else 0.0


class BlockCacheFull(RuntimeError):
    """Every L1 block is in use (referenced), so nothing can be placed there now."""


class BlockCache:
    """Hash-chained KV blocks in device (L1), host (L2) and disk (L3) tiers; see the module docstring.

    ``block_shape``: (n_layer, n_head, head_dim). ``l1_blocks`` / ``l2_blocks`` / ``l3_blocks``:
    capacity of each tier in blocks (``l2_blocks=0`` disables L2; L3 needs ``disk_dir``).
    """

    def __init__(self, *, block_tokens: int, block_shape: tuple[int, int, int], dtype: torch.dtype,
                 device: str | torch.device = "cpu", l1_blocks: int = 1024, l2_blocks: int = 4096,
                 disk_dir: str | Path | None = None, l3_blocks: int = 65536, namespace: str = "") -> None:
        if block_tokens < 1 or l1_blocks < 1 or l2_blocks < 0 or l3_blocks < 0:
            raise ValueError(f"BlockCache: block_tokens and l1_blocks must be >= 1, l2/l3 >= 0; got "
                             f"{block_tokens}, {l1_blocks}, {l2_blocks}, {l3_blocks}")
        n_layer, n_head, head_dim = block_shape
        self.block_tokens = block_tokens
        self.namespace = namespace
        self.device = torch.device(device)
        self.dtype = dtype
        self.shape = (n_layer, 2, n_head, block_tokens, head_dim)
        self.pool = torch.zeros((l1_blocks, *self.shape), dtype=dtype, device=self.device)
        self.l1_blocks, self.l2_blocks, self.l3_blocks = l1_blocks, l2_blocks, l3_blocks
        self._l1: dict[bytes, int] = {}                 # hash -> pool index
        self._hash_of: list[bytes | None] = [None] * l1_blocks
        self._refs = [0] * l1_blocks
        self._free = list(range(l1_blocks - 1, -1, -1))
        self._lru: OrderedDict[int, None] = OrderedDict()  # unreferenced L1 blocks, oldest first
        self._l2: OrderedDict[bytes, Tensor] = OrderedDict()
        self._l3: OrderedDict[bytes, None] = OrderedDict()
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        self._lock = threading.RLock()
        self.stats = BlockCacheStats()
        self._hash_memo: dict[tuple[int, ...], list[bytes]] = {}
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            files = sorted(self.disk_dir.glob("*.pt"), key=lambda p: p.stat().st_mtime)
            for path in files[-l3_blocks:] if l3_blocks else []:
                try:
                    self._l3[bytes.fromhex(path.stem)] = None
                except ValueError:
                    continue

    # ------------------------------------------------------------ queries

    def hashes(self, tokens: Sequence[int]) -> list[bytes]:
        """The chain names of ``tokens``' full blocks (memoised: prompts repeat)."""
        key = tuple(tokens)
        got = self._hash_memo.get(key)
        if got is None:
            if len(self._hash_memo) >= 65536:
                self._hash_memo.clear()
            got = self._hash_memo[key] = chain_hashes(key, self.block_tokens, self.namespace)
        return got

    def in_l1(self, h: bytes) -> bool:
        return h in self._l1

    def tier_of(self, h: bytes) -> str | None:
        """Which tier holds block ``h`` now (None: none)."""
        with self._lock:
            if h in self._l1:
                return "l1"
            if h in self._l2:
                return "l2"
            if h in self._l3:
                return "l3"
            return None

    def acquire(self, hashes: Sequence[bytes]) -> list[int]:
        """Pin and return the L1 indices of the longest run of ``hashes`` (from the first) that some
        tier holds, promoting L2/L3 blocks into L1. Counts ``len(hashes)`` blocks as queried and the
        found ones as hits of the tier they came from. Release the indices with :meth:`release`."""
        out: list[int] = []
        with self._lock:
            self.stats.queried_tokens += len(hashes) * self.block_tokens
            for h in hashes:
                idx = self._l1.get(h)
                tier = "l1"
                if idx is None:
                    data = self._take_lower(h)
                    if data is None:
                        break
                    tier = "l3" if data[1] else "l2"
                    try:
                        idx = self._place(h, data[0])
                    except BlockCacheFull:
                        break
                    self.stats.promotions += 1
                self._ref(idx)
                self.stats.hits[tier] += self.block_tokens
                out.append(idx)
        return out

    def insert(self, h: bytes, kv: Tensor) -> int | None:
        """Store block ``h`` (a tensor of :attr:`shape`) in L1 and pin it; returns its index, or None
        if every L1 block is pinned. A block already held is pinned and returned as it is."""
        if tuple(kv.shape) != self.shape:
            raise ValueError(f"block tensor shape {tuple(kv.shape)} != cache block shape {self.shape}")
        with self._lock:
            idx = self._l1.get(h)
            if idx is None:
                self._drop_lower(h)
                try:
                    idx = self._place(h, kv)
                except BlockCacheFull:
                    return None
                self.stats.inserted += 1
            self._ref(idx)
            return idx

    def insert_many(self, hashes: Sequence[bytes], data: Tensor) -> list[int | None]:
        """:meth:`insert` for many blocks at once (``data`` [P, *shape]): one write into the pool
        and one device-to-host copy for the blocks it evicts. Pins what it returns."""
        if tuple(data.shape[1:]) != self.shape or data.shape[0] != len(hashes):
            raise ValueError(f"blocks tensor shape {tuple(data.shape)} != ({len(hashes)}, *{self.shape})")
        out: list[int | None] = []
        with self._lock:
            new_idx: list[int] = []
            new_rows: list[int] = []
            victims: list[tuple[bytes, int]] = []
            for j, h in enumerate(hashes):
                idx = self._l1.get(h)
                if idx is None:
                    self._drop_lower(h)
                    if self._free:
                        idx = self._free.pop()
                    elif self._lru:
                        idx, _ = self._lru.popitem(last=False)
                        old = self._hash_of[idx]
                        assert old is not None
                        del self._l1[old]
                        self.stats.evictions["l1"] += 1
                        victims.append((old, idx))
                    else:
                        out.append(None)
                        continue
                    self._l1[h] = idx
                    self._hash_of[idx] = h
                    new_idx.append(idx)
                    new_rows.append(j)
                    self.stats.inserted += 1
                self._ref(idx)
                out.append(idx)
            if victims:
                saved = self.pool[torch.as_tensor([v[1] for v in victims], device=self.device)].to("cpu")
                for k, (old, _) in enumerate(victims):
                    self._demote_to_l2(old, saved[k].clone())
            if new_idx:
                rows = torch.as_tensor(new_rows, device=data.device)
                self.pool[torch.as_tensor(new_idx, device=self.device)] = data[rows].to(self.pool.dtype)
        return out

    def release(self, indices: Sequence[int]) -> None:
        """Unpin blocks returned by :meth:`acquire` / :meth:`insert` (most recently used now)."""
        with self._lock:
            for idx in indices:
                if self._refs[idx] <= 0:
                    raise ValueError(f"block {idx} released more often than acquired")
                self._refs[idx] -= 1
                if self._refs[idx] == 0:
                    self._lru[idx] = None

    def refcount(self, idx: int) -> int:
        return self._refs[idx]

    def __len__(self) -> int:
        with self._lock:
            return len(self._l1) + len(self._l2) + len(self._l3)

    def counts(self) -> dict[str, int]:
        """Blocks held per tier."""
        with self._lock:
            return {"l1": len(self._l1), "l2": len(self._l2), "l3": len(self._l3)}

    # ------------------------------------------------------------ internals (lock held)

    def _ref(self, idx: int) -> None:
        self._refs[idx] += 1
        self._lru.pop(idx, None)

    def _place(self, h: bytes, kv: Tensor) -> int:
        if not self._free:
            if not self._lru:
                raise BlockCacheFull(f"all {self.l1_blocks} L1 blocks are in use")
            victim, _ = self._lru.popitem(last=False)
            old = self._hash_of[victim]
            assert old is not None
            del self._l1[old]
            self.stats.evictions["l1"] += 1
            self._demote_to_l2(old, self.pool[victim].to("cpu", copy=True))
            self._hash_of[victim] = None
            self._free.append(victim)
        idx = self._free.pop()
        self.pool[idx].copy_(kv, non_blocking=False)
        self._l1[h] = idx
        self._hash_of[idx] = h
        return idx

    def _demote_to_l2(self, h: bytes, data: Tensor) -> None:
        if self.l2_blocks == 0:
            self._demote_to_l3(h, data)
            return
        self._l2[h] = data
        while len(self._l2) > self.l2_blocks:
            old, old_data = self._l2.popitem(last=False)
            self.stats.evictions["l2"] += 1
            self._demote_to_l3(old, old_data)

    def _demote_to_l3(self, h: bytes, data: Tensor) -> None:
        if self.disk_dir is None or self.l3_blocks == 0:
            self.stats.dropped += 1
            return
        try:
            torch.save(data.contiguous(), self.disk_dir / f"{h.hex()}.pt")
        except OSError:
            log.exception("block cache: cannot write %s", self.disk_dir)
            self.stats.dropped += 1
            return
        self._l3[h] = None
        while len(self._l3) > self.l3_blocks:
            old, _ = self._l3.popitem(last=False)
            self.stats.evictions["l3"] += 1
            self.stats.dropped += 1
            (self.disk_dir / f"{old.hex()}.pt").unlink(missing_ok=True)

    def _take_lower(self, h: bytes) -> tuple[Tensor, bool] | None:
        """Remove block ``h`` from L2 or L3 and return (its data, came from disk)."""
        data = self._l2.pop(h, None)
        if data is not None:
            return data, False
        if h in self._l3 and self.disk_dir is not None:
            path = self.disk_dir / f"{h.hex()}.pt"
            del self._l3[h]
            try:
                data = torch.load(path, map_location="cpu", weights_only=True)
            except (OSError, RuntimeError, EOFError):
                log.warning("block cache: unreadable block file %s dropped", path)
                path.unlink(missing_ok=True)
                return None
            path.unlink(missing_ok=True)
            if not isinstance(data, Tensor) or tuple(data.shape) != self.shape:
                return None
            return data.to(self.dtype), True
        return None

    def _drop_lower(self, h: bytes) -> None:
        self._l2.pop(h, None)
        if h in self._l3 and self.disk_dir is not None:
            del self._l3[h]
            (self.disk_dir / f"{h.hex()}.pt").unlink(missing_ok=True)


__all__ = ["TIERS", "BlockCache", "BlockCacheFull", "BlockCacheStats", "chain_hashes"]
