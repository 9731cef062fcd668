"""A real redis-server per test, on a free loopback port with its own directory, AOF on and
``appendfsync always``; killed afterwards. Without redis-server on PATH the tests are skipped,
unless FLASHNPC_REQUIRE_REDIS=1 (CI), where they fail."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server process: ``url``, ``client()``, ``stop()`` (kill -9) and ``start()``
    again on the same port and directory (its AOF brings the data back)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe is not None
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--protected-mode", "no", "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        import redis

        while True:
            try:
                redis.Redis(port=self.port, socket_timeout=1).ping()
                return
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("redis-server did not start: "
                                         + (self.dir / "redis.log").read_text()[-2000:]) from None
                time.sleep(0.02)  # a child process: there is nothing to await on

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def client(self):
        import redis

        return redis.Redis(port=self.port, decode_responses=True)


def redis_required() -> None:
    """Skip without redis-server on PATH (fail instead under FLASHNPC_REQUIRE_REDIS=1)."""
    if shutil.which("redis-server") is None:
        if os.environ.get("FLASHNPC_REQUIRE_REDIS") == "1":
            pytest.fail("redis-server is not installed, and FLASHNPC_REQUIRE_REDIS=1")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    redis_required()
    d = tmp_path / "redis"
    d.mkdir()
    server = RedisServer(d)
    server.start()
    try:
        yield server
    finally:
        server.stop()


WORLD = dict(npcs=40, changes_per_s=40.0, size=500.0, seed=1)


def cluster_node(redis_url: str, name: str, *, lease_ms: int = 600, **config):
    """An in-process cluster node over the seeded 40-NPC world, 4 areas of 250 (not started)."""
    from server_sync import ServerConfig
    from server_sync.cluster.node import build_node
    from server_sync.sync.world import sim_world

    from ..conftest import SECRET

    cfg = dict(secret=SECRET, port=0, http_port=None, radius=100.0, tick_hz=50.0,
               snapshot_every_s=1.0, max_speed=1000.0)
    cfg.update(config)
    return build_node(sim_world(WORLD["npcs"], changes_per_s=WORLD["changes_per_s"],
                                size=WORLD["size"], seed=WORLD["seed"]),
                      ServerConfig(**cfg), redis_url, node_id=name, area_size=250.0,
                      lease_ms=lease_ms)


def all_owned(*nodes) -> bool:
    """Every area has exactly one owner among ``nodes``, and each node owns some."""
    owned = [set(n.cluster.owned) for n in nodes]
    total = set().union(*owned)
    return (len(total) == len(nodes[0].cluster.areas) and sum(map(len, owned)) == len(total)
            and all(owned))
