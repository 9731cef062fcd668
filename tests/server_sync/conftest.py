"""Shared helpers: a condition wait (never a bare sleep) and a running test server."""

import asyncio
import time

import pytest

from server_sync import ServerConfig, SyncServer, issue_token
from server_sync.sync.world import sim_world

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


@pytest.fixture
async def server():
    """A server over a seeded 200-NPC world on ephemeral ports (no HTTP)."""
    world = sim_world(200, changes_per_s=200, size=400.0, seed=1)
    srv = SyncServer(world, ServerConfig(secret=SECRET, port=0, http_port=None, radius=60.0,
                                         tick_hz=50.0, grace_s=30.0))
    await srv.start()
    yield srv
    await srv.stop()
