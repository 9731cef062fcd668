"""The world one node serves: its areas simulated, every other area mirrored from Redis.

:class:`ClusterWorld` is a :class:`~server_sync.sync.world.SyncWorld` over a
:class:`~server_sync.sync.world.TreeWorld` that every node builds the same (same
``--world`` and ``--seed``). Each NPC belongs to the area of its home position (where it
was built). For the areas this node owns (:mod:`server_sync.cluster.leases`) the NPCs'
trees tick as in a single-node world; every other NPC is a *mirror*: its synced keys and
position are set from the ``changes`` stream, which fires the same observers, so the
:class:`~server_sync.sync.core.SyncCore` above computes interest and deltas unchanged and
each node sends its own clients exactly the deltas within their interest.

Each :meth:`step` (inside the core's tick, before it journals the tick):

1. every ``lease_ms / 4``: renew the leases (an area lost to another node becomes a
   mirror), scan, acquire the free areas this node is preferred for, release the ones
   another live node is preferred for (after a checkpoint);
2. poll Redis once: the change entries after the cursor are applied to the mirrors, the
   intents after each owned area's consumed id are queued, and the handoffs after the
   handoff cursor that name a session this node holds go to :attr:`ClusterWorld.replaced`
   (a hello on another node replaced it; the core ends it after the tick);
3. finish takeovers: an acquired area's NPCs get their checkpoint (with the synced values
   the stream holds), the area is checkpointed under the new fence, its trees start;
4. apply the intents of the owned areas' streams to their trees; every talk of this
   node's clients goes to its NPC's area intent stream (written by the tick's commit under
   the player's session fence, before the talk is acknowledged) and is applied by the
   area's owner at its next poll - this node's own areas included, one tick later, so a
   talk of a session that was replaced meanwhile is never applied;
5. tick the owned trees.

What the tick changed locally is published by :class:`~server_sync.cluster.store.RedisStore`
in the tick's one commit. When Redis cannot be reached, :meth:`step` ticks nothing and
records the failure in :attr:`ClusterWorld.error`; the commit then fails and the core
fails closed (refuses clients, probes, reloads the durable view).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from contextlib import contextmanager
from typing import Any

from ..sync.persistence import POS_KEY
from ..sync.world import NpcMoveObserver, Pos, StateObserver, TreeWorld
from .backplane import START, Backplane, Commit, DurableView, Entry, Poll, stream_id
from .keys import area_of
from .leases import Acquired, LeaseTable, preferred

__all__ = ["REDIS_ERRORS", "ClusterWorld"]

log = logging.getLogger("flashnpc.cluster")


def _redis_errors() -> tuple[type[BaseException], ...]:
    import redis

    return (redis.RedisError, OSError)


#: what a Redis call may raise when the server is down, slow or refuses a command
REDIS_ERRORS = _redis_errors()


class ClusterWorld:
    """See the module docstring. ``inner``: the world every node builds the same;
    ``area_size``: side of an area; ``clock``: wall seconds (lease timing)."""

    def __init__(self, inner: TreeWorld, backplane: Backplane, leases: LeaseTable, *,
                 area_size: float = 250.0, clock: Callable[[], float] = time.monotonic,
                 poll_count: int = 5000) -> None:
        if not area_size > 0:
            raise ValueError(f"area_size must be > 0, got {area_size}")
        self.inner = inner
        self.backplane = backplane
        self.leases = leases
        self.node = leases.node
        self.area_size = float(area_size)
        self.clock = clock
        self.poll_count = poll_count
        self.maintain_every_s = leases.lease_ms / 4000.0
        self.area: dict[str, str] = {n: area_of(inner.npc_position(n), self.area_size)
                                     for n in inner.npc_ids()}
        self.area_npcs: dict[str, list[str]] = {}
        for n, a in self.area.items():
            self.area_npcs.setdefault(a, []).append(n)
        self.areas = sorted(self.area_npcs)
        self.owned: dict[str, str] = {}      # area -> our fencing token
        self.consumed: dict[str, str] = {}   # owned area -> last intent id applied
        self.cursor = START                  # last change entry applied to the mirrors
        self.remote_players: dict[str, Pos] = {}  # other nodes' players
        #: player -> the session ("GEN NODE", :meth:`Backplane.claim`) this node holds for
        #: it: set at the hello, kept until the player's leave is committed
        self.player_sessions: dict[str, str] = {}
        #: player -> a session of :attr:`player_sessions` that was replaced (a handoff, or a
        #: commit that refused its writes): the core ends it after the tick
        self.replaced: dict[str, str] = {}
        self.handoffs_cursor = START          # last handoff read
        self.error: str | None = None        # the last Redis failure of step(), or None
        self._taking: list[Acquired] = []
        self._talks: list[tuple[str, str, str]] = []
        self._forward: list[tuple[str, dict[str, Any]]] = []
        self._local: list[tuple[str, str, Any]] = []
        self._consumed_dirty: set[str] = set()
        self._mirroring = False
        self._next_maintain = 0.0
        #: the owned trees do not tick (``/admin/freeze``); the streams are still followed
        self.frozen = False
        # counters (exported as flashnpc_cluster_* metrics)
        self.takeovers_total = 0
        self.releases_total = 0
        self.areas_lost_total = 0
        self.mirror_entries_total = 0
        self.mirror_reloads_total = 0
        self.intents_forwarded_total = 0
        self.intents_consumed_total = 0
        self.redis_errors_total = 0
        self.last_takeover_at: float | None = None
        for npc in inner.npcs.values():
            inner.scheduler.remove(npc.tree)  # nothing is simulated until an area is owned
        inner.observe(self._capture_state, self._capture_move)

    def fingerprint(self) -> str:
        """What must be equal on every node: NPCs, home positions, synced keys, area size."""
        h = hashlib.blake2b(digest_size=8)
        for n in sorted(self.area):
            x, y = self.inner.npc_position(n)
            h.update(f"{n}@{x:.3f},{y:.3f};".encode())
        h.update(f"{sorted(self.inner.synced_keys)}|{self.area_size}".encode())
        return f"{len(self.area)} npcs, {len(self.areas)} areas, {h.hexdigest()}"

    # ---- observers: what this node changed itself is published ---------------------------
    def _capture_state(self, npc_id: str, key: str, old: Any, new: Any) -> None:
        if not self._mirroring:
            self._local.append((npc_id, key, new))

    def _capture_move(self, npc_id: str, pos: Pos) -> None:
        if not self._mirroring:
            self._local.append((npc_id, POS_KEY, [pos[0], pos[1]]))

    @contextmanager
    def _mirror(self) -> Any:
        self._mirroring = True
        try:
            yield
        finally:
            self._mirroring = False

    # ---- SyncWorld -----------------------------------------------------------------------
    def npc_ids(self) -> Iterable[str]:
        return self.inner.npc_ids()

    def npc_position(self, npc_id: str) -> Pos:
        return self.inner.npc_position(npc_id)

    def npc_state(self, npc_id: str) -> dict[str, Any]:
        return self.inner.npc_state(npc_id)

    def observe(self, on_state: StateObserver, on_move: NpcMoveObserver) -> None:
        self.inner.observe(on_state, on_move)

    @property
    def players(self) -> dict[str, Pos]:
        """This node's players (the core's); :attr:`remote_players` holds the others'."""
        return self.inner.players

    def set_player(self, player_id: str, position: Pos) -> None:
        self.inner.set_player(player_id, position)

    def remove_player(self, player_id: str) -> None:
        self.inner.remove_player(player_id)

    def player_positions(self) -> dict[str, Pos]:
        """Every player of the world, this node's and the others' (what trees may read)."""
        return {**self.remote_players, **self.inner.players}

    def talk(self, npc_id: str, player_id: str, intent: str) -> None:
        """Queue a talk: this tick's commit appends it to its NPC's area intent stream, and
        the area's owner applies it at its next poll (module docstring, step 4)."""
        if npc_id in self.area:
            self._talks.append((npc_id, player_id, intent))

    def intents(self) -> Collection[str]:
        return self.inner.intents()

    def apply_state(self, npc_id: str, key: str, value: Any) -> None:
        """Replay one durable change (the core's recovery); not published again."""
        with self._mirror():
            self.inner.apply_state(npc_id, key, value)

    def save(self) -> dict[str, Any]:
        """The owned NPCs (what this node checkpoints) and this node's players."""
        npcs = self.inner.npcs
        return {"time": self.inner.time,
                "npcs": {n: {"pos": list(npcs[n].pos), "tree": npcs[n].tree.snapshot()}
                         for a in self.owned for n in self.area_npcs[a]},
                "players": {p: list(v) for p, v in self.inner.players.items()}}

    def load(self, data: Mapping[str, Any]) -> None:
        """Restore NPC saves (the durable view's checkpoints); other NPCs are left as they are."""
        with self._mirror():
            for n, entry in data["npcs"].items():
                npc = self.inner.npcs.get(n)
                if npc is None:
                    raise ValueError(f"the checkpoint has NPC {n!r}, this world does not")
                self.inner.move_npc(n, (float(entry["pos"][0]), float(entry["pos"][1])))
                npc.tree.restore(entry["tree"])
                npc.tree.wake()

    # ---- the tick ------------------------------------------------------------------------
    def step(self, dt: float) -> None:
        """See the module docstring."""
        try:
            now = self.clock()
            if now >= self._next_maintain:
                self._next_maintain = now + self.maintain_every_s
                self._maintain()
            intents = self._poll()
            self._finish_takeovers()
        except REDIS_ERRORS as exc:
            self.redis_errors_total += 1
            if self.error is None:
                log.error("node %s: Redis unreachable, nothing ticks: %s", self.node, exc)
            self.error = f"Redis: {type(exc).__name__}: {exc}"
            return
        self.error = None
        inner = self.inner
        for area, rows in intents.items():
            if area not in self.owned:
                continue
            for iid, body in rows:
                inner.talk(body["npc"], body["player"], body["intent"])
                self.consumed[area] = iid
                self._consumed_dirty.add(area)
                if body.get("n") != self.node:
                    self.intents_consumed_total += 1
        talks, self._talks = self._talks, []
        for npc, player, intent in talks:
            area = self.area[npc]
            self._forward.append((area, {"npc": npc, "player": player, "intent": intent,
                                         "n": self.node}))
            if area not in self.owned:
                self.intents_forwarded_total += 1
        if not self.frozen:
            self.inner.step(dt)

    def take_commit(self) -> Commit:
        """What this tick publishes (the store adds players' cseq and positions): the local
        changes by area under their fences, consumed intent ids, forwarded intents."""
        c = Commit(forward=self._forward)
        self._forward = []
        local, self._local = self._local, []
        for npc, key, value in local:
            area = self.area[npc]
            if area not in self.owned:
                log.warning("node %s: a change of %s in area %s it does not own is dropped",
                            self.node, npc, area)
                continue
            c.areas.setdefault(area, []).append([npc, key, value])
        for area in self._consumed_dirty:
            if area in self.owned:
                c.consumed[area] = self.consumed[area]
        self._consumed_dirty.clear()
        c.fences = {a: self.owned[a] for a in {*c.areas, *c.consumed}}
        return c

    def fence_players(self, c: Commit) -> None:
        """Check every player ``c`` writes (its cseq, position, talks) against the session
        this node holds for it (:attr:`player_sessions`)."""
        held = self.player_sessions
        players = {*c.cseq, *c.players, *(body["player"] for _, body in c.forward)}
        c.sessions = {p: held[p] for p in players if p in held}

    def committed(self, c: Commit, replaced: Iterable[str]) -> None:
        """After the commit of ``c``: the sessions it found replaced go to :attr:`replaced`;
        a player whose leave was committed (and who did not come back) is forgotten."""
        for p in replaced:
            if p in c.sessions:
                self.replaced[p] = c.sessions[p]
        for p, v in c.players.items():
            if v is None and p not in self.inner.players:
                self.player_sessions.pop(p, None)

    def take_replaced(self) -> dict[str, str]:
        """The replaced sessions found since the last call (:attr:`replaced`)."""
        out, self.replaced = self.replaced, {}
        return out

    # ---- ownership -----------------------------------------------------------------------
    def _maintain(self) -> None:
        """Renew, scan, acquire and release (module docstring, step 1)."""
        renewal = self.leases.renew(dict(self.owned))
        if renewal.lost:
            log.warning("node %s: areas %s were taken over by another node", self.node,
                        renewal.lost)
            self.lose(renewal.lost)
        if renewal.lapsed or self.backplane.deleted_after(self.cursor):
            self._reload_mirrors()
        scan = self.leases.scan(self.areas)
        live = scan.live if self.node in scan.live else [*scan.live, self.node]
        taking = {t.area for t in self._taking}
        want = [a for a, h in scan.holders.items()
                if not h and a not in taking and preferred(a, live) == self.node]
        self._taking += self.leases.acquire(want)
        give = [a for a in self.owned if preferred(a, live) != self.node]
        if give:
            self.checkpoint(give)
            self.leases.release(give)
            self._unschedule(give)
            self.releases_total += len(give)

    def _finish_takeovers(self) -> None:
        """Start the areas acquired this tick, now that the mirrors hold every change their
        previous owners published (module docstring, step 3)."""
        if not self._taking:
            return
        taking, self._taking = self._taking, []
        inner = self.inner
        with self._mirror():
            for acq in taking:
                saves = json.loads(acq.checkpoint)["npcs"] if acq.checkpoint else {}
                for n in self.area_npcs[acq.area]:
                    npc = inner.npcs[n]
                    if n in saves:
                        npc.tree.restore(_with_synced(saves[n]["tree"], inner.npc_state(n)))
                    npc.tree.wake()
        for acq in taking:
            self.owned[acq.area] = acq.fence
            self.consumed[acq.area] = acq.consumed
        try:
            self.checkpoint([a.area for a in taking])  # the area's state under the new fence
        except BaseException:
            for acq in taking:
                del self.owned[acq.area]
            self._taking = taking + self._taking
            raise
        for acq in taking:
            for n in self.area_npcs[acq.area]:
                inner.scheduler.add(inner.npcs[n].tree, start=inner.time)
        self.takeovers_total += len(taking)
        self.last_takeover_at = self.clock()
        log.info("node %s: took over areas %s", self.node, [a.area for a in taking])

    def checkpoint(self, areas: Iterable[str] | None = None) -> str:
        """Checkpoint ``areas`` (default: every owned one) under their fences; an area whose
        fence is no longer ours becomes a mirror. Returns the change entry included."""
        areas = list(self.owned if areas is None else areas)
        npcs = self.inner.npcs
        saves = {a: json.dumps({"fence": self.owned[a], "npcs": {
            n: {"pos": list(npcs[n].pos), "tree": npcs[n].tree.snapshot()}
            for n in self.area_npcs[a]}}, separators=(",", ":")) for a in areas}
        cid, lost = self.backplane.checkpoint(saves, {a: self.owned[a] for a in areas})
        if lost:
            self.lose(lost)
        return cid

    def lose(self, areas: Iterable[str]) -> None:
        """``areas`` have another owner: their NPCs become mirrors."""
        areas = [a for a in areas if a in self.owned]
        self._unschedule(areas)
        self.areas_lost_total += len(areas)

    def _unschedule(self, areas: Iterable[str]) -> None:
        for a in areas:
            self.owned.pop(a, None)
            self.consumed.pop(a, None)
            self._consumed_dirty.discard(a)
            for n in self.area_npcs[a]:
                self.inner.scheduler.remove(self.inner.npcs[n].tree)

    def release_all(self) -> None:
        """A clean shutdown: checkpoint, release every area, drop the heartbeat (the other
        nodes take over at their next scan instead of after the lease)."""
        areas = list(self.owned)
        if areas:
            self.checkpoint(areas)
            self.leases.release(areas)
            self._unschedule(areas)
        self.leases.leave()

    # ---- the streams ---------------------------------------------------------------------
    def _poll(self) -> dict[str, list[tuple[str, dict[str, Any]]]]:
        consumed = {a: self.consumed[a] for a in self.owned}
        got = self.backplane.poll(self.cursor, consumed, self.poll_count, self.handoffs_cursor)
        intents = got.intents
        while True:
            self._apply_entries(got.entries)
            self._handoffs(got)
            if len(got.entries) < self.poll_count and len(got.handoffs) < self.poll_count:
                return intents
            got = self.backplane.poll(self.cursor, {}, self.poll_count, self.handoffs_cursor)

    def _handoffs(self, got: Poll) -> None:
        self.handoffs_cursor = got.handoffs_id
        for player, session in got.handoffs:
            if self.player_sessions.get(player) == session:
                self.replaced[player] = session

    def _apply_entries(self, entries: list[Entry]) -> None:
        inner = self.inner
        with self._mirror():
            for e in entries:
                self.cursor = e.id
                if e.node == self.node:
                    continue  # this node's own tick: already applied here
                self.mirror_entries_total += 1
                for area, changes in e.areas.items():
                    if area in self.owned:
                        continue  # only a fenced-out writer could have sent it
                    for npc, key, value in changes:
                        inner.apply_state(npc, key, value)
                for p, v in e.players.items():
                    if v is None:
                        self.remote_players.pop(p, None)
                    else:
                        self.remote_players[p] = (float(v[0]), float(v[1]))

    def _reload_mirrors(self) -> None:
        """This node fell behind the trimmed stream (or was not live): reload every mirror
        from the durable view."""
        view = self.backplane.durable_view()
        saves, changes = self.durable_state(view)
        mirrored = {n for n, a in self.area.items() if a not in self.owned}
        with self._mirror():
            self.load({"npcs": {n: s for n, s in saves.items() if n in mirrored}})
            for npc, key, value in changes:
                if npc in mirrored:
                    self.inner.apply_state(npc, key, value)
        self.mirror_reloads_total += 1
        log.warning("node %s: mirrors reloaded from the durable view", self.node)

    def durable_state(self, view: DurableView) -> tuple[dict[str, Any], list[tuple[str, str, Any]]]:
        """From the durable view: the NPC saves of every checkpoint and the changes after
        each area's checkpoint, in stream order. Moves the cursor to the view's end and
        takes the remote players from it."""
        saves: dict[str, Any] = {}
        for cp in view.checkpoints.values():
            saves.update(cp["npcs"])
        after = {a: stream_id(i) for a, i in view.checkpoint_ids.items()}
        changes: list[tuple[str, str, Any]] = []
        for e in view.entries:
            eid = stream_id(e.id)
            for area, rows in e.areas.items():
                if eid > after.get(area, (0, 0)):
                    changes += [(n, k, v) for n, k, v in rows]
        self.cursor = view.last_id
        self.remote_players = {p: pos for p, pos in view.player_pos.items()
                               if view.player_node.get(p) != self.node}
        return saves, changes

    def reset(self, view: DurableView) -> tuple[dict[str, Any], list[tuple[str, str, Any]]]:
        """The core failed closed: forget what the failed tick queued, take the consumed
        ids of the owned areas from Redis, and return :meth:`durable_state`."""
        self._talks.clear()
        self._forward.clear()
        self._local.clear()
        self._consumed_dirty.clear()
        self._taking.clear()
        self.player_sessions.clear()  # the core forgets every session
        self.replaced.clear()
        self.handoffs_cursor = view.handoffs_id
        for a in self.owned:
            self.consumed[a] = view.consumed.get(a, START)
        return self.durable_state(view)

    def status(self) -> dict[str, Any]:
        """For /health: the node, its areas, the stream cursor, the last Redis error."""
        return {"node": self.node, "areas_owned": sorted(self.owned), "areas": len(self.areas),
                "cursor": self.cursor, "redis_error": self.error,
                "remote_players": len(self.remote_players)}


def _with_synced(tree_save: dict[str, Any], synced: dict[str, Any]) -> dict[str, Any]:
    """A tree save whose root blackboard holds ``synced`` (the mirror's values, newer than
    the checkpoint's), so restoring it changes no synced key."""
    boards = [dict(b) for b in tree_save["blackboards"]]
    entries = {k: dict(v) for k, v in boards[0]["entries"].items()}
    for k, v in synced.items():
        if k in entries:
            entries[k]["value"] = v
    boards[0] = {**boards[0], "entries": entries}
    return {**tree_save, "blackboards": boards}
