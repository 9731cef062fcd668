"""The rendered nginx configuration: the committed example is what the code renders, real nginx
accepts it, and ``flashnpc serve --front --run-nginx`` runs a front that clients reach."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from server_sync.dialogue.front import (
    FrontConfig,
    Nginx,
    NginxError,
    parse_listen,
    parse_workers,
    render_conf,
)
from tests.server_sync.dialogue.test_dialogue_serve_cli import wait_for_file

from .conftest import ROOT, client, free_port

EXAMPLE = ROOT / "deploy" / "nginx" / "flashnpc-dialogue.conf"
EXAMPLE_CONFIG = FrontConfig(parse_workers("127.0.0.1:8767:8768,127.0.0.1:8777:8778"),
                             listen=parse_listen("0.0.0.0:8080"))


def test_the_committed_example_is_what_the_code_renders():
    assert EXAMPLE.read_text() == render_conf(EXAMPLE_CONFIG), \
        "regenerate: flashnpc serve --print-conf --workers 127.0.0.1:8767:8768,127.0.0.1:8777:8778 " \
        "--front-listen 0.0.0.0:8080 > deploy/nginx/flashnpc-dialogue.conf"


def test_nginx_accepts_the_example_and_refuses_a_broken_one_with_its_reason(tmp_path: Path,
                                                                            nginx_installed):
    nginx = Nginx(tmp_path)
    cfg = FrontConfig(EXAMPLE_CONFIG.workers, listen=("127.0.0.1", free_port()))
    nginx.start(render_conf(cfg, {"127.0.0.1:8777"}), cfg.listen)  # runs nginx -t first
    try:
        nginx.conf.write_text(render_conf(cfg).replace("hash $flashnpc_dialogue_key consistent;",
                                                       "hash;"))
        with pytest.raises(NginxError, match="invalid number of arguments in \"hash\""):
            nginx.reload()
        assert nginx.proc is not None and nginx.proc.poll() is None  # the old config still runs
    finally:
        nginx.stop()
    with pytest.raises(ValueError, match="not in the config"):
        render_conf(cfg, {"10.0.0.1:1"})


async def test_serve_front_runs_nginx_in_front_of_workers_until_sigterm(workers, tmp_path: Path,
                                                                        nginx_installed):
    port = free_port()
    spec = ",".join(f"{w.worker.host}:{w.worker.port}:{w.worker.http_port}" for w in workers[:2])
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-m", "plugin.cli", "serve", "--front", "--workers", spec,
         "--front-listen", f"127.0.0.1:{port}", "--run-nginx", str(tmp_path / "nginx"),
         "--health-interval", "0.2", "--ready-file", str(ready)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    try:
        assert wait_for_file(ready, proc).split() == [str(port)]
        c = client(f"ws://127.0.0.1:{port}", "someone")
        await c.connect()
        line = await (await c.open_session("merchant", "idle")).request_line("greet")
        assert line.worker in ("w0", "w1") and line.text
        await c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert not (tmp_path / "nginx" / "nginx.pid").exists()  # nginx stopped with it


def test_serve_front_without_workers_is_a_usage_error():
    out = subprocess.run([sys.executable, "-m", "plugin.cli", "serve", "--front"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--front needs --workers" in out.stderr
