"""The server's sans-I/O core: sessions, interest, coalesced deltas, resume, journaling.

No sockets and no clock of its own: the asyncio layer (:mod:`server_sync.sync.server`) calls
:meth:`SyncCore.hello` when a client authenticates, :meth:`SyncCore.receive` for each
later message, :meth:`SyncCore.detach` when a connection drops and :meth:`SyncCore.tick`
at the tick rate, then sends each session's ``outbox`` (encoded frames, in order).

Per tick: apply the intents received since the last tick, step the world, recompute the
areas of players (and around NPCs) that moved, journal intents and changes in one
transaction, then acknowledge intents and emit at most one delta per session holding
every change to NPCs in its area (latest value per key), NPCs entering and NPCs leaving.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterable
from typing import Any

from ..transport.wire import PROTOCOL_VERSION, Codec, ProtocolError, encode
from .interest import SpatialGrid
from .persistence import PLAYER_KEY, POS_KEY, IntentRecord, Store
from .world import Pos, SyncWorld

__all__ = ["Session", "SyncCore"]

Frame = bytes | str


class Session:
    """One player's sync state; survives disconnects for ``grace_s`` seconds."""

    __slots__ = ("accepted", "acked", "area_dirty", "codec", "detached_at", "known",
                 "outbox", "pending_move", "pending_set", "player_id", "ring", "sent",
                 "seq", "want_ack")

    def __init__(self, player_id: str, codec: Codec, ring_size: int, cseq_floor: int) -> None:
        self.player_id = player_id
        self.codec: Codec = codec
        self.seq = 0
        self.ring: deque[tuple[int, Frame]] = deque(maxlen=ring_size)
        self.known: set[str] = set()   # NPCs in the area now
        self.sent: set[str] = set()    # NPCs the client holds as of the last delta/snapshot
        self.area_dirty = False
        self.pending_set: dict[str, dict[str, Any]] = {}
        self.pending_move: dict[str, list[float]] = {}
        self.accepted = cseq_floor  # highest client seq accepted (maybe not yet durable)
        self.acked = cseq_floor     # highest client seq durable and acknowledged
        self.want_ack = False
        self.outbox: list[Frame] = []
        self.detached_at: float | None = None

    @property
    def attached(self) -> bool:
        return self.detached_at is None

    def __repr__(self) -> str:
        return f"<Session {self.player_id} seq={self.seq} known={len(self.known)}>"


class SyncCore:
    """Authoritative sync state for one world (see the module docstring).

    ``radius``: interest radius; an NPC already in a client's area leaves it only beyond
    ``radius * hysteresis``. ``ring_size``: deltas kept per session for resume.
    ``grace_s``: how long a detached session (and its player) is kept.
    ``store``: optional :class:`~server_sync.sync.persistence.Store`; if it holds a saved
    world, the world is recovered from it here. ``snapshot_every_s``: world snapshot
    cadence (in world ticks' ``now``).
    """

    def __init__(self, world: SyncWorld, *, radius: float = 100.0, hysteresis: float = 1.1,
                 ring_size: int = 64, grace_s: float = 30.0, store: Store | None = None,
                 snapshot_every_s: float = 60.0, epoch: str | None = None) -> None:
        if radius <= 0 or hysteresis < 1.0 or ring_size < 1:
            raise ValueError("SyncCore needs radius > 0, hysteresis >= 1 and ring_size >= 1")
        self.world = world
        self.radius = float(radius)
        self.keep_radius = self.radius * hysteresis
        self.ring_size = ring_size
        self.grace_s = grace_s
        self.store = store
        self.snapshot_every_s = snapshot_every_s
        self.epoch = epoch or uuid.uuid4().hex[:16]
        self.frozen = False
        self.sessions: dict[str, Session] = {}
        self.npcs = SpatialGrid(self.radius)
        self.players = SpatialGrid(self.radius)
        self.subs: dict[str, set[Session]] = {}
        self._intents: list[tuple[Session, dict[str, Any]]] = []
        self._changes: list[tuple[str, str, Any]] = []
        self._recompute: set[Session] = set()
        self._moved_npcs: list[str] = []
        self._dirty: set[Session] = set()
        self._cseq_floor: dict[str, int] = {}
        self._last_snapshot = 0.0
        self.now = 0.0
        # counters (the server exports them as metrics)
        self.changes_total = 0
        self.deltas_total = 0
        self.snapshots_total = 0
        self.replays_total = 0
        self.intents_total = 0
        self.duplicate_intents_total = 0
        self.ticks = 0
        for nid in world.npc_ids():
            self.npcs.place(nid, world.npc_position(nid))
            self.subs[nid] = set()
        world.observe(self._on_state, self._on_move)
        if store is not None:
            self._recover(store)

    # ---- world observers -----------------------------------------------------------------
    def _on_state(self, npc_id: str, key: str, old: Any, new: Any) -> None:
        self._changes.append((npc_id, key, new))
        subs = self.subs.get(npc_id)
        if subs:
            for s in subs:
                ch = s.pending_set.get(npc_id)
                if ch is None:
                    s.pending_set[npc_id] = {key: new}
                else:
                    ch[key] = new
            self._dirty.update(subs)

    def _on_move(self, npc_id: str, pos: Pos) -> None:
        self._changes.append((npc_id, POS_KEY, [pos[0], pos[1]]))
        self.npcs.place(npc_id, pos)
        self._moved_npcs.append(npc_id)
        subs = self.subs.get(npc_id)
        if subs:
            for s in subs:
                s.pending_move[npc_id] = [pos[0], pos[1]]
            self._dirty.update(subs)

    # ---- recovery --------------------------------------------------------------------------
    def _recover(self, store: Store) -> None:
        rec = store.recover()
        self._cseq_floor = dict(rec.player_cseq)
        if rec.snapshot is not None:
            self.world.load(rec.snapshot)
        for npc_id, key, value in rec.changes:
            if key == PLAYER_KEY:
                if value is None:
                    self.world.remove_player(npc_id)
                else:
                    self.world.set_player(npc_id, (value[0], value[1]))
                continue
            if key == POS_KEY:
                self.npcs.place(npc_id, (value[0], value[1]))
            self.world.apply_state(npc_id, key, value)
        self._changes.clear()
        self._moved_npcs.clear()
        for nid in self.world.npc_ids():
            self.npcs.place(nid, self.world.npc_position(nid))
        store.write_snapshot(self._save())

    def _save(self) -> dict[str, Any]:
        return self.world.save()

    # ---- sessions ------------------------------------------------------------------------
    def hello(self, player_id: str, msg: dict[str, Any], codec: Codec) -> Session:
        """Attach ``player_id`` (already authenticated) and queue its first frames: the
        missed deltas when ``msg['resume']`` is inside the window, otherwise a snapshot;
        then an ``ack`` of the highest intent seq applied so far (0 if none), which tells
        the client that it is in sync."""
        if msg["v"] != PROTOCOL_VERSION:
            raise ProtocolError("unsupported_version",
                                f"server speaks protocol {PROTOCOL_VERSION}, client {msg['v']}")
        s = self.sessions.get(player_id)
        resume = msg.get("resume")
        if s is not None and resume is not None and s.codec == codec \
                and resume["epoch"] == self.epoch and self._replay(s, resume["seq"]):
            s.detached_at = None
            self.replays_total += 1
            s.outbox.append(encode({"t": "ack", "cseq": s.acked}, s.codec))
            return s
        if s is None:
            s = Session(player_id, codec, self.ring_size, self._cseq_floor.get(player_id, 0))
            self.sessions[player_id] = s
            pos = msg.get("pos")
            if pos is None:
                saved = getattr(self.world, "players", {}).get(player_id)
                pos = saved if saved is not None else (0.0, 0.0)
            self._place_player(s, (float(pos[0]), float(pos[1])))
        s.codec = codec
        s.detached_at = None
        s.outbox.clear()
        self._snapshot(s)
        s.outbox.append(encode({"t": "ack", "cseq": s.acked}, s.codec))
        return s

    def _replay(self, s: Session, last_seq: int) -> bool:
        if last_seq > s.seq:
            return False
        if last_seq == s.seq:
            s.outbox.clear()
            return True
        if not s.ring or s.ring[0][0] > last_seq + 1:
            return False  # outside the window
        s.outbox = [f for seq, f in s.ring if seq > last_seq]
        return True

    def _snapshot(self, s: Session) -> None:
        self._update_area(s)
        world = self.world
        npcs = {n: {"pos": list(world.npc_position(n)), "state": world.npc_state(n)}
                for n in s.known}
        s.sent = set(s.known)
        s.area_dirty = False
        s.pending_set.clear()
        s.pending_move.clear()
        self._dirty.discard(s)
        s.outbox.append(encode({"t": "snapshot", "v": PROTOCOL_VERSION, "epoch": self.epoch,
                                "seq": s.seq, "time": self.now * 1000.0,
                                "radius": self.radius, "npcs": npcs}, s.codec))
        self.snapshots_total += 1

    def receive(self, s: Session, msg: dict[str, Any]) -> None:
        """Handle a validated ``intent`` or ``resync`` (``bye`` is the I/O layer's).
        Frames it queues (a repeated ack, a snapshot) should be sent right away."""
        t = msg["t"]
        if t == "intent":
            cseq = msg["cseq"]
            if cseq <= s.acked:
                self.duplicate_intents_total += 1
                s.outbox.append(encode({"t": "ack", "cseq": s.acked}, s.codec))
            elif cseq <= s.accepted:
                self.duplicate_intents_total += 1  # acknowledged at the end of this tick
            else:
                s.accepted = cseq
                self._intents.append((s, msg))
        elif t == "resync":
            self._snapshot(s)
        elif t == "hello":
            raise ProtocolError("bad_message", "hello: already authenticated")

    def detach(self, s: Session, now: float) -> None:
        """The connection dropped: keep the session (and its deltas) for ``grace_s``."""
        s.detached_at = now
        s.outbox.clear()

    def drop(self, s: Session) -> None:
        """Forget a session now (client said bye, or its grace ran out)."""
        if self.sessions.get(s.player_id) is not s:
            return
        del self.sessions[s.player_id]
        for n in s.known:
            self.subs[n].discard(s)
        self.players.remove(s.player_id)
        self.world.remove_player(s.player_id)
        self._changes.append((s.player_id, PLAYER_KEY, None))
        self._dirty.discard(s)
        self._recompute.discard(s)

    # ---- interest ------------------------------------------------------------------------
    def _place_player(self, s: Session, pos: Pos) -> None:
        self._changes.append((s.player_id, PLAYER_KEY, [pos[0], pos[1]]))
        self.players.place(s.player_id, pos)
        self.world.set_player(s.player_id, pos)
        self._recompute.add(s)

    def _update_area(self, s: Session) -> None:
        pos = self.players.position(s.player_id)
        px, py = pos
        keep2 = self.keep_radius * self.keep_radius
        where = self.npcs.position
        new = set(self.npcs.near(pos, self.radius))
        for n in s.known:
            if n not in new and n in self.npcs:
                x, y = where(n)
                if (x - px) * (x - px) + (y - py) * (y - py) <= keep2:
                    new.add(n)
        if new == s.known:
            return
        for n in new - s.known:
            self.subs[n].add(s)
        for n in s.known - new:
            self.subs[n].discard(s)
        s.known = new
        s.area_dirty = True
        self._dirty.add(s)

    # ---- ticking -------------------------------------------------------------------------
    def _apply_intent(self, player_id: str, body: dict[str, Any]) -> None:
        pos = body.get("pos")
        if pos is not None:
            s = self.sessions.get(player_id)
            if s is not None:
                self._place_player(s, (float(pos[0]), float(pos[1])))
            else:
                self.world.set_player(player_id, (float(pos[0]), float(pos[1])))
                self._changes.append((player_id, PLAYER_KEY, [float(pos[0]), float(pos[1])]))
        talk = body.get("talk")
        if talk is not None:
            self.world.talk(talk["npc"], player_id, talk["intent"])

    def tick(self, dt: float, now: float) -> list[Session]:
        """One server tick at wall time ``now`` (seconds); returns the attached sessions
        with frames to send (in each ``outbox``)."""
        self.now = now
        self.ticks += 1
        intents, self._intents = self._intents, []
        for s, msg in intents:
            self._apply_intent(s.player_id, msg)
        self.intents_total += len(intents)
        if not self.frozen:
            self.world.step(dt)
        for nid in self._moved_npcs:
            pos = self.npcs.position(nid)
            for pid in self.players.near(pos, self.keep_radius):
                self._recompute.add(self.sessions[pid])
            self._recompute.update(self.subs.get(nid, ()))
        self._moved_npcs.clear()
        for s in self._recompute:
            if s.player_id in self.sessions:
                self._update_area(s)
        self._recompute.clear()
        changes, self._changes = self._changes, []
        self.changes_total += sum(1 for c in changes if c[1][0] != "@")
        if self.store is not None and (intents or changes):
            self.store.commit_tick(
                (IntentRecord(s.player_id, m["cseq"], {k: v for k, v in m.items()
                                                         if k in ("pos", "talk")})
                 for s, m in intents), changes)
        out: set[Session] = set()
        acking: set[Session] = set()
        for s, _ in intents:
            if s.acked < s.accepted:
                s.acked = s.accepted
                acking.add(s)
        t_ms = now * 1000.0
        for s in self._dirty:
            if self._flush(s, t_ms, s in acking):  # a delta carries the ack along
                acking.discard(s)
                if s.attached:
                    out.add(s)
        self._dirty.clear()
        for s in acking:
            if s.attached:
                s.outbox.append(encode({"t": "ack", "cseq": s.acked}, s.codec))
                out.add(s)
        self._expire(now)
        if self.store is not None and now - self._last_snapshot >= self.snapshot_every_s:
            self._last_snapshot = now
            self.store.write_snapshot(self._save())
        return list(out)

    def _flush(self, s: Session, t_ms: float, ack: bool) -> bool:
        msg: dict[str, Any] = {"t": "delta", "seq": s.seq + 1, "time": t_ms}
        known = s.known
        entered: set[str] = set()
        if s.area_dirty:
            entered = known - s.sent
            left = s.sent - known
            s.sent = set(known)
            s.area_dirty = False
            if entered:
                world = self.world
                msg["enter"] = {n: {"pos": list(world.npc_position(n)),
                                    "state": world.npc_state(n)} for n in entered}
            if left:
                msg["leave"] = sorted(left)
        if s.pending_set:
            sets = {n: ch for n, ch in s.pending_set.items() if n in known and n not in entered}
            if sets:
                msg["set"] = sets
            s.pending_set = {}
        if s.pending_move:
            moves = {n: p for n, p in s.pending_move.items() if n in known and n not in entered}
            if moves:
                msg["move"] = moves
            s.pending_move = {}
        if len(msg) == 3:
            return False
        if ack:
            msg["ack"] = s.acked
        s.seq += 1
        frame = encode(msg, s.codec)
        s.ring.append((s.seq, frame))
        self.deltas_total += 1
        if s.attached:
            s.outbox.append(frame)
        return True

    def _expire(self, now: float) -> None:
        if not self.grace_s or self.ticks % 10:
            return
        gone = [s for s in self.sessions.values()
                if s.detached_at is not None and now - s.detached_at > self.grace_s]
        for s in gone:
            self.drop(s)

    # ---- inspection ----------------------------------------------------------------------
    def area_of(self, player_id: str) -> dict[str, Any]:
        """What the client of ``player_id`` should hold: {seq, npcs: {id: {pos, state}}},
        plus ``player_pos``, where the server has the player."""
        s = self.sessions[player_id]
        w = self.world
        return {"seq": s.seq, "player_pos": list(self.players.position(player_id)),
                "npcs": {n: {"pos": list(w.npc_position(n)), "state": w.npc_state(n)}
                         for n in s.sent}}

    def areas(self, players: Iterable[str] | None = None) -> dict[str, Any]:
        ids = self.sessions.keys() if players is None else players
        return {p: self.area_of(p) for p in ids if p in self.sessions}
