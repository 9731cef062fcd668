"""The Redis side of a node's tick: the fenced commit, fenced checkpoints, the stream poll
and the durable view of the world.

* :meth:`Backplane.commit` - one script per tick, everything or nothing: it checks the fence
  of every area the tick wrote, then appends the tick's changes to ``changes`` (one entry),
  forwards intents to other areas' ``intents:AREA`` streams, records the intents this node
  consumed, raises each player's highest applied ``cseq`` and records player positions.
  A fence that is no longer this node's token fails the whole commit (:class:`Fenced`).
* :meth:`Backplane.checkpoint` - saves owned areas (their NPCs' full saves, the change
  entry they include, under their fences) and trims what every checkpoint covers.
* :meth:`Backplane.poll` - the change-stream entries after the node's cursor and the
  intents after each owned area's consumed id (one XREAD).
* :meth:`Backplane.durable_view` - checkpoints plus the change stream, read in one
  transaction: what the world is once everything acknowledged is applied.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .keys import Keys
from .keys import as_str as _s

__all__ = ["START", "Backplane", "Commit", "DurableView", "Entry", "Fenced", "stream_id"]

#: stream ids are "MS-SEQ"; the id before every entry
START = "0-0"

_COMMIT = """
-- KEYS: changes, consumed, cseq, player_pos, player_node, NF fences, intent streams
-- ARGV: node, NF, JSON {f: fences, a: their areas, e: entry or "", c: [[area, id]],
--       q: [[player, cseq]], p: [[player, "x,y" or ""]], i: [[intent key index, body]]}
local node, nf = ARGV[1], tonumber(ARGV[2])
local p = cjson.decode(ARGV[3])
for i = 1, nf do
  local cur = redis.call('GET', KEYS[5 + i])
  if cur ~= p.f[i] then return {0, p.a[i], cur or ''} end
end
local id = ''
if p.e ~= '' then id = redis.call('XADD', KEYS[1], '*', 'n', node, 'd', p.e) end
for _, it in ipairs(p.i) do redis.call('XADD', KEYS[5 + nf + it[1]], '*', 'd', it[2]) end
for _, c in ipairs(p.c) do redis.call('HSET', KEYS[2], c[1], c[2]) end
for _, q in ipairs(p.q) do
  if tonumber(q[2]) > tonumber(redis.call('HGET', KEYS[3], q[1]) or '0') then
    redis.call('HSET', KEYS[3], q[1], q[2])
  end
end
for _, pp in ipairs(p.p) do
  if pp[2] == '' then
    if redis.call('HGET', KEYS[5], pp[1]) == node then
      redis.call('HDEL', KEYS[4], pp[1])
      redis.call('HDEL', KEYS[5], pp[1])
    end
  else
    redis.call('HSET', KEYS[4], pp[1], pp[2])
    redis.call('HSET', KEYS[5], pp[1], node)
  end
end
return {1, id}
"""

_CHECKPOINT = """
-- KEYS: changes, checkpoints, checkpoint_ids, consumed, N fences, N intent streams
-- ARGV: N, JSON {a: areas, f: fences, d: checkpoint JSON per area}
local n = tonumber(ARGV[1])
local p = cjson.decode(ARGV[2])
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local id = '0-0'
if last[1] then id = last[1][1] end
local lost = {}
for i = 1, n do
  if redis.call('GET', KEYS[4 + i]) == p.f[i] then
    redis.call('HSET', KEYS[2], p.a[i], p.d[i])
    redis.call('HSET', KEYS[3], p.a[i], id)
    local c = redis.call('HGET', KEYS[4], p.a[i])
    if c then redis.call('XTRIM', KEYS[4 + n + i], 'MINID', c) end
  else
    lost[#lost + 1] = p.a[i]
  end
end
-- the change stream is needed from the oldest checkpoint on
local min, minms, minseq = nil, 0, 0
for _, v in ipairs(redis.call('HVALS', KEYS[3])) do
  local ms, seq = string.match(v, '(%d+)-(%d+)')
  ms, seq = tonumber(ms), tonumber(seq)
  if min == nil or ms < minms or (ms == minms and seq < minseq) then
    min, minms, minseq = v, ms, seq
  end
end
if min then redis.call('XTRIM', KEYS[1], 'MINID', '~', min) end
return {id, lost}
"""

_INIT = """
-- KEYS: meta, changes. ARGV: fingerprint
redis.call('HSETNX', KEYS[1], 'world', ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('XADD', KEYS[2], '*', 'n', '', 'd', '{}') end
return redis.call('HGET', KEYS[1], 'world')
"""


class Fenced(Exception):
    """A commit was refused: ``area`` has a newer owner (its fence is ``fence``)."""

    def __init__(self, area: str, fence: str) -> None:
        super().__init__(f"area {area} was taken over by another node (fence now {fence or '-'})")
        self.area = area
        self.fence = fence


def stream_id(s: str) -> tuple[int, int]:
    """A stream id as a sortable pair ("1700000000000-3" -> (1700000000000, 3))."""
    ms, _, seq = s.partition("-")
    return int(ms), int(seq or 0)


@dataclass
class Entry:
    """One change-stream entry: who wrote it, each area's changes ``[npc, key, value]`` and
    player positions (``[x, y]``, or None when the player left that node)."""

    id: str
    node: str
    areas: dict[str, list[list[Any]]]
    players: dict[str, list[float] | None]


@dataclass
class DurableView:
    """Checkpoints (area -> {fence, npcs}), the change entry each includes, the entries of
    the change stream after the oldest checkpoint, the last id, and durable players."""

    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoint_ids: dict[str, str] = field(default_factory=dict)
    entries: list[Entry] = field(default_factory=list)
    last_id: str = START
    consumed: dict[str, str] = field(default_factory=dict)
    player_pos: dict[str, tuple[float, float]] = field(default_factory=dict)
    player_node: dict[str, str] = field(default_factory=dict)


@dataclass
class Commit:
    """What one tick writes (see :meth:`Backplane.commit`)."""

    fences: dict[str, str] = field(default_factory=dict)          # area -> token to check
    areas: dict[str, list[list[Any]]] = field(default_factory=dict)  # published changes
    players: dict[str, list[float] | None] = field(default_factory=dict)
    consumed: dict[str, str] = field(default_factory=dict)        # area -> last intent id
    cseq: dict[str, int] = field(default_factory=dict)
    forward: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (area, intent)

    def __bool__(self) -> bool:
        return bool(self.areas or self.players or self.consumed or self.cseq or self.forward)


_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


class Backplane:
    """A node's scripted reads and writes (see the module docstring). Redis errors, and
    ValueError for a value JSON cannot hold, propagate to the caller."""

    def __init__(self, redis: Any, keys: Keys, node: str) -> None:
        self.r = redis
        self.keys = keys
        self.node = node
        self._commit = redis.register_script(_COMMIT)
        self._checkpoint = redis.register_script(_CHECKPOINT)
        self._init = redis.register_script(_INIT)

    def join(self, fingerprint: str) -> None:
        """Record the world's fingerprint, or check it against the one recorded; ValueError
        when this node's world differs from the others'."""
        k = self.keys
        have = _s(self._init(keys=[k.meta, k.changes], args=[fingerprint]))
        if have != fingerprint:
            raise ValueError(
                f"node {self.node}: its world ({fingerprint}) differs from the one the other "
                f"nodes serve in Redis world {k.prefix!r} ({have}); every node must run the "
                f"same --world, --seed and --area-size")

    def commit(self, c: Commit) -> str:
        """Write one tick (see the module docstring); returns the new change entry's id
        ("" when the tick published no changes). :class:`Fenced` if an area was taken over."""
        k = self.keys
        fence_areas = list(c.fences)
        targets = sorted({a for a, _ in c.forward})
        index = {a: i + 1 for i, a in enumerate(targets)}
        keys = [k.changes, k.consumed, k.cseq, k.player_pos, k.player_node,
                *(k.fence(a) for a in fence_areas), *(k.intents(a) for a in targets)]
        entry = _dumps({"a": c.areas, "p": c.players}) if (c.areas or c.players) else ""
        payload = {
            "f": [c.fences[a] for a in fence_areas], "a": fence_areas, "e": entry,
            "c": [[a, i] for a, i in c.consumed.items()],
            "q": [[p, str(q)] for p, q in c.cseq.items()],
            "p": [[p, "" if v is None else f"{v[0]!r},{v[1]!r}"] for p, v in c.players.items()],
            "i": [[index[a], _dumps(body)] for a, body in c.forward],
        }
        out = self._commit(keys=keys, args=[self.node, len(fence_areas), _dumps(payload)])
        if int(out[0]) == 0:
            raise Fenced(_s(out[1]), _s(out[2]))
        return _s(out[1])

    def checkpoint(self, saves: dict[str, str], fences: dict[str, str]) -> tuple[str, list[str]]:
        """Checkpoint each area of ``saves`` (area -> JSON) under its fence; returns the
        change entry they include and the areas whose fence is no longer ours (not written)."""
        if not saves:
            return "", []
        k = self.keys
        areas = list(saves)
        keys = [k.changes, k.checkpoints, k.checkpoint_ids, k.consumed,
                *(k.fence(a) for a in areas), *(k.intents(a) for a in areas)]
        payload = {"a": areas, "f": [fences[a] for a in areas], "d": [saves[a] for a in areas]}
        cid, lost = self._checkpoint(keys=keys, args=[len(areas), _dumps(payload)])
        return _s(cid), [_s(a) for a in lost]

    def poll(self, cursor: str, consumed: dict[str, str], count: int = 5000
             ) -> tuple[list[Entry], dict[str, list[tuple[str, dict[str, Any]]]]]:
        """The change entries after ``cursor`` and the intents after each ``consumed`` id
        (area -> id), at most ``count`` per stream, in stream order."""
        k = self.keys
        streams = {k.changes: cursor, **{k.intents(a): i for a, i in consumed.items()}}
        got = self.r.xread(streams, count=count) or []
        entries: list[Entry] = []
        intents: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        by_key = {k.intents(a): a for a in consumed}
        for key, rows in got:
            key = _s(key)
            if key == k.changes:
                entries = [_entry(_s(i), f) for i, f in rows]
            else:
                intents[by_key[key]] = [(_s(i), json.loads(f["d"])) for i, f in rows]
        return entries, intents

    def deleted_after(self, cursor: str) -> bool:
        """Whether entries after ``cursor`` were trimmed from the change stream (a node that
        fell that far behind must reload its mirrors)."""
        info = self.r.xinfo_stream(self.keys.changes)
        deleted = _s(info.get("max-deleted-entry-id", START))
        return stream_id(deleted) > stream_id(cursor)

    def durable_view(self) -> DurableView:
        """Everything durable about the world, read in one transaction."""
        k = self.keys
        pipe = self.r.pipeline(transaction=True)
        pipe.hgetall(k.checkpoints)
        pipe.hgetall(k.checkpoint_ids)
        pipe.xrange(k.changes)
        pipe.xinfo_stream(k.changes)
        pipe.hgetall(k.player_pos)
        pipe.hgetall(k.player_node)
        pipe.hgetall(k.consumed)
        cps, ids, rows, info, pos, nodes, consumed = pipe.execute()
        view = DurableView(
            checkpoints={_s(a): json.loads(v) for a, v in cps.items()},
            checkpoint_ids={_s(a): _s(v) for a, v in ids.items()},
            entries=[_entry(_s(i), f) for i, f in rows],
            last_id=_s(info["last-generated-id"]),
            player_pos={_s(p): _pos(_s(v)) for p, v in pos.items()},
            player_node={_s(p): _s(v) for p, v in nodes.items()},
            consumed={_s(a): _s(v) for a, v in consumed.items()})
        return view

    def player_state(self, player: str) -> tuple[int, tuple[float, float] | None]:
        """A player's highest applied intent seq (0: none) and durable position (or None)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hget(self.keys.cseq, player)
        pipe.hget(self.keys.player_pos, player)
        cseq, pos = pipe.execute()
        return int(cseq or 0), None if pos is None else _pos(_s(pos))

    def pending_intents(self, areas: Sequence[str]) -> dict[str, int]:
        """Per area: intents in its stream after the consumed id (for checks and /health)."""
        k = self.keys
        pipe = self.r.pipeline(transaction=True)
        pipe.hgetall(k.consumed)
        for a in areas:
            pipe.xrevrange(k.intents(a), count=1)
        consumed, *lasts = pipe.execute()
        consumed = {_s(a): _s(v) for a, v in consumed.items()}
        out = {}
        for a, last in zip(areas, lasts):
            if last:
                n = len(self.r.xrange(k.intents(a), min=f"({consumed.get(a, START)}"))
                if n:
                    out[a] = n
        return out


def _entry(eid: str, fields: dict[Any, Any]) -> Entry:
    f = {_s(k): _s(v) for k, v in fields.items()}
    d = json.loads(f.get("d", "{}"))
    return Entry(eid, f.get("n", ""), d.get("a", {}), d.get("p", {}))


def _pos(v: str) -> tuple[float, float]:
    x, _, y = v.partition(",")
    return float(x), float(y)
