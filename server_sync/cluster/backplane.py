"""The Redis side of a node's tick: the fenced commit, fenced checkpoints, the stream poll
and the durable view of the world.

* :meth:`Backplane.commit` - one script per tick, everything or nothing: it checks the fence
  of every area the tick wrote, then appends the tick's changes to ``changes`` (one entry),
  forwards intents to other areas' ``intents:AREA`` streams, records the intents this node
  consumed, raises each player's highest applied ``cseq`` and records player positions.
  A fence that is no longer this node's token fails the whole commit (:class:`Fenced`).
  Every player write is fenced too, by the player's session (``"GEN NODE"`` in
  ``sessions``): a player whose session is no longer the one this node holds (a hello on
  another node replaced it, :meth:`Backplane.claim`) writes nothing, not its ``cseq``, its
  position or its talks, and is returned so the node ends that session; the rest of the
  tick is written.
* :meth:`Backplane.claim` - a hello: the player's session becomes this node's (a new
  generation), the node that served it before is told through ``handoffs``, and the
  player's ``cseq`` and position are read in the same script.
* :meth:`Backplane.checkpoint` - saves owned areas (their NPCs' full saves, the change
  entry they include, under their fences) and trims what every checkpoint covers.
* :meth:`Backplane.poll` - the change-stream entries after the node's cursor, the
  intents after each owned area's consumed id and the handoffs after the node's handoff
  cursor (one XREAD).
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

__all__ = ["START", "Backplane", "Claim", "Commit", "DurableView", "Entry", "Fenced",
           "Poll", "stream_id"]

#: stream ids are "MS-SEQ"; the id before every entry
START = "0-0"
#: about how many handoffs the ``handoffs`` stream keeps (a node reads them every tick)
HANDOFFS_KEPT = 10000

_COMMIT = """
-- KEYS: changes, consumed, cseq, player_pos, player_node, sessions, NF fences, intent streams
-- ARGV: node, NF, JSON {f: fences, a: their areas, e: areas JSON or "", c: [[area, id]],
--       s: [[player, session]], q: [[player, cseq]],
--       p: [[player, "x,y" or "", its "player":[x,y] JSON]], i: [[intent key index, body, player]]}
local node, nf = ARGV[1], tonumber(ARGV[2])
local p = cjson.decode(ARGV[3])
for i = 1, nf do
  local cur = redis.call('GET', KEYS[6 + i])
  if cur ~= p.f[i] then return {0, p.a[i], cur or ''} end
end
-- a player whose session a hello on another node replaced writes nothing
local stale, replaced = {}, {}
for _, s in ipairs(p.s) do
  if redis.call('HGET', KEYS[6], s[1]) ~= s[2] then
    stale[s[1]] = true
    replaced[#replaced + 1] = s[1]
  end
end
local moved = {}
for _, pp in ipairs(p.p) do
  if not stale[pp[1]] then
    if pp[2] == '' then
      if redis.call('HGET', KEYS[5], pp[1]) == node then
        redis.call('HDEL', KEYS[4], pp[1])
        redis.call('HDEL', KEYS[5], pp[1])
      end
    else
      redis.call('HSET', KEYS[4], pp[1], pp[2])
      redis.call('HSET', KEYS[5], pp[1], node)
    end
    moved[#moved + 1] = pp[3]
  end
end
local id = ''
if p.e ~= '' or #moved > 0 then
  local areas = p.e
  if areas == '' then areas = '{}' end
  id = redis.call('XADD', KEYS[1], '*', 'n', node,
                  'd', '{"a":' .. areas .. ',"p":{' .. table.concat(moved, ',') .. '}}')
end
for _, it in ipairs(p.i) do
  if not stale[it[3]] then redis.call('XADD', KEYS[6 + nf + it[1]], '*', 'd', it[2]) end
end
for _, c in ipairs(p.c) do redis.call('HSET', KEYS[2], c[1], c[2]) end
for _, q in ipairs(p.q) do
  if not stale[q[1]] and tonumber(q[2]) > tonumber(redis.call('HGET', KEYS[3], q[1]) or '0') then
    redis.call('HSET', KEYS[3], q[1], q[2])
  end
end
return {1, id, replaced}
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

_CLAIM = """
-- KEYS: sessions, player_node, cseq, player_pos, handoffs. ARGV: player, node, handoffs length
local prev = redis.call('HGET', KEYS[1], ARGV[1])
local gen = 1
if prev then gen = tonumber(string.match(prev, '^%d+')) + 1 end
local session = gen .. ' ' .. ARGV[2]
redis.call('HSET', KEYS[1], ARGV[1], session)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
if prev and string.match(prev, '^%d+ (.*)$') ~= ARGV[2] then
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], '*', 'p', ARGV[1], 's', prev)
end
return {session, prev or '', redis.call('HGET', KEYS[3], ARGV[1]) or '0',
        redis.call('HGET', KEYS[4], ARGV[1]) or ''}
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
    handoffs_id: str = START  # the last entry of the handoffs stream


@dataclass
class Claim:
    """A hello's claim of a player (:meth:`Backplane.claim`): the session this node now
    holds, the one before it (``""``: none), the player's highest applied intent seq (0:
    none) and durable position (or None)."""

    session: str
    previous: str
    cseq: int
    pos: tuple[float, float] | None


@dataclass
class Poll:
    """One poll (:meth:`Backplane.poll`): change entries, intents by area, and handoffs
    ``(player, the session that was replaced)``, each in stream order; ``handoffs_id`` is
    the last handoff read (the cursor given when none was)."""

    entries: list[Entry]
    intents: dict[str, list[tuple[str, dict[str, Any]]]]
    handoffs: list[tuple[str, str]]
    handoffs_id: str


@dataclass
class Commit:
    """What one tick writes (see :meth:`Backplane.commit`)."""

    fences: dict[str, str] = field(default_factory=dict)          # area -> token to check
    areas: dict[str, list[list[Any]]] = field(default_factory=dict)  # published changes
    players: dict[str, list[float] | None] = field(default_factory=dict)
    consumed: dict[str, str] = field(default_factory=dict)        # area -> last intent id
    cseq: dict[str, int] = field(default_factory=dict)
    forward: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (area, intent)
    sessions: dict[str, str] = field(default_factory=dict)  # player -> session to check

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
        self._claim = redis.register_script(_CLAIM)

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

    def commit(self, c: Commit) -> tuple[str, list[str]]:
        """Write one tick (see the module docstring); returns the new change entry's id
        ("" when the tick published nothing) and the players of ``c.sessions`` whose session
        was replaced (nothing of theirs written). A player without a session in
        ``c.sessions`` is written unchecked. :class:`Fenced` if an area was taken over."""
        k = self.keys
        fence_areas = list(c.fences)
        targets = sorted({a for a, _ in c.forward})
        index = {a: i + 1 for i, a in enumerate(targets)}
        keys = [k.changes, k.consumed, k.cseq, k.player_pos, k.player_node, k.sessions,
                *(k.fence(a) for a in fence_areas), *(k.intents(a) for a in targets)]
        payload = {
            "f": [c.fences[a] for a in fence_areas], "a": fence_areas,
            "e": _dumps(c.areas) if c.areas else "",
            "c": [[a, i] for a, i in c.consumed.items()],
            "s": [[p, v] for p, v in c.sessions.items()],
            "q": [[p, str(q)] for p, q in c.cseq.items()],
            "p": [[p, "" if v is None else f"{v[0]!r},{v[1]!r}", f"{_dumps(p)}:{_dumps(v)}"]
                  for p, v in c.players.items()],
            "i": [[index[a], _dumps(body), body["player"]] for a, body in c.forward],
        }
        out = self._commit(keys=keys, args=[self.node, len(fence_areas), _dumps(payload)])
        if int(out[0]) == 0:
            raise Fenced(_s(out[1]), _s(out[2]))
        return _s(out[1]), [_s(p) for p in out[2]]

    def claim(self, player: str) -> Claim:
        """A hello of ``player`` on this node: in one script, its session becomes this
        node's (generation + 1; ``player_node`` this node), a session another node held is
        announced on ``handoffs`` for that node to end, and the player's ``cseq`` and
        position are read - so every intent a replaced session got written is in ``cseq``,
        and none it sends later is (the commit's session fence)."""
        k = self.keys
        session, previous, cseq, pos = self._claim(
            keys=[k.sessions, k.player_node, k.cseq, k.player_pos, k.handoffs],
            args=[player, self.node, HANDOFFS_KEPT])
        pos = _s(pos)
        return Claim(_s(session), _s(previous), int(cseq), _pos(pos) if pos else None)

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

    def poll(self, cursor: str, consumed: dict[str, str], count: int = 5000,
             handoffs: str | None = None) -> Poll:
        """The change entries after ``cursor``, the intents after each ``consumed`` id
        (area -> id) and, unless ``handoffs`` is None, the handoffs after that id; at most
        ``count`` per stream, in stream order (one XREAD)."""
        k = self.keys
        streams = {k.changes: cursor, **{k.intents(a): i for a, i in consumed.items()}}
        if handoffs is not None:
            streams[k.handoffs] = handoffs
        got = self.r.xread(streams, count=count) or []
        out = Poll([], {}, [], handoffs or START)
        by_key = {k.intents(a): a for a in consumed}
        for key, rows in got:
            key = _s(key)
            if key == k.changes:
                out.entries = [_entry(_s(i), f) for i, f in rows]
            elif key == k.handoffs:
                out.handoffs = [(_s(f["p"]), _s(f["s"])) for _, f in rows]
                out.handoffs_id = _s(rows[-1][0])
            else:
                out.intents[by_key[key]] = [(_s(i), json.loads(f["d"])) for i, f in rows]
        return out

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
        pipe.xrevrange(k.handoffs, count=1)
        cps, ids, rows, info, pos, nodes, consumed, handoffs = pipe.execute()
        view = DurableView(
            checkpoints={_s(a): json.loads(v) for a, v in cps.items()},
            checkpoint_ids={_s(a): _s(v) for a, v in ids.items()},
            entries=[_entry(_s(i), f) for i, f in rows],
            last_id=_s(info["last-generated-id"]),
            player_pos={_s(p): _pos(_s(v)) for p, v in pos.items()},
            player_node={_s(p): _s(v) for p, v in nodes.items()},
            consumed={_s(a): _s(v) for a, v in consumed.items()},
            handoffs_id=_s(handoffs[0][0]) if handoffs else START)
        return view

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
