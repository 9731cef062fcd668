"""``flashnpc serve --dialogue``: the shipped model answers a line on its own port, and the
sync server keeps its ports and ready-file fields."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from websockets.asyncio.client import connect

from server_sync.dialogue.dialogue_protocol import decode_dialogue_server
from server_sync.transport.wire import encode
from tests.server_sync.conftest import SECRET, token


def wait_for_file(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode}: {proc.stderr.read()!r}")
        if time.monotonic() > deadline:
            raise AssertionError("serve did not write its ready file")
        time.sleep(0.05)  # a child process: nothing to await on
    return path.read_text()


async def test_serve_dialogue_answers_a_line_next_to_the_sync_server(tmp_path):
    ready = tmp_path / "ready"
    env = {**os.environ, "FLASHNPC_SECRET": SECRET.decode()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "plugin.cli", "serve", "--world", "sim:20", "--port", "0",
         "--http-port", "-1", "--dialogue", "--dialogue-port", "0", "--dialogue-http-port", "-1",
         "--max-batch", "8", "--ready-file", str(ready)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        fields = wait_for_file(ready, proc).split()
        assert len(fields) == 4 and fields[1] == fields[3] == "None"
        async with connect(f"ws://127.0.0.1:{fields[2]}") as ws:
            await ws.send(encode({"t": "hello", "v": 1, "token": token("ann")}, "msgpack"))
            assert decode_dialogue_server(await ws.recv())[0]["t"] == "welcome"
            await ws.send(encode({"t": "open_session", "rid": 1, "archetype": "guard",
                                  "state": "idle"}, "msgpack"))
            reply = decode_dialogue_server(await ws.recv())[0]
            assert reply["t"] == "session", reply
            await ws.send(encode({"t": "request_line", "rid": 2, "session": reply["session"],
                                  "intent": "greet"}, "msgpack"))
            line = decode_dialogue_server(await ws.recv())[0]
            assert line["t"] == "line" and line["rid"] == 2 and line["text"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()  # never leave a server behind
            proc.wait()
            raise
        assert code == 0


def test_serve_dialogue_refuses_zero_cpu_threads_with_a_reason():
    env = dict(os.environ, FLASHNPC_SECRET=SECRET.decode())
    out = subprocess.run([sys.executable, "-m", "plugin.cli", "serve", "--port", "0", "--http-port", "0",
                          "--dialogue", "--cpu-threads", "0"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 1
    assert "--cpu-threads must be >= 1, got 0" in out.stderr


def test_serve_dialogue_without_torch_says_what_to_install():
    env = dict(os.environ, FLASHNPC_SECRET=SECRET.decode())
    code = ("import sys; sys.modules['torch'] = None; from plugin.cli import main; "
            "sys.exit(main(['serve', '--port', '0', '--http-port', '0', '--dialogue']))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1
    assert "--dialogue needs PyTorch (pip install 'flashnpc[gpu]'" in out.stderr
