"""The server's sans-I/O core: sessions, interest, coalesced deltas, resume, journaling.

No sockets and no clock of its own: the asyncio layer (:mod:`server_sync.sync.server`) calls
:meth:`SyncCore.hello` when a client authenticates, :meth:`SyncCore.receive` for each
later message, :meth:`SyncCore.detach` when a connection drops and :meth:`SyncCore.tick`
at the tick rate, then sends each session's ``outbox`` (encoded frames, in order).

Per tick: apply the intents received since the last tick (or refuse them, by the rules of
:mod:`server_sync.sync.authority`), step the world, recompute the areas of players (and
around NPCs) that moved, journal intents and changes in one transaction, then send the
refusals, acknowledge intents and emit at most one delta per session holding every change to
NPCs in its area (latest value per key), NPCs entering and NPCs leaving.

Durability: nothing leaves the core before the tick that produced it is journaled. When the
journal cannot be written (:class:`~server_sync.sync.persistence.StoreError`: disk full,
database error), the core *fails closed*: it drops everything the tick did in memory by
reloading the last durable state from the database, forgets every session (their clients
reconnect and send their unacknowledged intents again), starts a new epoch and sets
:attr:`SyncCore.unavailable` to the cause. While unavailable it refuses hellos, does not step
the world, and once a second tries to write a snapshot; the first that succeeds ends the
outage.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Iterable
from typing import Any

from ..transport.wire import PROTOCOL_VERSION, Codec, ProtocolError, encode
from .authority import MoveBudget, Refusal, Rules, bounds_around
from .interest import SpatialGrid
from .persistence import PLAYER_KEY, POS_KEY, IntentRecord, Recovery, Store, StoreError
from .world import TALK_INTENTS, Pos, SyncWorld

__all__ = ["Session", "SyncCore"]

log = logging.getLogger("flashnpc.server_sync")

#: seconds between attempts to end an outage of the journal
PROBE_EVERY_S = 1.0

Frame = bytes | str


class Session:
    """One player's sync state; survives disconnects for ``grace_s`` seconds."""

    __slots__ = ("accepted", "acked", "area_dirty", "budget", "codec", "detached_at", "known",
                 "outbox", "pending_move", "pending_pos", "pending_set", "player_id", "ring",
                 "sent", "seq", "want_ack")

    def __init__(self, player_id: str, codec: Codec, ring_size: int, cseq_floor: int,
                 budget: MoveBudget) -> None:
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
        self.budget = budget  # movement allowance (server authority)
        self.pending_pos: list[float] | None = None  # an admin move the client must hear of

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
    cadence (in world ticks' ``now``). Server authority (:mod:`server_sync.sync.authority`):
    ``max_speed`` (units/s), ``move_burst_s``, ``talk_range`` (default ``radius``) and
    ``bounds`` (x0, y0, x1, y1; default: the NPCs' bounding box grown by ``radius``).
    ``tick_hz`` is announced in snapshots.
    """

    def __init__(self, world: SyncWorld, *, radius: float = 100.0, hysteresis: float = 1.1,
                 ring_size: int = 64, grace_s: float = 30.0, store: Store | None = None,
                 snapshot_every_s: float = 60.0, epoch: str | None = None,
                 max_speed: float = 50.0, move_burst_s: float = 2.0,
                 talk_range: float | None = None,
                 bounds: tuple[float, float, float, float] | None = None,
                 tick_hz: float = 20.0) -> None:
        if radius <= 0 or hysteresis < 1.0 or ring_size < 1:
            raise ValueError("SyncCore needs radius > 0, hysteresis >= 1 and ring_size >= 1")
        self.world = world
        self.tick_hz = float(tick_hz)
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
        self._admin_moves: list[tuple[str, Pos]] = []
        self._last_snapshot = 0.0
        self._last_probe = 0.0
        self.now = 0.0
        #: why the journal cannot be written (the core refuses clients meanwhile), or None
        self.unavailable: str | None = None
        #: the last failed snapshot write (the journal still works), or None
        self.snapshot_error: str | None = None
        # counters (the server exports them as metrics)
        self.changes_total = 0
        self.deltas_total = 0
        self.snapshots_total = 0
        self.replays_total = 0
        self.intents_total = 0
        self.duplicate_intents_total = 0
        self.refused_total = 0
        self.outages_total = 0
        self.ticks = 0
        for nid in world.npc_ids():
            self.npcs.place(nid, world.npc_position(nid))
            self.subs[nid] = set()
        intents = getattr(world, "intents", None)
        self.rules = Rules(
            bounds=bounds or bounds_around((world.npc_position(n) for n in world.npc_ids()),
                                           self.radius),
            intents=frozenset(intents() if callable(intents) else TALK_INTENTS),
            radius=self.radius, talk_range=self.radius if talk_range is None else talk_range,
            max_speed=max_speed, move_burst_s=move_burst_s)
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
        self._load(store.recover())
        store.write_snapshot(self._save())

    def _load(self, rec: Recovery) -> None:
        """Put the world in the durable state ``rec`` describes."""
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

    def _fail_closed(self, err: StoreError) -> None:
        """The journal could not take a tick: drop what the tick did by reloading the
        durable state, forget every session, start a new epoch (module docstring)."""
        assert self.store is not None
        self.unavailable = str(err)
        self.outages_total += 1
        self._last_probe = self.now
        log.error("journal unavailable, refusing clients until a snapshot can be written: %s",
                  err)
        self.sessions.clear()
        self.subs = {n: set() for n in self.subs}
        self.players = SpatialGrid(self.radius)
        self._intents.clear()
        self._admin_moves.clear()
        self._recompute.clear()
        self._dirty.clear()
        for pid in list(getattr(self.world, "players", {})):
            self.world.remove_player(pid)
        try:
            self._load(self.store.recover())
        except StoreError as exc:
            self.unavailable = f"{err}; and the database cannot be read: {exc}"
        self._changes.clear()
        self._moved_npcs.clear()
        self.epoch = uuid.uuid4().hex[:16]

    def _probe(self, now: float) -> None:
        """While unavailable: try to write a snapshot of the durable state."""
        if now - self._last_probe < PROBE_EVERY_S:
            return
        self._last_probe = now
        assert self.store is not None
        try:
            if self.unavailable is not None and "cannot be read" in self.unavailable:
                self._load(self.store.recover())
            self.store.write_snapshot(self._save())
        except StoreError as exc:
            log.warning("journal still unavailable: %s", exc)
            return
        log.warning("journal writable again: serving")
        self.unavailable = None
        self._last_snapshot = now

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
        if self.unavailable is not None:
            raise ProtocolError("unavailable", f"the server cannot save the world now "
                                               f"({self.unavailable}); try again later")
        s = self.sessions.get(player_id)
        resume = msg.get("resume")
        if s is not None and resume is not None and s.codec == codec \
                and resume["epoch"] == self.epoch and self._replay(s, resume["seq"]):
            s.detached_at = None
            self.replays_total += 1
            s.outbox.append(encode({"t": "ack", "cseq": s.acked}, s.codec))
            return s
        if s is None:
            s = Session(player_id, codec, self.ring_size, self._cseq_floor.get(player_id, 0),
                        self.rules.new_budget(self.now))
            self.sessions[player_id] = s
            self._place_player(s, self._spawn(player_id, msg.get("pos")))
        s.codec = codec
        s.detached_at = None
        s.outbox.clear()
        self._snapshot(s)
        s.outbox.append(encode({"t": "ack", "cseq": s.acked}, s.codec))
        return s

    def _spawn(self, player_id: str, hello_pos: Any) -> Pos:
        """Where a player without a session starts: its position on the server (recovered
        after a restart) if it has one, else the hello's ``pos``, else the middle of the
        world; clamped into the world bounds."""
        saved = getattr(self.world, "players", {}).get(player_id)
        if saved is not None:
            pos = saved
        elif hello_pos is not None:
            pos = hello_pos
        else:
            x0, y0, x1, y1 = self.rules.bounds
            pos = ((x0 + x1) / 2, (y0 + y1) / 2)
        return self.rules.clamp((float(pos[0]), float(pos[1])))

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
        s.pending_pos = None  # the snapshot says where the player is
        s.outbox.append(encode({"t": "snapshot", "v": PROTOCOL_VERSION, "epoch": self.epoch,
                                "seq": s.seq, "time": self.now * 1000.0,
                                "radius": self.radius, "tick_hz": self.tick_hz,
                                "pos": list(self.players.position(s.player_id)),
                                "npcs": npcs}, s.codec))
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
    def teleport(self, player_id: str, pos: Pos) -> None:
        """An admin move: put ``player_id`` at ``pos`` at the next tick, whatever its speed
        (journaled like an intent; its client hears of it in a delta's ``pos``). ValueError
        outside the world bounds or for a player the server does not know."""
        refusal = self.rules.out_of_bounds(pos)
        if refusal is not None:
            raise ValueError(refusal.reason)
        if player_id not in self.sessions and player_id not in getattr(self.world, "players", {}):
            raise ValueError(f"no player {player_id!r}")
        self._admin_moves.append((player_id, (float(pos[0]), float(pos[1]))))

    def _apply_admin_moves(self) -> None:
        moves, self._admin_moves = self._admin_moves, []
        for pid, pos in moves:
            s = self.sessions.get(pid)
            if s is None:
                self.world.set_player(pid, pos)
                self._changes.append((pid, PLAYER_KEY, [pos[0], pos[1]]))
                continue
            self._place_player(s, pos)
            s.budget = self.rules.new_budget(self.now)
            s.pending_pos = [pos[0], pos[1]]
            self._dirty.add(s)

    def _apply_intent(self, s: Session, body: dict[str, Any]) -> Refusal | None:
        """Apply one intent whole, or refuse it whole (server authority)."""
        if self.sessions.get(s.player_id) is not s:
            return None  # the player left (bye) after sending it: nothing to apply
        here = self.players.position(s.player_id)
        pos = body.get("pos")
        to = here if pos is None else (float(pos[0]), float(pos[1]))
        if pos is not None:
            refusal = self.rules.check_move(s.budget, here, to, self.now)
            if refusal is not None:
                return refusal
        talk = body.get("talk")
        if talk is not None:
            npc = talk["npc"]
            npc_pos = self.npcs.position(npc) if npc in self.subs else None
            refusal = self.rules.check_talk(npc, talk["intent"], npc_pos, to, npc in s.known)
            if refusal is not None:
                return refusal
        if pos is not None:
            self._place_player(s, to)
        if talk is not None:
            self.world.talk(talk["npc"], s.player_id, talk["intent"])
        return None

    def tick(self, dt: float, now: float) -> list[Session]:
        """One server tick at wall time ``now`` (seconds); returns the attached sessions
        with frames to send (in each ``outbox``)."""
        self.now = now
        self.ticks += 1
        if self.unavailable is not None:
            self._probe(now)
            return []
        intents, self._intents = self._intents, []
        self._apply_admin_moves()
        refusals: list[tuple[Session, int, Refusal]] = []
        for s, msg in intents:
            refusal = self._apply_intent(s, msg)
            if refusal is not None:
                refusals.append((s, msg["cseq"], refusal))
        self.intents_total += len(intents) - len(refusals)
        self.refused_total += len(refusals)
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
        if self.store is not None and (intents or changes):
            refused = {(id(s), c): r.rule for s, c, r in refusals}
            try:
                self.store.commit_tick(
                    (IntentRecord(s.player_id, m["cseq"], _journal_body(
                        m, refused.get((id(s), m["cseq"])))) for s, m in intents), changes)
            except StoreError as err:
                self._fail_closed(err)
                return []
        self.changes_total += sum(1 for c in changes if c[1][0] != "@")
        for s, cseq, refusal in refusals:
            if s.attached and self.sessions.get(s.player_id) is s:
                msg: dict[str, Any] = {"t": "refused", "cseq": cseq, "rule": refusal.rule,
                                       "reason": refusal.reason}
                if refusal.rule in ("too_fast", "out_of_bounds"):
                    msg["pos"] = list(self.players.position(s.player_id))
                s.outbox.append(encode(msg, s.codec))
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
            try:
                self.store.write_snapshot(self._save())
                self.snapshot_error = None
            except StoreError as exc:  # the journal still holds everything: retry later
                self.snapshot_error = str(exc)
                log.warning("%s (the journal keeps every tick; next try in %g s)", exc,
                            self.snapshot_every_s)
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
        if s.pending_pos is not None:
            msg["pos"] = s.pending_pos
            s.pending_pos = None
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


def _journal_body(msg: dict[str, Any], refused: str | None) -> dict[str, Any]:
    """What the journal keeps of an intent: its pos/talk, and the rule if it was refused."""
    body = {k: v for k, v in msg.items() if k in ("pos", "talk")}
    if refused is not None:
        body["refused"] = refused
    return body
