"""A real engine client: Godot 3 headless runs the GDScript clients of examples/godot/ (written
from docs/protocol.md alone) against servers started here on loopback. Skipped, saying so,
where godot3-server is not installed; CI installs it and sets FLASHNPC_REQUIRE_GODOT, which
turns that skip into a failure (.ci/run)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from server_sync import ServerConfig, SyncServer
from server_sync.dialogue.dialogue_server import DialogueConfig, DialogueServer
from server_sync.sync.world import sim_world

from .conftest import SECRET, token
from .dialogue.conftest import cat, loaded, make_service  # noqa: F401  (loaded: a fixture)

GODOT = shutil.which("godot3-server")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "godot"
MISSING = "godot3-server is not installed (Debian: apt-get install godot3-server)"


@pytest.fixture(autouse=True)
def godot_installed() -> None:
    if GODOT is None:
        if os.environ.get("FLASHNPC_REQUIRE_GODOT"):
            pytest.fail(f"{MISSING}, and FLASHNPC_REQUIRE_GODOT is set")
        pytest.skip(MISSING)


async def godot(script: str, tmp_path: Path, **args: str) -> dict[str, Any]:
    """Run ``script`` headless with ``--key=value`` arguments; its RESULT line, parsed."""
    assert GODOT is not None
    proc = await asyncio.create_subprocess_exec(
        GODOT, "--no-window", "--path", str(EXAMPLES), "-s", script,
        *(f"--{k}={v}" for k, v in args.items()),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env=dict(os.environ, HOME=str(tmp_path)))
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    text = out.decode(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    assert lines, text[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert proc.returncode == 0 and result["ok"], text[-3000:]
    return result


async def test_a_godot_client_joins_follows_deltas_resumes_and_matches_the_server(tmp_path):
    config = ServerConfig(secret=SECRET, port=0, http_port=0, admin_token="godot-admin")
    async with SyncServer(sim_world(100, changes_per_s=50, size=300.0, seed=4), config) as srv:
        result = await godot("check_sync.gd", tmp_path, url=f"ws://127.0.0.1:{srv.port}",
                             http=f"127.0.0.1:{srv.http_port}", admin="godot-admin",
                             token=token("godot"), player="godot")
    figures = result["figures"]
    assert figures["resumes"] == 1 and figures["gaps"] == 0 and figures["acked"] == 8
    assert figures["deltas"] >= 3


async def test_a_godot_client_streams_a_line_and_cancels_a_request(tmp_path, loaded):  # noqa: F811
    cfg = DialogueConfig(secret=SECRET, port=0, http_port=None)
    async with DialogueServer(make_service(loaded), cfg) as srv:
        result = await godot("check_dialogue.gd", tmp_path, url=f"ws://127.0.0.1:{srv.port}",
                             token=token("godot"), archetype=cat(loaded, "archetypes"),
                             state=cat(loaded, "states"), intent=cat(loaded, "intents"))
    assert result["line"]["text"]
