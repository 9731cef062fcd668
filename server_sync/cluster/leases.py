"""Area ownership: one lease per area in Redis, a fencing token per takeover, node liveness.

An area is owned by the node named in ``lease:AREA`` (``SET ... NX PX lease_ms``). The owner
renews it every ``lease_ms / 4`` (:meth:`LeaseTable.renew`, a check-and-extend script); a
node that stops renewing (killed, paused, cut off) loses it ``lease_ms`` after its last
renewal. Each acquisition increments ``fence:AREA``: the acquirer's *fencing token*. Every
write an owner makes for an area (:mod:`server_sync.cluster.backplane`) first checks that
the fence is still its token, so a paused or zombie node can never overwrite what its
successor wrote, even if its lease expired without it noticing.

Liveness: each renewal also records the node's heartbeat (Redis time) in the ``nodes``
sorted set; a node is *live* while its heartbeat is younger than ``lease_ms``. Which live
node should own an area is rendezvous hashing (:func:`preferred`): every node computes the
same answer, so nodes that start together split the areas without talking to each other,
and the areas of a dead node go to the survivors in proportion.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .keys import Keys
from .keys import as_str as _s

__all__ = ["Acquired", "LeaseTable", "Renewal", "Scan", "preferred"]

_ACQUIRE = """
-- KEYS: consumed, checkpoints, then per area: lease, fence. ARGV: node, lease_ms, areas...
local out = {}
local n = #ARGV - 2
for i = 1, n do
  local area = ARGV[2 + i]
  if redis.call('SET', KEYS[1 + 2 * i], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local fence = redis.call('INCR', KEYS[2 + 2 * i])
    local consumed = redis.call('HGET', KEYS[1], area) or '0-0'
    local cp = redis.call('HGET', KEYS[2], area) or ''
    out[#out + 1] = {area, tostring(fence), consumed, cp}
  end
end
return out
"""

_RENEW = """
-- KEYS: nodes, then per area: lease, fence. ARGV: node, lease_ms, fences...
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prev = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 100 * tonumber(ARGV[2]))
local out = {tostring(now), prev or '-1'}
local n = #ARGV - 2
for i = 1, n do
  local lease, fence = KEYS[2 * i], KEYS[1 + 2 * i]
  local holder = redis.call('GET', lease)
  local ok = 0
  if holder == ARGV[1] then
    redis.call('PEXPIRE', lease, ARGV[2])
    ok = 1
  elseif not holder and redis.call('GET', fence) == ARGV[2 + i] then
    -- expired, and nobody took it over since: the same token is still the newest
    redis.call('SET', lease, ARGV[1], 'PX', ARGV[2])
    ok = 1
  end
  out[#out + 1] = ok
end
return out
"""

_SCAN = """
-- KEYS: nodes, then every area's lease. ARGV: lease_ms
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. (now - tonumber(ARGV[1])), '+inf')
local holders = {}
for i = 2, #KEYS do holders[#holders + 1] = redis.call('GET', KEYS[i]) or '' end
return {live, holders}
"""

_RELEASE = """
-- KEYS: leases. ARGV: node
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]); n = n + 1 end
end
return n
"""


def preferred(area: str, live: Iterable[str]) -> str | None:
    """The live node that should own ``area`` (rendezvous hashing; None without nodes)."""
    best, best_score = None, b""
    for node in live:
        score = hashlib.blake2b(f"{node}\0{area}".encode(), digest_size=8).digest()
        if best is None or score > best_score:
            best, best_score = node, score
    return best


@dataclass(frozen=True)
class Acquired:
    """An area this node now owns: its fencing token, the last intent its previous owners
    applied and its checkpoint (JSON, "" if it never had one)."""

    area: str
    fence: str
    consumed: str
    checkpoint: str


@dataclass(frozen=True)
class Renewal:
    """A renewal's outcome: the areas kept, the ones lost to another node, and whether this
    node's heartbeat had lapsed (it was not live: paused or cut off for ``lease_ms``)."""

    kept: list[str]
    lost: list[str]
    lapsed: bool


@dataclass(frozen=True)
class Scan:
    """Who is live and who holds each area ("" for none)."""

    live: list[str]
    holders: dict[str, str]


class LeaseTable:
    """The lease operations of one node over a redis-py client (see the module docstring).
    Each method is one round trip (one script); Redis errors propagate to the caller."""

    def __init__(self, redis: Any, keys: Keys, node: str, lease_ms: int) -> None:
        if lease_ms < 100:
            raise ValueError(f"lease_ms must be >= 100, got {lease_ms}")
        self.r = redis
        self.keys = keys
        self.node = node
        self.lease_ms = int(lease_ms)
        self._acquire = redis.register_script(_ACQUIRE)
        self._renew = redis.register_script(_RENEW)
        self._scan = redis.register_script(_SCAN)
        self._release = redis.register_script(_RELEASE)

    def acquire(self, areas: Sequence[str]) -> list[Acquired]:
        """Take every area of ``areas`` that has no owner now (others are skipped)."""
        if not areas:
            return []
        k = self.keys
        keys = [k.consumed, k.checkpoints]
        for a in areas:
            keys += [k.lease(a), k.fence(a)]
        rows = self._acquire(keys=keys, args=[self.node, self.lease_ms, *areas])
        return [Acquired(_s(a), _s(f), _s(c), _s(cp)) for a, f, c, cp in rows]

    def renew(self, fences: dict[str, str]) -> Renewal:
        """Extend the leases of ``fences`` (area -> token) and record the heartbeat. An area
        whose lease expired is taken back if its fence is still ours; otherwise it is lost."""
        k = self.keys
        areas = list(fences)
        keys = [k.nodes]
        for a in areas:
            keys += [k.lease(a), k.fence(a)]
        out = self._renew(keys=keys, args=[self.node, self.lease_ms,
                                           *(fences[a] for a in areas)])
        now, prev = int(out[0]), int(out[1])
        oks = out[2:]
        return Renewal([a for a, ok in zip(areas, oks) if ok],
                       [a for a, ok in zip(areas, oks) if not ok],
                       lapsed=prev >= 0 and now - prev >= self.lease_ms)

    def scan(self, areas: Sequence[str]) -> Scan:
        keys = [self.keys.nodes] + [self.keys.lease(a) for a in areas]
        live, holders = self._scan(keys=keys, args=[self.lease_ms])
        return Scan(sorted(_s(n) for n in live), {a: _s(h) for a, h in zip(areas, holders)})

    def release(self, areas: Sequence[str]) -> int:
        """Give up ``areas`` now (those this node still holds); returns how many."""
        if not areas:
            return 0
        return int(self._release(keys=[self.keys.lease(a) for a in areas], args=[self.node]))

    def leave(self) -> None:
        """Drop this node's heartbeat (a clean shutdown: it is no longer live)."""
        self.r.zrem(self.keys.nodes, self.node)
