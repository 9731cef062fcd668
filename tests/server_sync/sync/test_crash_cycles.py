"""No acknowledged intent is lost over ten kill -9 cycles and one disk-full cycle (issue #15):
real ``flashnpc serve --db`` processes on one SQLite file (on a tmpfs, so the disk can fill),
three players sending moves and talks while the server is killed with intents in flight.

After every restart each player's durable state is read back through the protocol itself (a
bare ``hello``: the snapshot's ``pos`` and NPC states, then the ack of the highest durable
``cseq``) before its client reconnects and re-sends what was not acknowledged."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from typing import Any

import pytest
from websockets.asyncio.client import connect

from server_sync import Client
from server_sync.sync.protocol import decode_server
from server_sync.transport.wire import encode

from ..conftest import until
from ..fuzz_harness import serve, token

PLAYERS = ("p0", "p1", "p2")
KILL_CYCLES = 10
SERVE_ARGS = ("--world", "sim:400:50:300", "--radius", "500", "--max-speed", "1000",
              "--snapshot-every", "3", "--tick-hz", "20")


class Player:
    """A client and every intent it sent, by cseq."""

    def __init__(self, pid: str, index: int, rng: random.Random) -> None:
        self.pid = pid
        self.rng = rng
        self.npcs = iter(range(index, 400, len(PLAYERS)))  # talks never share an NPC
        self.client = Client("ws://127.0.0.1:9", lambda: token(pid), position=(150.0, 150.0),
                             backoff_initial_s=0.02, backoff_max_s=0.1, seed=index)
        self.sent: dict[int, dict[str, Any]] = {}
        self.task: asyncio.Task[None] | None = None

    async def burst(self, n: int) -> None:
        for _ in range(n):
            if self.rng.random() < 0.3:
                talk = (f"npc{next(self.npcs)}", self.rng.choice(["greet", "trade", "threaten"]))
                self.sent[await self.client.send_intent(talk=talk)] = {"talk": talk}
            else:
                pos = (self.rng.uniform(50, 250), self.rng.uniform(50, 250))
                self.sent[await self.client.send_intent(pos=pos)] = {"pos": pos}


async def durable_view(port: int, pid: str) -> tuple[int, list[float], dict[str, Any]]:
    """What the restarted server holds for ``pid``: (durable cseq, position, NPC states)."""
    async with connect(f"ws://127.0.0.1:{port}") as ws:
        await ws.send(encode({"t": "hello", "v": 1, "token": token(pid)}, "msgpack"))
        snapshot = decode_server(await asyncio.wait_for(ws.recv(), 20))[0]
        ack = decode_server(await asyncio.wait_for(ws.recv(), 20))[0]
    assert (snapshot["t"], ack["t"]) == ("snapshot", "ack")
    return ack["cseq"], snapshot["pos"], {n: e["state"] for n, e in snapshot["npcs"].items()}


def lost(player: Player, acked: int, durable: int, pos: list[float], npcs: dict[str, Any]
         ) -> list[str]:
    """The acknowledged intents of ``player`` whose effect the server does not hold."""
    out = [f"cseq {c}" for c in range(durable + 1, acked + 1)]  # acked, yet not durable
    moves = [c for c, b in player.sent.items() if "pos" in b and c <= durable]
    if moves and pos != list(player.sent[max(moves)]["pos"]):
        out.append(f"move {max(moves)}: server has {pos}")
    for c, b in player.sent.items():
        if "talk" in b and c <= acked:
            npc, intent = b["talk"]
            state = npcs.get(npc, {})
            if (state.get("talking_to"), state.get("last_intent")) != (player.pid, intent):
                out.append(f"talk {c} to {npc}: server has {state}")
    return out


@pytest.mark.slow
async def test_no_acknowledged_intent_is_lost_over_ten_kill_9_cycles_and_a_full_disk(tmpfs):
    fs = tmpfs("32m")
    db = str(fs.path / "world.sqlite")
    rng = random.Random(15)
    players = [Player(pid, k, rng) for k, pid in enumerate(PLAYERS)]
    checked: dict[str, Any] = {"restarts_checked": 0, "kills": 0, "unacked_at_kill": 0, "lost": []}
    for cycle in range(KILL_CYCLES + 2):  # the last run only checks what the last kill left
        full_disk = cycle == KILL_CYCLES
        with serve(fs.path.parent, *SERVE_ARGS, "--db", db, name=f"serve{cycle}") as srv:
            port = int(srv.ports[0])
            if cycle:  # the durable state, read before the clients re-send anything
                for p in players:
                    durable, pos, npcs = await durable_view(port, p.pid)
                    checked["lost"] += lost(p, p.client.acked, durable, pos, npcs)
                checked["restarts_checked"] += 1
            if cycle == KILL_CYCLES + 1:
                break
            for p in players:
                p.client.url = f"ws://127.0.0.1:{port}"
                if p.task is None:
                    p.task = asyncio.create_task(p.client.run())
            await until(lambda: all(p.client.synced.is_set() and p.client.pending_intents == 0
                                    for p in players), 30, "clients synced, all re-sent acked")
            if full_disk:
                fs.fill()  # the next tick cannot be journaled: the server fails closed
                await until(lambda: all(p.client.last_error and p.client.last_error[0] ==
                                        "unavailable" for p in players), 30, "refused: disk full")
                marks = {p.pid: p.client.acked for p in players}
                for p in players:
                    await p.burst(3)
                await until(lambda: all(not p.client.connected for p in players), 30, "refused")
                assert all(p.client.acked == marks[p.pid] for p in players)  # nothing unsaved acked
                fs.free()
                await until(lambda: all(p.client.pending_intents == 0 for p in players), 30,
                            "the intents of the outage saved once the disk has room")
            marks = {p.pid: p.client.acked for p in players}
            for p in players:
                await p.burst(rng.randint(5, 15))
            await until(lambda m=marks: all(p.client.acked > m[p.pid] for p in players), 30,
                        "acks")
            for p in players:  # and kill -9 with these in flight
                await p.burst(rng.randint(1, 5))
            os.kill(srv.proc.pid, signal.SIGKILL)
            srv.proc.wait(10)
            checked["kills"] += 1
            checked["unacked_at_kill"] += sum(p.client.cseq - p.client.acked for p in players)
            assert "Traceback" not in srv.stderr(), srv.stderr()[-2000:]
    for p in players:
        await p.client.close()
        await p.task
    checked["acked_intents"] = sum(p.client.acked for p in players)
    checked["talks"] = sum("talk" in b for p in players for b in p.sent.values())
    print("crash cycles:", checked)
    assert checked["restarts_checked"] == checked["kills"] == KILL_CYCLES + 1
    assert checked["lost"] == []
