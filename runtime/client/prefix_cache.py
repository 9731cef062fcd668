"""Prefix KV cache: the keys/values of a prompt's invariant prefix, computed once and shared.

A line prompt starts with ``<bos> <arch:A> <persona:P>... <state:S>`` (see
:meth:`runtime.tokenizer.Tokenizer.encode_prompt`); every request and every NPC with that
prefix can start decoding from the same keys and values. :class:`PrefixCache` keeps them:

* L1, in memory: least-recently-used entries within a byte budget (``max_bytes``);
* L2, optional, on disk (``disk_dir``): one ``.npz`` file per entry, written when an entry is
  computed and read back on an L1 miss, so prefixes survive a restart. :meth:`PrefixCache.preload`
  fills L1 from L2 at start-up.

Entries belong to a *domain* (``"barks"``, ``"quest"``, ...) whose time to live
(``ttl_seconds[domain]``, else ``default_ttl``; ``None`` = forever) decides when an entry is
stale, in L1 and L2 alike. Keys include a model fingerprint, so two models never share entries.

The cached arrays are read-only and shared between callers; onnxruntime only reads its past
inputs, so sharing them is safe. Thread-safe. Hit and miss are counted in prefix tokens.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

KV = list[np.ndarray]


@dataclass
class CacheStats:
    """Counters since the cache was made; ``*_tokens`` count prefix tokens, not requests."""

    queries_tokens: int = 0
    hits_tokens: int = 0
    l1_hits: int = 0
    l2_hits: int = 0
    misses: int = 0
    evictions: int = 0
    expired: int = 0
    entries: int = 0
    bytes: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits_tokens / self.queries_tokens if self.queries_tokens else 0.0


@dataclass
class _Entry:
    kv: KV
    nbytes: int
    domain: str
    created: float
    extra: dict[str, np.ndarray] = field(default_factory=dict)


class PrefixCache:
    """L1 (memory, LRU within ``max_bytes``) + optional L2 (``disk_dir``) prefix KV cache.

    ``fingerprint`` identifies the model (keys from different fingerprints never match).
    ``clock`` returns seconds (``time.time`` by default; tests pass their own).
    """

    def __init__(self, *, max_bytes: int = 32 * 1024 * 1024, disk_dir: str | Path | None = None,
                 default_ttl: float | None = None, ttl_seconds: Mapping[str, float | None] | None = None,
                 fingerprint: str = "", clock: Callable[[], float] = time.time) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        for dom, ttl in {"<default>": default_ttl, **(ttl_seconds or {})}.items():
            if ttl is not None and not ttl > 0:
                raise ValueError(f"ttl for domain {dom!r} must be > 0 seconds or None, got {ttl!r}")
        self.max_bytes = max_bytes
        self.default_ttl = default_ttl
        self.ttl_seconds: dict[str, float | None] = dict(ttl_seconds or {})
        self.fingerprint = fingerprint
        self.clock = clock
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
        self._l1: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.stats = CacheStats()

    # ------------------------------------------------------------ policy

    def ttl(self, domain: str) -> float | None:
        """Seconds an entry of ``domain`` stays fresh (None = no limit)."""
        return self.ttl_seconds.get(domain, self.default_ttl)

    def _fresh(self, created: float, domain: str, now: float) -> bool:
        ttl = self.ttl(domain)
        return ttl is None or now - created < ttl

    def _file(self, key: tuple[int, ...]) -> Path:
        assert self.disk_dir is not None
        h = hashlib.sha256(f"{self.fingerprint}|{','.join(map(str, key))}".encode()).hexdigest()[:32]
        return self.disk_dir / f"prefix-{h}.npz"

    # ------------------------------------------------------------ lookup

    def get(self, prefix: Sequence[int], domain: str = "default") -> KV | None:
        """The cached KV of ``prefix`` (fresh for ``domain``'s TTL), or None; counts the query."""
        key = tuple(int(t) for t in prefix)
        now = self.clock()
        with self._lock:
            self.stats.queries_tokens += len(key)
            entry = self._l1.get(key)
            if entry is not None and not self._fresh(entry.created, entry.domain, now):
                self._drop(key)
                self.stats.expired += 1
                entry = None
            if entry is not None:
                self._l1.move_to_end(key)
                self.stats.hits_tokens += len(key)
                self.stats.l1_hits += 1
                return entry.kv
        kv = self._read_disk(key, domain, now)
        with self._lock:
            if kv is None:
                self.stats.misses += 1
                return None
            self.stats.hits_tokens += len(key)
            self.stats.l2_hits += 1
        return kv

    def put(self, prefix: Sequence[int], kv: KV, domain: str = "default", *, persist: bool = True) -> KV:
        """Store ``kv`` (arrays become read-only) for ``prefix``; returns the stored arrays."""
        key = tuple(int(t) for t in prefix)
        stored = [np.ascontiguousarray(a) for a in kv]
        for a in stored:
            a.flags.writeable = False
        now = self.clock()
        self._insert(key, stored, domain, now)
        if persist and self.disk_dir is not None:
            self._write_disk(key, stored, domain, now)
        return stored

    def get_or_compute(self, prefix: Sequence[int], compute: Callable[[], KV],
                       domain: str = "default") -> tuple[KV, bool]:
        """(KV, hit): the cached KV, or ``compute()``'s, which is then stored."""
        kv = self.get(prefix, domain)
        if kv is not None:
            return kv, True
        return self.put(prefix, compute(), domain), False

    def _insert(self, key: tuple[int, ...], kv: KV, domain: str, created: float) -> None:
        nbytes = sum(a.nbytes for a in kv)
        with self._lock:
            if key in self._l1:
                self._drop(key)
            if nbytes > self.max_bytes:
                return
            while self._bytes + nbytes > self.max_bytes and self._l1:
                self._drop(next(iter(self._l1)))
                self.stats.evictions += 1
            self._l1[key] = _Entry(kv, nbytes, domain, created)
            self._bytes += nbytes
            self._sync_stats()

    def _drop(self, key: tuple[int, ...]) -> None:
        entry = self._l1.pop(key)
        self._bytes -= entry.nbytes
        self._sync_stats()

    def _sync_stats(self) -> None:
        self.stats.entries = len(self._l1)
        self.stats.bytes = self._bytes

    def clear(self, *, disk: bool = False) -> None:
        """Empty L1 (and L2 with ``disk=True``)."""
        with self._lock:
            self._l1.clear()
            self._bytes = 0
            self._sync_stats()
        if disk and self.disk_dir is not None:
            for p in self.disk_dir.glob("prefix-*.npz"):
                p.unlink(missing_ok=True)

    def __len__(self) -> int:
        return len(self._l1)

    # ------------------------------------------------------------ L2

    def _write_disk(self, key: tuple[int, ...], kv: KV, domain: str, created: float) -> None:
        path = self._file(key)
        arrays = {f"kv{i}": a for i, a in enumerate(kv)}
        meta = np.array([self.fingerprint, domain, repr(created)])
        # write to a temp file and rename, so a crash never leaves a torn entry behind
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, key=np.asarray(key, dtype=np.int64), meta=meta, **arrays)
            os.replace(tmp, path)
        except OSError:
            Path(tmp).unlink(missing_ok=True)

    def _load_file(self, path: Path) -> tuple[tuple[int, ...], KV, str, float] | None:
        try:
            with np.load(path, allow_pickle=False) as z:
                key = tuple(int(t) for t in z["key"])
                fingerprint, domain, created = (str(s) for s in z["meta"])
                kv = [z[f"kv{i}"] for i in range(len(z.files) - 2)]
        except (OSError, ValueError, KeyError, EOFError):
            path.unlink(missing_ok=True)  # unreadable entries are recomputed, never trusted
            return None
        if fingerprint != self.fingerprint:
            return None
        return key, kv, domain, float(created)

    def _read_disk(self, key: tuple[int, ...], domain: str, now: float) -> KV | None:
        if self.disk_dir is None:
            return None
        path = self._file(key)
        if not path.is_file():
            return None
        loaded = self._load_file(path)
        if loaded is None or loaded[0] != key:
            return None
        _, kv, stored_domain, created = loaded
        if not self._fresh(created, stored_domain, now):
            path.unlink(missing_ok=True)
            with self._lock:
                self.stats.expired += 1
            return None
        for a in kv:
            a.flags.writeable = False
        self._insert(key, kv, stored_domain, created)
        return kv

    def preload(self) -> int:
        """Read fresh L2 entries of this model into L1 (newest first, within the budget); returns how many."""
        if self.disk_dir is None:
            return 0
        now = self.clock()
        files = sorted(self.disk_dir.glob("prefix-*.npz"), key=lambda p: p.stat().st_mtime, reverse=True)
        n = 0
        for path in files:
            loaded = self._load_file(path)
            if loaded is None:
                continue
            key, kv, domain, created = loaded
            if not self._fresh(created, domain, now):
                path.unlink(missing_ok=True)
                continue
            nbytes = sum(a.nbytes for a in kv)
            if self._bytes + nbytes > self.max_bytes:
                break
            for a in kv:
                a.flags.writeable = False
            self._insert(key, kv, domain, created)
            n += 1
        return n


__all__ = ["CacheStats", "PrefixCache"]
