"""Shared helpers: a condition wait (never a bare sleep), a running test server, and the schema
check every test runs under: each message an in-process server sends is validated against the
shipped JSON Schemas (tests/server_sync/schema_check.py); a test fails if one does not match."""

import asyncio
import os
import subprocess
import time

import pytest

from server_sync import ServerConfig, SyncServer, issue_token
from server_sync.sync.world import sim_world
from server_sync.transport import gate

from .schema_check import OutboundRecorder

SECRET = b"test-secret-0123456789-0123456789"


async def until(cond, timeout=10.0, what="condition"):
    """Wait until cond() is true, polling the event loop; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def token(player, **kw):
    return issue_token(SECRET, player, **kw)


async def raw(port, frames, *, text=None, decode=None):
    """Send ``frames`` on a bare connection (``text=True``: bytes as text frames, unchecked);
    return the sync messages received (``decode``: another decoder) and the close frame."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    from server_sync.sync.protocol import decode_server

    decode = decode or decode_server
    got = []
    async with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None) as ws:
        for f in frames:
            await (ws.send(f, text=True) if text and isinstance(f, bytes) else ws.send(f))
        try:
            async for frame in ws:
                got.append(decode(frame)[0])
        except ConnectionClosed:
            pass
        return got, ws.protocol.close_rcvd or ws.protocol.close_sent


@pytest.fixture(autouse=True)
def outbound_schema_check():
    """Check every message the servers send in this test against the JSON Schemas."""
    recorder = OutboundRecorder()
    previous, gate.outbound_check = gate.outbound_check, recorder
    yield recorder
    gate.outbound_check = previous
    assert recorder.violations == [], "messages outside the published schemas"


@pytest.fixture
async def server():
    """A server over a seeded 200-NPC world on ephemeral ports (no HTTP)."""
    world = sim_world(200, changes_per_s=200, size=400.0, seed=1)
    srv = SyncServer(world, ServerConfig(secret=SECRET, port=0, http_port=None, radius=60.0,
                                         tick_hz=50.0, grace_s=30.0))
    await srv.start()
    yield srv
    await srv.stop()


class SmallFs:
    """A small tmpfs mounted for one test: fill it to the last byte, free it, make it read-only."""

    def __init__(self, path):
        self.path = path
        self.filler = path / "filler"

    def fill(self):
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for size in (65536, 4096, 1):  # down to the last byte that fits
                try:
                    while True:
                        os.write(fd, b"\0" * size)
                except OSError:
                    pass
        finally:
            os.close(fd)

    def free(self):
        self.filler.unlink(missing_ok=True)

    def read_only(self):
        subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True)


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(size)`` mounts a tmpfs of ``size`` (e.g. "4m") under tmp_path and returns its
    :class:`SmallFs` (CI runs as root); the test is skipped, saying why, where mounting is
    impossible. Everything mounted is unmounted afterwards."""
    mounted = []

    def mount(size):
        mnt = tmp_path / f"tmpfs{len(mounted)}"
        mnt.mkdir()
        try:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                               capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"cannot mount a tmpfs for the disk-full test: {exc}")
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs for the disk-full test (needs root): "
                        f"{r.stderr.strip()}")
        mounted.append(mnt)
        return SmallFs(mnt)

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


@pytest.fixture
def small_fs(tmpfs):
    """A 4 MiB tmpfs (see :func:`tmpfs`)."""
    return tmpfs("4m")
