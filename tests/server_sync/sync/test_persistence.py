"""SQLite persistence: the journal's contract, and kill -9 of a real server process."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request

from server_sync import Client, issue_token
from server_sync.sync.core import SyncCore
from server_sync.sync.persistence import IntentRecord, Store
from server_sync.sync.world import sim_world

from ..conftest import until


def test_the_store_uses_wal_and_recovers_what_was_journaled_after_the_snapshot(tmp_path):
    store = Store(tmp_path / "w.sqlite")
    assert store.journal_mode == "wal"
    store.commit_tick([IntentRecord("p1", 1, {"pos": [1, 2]})], [("n1", "state", "a")])
    store.write_snapshot({"time": 1.0})
    store.commit_tick([IntentRecord("p1", 2, {"pos": [3, 4]})], [("n1", "state", "b")])
    store.close()
    rec = Store(tmp_path / "w.sqlite").recover()
    assert rec.snapshot == {"time": 1.0}
    assert rec.changes == [("n1", "state", "b")]
    assert rec.intents == [IntentRecord("p1", 2, {"pos": [3, 4]})]
    assert rec.player_cseq == {"p1": 2}


def test_a_core_recovers_world_state_and_intent_dedup_from_its_store(tmp_path):
    path = tmp_path / "w.sqlite"
    world = sim_world(20, changes_per_s=1e-6, size=50.0)
    core = SyncCore(world, radius=100.0, store=Store(path), snapshot_every_s=1e9)
    s = core.hello("p1", {"t": "hello", "v": 1, "token": "t", "pos": [1.0, 1.0]}, "msgpack")
    core.receive(s, {"t": "intent", "cseq": 1, "talk": {"npc": "npc3", "intent": "greet"}})
    core.receive(s, {"t": "intent", "cseq": 2, "pos": [7.0, 8.0]})
    core.tick(0.01, 1.0)
    assert s.acked == 2
    core.store.close()  # no snapshot since the first: state must come from the journal

    world2 = sim_world(20, changes_per_s=1e-6, size=50.0)
    core2 = SyncCore(world2, radius=100.0, store=Store(path))
    assert world2.npc_state("npc3")["talking_to"] == "p1"
    assert world2.npc_state("npc3")["last_intent"] == "greet"
    assert world2.players["p1"] == (7.0, 8.0)
    s2 = core2.hello("p1", {"t": "hello", "v": 1, "token": "t"}, "msgpack")
    assert s2.acked == 2
    s2.outbox.clear()
    core2.receive(s2, {"t": "intent", "cseq": 2, "pos": [0.0, 0.0]})  # re-sent after restart
    core2.tick(0.0, 2.0)
    assert world2.players["p1"] == (7.0, 8.0)
    assert core2.duplicate_intents_total == 1


def _start_server(db, tmp_path, name):
    ready = tmp_path / f"ready-{name}"
    env = dict(os.environ, FLASHNPC_SECRET="k" * 32, FLASHNPC_ADMIN_TOKEN="admin-token")
    proc = subprocess.Popen(
        [sys.executable, "-m", "plugin.cli", "serve", "--port", "0", "--http-port", "0",
         "--world", "sim:100:50:300", "--db", str(db), "--snapshot-every", "1000",
         "--radius", "500", "--ready-file", str(ready)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc, ready


async def _ports(proc, ready):
    await until(lambda: ready.exists() or proc.poll() is not None, 60, "server start")
    assert proc.poll() is None, proc.stderr.read().decode()
    ws_port, http_port = ready.read_text().split()
    return int(ws_port), int(http_port)


def _areas(http_port):
    req = urllib.request.Request(f"http://127.0.0.1:{http_port}/admin/areas",
                                 headers={"Authorization": "Bearer admin-token"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


async def test_kill_9_loses_no_acknowledged_intent_and_clients_resume(tmp_path):
    db = tmp_path / "world.sqlite"
    proc, ready = _start_server(db, tmp_path, "a")
    try:
        ws_port, _ = await _ports(proc, ready)
        secret = b"k" * 32
        client = Client(f"ws://127.0.0.1:{ws_port}", lambda: issue_token(secret, "alice"),
                        position=(10.0, 10.0), seed=1, backoff_initial_s=0.05,
                        backoff_max_s=0.2)
        task = asyncio.create_task(client.run())
        await asyncio.wait_for(client.synced.wait(), 20)
        for k in range(1, 31):
            await client.send_intent(pos=(10.0 + k, 20.0))
        await client.send_intent(talk=("npc7", "trade"))
        await asyncio.wait_for(client.wait_acked(), 20)
        first_epoch = client.replica.epoch
        os.kill(proc.pid, signal.SIGKILL)  # right after the last ack
        proc.wait(10)

        proc, ready = _start_server(db, tmp_path, "b")
        ws_port, http_port = await _ports(proc, ready)
        client.url = f"ws://127.0.0.1:{ws_port}"  # the new process listens on a new port
        await until(lambda: client.synced.is_set() and client.replica.epoch != first_epoch,
                    20, "client resync after restart")
        area = _areas(http_port)["alice"]
        assert area["player_pos"] == [40.0, 20.0]  # the last acknowledged move
        assert area["npcs"]["npc7"]["state"]["talking_to"] == "alice"
        assert area["npcs"]["npc7"]["state"]["last_intent"] == "trade"
        assert client.replica.npcs["npc7"]["state"]["last_intent"] == "trade"
        assert client.pending_intents == 0
        await client.close()
        await asyncio.wait_for(task, 10)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)
