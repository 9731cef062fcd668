"""Several models behind one dialogue server, over real WebSockets on 127.0.0.1: a tiny random
base model and a real (few-step) fine-tune of it with a new archetype (``smuggler``). Sessions
are routed by the model they name, /metrics and /health report each model, and the capacity
rule serves non-essential sessions by the fallback model or with authored lines while a
model's prefix-cache hit rate is under the threshold."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime.serving.dialogue_service import CircuitBreaker
from runtime.serving.model_router import CapacityRule, ModelRouter
from server_sync.dialogue.dialogue_server import DialogueConfig, DialogueServer
from tests.runtime.conftest import copy_tiny_model
from tests.server_sync.conftest import SECRET
from tests.test_metric_names import check, undocumented

from .test_dialogue_server import Peer, get, hello

STUDIO = [
    {"archetype": "smuggler", "state": "alert", "line": "Lanterns on the water. Douse yours, quick.",
     "context": {"tide": "high"}},
    {"archetype": "smuggler", "state": "friendly", "line": "Keep your voice down and your purse open."},
    {"archetype": "guard", "state": "patrol", "line": "The harbour chain is up tonight."},
] * 4
QUICK = {"default_deadline_ms": 30_000, "min_mean_logprob": None, "max_batch": 8}


@pytest.fixture(scope="module")
def model_dirs(tiny_model_build: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``base``: a tiny exported model; ``pirate``: it fine-tuned (adapters, 2 steps) on STUDIO."""
    import torch

    from runtime.factory.finetune import FinetuneConfig, finetune

    root = tmp_path_factory.mktemp("multi_model")
    base = copy_tiny_model(tiny_model_build, root / "base")
    lines = root / "studio.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in STUDIO))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        finetune(base, lines, root / "pirate", FinetuneConfig(steps=2, batch_size=4, replay=0.0, lr=1e-2),
                 progress=False)
    finally:
        torch.set_num_threads(threads)
    return {"base": base, "pirate": root / "pirate"}


async def open_session(peer: Peer, rid: int, archetype: str, state: str, **extra: Any) -> dict[str, Any]:
    await peer.send({"t": "open_session", "rid": rid, "archetype": archetype, "state": state, **extra})
    while True:
        m = await peer.recv()
        if m.get("rid") == rid:
            return m


async def line(peer: Peer, rid: int, sid: str, intent: str = "greet", **extra: Any) -> dict[str, Any]:
    await peer.send({"t": "request_line", "rid": rid, "session": sid, "intent": intent, "max_tokens": 4,
                     "seed": rid, **extra})
    reply, _ = await peer.until("line", rid)
    return reply


def lines_of(router: ModelRouter, model: str) -> float:
    """Lines the model's own service answered (model or fallback)."""
    m = router.services[model].metrics
    return m.value("flashnpc_lines_total", source="model") + m.value("flashnpc_lines_total", source="fallback")


async def test_sessions_go_to_the_model_they_name_and_an_unknown_model_is_refused_by_name(model_dirs):
    router = ModelRouter.load(model_dirs, **QUICK)  # onnxruntime engines
    async with DialogueServer(router, DialogueConfig(secret=SECRET, port=0, http_port=None)) as srv:
        peer = await hello(srv.port)
        err = await open_session(peer, 1, "guard", "idle", model="kraken")
        assert err["t"] == "error" and err["code"] == "invalid_request"
        assert "unknown model 'kraken' (models: base, pirate)" in err["reason"]
        # the fine-tune's new archetype exists on its model only
        err = await open_session(peer, 2, "smuggler", "alert")
        assert err["t"] == "error" and "smuggler" in err["reason"]
        pirate = await open_session(peer, 3, "smuggler", "alert", model="pirate", context={"tide": "high"})
        assert pirate["t"] == "session" and pirate["model"] == "pirate"
        base = await open_session(peer, 4, "guard", "idle")
        assert base["model"] == "base"

        before = {m: lines_of(router, m) for m in ("base", "pirate")}
        for rid in range(10, 13):
            got = await line(peer, rid, pirate["session"])
            assert got["served_by"] == ("authored" if got["fallback"] else "pirate")
            if got["fallback"]:  # the pirate model's own authored lines: the studio's
                assert got["text"] == "Lanterns on the water. Douse yours, quick."
        assert lines_of(router, "pirate") == before["pirate"] + 3 and lines_of(router, "base") == before["base"]
        got = await line(peer, 20, base["session"])
        assert got["served_by"] in ("base", "authored") and lines_of(router, "base") == before["base"] + 1

        # updates and closes go to the session's model too
        await peer.send({"t": "update_state", "rid": 21, "session": pirate["session"], "state": "friendly"})
        assert (await peer.until("ok", 21))[0] == {"t": "ok", "rid": 21}
        assert router.services["pirate"].session(pirate["session"]).state == "friendly"
        await peer.send({"t": "close_session", "rid": 22, "session": pirate["session"]})
        await peer.until("ok", 22)
        assert router.services["pirate"].num_sessions == 0 and router.services["base"].num_sessions == 1
        await peer.ws.close()


async def test_the_dialogue_client_names_its_model_and_keeps_it_when_it_re_opens(model_dirs):
    from server_sync.dialogue.client import DialogueClient
    from tests.server_sync.conftest import token, until

    router = ModelRouter.load(model_dirs, **QUICK)
    async with DialogueServer(router, DialogueConfig(secret=SECRET, port=0, http_port=None)) as srv:
        c = DialogueClient(f"ws://127.0.0.1:{srv.port}", token("p"), key="k", seed=0,
                           deadline_ms=30_000)
        await c.connect()
        s = await c.open_session("smuggler", "alert", context={"tide": "high"}, model="pirate",
                                 essential=False)
        assert router.services["pirate"].session(s.sid) is not None
        first = await s.request_line("greet", max_tokens=4)
        assert first.served_by in ("pirate", "authored") and first.served_by is not None
        old_sid = s.sid
        await c.drop_connection()
        await until(lambda: s.sid is not None and s.sid != old_sid, what="the session re-opened")
        assert router.services["pirate"].session(s.sid) is not None  # still the fine-tune's
        assert router.services["base"].num_sessions == 0
        await c.close()


async def test_metrics_label_each_model_and_health_reports_each_models_breaker(model_dirs):
    router = ModelRouter.load(model_dirs, **QUICK)
    router.services["pirate"].breaker = CircuitBreaker(p95_budget_ms=1e-6, min_requests=1, cooldown_s=3600)
    async with DialogueServer(router, DialogueConfig(secret=SECRET, port=0, http_port=0)) as srv:
        url = f"http://127.0.0.1:{srv.http_port}"
        peer = await hello(srv.port)
        sid = (await open_session(peer, 1, "smuggler", "friendly", model="pirate"))["session"]
        for rid in (2, 3):  # the first opens pirate's breaker (any latency is over budget)
            got = await line(peer, rid, sid)
        assert got["fallback_reason"] == "breaker_open" and got["served_by"] == "authored"
        status, body = await asyncio.to_thread(get, url + "/health")
        health = json.loads(body)
        assert status == 503 and health["status"] == "degraded"
        models = health["service"]["models"]
        assert models["pirate"]["breaker"]["state"] == "open" and models["base"]["breaker"]["state"] == "closed"
        assert [r.split(":")[0] for r in health["reasons"]] == ["model pirate"]

        status, body = await asyncio.to_thread(get, url + "/metrics")
        families = list(text_string_to_metric_families(body.decode()))  # the page parses
        assert check(router.registry.collect()) == [] and undocumented(router.registry.collect()) == []
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}

        def value(name: str, **labels: str) -> float:
            return samples[(name, tuple(sorted(labels.items())))]

        assert value("flashnpc_breaker_state", model_name="pirate") == 2
        assert value("flashnpc_breaker_state", model_name="base") == 0
        served = {by: value("flashnpc_served_lines_total", model_name="pirate", served_by=by)
                  for by in ("pirate", "authored")}
        assert sum(served.values()) == 2 and served["authored"] >= 1
        assert value("flashnpc_served_lines_total", model_name="base", served_by="base") == 0
        assert value("flashnpc_fallback_lines_total", model_name="pirate", reason="breaker_open") == 1
        assert value("flashnpc_dialogue_sessions", model_name="pirate") == 1
        assert value("flashnpc_capacity_shedding", model_name="base") == 0
        assert {dict(lb)["model_name"] for n, lb in samples if n == "flashnpc_lines_total"} == {"base", "pirate"}
        await peer.ws.close()


async def test_under_the_hit_rate_non_essential_sessions_get_the_fallback_model_or_authored_lines(model_dirs):
    rule = CapacityRule(min_hit_rate=0.6, window_s=3600, min_requests=8, fallback_model="base")
    router = ModelRouter.load(model_dirs, engine="torch", capacity=rule, **QUICK)  # the engine with a prefix cache
    pirate = router.services["pirate"]
    cat = pirate.catalog
    async with DialogueServer(router, DialogueConfig(secret=SECRET, port=0, http_port=None,
                                                     max_sessions_per_conn=64)) as srv:
        peer = await hello(srv.port)
        light = (await open_session(peer, 1, "guard", "idle", model="pirate", essential=False))["session"]
        smug = (await open_session(peer, 2, "smuggler", "friendly", model="pirate", essential=False))["session"]
        vip = (await open_session(peer, 3, "smuggler", "friendly", model="pirate"))["session"]
        # nothing measured yet: the rule does not judge an empty window
        assert pirate.prefix_window.rate() is None
        assert (await line(peer, 4, light))["served_by"] in ("pirate", "authored")

        # prompts the cache has never seen: every lookup misses
        combos = [(a, s) for a in cat["archetypes"] for s in cat["states"]][1::5][:10]
        rid = 100
        for a, s in combos:
            sid = (await open_session(peer, rid, a, s, model="pirate"))["session"]
            await line(peer, rid + 1, sid, intent="trade")
            rid += 2
        rate = pirate.prefix_window.rate()
        assert rate is not None and rate < 0.6 and router.shedding("pirate")

        # non-essential, known to the fallback model: served by it
        base_before = lines_of(router, "base")
        got = await line(peer, 200, light)
        assert got.get("fallback_reason") != "capacity"
        assert got["served_by"] == ("authored" if got["fallback"] else "base")
        assert lines_of(router, "base") == base_before + 1
        # non-essential, an archetype the base does not know: the pirate model's authored line
        pirate_before = pirate.metrics.value("flashnpc_generation_tokens_total")
        got = await line(peer, 201, smug, intent="approach")
        assert got["fallback"] and got["fallback_reason"] == "capacity" and got["served_by"] == "authored"
        assert got["text"] == "Keep your voice down and your purse open." and got["tokens"] == 0
        # the studio wrote that line for approach: a greeting gets a generic line, never it
        got = await line(peer, 204, smug)
        assert got["fallback_reason"] == "capacity" and got["text"] in ("...", "Hm.")
        assert pirate.metrics.value("flashnpc_generation_tokens_total") == pirate_before
        # essential: the full model, always
        got = await line(peer, 202, vip)
        assert got.get("fallback_reason") != "capacity" and got["served_by"] in ("pirate", "authored")
        # no fallback model configured: authored lines for every non-essential session
        router.capacity = dataclasses.replace(rule, fallback_model=None)
        got = await line(peer, 203, light)
        assert got["fallback_reason"] == "capacity" and got["served_by"] == "authored"
        router.capacity = rule

        # the same prompt again and again: the cache pays, the rate climbs back, the rule lets go
        for rid in range(300, 340):
            await line(peer, rid, vip)
            if not router.shedding("pirate"):
                break
        assert not router.shedding("pirate") and pirate.prefix_window.rate() >= 0.6
        got = await line(peer, 400, light)
        assert got.get("fallback_reason") != "capacity" and got["served_by"] in ("pirate", "authored")
        await peer.ws.close()


async def test_serve_loads_the_models_named_by_model_flags_and_routes_by_them(model_dirs, tmp_path):
    from .test_dialogue_serve_cli import wait_for_file

    ready = tmp_path / "ready"
    env = {**os.environ, "FLASHNPC_SECRET": SECRET.decode()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "plugin.cli", "serve", "--world", "sim:5", "--port", "0", "--http-port", "-1",
         "--dialogue", "--dialogue-port", "0", "--dialogue-http-port", "-1", "--max-batch", "4",
         "--model-dir", str(model_dirs["base"]), "--model", f"pirate={model_dirs['pirate']}",
         "--fallback-model", "base", "--ready-file", str(ready)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        port = wait_for_file(ready, proc).split()[2]
        peer = await hello(int(port))
        opened = await open_session(peer, 1, "smuggler", "friendly", model="pirate", essential=False)
        assert opened["model"] == "pirate"
        got = await line(peer, 2, opened["session"])
        assert got["served_by"] in ("pirate", "authored")
        await peer.ws.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert b"models base, pirate" in out


@pytest.mark.parametrize(("flags", "message"), [
    (["--model", "pirate"], "--model pirate: expected NAME=DIR"),
    (["--model", "Pirate=x"], "the name 'Pirate' must be 1..64 lower-case letters"),
    (["--model", "base={pirate}"], "the name 'base' is given twice ('base' is the --model-dir / shipped model)"),
    (["--model", "p={pirate}", "--model", "p={pirate}"], "--model p={pirate}: the name 'p' is given twice"),
    (["--model", "p={nowhere}"], "is not a directory"),
    (["--model", "p={studio}"], "is not an exported model directory (missing model.int4.onnx, config.json"),
    (["--model", "p={pirate}", "--fallback-model", "kraken"],
     "--fallback-model kraken: not a loaded model (models: base, p)"),
    (["--capacity-hit-rate", "1.5"], "capacity hit rate must be in 0..1, got 1.5"),
])
def test_serve_refuses_bad_model_flags_with_one_line_naming_the_flag(model_dirs, tmp_path, monkeypatch, capsys,
                                                                     flags, message):
    from plugin.cli import main

    names = {"pirate": model_dirs["pirate"], "nowhere": tmp_path / "nowhere", "studio": tmp_path}
    flags = [f.format(**names) for f in flags]
    monkeypatch.setenv("FLASHNPC_SECRET", SECRET.decode())
    rc = main(["serve", "--world", "sim:5", "--port", "0", "--http-port", "-1", "--dialogue",
               "--dialogue-port", "0", "--dialogue-http-port", "-1", *flags])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("flashnpc serve: error: ") and err.count("\n") == 1, err
    assert message.format(**names) in err
