"""One player, one session in the cluster: a hello on node B replaces the player's session on
node A as one node replaces a connection (``error replaced``, close 1008), B serves the player
from its durable cseq and position, every intent is applied exactly once, and nothing a
replaced session sends afterwards is applied (two in-process nodes on a real redis-server)."""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from typing import Any

from server_sync.cluster.backplane import Backplane, Commit
from server_sync.cluster.keys import Keys
from server_sync.sync.protocol import decode_server
from server_sync.sync.server import REPLACED_REASON
from server_sync.transport.wire import PROTOCOL_VERSION, encode
from server_sync.transport.ws_io import ws_connect

from ..conftest import token, until
from .conftest import all_owned, cluster_node

PLAYER = "carol"
KEYS = Keys()
#: the close a replaced connection gets on one node (server_sync/sync/server.py)
REPLACED_CLOSE = (1008, f"replaced: {REPLACED_REASON}")


class Link:
    """One raw connection of a player, with the client's cseqs chosen by the test."""

    def __init__(self) -> None:
        self.msgs: list[dict[str, Any]] = []
        self.acked = 0
        self.hello_ack: int | None = None  # the ack that follows the hello's snapshot
        self.ws: Any = None

    async def open(self, port: int, pos: tuple[float, float] | None = None,
                   resume: dict[str, Any] | None = None) -> Link:
        self.ws = await ws_connect(f"ws://127.0.0.1:{port}", self._on_frame)
        hello: dict[str, Any] = {"t": "hello", "v": PROTOCOL_VERSION, "token": token(PLAYER)}
        if pos is not None:
            hello["pos"] = list(pos)
        if resume is not None:
            hello["resume"] = resume
        self.ws.send(encode(hello, "msgpack"))
        await until(lambda: self.hello_ack is not None, 10, "the hello's ack")
        return self

    def _on_frame(self, frame: bytes | str) -> None:
        msg, _ = decode_server(frame)
        self.msgs.append(msg)
        ack = msg.get("cseq") if msg["t"] == "ack" else msg.get("ack")
        if ack is not None:
            self.acked = max(self.acked, ack)
            if self.hello_ack is None and msg["t"] == "ack":
                self.hello_ack = ack

    def send(self, cseq: int, *, pos: tuple[float, float] | None = None,
             talk: tuple[str, str] | None = None) -> None:
        msg: dict[str, Any] = {"t": "intent", "cseq": cseq}
        if pos is not None:
            msg["pos"] = list(pos)
        if talk is not None:
            msg["talk"] = {"npc": talk[0], "intent": talk[1]}
        self.ws.send(encode(msg, "msgpack"))

    @property
    def snapshot(self) -> dict[str, Any]:
        return next(m for m in self.msgs if m["t"] == "snapshot")

    @property
    def close(self) -> tuple[int, str] | None:
        rcvd = self.ws.protocol.close_rcvd
        return None if rcvd is None else (rcvd.code, rcvd.reason)

    @property
    def errors(self) -> list[str]:
        return [m["code"] for m in self.msgs if m["t"] == "error"]


def spy_talks(*nodes) -> Counter:
    """Count every talk a node's trees get (node, npc, intent): the real talk still runs."""
    applied: Counter = Counter()
    for node in nodes:
        inner = node.cluster.inner

        def talk(npc, player, intent, _real=inner.talk, _node=node.cluster.node):
            applied[(_node, npc, intent)] += 1
            _real(npc, player, intent)

        inner.talk = talk
    return applied


def two_npcs(a, b) -> tuple[str, str, tuple[float, float]]:
    """An NPC a simulates, one b simulates, and a point within talk range of both."""
    w = a.core.world
    pairs = [(math.dist(w.npc_position(x), w.npc_position(y)), x, y)
             for x in a.cluster.area_npcs[sorted(a.cluster.owned)[0]]
             for area in sorted(b.cluster.owned) for y in b.cluster.area_npcs[area]]
    d, x, y = min(pairs)
    assert d < 150.0, d  # the seeded world has such a pair
    (x0, y0), (x1, y1) = w.npc_position(x), w.npc_position(y)
    return x, y, ((x0 + x1) / 2, (y0 + y1) / 2)


async def player_on_a(a, b) -> tuple[Counter, str, str, tuple[float, float], Link]:
    """Spy on the talks, pick :func:`two_npcs`, connect the player to a next to both."""
    applied = spy_talks(a, b)
    npc_a, npc_b, here = two_npcs(a, b)
    return applied, npc_a, npc_b, here, await Link().open(a.port, here)


@contextlib.asynccontextmanager
async def two_nodes(redis_server):
    async with cluster_node(redis_server.url, "a") as a, \
            cluster_node(redis_server.url, "b") as b:
        await until(lambda: all_owned(a, b), 20, "both nodes own areas")
        yield a, b


def durable(r) -> tuple[int, str | None, str | None, str | None]:
    return (int(r.hget(KEYS.cseq, PLAYER) or 0), r.hget(KEYS.player_pos, PLAYER),
            r.hget(KEYS.player_node, PLAYER), r.hget(KEYS.sessions, PLAYER))


async def settle(*nodes, ticks: int = 15) -> None:
    """Let every node tick ``ticks`` more times (a talk is applied one tick after its ack)."""
    start = [n.core.ticks for n in nodes]
    await until(lambda: all(n.core.ticks >= t + ticks for n, t in zip(nodes, start)), 10,
                "the nodes tick on")


def test_a_commit_of_a_replaced_session_writes_nothing_of_that_player_and_the_rest_of_the_tick(
        redis_server):
    r = redis_server.client()
    a, b = Backplane(r, KEYS, "a"), Backplane(r, KEYS, "b")
    a.join("w")
    first = a.claim("p1")
    assert (first.session, first.previous, first.cseq, first.pos) == ("1 a", "", 0, None)
    other = a.claim("p2")
    a.commit(Commit(cseq={"p1": 3}, players={"p1": [1.0, 2.0]}, sessions={"p1": "1 a"}))
    moved = b.claim("p1")  # p1 says hello on b: it gets what a wrote, a is told
    assert (moved.session, moved.previous, moved.cseq, moved.pos) == ("2 b", "1 a", 3, (1.0, 2.0))
    assert r.hget(KEYS.player_node, "p1") == "b"
    talk = {"npc": "npc1", "intent": "greet", "n": "a"}
    before = r.xlen(KEYS.changes)
    _, replaced = a.commit(Commit(
        cseq={"p1": 5, "p2": 1}, players={"p1": [9.0, 9.0], "p2": [4.0, 4.0]},
        forward=[("0:0", {**talk, "player": "p1"}), ("0:0", {**talk, "player": "p2"})],
        sessions={"p1": "1 a", "p2": other.session}))
    assert replaced == ["p1"]
    assert r.hget(KEYS.cseq, "p1") == "3" and r.hget(KEYS.player_pos, "p1") == "1.0,2.0"
    assert r.hget(KEYS.cseq, "p2") == "1" and r.hget(KEYS.player_pos, "p2") == "4.0,4.0"
    assert [f["d"] for _, f in r.xrange(KEYS.intents("0:0"))] == [
        '{"npc":"npc1","intent":"greet","n":"a","player":"p2"}']
    assert r.xlen(KEYS.changes) == before + 1
    assert '"p1"' not in r.xrevrange(KEYS.changes, count=1)[0][1]["d"]  # mirrors not told
    got = a.poll("0-0", {}, handoffs="0-0")
    assert got.handoffs == [("p1", "1 a")]
    assert b.claim("p1").previous == "2 b" and r.xlen(KEYS.handoffs) == 1  # same node: no handoff


async def test_a_hello_on_another_node_closes_the_first_connection_replaced_and_loses_or_repeats_no_intent(
        redis_server):
    r = redis_server.client()
    async with two_nodes(redis_server) as (a, b):
        applied, npc_a, npc_b, (x, y), on_a = await player_on_a(a, b)
        on_a.send(1, talk=(npc_a, "greet"))  # a simulates npc_a: a talk to its own area
        on_a.send(2, talk=(npc_b, "greet"))  # forwarded to b's area
        on_a.send(3, pos=(x + 1.0, y))
        await until(lambda: on_a.acked == 3, 10, "a acknowledges 1-3")
        on_a.send(4, talk=(npc_a, "trade"))  # maybe applied by a, maybe re-sent to b
        on_a.send(5, talk=(npc_b, "trade"))
        on_a.send(6, pos=(x + 2.0, y))
        claimed_at: list[int] = []
        real_claim = b.core.store.claim

        def claim(player):
            claimed_at.append(a.core.ticks)
            return real_claim(player)

        b.core.store.claim = claim
        ended_at: list[int] = []
        a.core.on_replaced = lambda p, _kick=a.core.on_replaced: (
            ended_at.append(a.core.ticks), _kick(p))
        seen = on_a.acked  # what the client knew when it switched
        on_b = await Link().open(b.port)
        floor = on_b.hello_ack
        assert seen <= floor <= 6
        for cseq in range(seen + 1, 7):  # the client re-sends what it did not see acked
            if cseq in (4, 5):
                on_b.send(cseq, talk=((npc_a, npc_b)[cseq - 4], "trade"))
            elif cseq == 6:
                on_b.send(6, pos=(x + 2.0, y))
        on_b.send(7, talk=(npc_a, "threaten"))
        on_b.send(8, talk=(npc_b, "threaten"))
        on_b.send(9, pos=(x + 3.0, y))
        await until(lambda: on_b.acked == 9, 10, "b acknowledges everything")
        await until(lambda: on_a.close is not None, 10, "a closes the first connection")
        assert on_a.close == REPLACED_CLOSE and on_a.errors == ["replaced"]
        assert ended_at[0] - claimed_at[0] <= 1  # a's next tick after b's claim
        assert PLAYER not in a.core.sessions and a.core.replaced_total == 1
        assert b.core.sessions[PLAYER].acked == 9 and on_b.close is None
        # b started from what a had durably applied when b claimed the player
        assert on_b.snapshot["pos"] == [x + (2.0 if floor >= 6 else 1.0), y]
        assert durable(r) == (9, f"{x + 3.0!r},{y!r}", "b", "2 b")
        await until(lambda: sum(applied.values()) >= 6, 10, "every talk applied")
        await settle(a, b)
        owner = {npc_a: "a", npc_b: "b"}
        assert applied == Counter({(owner[n], n, i): 1 for n in (npc_a, npc_b)
                                   for i in ("greet", "trade", "threaten")})
        assert b.core.world.npc_state(npc_a)["last_intent"] == "threaten"
        assert b.core.duplicate_intents_total == max(0, floor - seen)


async def test_a_replaced_session_that_keeps_sending_gets_nothing_applied(redis_server):
    r = redis_server.client()
    async with two_nodes(redis_server) as (a, b):
        applied, npc_a, npc_b, (x, y), on_a = await player_on_a(a, b)
        on_a.send(1, talk=(npc_a, "greet"))
        await until(lambda: on_a.acked == 1, 10, "a acknowledges 1")
        a.cluster.handoffs_cursor = "99999999999999-0"  # a has not read the handoff yet:
        on_b = await Link().open(b.port)                # only the commit fence stops it
        assert on_b.hello_ack == 1
        on_a.send(2, talk=(npc_a, "ask_rumors"))
        on_a.send(3, talk=(npc_b, "ask_rumors"))
        on_a.send(4, pos=(x + 40.0, y))
        await until(lambda: on_a.close is not None, 10, "a ends the replaced session")
        assert on_a.close == REPLACED_CLOSE and on_a.errors == ["replaced"]
        assert on_a.acked == 1  # nothing of 2-4 was acknowledged
        assert PLAYER not in a.core.sessions and a.core.replaced_total == 1
        assert durable(r) == (1, f"{x!r},{y!r}", "b", "2 b")
        on_b.send(2, talk=(npc_b, "farewell"))  # the client's own 2, on b: applied once
        await until(lambda: on_b.acked == 2, 10, "b acknowledges 2")
        await settle(a, b)
        assert applied == Counter({("a", npc_a, "greet"): 1, ("b", npc_b, "farewell"): 1})
        assert durable(r) == (2, f"{x!r},{y!r}", "b", "2 b")
        assert b.core.sessions[PLAYER].acked == 2 and on_b.close is None


async def test_a_detached_session_is_dropped_not_resumed_when_the_player_says_hello_elsewhere(
        redis_server):
    async with two_nodes(redis_server) as (a, b):
        _, _, _, (x, y), on_a = await player_on_a(a, b)
        on_a.send(1, pos=(x + 1.0, y))
        await until(lambda: on_a.acked == 1, 10, "a acknowledges 1")
        resume = {"epoch": on_a.snapshot["epoch"], "seq": a.core.sessions[PLAYER].seq}
        on_a.ws.abort()  # the link drops: a keeps the session for its grace
        await until(lambda: a.core.sessions[PLAYER].detached_at is not None, 10, "detached")
        on_b = await Link().open(b.port)
        assert on_b.hello_ack == 1
        await until(lambda: PLAYER not in a.core.sessions, 10, "a drops the detached session")
        again = await Link().open(a.port, resume=resume)  # back on a: nothing to resume
        assert again.msgs[0]["t"] == "snapshot" and again.hello_ack == 1
        await until(lambda: on_b.close is not None, 10, "b ends its session in turn")
        assert on_b.close == REPLACED_CLOSE and PLAYER not in b.core.sessions
        assert a.core.replaced_total == b.core.replaced_total == 1
