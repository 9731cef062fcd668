"""Durability under values the journal cannot store, failing journal writes, a full disk and a
read-only database: nothing unjournaled is kept in memory or acknowledged (issue #15)."""

import asyncio
import os
import subprocess
import sys

import pytest
from websockets.asyncio.client import connect

from server_sync import Client, ServerConfig, SyncServer
from server_sync.sync.core import SyncCore
from server_sync.sync.persistence import Store, StoreError
from server_sync.sync.protocol import decode_server
from server_sync.sync.world import sim_world
from server_sync.transport.schema import MAX_INT
from server_sync.transport.wire import ProtocolError, encode

from ..conftest import SECRET, raw, token, until


def world():
    return sim_world(20, changes_per_s=1e-6, size=50.0, seed=3)


def hello(player):
    return encode({"t": "hello", "v": 1, "token": token(player)}, "msgpack")


@pytest.mark.parametrize("cseq", [2**63, 2**64 - 1, MAX_INT + 1])
async def test_a_cseq_the_journal_cannot_store_is_refused_at_the_gate_with_a_clear_error(
        tmp_path, cseq):
    store = Store(tmp_path / "w.sqlite")
    async with SyncServer(world(), ServerConfig(secret=SECRET, port=0, http_port=None,
                                                tick_hz=50.0), store) as srv:
        bob = Client(f"ws://127.0.0.1:{srv.port}", token("bob"), position=(10.0, 10.0))
        task = asyncio.create_task(bob.run())
        await asyncio.wait_for(bob.synced.wait(), 10)
        intent = encode({"t": "intent", "cseq": cseq, "talk": {"npc": "npc1", "intent": "greet"}},
                        "msgpack")
        got, close = await raw(srv.port, [hello("eve"), intent])
        assert [m["code"] for m in got if m["t"] == "error"] == ["bad_message"]
        assert f"'cseq' must be <= {MAX_INT}" in got[-1]["reason"]
        assert close.code == 1008
        for k in range(5):  # every other player's ticks commit and are acknowledged
            await bob.send_intent(pos=(11.0 + k, 10.0))
        await asyncio.wait_for(bob.wait_acked(), 10)
        assert srv.core.outages_total == 0 and srv.health()["status"] == "ready"
        await bob.close()
        await task
    assert Store(tmp_path / "w.sqlite").recover().player_cseq == {"bob": 5}


async def test_the_largest_cseq_a_client_may_use_is_journaled_and_acknowledged(tmp_path):
    store = Store(tmp_path / "w.sqlite")
    async with SyncServer(world(), ServerConfig(secret=SECRET, port=0, http_port=None), store) as srv, \
            connect(f"ws://127.0.0.1:{srv.port}") as ws:
        await ws.send(hello("eve"))
        await ws.send(encode({"t": "intent", "cseq": MAX_INT, "pos": [1.0, 1.0]}, "msgpack"))
        acks = []
        while MAX_INT not in acks:
            m = decode_server(await asyncio.wait_for(ws.recv(), 10))[0]
            acks += [m["cseq"]] if m["t"] == "ack" else [m["ack"]] if "ack" in m else []
    assert Store(tmp_path / "w.sqlite").recover().player_cseq == {"eve": MAX_INT}


class FlakyStore(Store):
    """A store whose next journal write fails as a full disk does."""

    fail_commits = 0

    def commit_tick(self, intents, changes):
        if self.fail_commits:
            self.fail_commits -= 1
            list(intents)
            raise StoreError("journal write failed: database or disk is full")
        super().commit_tick(intents, changes)


def core_hello(core, player, pos=(5.0, 5.0)):
    return core.hello(player, {"t": "hello", "v": 1, "token": "t", "pos": list(pos)}, "msgpack")


def test_a_tick_that_cannot_be_journaled_keeps_nothing_in_memory_and_acknowledges_nothing(tmp_path):
    store = FlakyStore(tmp_path / "w.sqlite")
    core = SyncCore(world(), radius=100.0, store=store, snapshot_every_s=1e9)
    s = core_hello(core, "p1")
    core.tick(0.01, 1.0)
    s.outbox.clear()
    epoch = core.epoch
    core.receive(s, {"t": "intent", "cseq": 1, "talk": {"npc": "npc3", "intent": "greet"}})
    core.receive(s, {"t": "intent", "cseq": 2, "pos": [9.0, 9.0]})
    store.fail_commits = 1
    assert core.tick(0.01, 2.0) == []
    assert s.outbox == []  # no ack, no delta
    assert "disk is full" in core.unavailable
    assert core.world.npc_state("npc3")["talking_to"] == ""  # the talk is gone from memory
    assert core.world.players == {"p1": (5.0, 5.0)}  # the durable position, not (9, 9)
    assert core.sessions == {} and core.epoch != epoch
    with pytest.raises(ProtocolError) as err:
        core_hello(core, "p1")
    assert err.value.code == "unavailable" and "disk is full" in err.value.reason
    core.tick(0.01, 2.5)  # the probe waits a second between tries
    assert core.unavailable is not None
    core.tick(0.01, 3.5)  # the snapshot succeeds: serving again
    assert core.unavailable is None
    s = core_hello(core, "p1")
    assert s.acked == 0  # cseq 1 and 2 were never saved, so never acknowledged
    s.outbox.clear()
    core.receive(s, {"t": "intent", "cseq": 1, "talk": {"npc": "npc3", "intent": "greet"}})
    core.tick(0.01, 4.0)
    assert s.acked == 1 and core.world.npc_state("npc3")["talking_to"] == "p1"
    store.close()
    assert Store(tmp_path / "w.sqlite").recover().player_cseq == {"p1": 1}


async def test_a_full_disk_fails_closed_acknowledges_nothing_unsaved_and_health_names_the_cause(
        small_fs):
    db = small_fs.path / "w.sqlite"
    async with SyncServer(world(), ServerConfig(secret=SECRET, port=0, http_port=None,
                                                tick_hz=50.0), Store(db)) as srv:
        client = Client(f"ws://127.0.0.1:{srv.port}", lambda: token("alice"), position=(10, 10),
                        backoff_initial_s=0.05, backoff_max_s=0.2, seed=1)
        task = asyncio.create_task(client.run())
        await asyncio.wait_for(client.synced.wait(), 10)
        await client.send_intent(pos=(12.0, 10.0))
        await asyncio.wait_for(client.wait_acked(), 10)
        small_fs.fill()
        await client.send_intent(talk=("npc4", "trade"))
        await until(lambda: srv.core.unavailable is not None, 10, "the outage")
        health = srv.health()
        assert health["status"] == "degraded"
        assert any("database or disk is full" in r for r in health["reasons"]), health
        assert not any("no transaction is active" in r for r in health["reasons"])
        await until(lambda: client.last_error is not None and client.last_error[0] == "unavailable",
                    10, "the client told why")
        assert client.acked == 1  # the talk was never saved: not acknowledged
        small_fs.free()
        await asyncio.wait_for(client.wait_acked(2), 20)  # re-sent after the outage, saved
        assert srv.core.world.npc_state("npc4")["talking_to"] == "alice"
        await client.close()
        await task
    rec = Store(db).recover()
    assert rec.player_cseq == {"alice": 2}
    assert ["npc4", "talking_to", "alice"] in [list(c) for c in rec.changes]


def test_a_read_only_database_at_start_is_a_one_line_error(small_fs):
    db = small_fs.path / "w.sqlite"
    Store(db).close()
    small_fs.read_only()
    env = dict(os.environ, FLASHNPC_SECRET=SECRET.decode())
    out = subprocess.run([sys.executable, "-m", "plugin.cli", "serve", "--port", "0",
                          "--http-port", "-1", "--world", "sim:10", "--db", str(db)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("flashnpc serve: ")
    assert f"cannot open the world database {db}" in lines[0] and "read-only" in lines[0]
