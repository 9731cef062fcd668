"""The front tests' parts: real nginx (skipped where it is not installed, unless
FLASHNPC_REQUIRE_NGINX is set: then a failure), real ``flashnpc serve --dialogue`` worker
processes over the shipped model, on free loopback ports, all stopped afterwards."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from server_sync.dialogue.client import DialogueClient
from server_sync.dialogue.dialogue_server import DialogueConfig, DialogueServer
from server_sync.dialogue.front import FrontConfig, Nginx, Worker, find_nginx, render_conf
from tests.server_sync.conftest import SECRET, token

ROOT = Path(__file__).resolve().parents[3]
MISSING = "nginx is not installed (Debian: apt-get install nginx)"


@pytest.fixture
def nginx_installed() -> None:
    """Skip (or fail, with FLASHNPC_REQUIRE_NGINX) a test that needs nginx where it is missing."""
    if find_nginx() is None:
        if os.environ.get("FLASHNPC_REQUIRE_NGINX"):
            pytest.fail(f"{MISSING}, and FLASHNPC_REQUIRE_NGINX is set")
        pytest.skip(MISSING)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class WorkerProc:
    """A ``flashnpc serve --dialogue`` child process and its ports."""

    id: str
    proc: subprocess.Popen[bytes]
    worker: Worker

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


def start_workers(ids: list[str], tmp: Path, *, extra: tuple[str, ...] = ()) -> list[WorkerProc]:
    """Start one worker per id (in parallel) and wait until each wrote its ready file."""
    env = dict(os.environ, FLASHNPC_SECRET=SECRET.decode(),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    started = []
    for wid in ids:
        ready = tmp / f"ready-{wid}"
        cmd = [sys.executable, "-m", "plugin.cli", "serve", "--port", "0", "--http-port", "-1",
               "--world", "sim:1", "--tick-hz", "1", "--dialogue", "--dialogue-port", "0",
               "--dialogue-http-port", "0", "--max-batch", "8", "--rate", "1000",
               "--worker-id", wid, "--ready-file", str(ready), *extra]
        started.append((wid, ready, subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                                     stderr=subprocess.PIPE)))
    out = []
    deadline = time.monotonic() + 60
    for wid, ready, proc in started:
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                for _, _, p in started:
                    p.kill()
                raise AssertionError(f"worker {wid} did not start: {proc.stderr.read()!r}")
            time.sleep(0.05)  # child processes starting: nothing to await on
        fields = ready.read_text().split()
        out.append(WorkerProc(wid, proc, Worker("127.0.0.1", int(fields[2]), int(fields[3]))))
    return out


def stop_workers(workers: list[WorkerProc]) -> None:
    for w in workers:
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGTERM)
    for w in workers:
        try:
            w.proc.wait(20)
        except subprocess.TimeoutExpired:
            w.kill()


@pytest.fixture(scope="package")
def worker_pool() -> Iterator[tuple[list[WorkerProc], Path]]:
    """Three worker processes for the package (started by the first test that asks)."""
    tmp = Path(tempfile.mkdtemp(prefix="flashnpc_front_workers_"))
    procs = start_workers(["w0", "w1", "w2"], tmp)
    yield procs, tmp
    stop_workers(procs)


@pytest.fixture
def workers(worker_pool: tuple[list[WorkerProc], Path]) -> list[WorkerProc]:
    """Three dialogue workers, w0..w2, shared by the package's tests; one a test killed is
    started again (on new ports) for the next test."""
    procs, tmp = worker_pool
    for i, w in enumerate(procs):
        if w.proc.poll() is not None:
            (tmp / f"ready-{w.id}").unlink(missing_ok=True)
            procs[i] = start_workers([w.id], tmp)[0]
    return procs


@pytest.fixture
def front(tmp_path: Path, nginx_installed: None) -> Iterator[Any]:
    """``front(workers, down=())``: a private nginx in front of ``workers`` on a free port;
    returns (Nginx, FrontConfig, ws URL). Stopped after the test."""
    started: list[Nginx] = []

    def make(ws: list[Worker], down: tuple[str, ...] = ()) -> tuple[Nginx, FrontConfig, str]:
        cfg = FrontConfig(list(ws), listen=("127.0.0.1", free_port()))
        nginx = Nginx(tmp_path / f"nginx{len(started)}")
        nginx.start(render_conf(cfg, set(down)), cfg.listen)
        started.append(nginx)
        return nginx, cfg, f"ws://127.0.0.1:{cfg.listen[1]}/"

    yield make
    for nginx in started:
        nginx.stop()


def client(url: str, key: str, player: str = "p", **kw: Any) -> DialogueClient:
    return DialogueClient(url, token(player), key=key, seed=0, **kw)


async def workers_of(url: str, keys: list[str]) -> dict[str, str]:
    """The worker each key's connection reaches through the front (its welcome's ``worker``)."""

    async def one(key: str) -> tuple[str, str]:
        c = client(url, key)
        await c.connect()
        worker = c.worker
        await c.close()
        assert worker is not None
        return key, worker

    return dict(await asyncio.gather(*[one(k) for k in keys]))


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0,
                     what: str = "condition") -> None:
    """Await ``check()`` until it is true (an nginx reload takes effect asynchronously); fail
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def in_process_worker(worker_id: str, **config: Any) -> DialogueServer:
    """A dialogue server over the shipped model in this process (its breaker and limits are
    the test's to set: ``breaker=`` goes to the service, the rest to DialogueConfig)."""
    from runtime.serving.dialogue_service import DialogueService

    service_kw = {k: config.pop(k) for k in ("breaker",) if k in config}
    service = DialogueService.load(max_batch=8, **service_kw)
    settings = {"rate_per_s": 1000, "rate_burst": 1000, **config}
    return DialogueServer(service, DialogueConfig(secret=SECRET, port=0, http_port=0,
                                                  worker_id=worker_id, **settings))


def address(server: DialogueServer) -> Worker:
    assert server.port is not None and server.http_port is not None
    return Worker("127.0.0.1", server.port, server.http_port)
