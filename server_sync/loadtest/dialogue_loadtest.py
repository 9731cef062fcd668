"""The dialogue load test: ``flashnpc serve --dialogue`` in one process, client worker
processes, all on loopback (127.0.0.1), for a bounded time; it stops by itself.

:func:`run_dialogue_loadtest` starts the server (a one-NPC sync world next to the dialogue
server, whose model is ``model_dir``, default the shipped one), then ``procs`` worker
processes that each hold a share of ``sessions`` dialogue sessions, one WebSocket per
session. Requests arrive as a Poisson process of ``rate`` requests/s over all sessions
(each session draws exponential gaps at ``rate / sessions``), open loop: a session does not
wait for its previous line. With ``burst`` every session instead asks at the same instants,
one wave every ``sessions / rate`` seconds (the same mean rate, worst-case arrivals).
Arrivals stop after ``duration`` s; lines still owed are awaited for ``deadline_ms`` + 5 s.

Every request streams (``stream: true``) unless ``stream`` is off (then there are no TTFT or ITL figures and goodput is judged on e2el). Figures, measured on the client's clock, with
vLLM's ``benchmark_serving`` names: ``request_throughput`` (lines/s) and ``output_throughput``
(model tokens/s) over ``duration_s`` (first arrival to the last answer), and mean / median / p95 / p99 of ``ttft_ms`` (send to first piece),
``tpot_ms`` ((e2el - ttft) / (tokens - 1)), ``itl_ms`` (gaps between pieces; a piece is
one decoded token's text) and ``e2el_ms`` (send to the final ``line``). TTFT, TPOT and ITL
cover model lines; E2EL covers every line, fallbacks included. ``goodput`` is model lines/s
within the SLO (``slo_ttft_ms`` and ``slo_e2el_ms``); ``fallbacks`` counts authored lines by
reason, ``busy`` the requests refused, ``errors`` the error replies and lost connections.
Output: ``out``/report.json and ``out``/plot.png.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..transport import aio

if TYPE_CHECKING:
    from .sync_loadtest import Progress

__all__ = ["DialogueLoadConfig", "run_dialogue_loadtest", "summarize"]

MAX_DURATION_S = 600.0


@dataclass
class DialogueLoadConfig:
    sessions: int = 200
    rate: float = 20.0          # requests per second, all sessions together
    duration: float = 20.0      # seconds of arrivals
    burst: bool = False
    stream: bool = True         # request_line with stream: pieces as they decode (TTFT, ITL)
    procs: int = 2
    device: str = "cpu"
    max_batch: int = 64
    engine: str = "auto"        # the server's dialogue engine (serve --engine)
    cpu_threads: int = 1        # the engine's intra-op threads (serve --cpu-threads)
    model_dir: str | None = None
    deadline_ms: int = 1000
    max_tokens: int | None = None
    slo_ttft_ms: float = 200.0
    slo_e2el_ms: float = 1000.0
    seed: int = 0
    out: str = "runs/loadtest_dialogue"


# ---- one request's record ----------------------------------------------------------------
# (sent_s, first_piece_s | None, end_s | None, kind, tokens, fallback_reason | "", piece_times)
# kind: "line", "fallback", "busy", "error:<code>" or "lost"


def _worker_main(index: int, cfg: dict[str, Any], n_sessions: int, url: str, secret: bytes,
                 catalog: dict[str, list[str]], start: Any, q: Any) -> None:
    try:
        records = aio.run(_worker(index, cfg, n_sessions, url, secret, catalog, start, q))
        q.put(("done", index, records))
    except Exception as exc:
        q.put(("fatal", index, repr(exc)))
        raise


async def _worker(index: int, cfg: dict[str, Any], n_sessions: int, url: str, secret: bytes,
                  catalog: dict[str, list[str]], start: Any, q: Any) -> list[tuple[Any, ...]]:
    """Open every session, report ``ready``, wait for the shared start time ``start.value``
    (perf_counter, set once every worker is ready), then send the requests."""
    from ..dialogue.dialogue_protocol import decode_dialogue_server
    from ..transport.auth import issue_token
    from ..transport.wire import encode
    from ..transport.ws_io import ws_connect

    rng = random.Random(cfg["seed"] * 1000 + index)
    per_session_rate = cfg["rate"] / cfg["sessions"]
    drain_s = cfg["deadline_ms"] / 1000.0 + 5.0
    records: list[tuple[Any, ...]] = []
    opened_count = 0
    started = asyncio.Event()

    async def wait_start() -> None:
        while start.value <= 0.0:
            await asyncio.sleep(0.01)
        started.set()

    def one_opened() -> None:
        nonlocal opened_count
        opened_count += 1
        if opened_count == n_sessions:
            q.put(("ready", index, None))

    start_task = asyncio.create_task(wait_start())

    async def session(k: int) -> None:
        """One session; it counts as opened (or failed to) exactly once, so ``ready`` comes."""
        counted = False

        def opened_now() -> None:
            nonlocal counted
            counted = True
            one_opened()

        try:
            await session_body(k, opened_now)
        finally:
            if not counted:
                one_opened()

    async def session_body(k: int, opened_now: Callable[[], None]) -> None:
        srng = random.Random(rng.randrange(1 << 30))
        loop = asyncio.get_running_loop()
        replies: list[asyncio.Future[dict[str, Any]]] = []  # hello / open_session answers
        open_reqs: dict[int, list[Any]] = {}
        sent_all = False
        drained = asyncio.Event()

        def on_message(frame: bytes | str) -> None:
            m = decode_dialogue_server(frame)[0]
            if replies:
                replies.pop(0).set_result(m)
                return
            now = time.perf_counter()
            r = open_reqs.get(m.get("rid", -1))
            if r is None:
                return
            if m["t"] == "piece":
                r[1] = now if r[1] is None else r[1]
                r[6].append(now)
                return
            r[2] = now
            if m["t"] == "line":
                r[3] = "fallback" if m["fallback"] else "line"
                r[4] = m["tokens"]
                r[5] = m.get("fallback_reason", "")
            else:
                r[3] = "busy" if m["t"] == "busy" else f"error:{m.get('code')}"
            records.append(tuple(open_reqs.pop(m["rid"])))
            if sent_all and not open_reqs:
                drained.set()

        ws = await ws_connect(url, on_message, open_timeout_s=60, max_size=2**20)
        try:
            async def call(msg: dict[str, Any]) -> dict[str, Any]:
                fut = loop.create_future()
                replies.append(fut)
                ws.send(encode(msg, "msgpack"))
                return await asyncio.wait_for(fut, 60)

            welcome = await call({"t": "hello", "v": 1,
                                  "token": issue_token(secret, f"w{index}s{k}")})
            if welcome["t"] != "welcome":
                raise RuntimeError(f"hello refused: {welcome}")
            opened = await call({"t": "open_session", "rid": 1,
                                 "archetype": srng.choice(catalog["archetypes"]),
                                 "state": srng.choice(catalog["states"])})
            if opened["t"] != "session":
                raise RuntimeError(f"open_session refused: {opened}")
            sid = opened["session"]
            opened_now()
            await started.wait()
            start_at = start.value
            stop_at = start_at + cfg["duration"]
            period = cfg["sessions"] / cfg["rate"]  # burst: one wave per period
            t = start_at - period if cfg["burst"] else start_at
            rid = 1
            while True:
                t += period if cfg["burst"] else srng.expovariate(per_session_rate)
                if t >= stop_at:
                    break
                await asyncio.sleep(max(0.0, t - time.perf_counter()))
                rid += 1
                msg: dict[str, Any] = {"t": "request_line", "rid": rid, "session": sid,
                                       "intent": srng.choice(catalog["intents"]), "stream": cfg["stream"],
                                       "deadline_ms": cfg["deadline_ms"]}
                if cfg["max_tokens"]:
                    msg["max_tokens"] = cfg["max_tokens"]
                open_reqs[rid] = [time.perf_counter(), None, None, "lost", 0, "", []]
                ws.send(encode(msg, "msgpack"))
            sent_all = True
            if open_reqs:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(drained.wait(), drain_s)
            records.extend(tuple(r) for r in open_reqs.values())  # never answered: "lost"
            open_reqs.clear()
            ws.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.wait_closed(), 5.0)
        finally:
            ws.abort()

    results = await asyncio.gather(*[session(k) for k in range(n_sessions)],
                                   return_exceptions=True)
    start_task.cancel()
    start_at = start.value
    failed = [r for r in results if isinstance(r, BaseException)]
    records.extend((start_at, None, None, f"error:{type(e).__name__}", 0, "", []) for e in failed)
    # times relative to the start, in seconds
    return [(r[0] - start_at, None if r[1] is None else r[1] - start_at,
             None if r[2] is None else r[2] - start_at, r[3], r[4], r[5],
             [p - start_at for p in r[6]]) for r in records]


# ---- figures -----------------------------------------------------------------------------

def _stats(values: list[float]) -> dict[str, float | None]:
    import numpy as np

    if not values:
        return {"mean": None, "median": None, "p95": None, "p99": None}
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "median": float(np.median(a)),
            "p95": float(np.percentile(a, 95)), "p99": float(np.percentile(a, 99))}


def summarize(records: list[tuple[Any, ...]], duration_s: float, *, slo_ttft_ms: float,
              slo_e2el_ms: float) -> dict[str, Any]:
    """vLLM-style figures from request records ``(sent_s, first_piece_s, end_s, kind, tokens,
    fallback_reason, piece_times_s)`` over a run of ``duration_s`` seconds (see the module
    docstring for each key's meaning)."""
    if duration_s <= 0:
        raise ValueError(f"summarize: duration_s must be > 0, got {duration_s}")
    ttft, tpot, itl, e2el = [], [], [], []
    kinds: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    out_tokens = good = 0
    for sent, first, end, kind, tokens, reason, pieces in records:
        kinds[kind] += 1
        if kind not in ("line", "fallback"):
            continue
        e = 1000.0 * (end - sent)
        e2el.append(e)
        if kind == "fallback":
            reasons[reason or "unknown"] += 1
            continue
        out_tokens += tokens
        if first is None:  # not streamed: no TTFT, the SLO is judged on e2el alone
            good += e <= slo_e2el_ms
            continue
        f = 1000.0 * (first - sent)
        ttft.append(f)
        if tokens > 1:
            tpot.append((e - f) / (tokens - 1))
        itl.extend(1000.0 * (b - a) for a, b in itertools.pairwise(pieces))
        good += f <= slo_ttft_ms and e <= slo_e2el_ms
    completed = kinds["line"] + kinds["fallback"]
    errors = {k: n for k, n in kinds.items() if k.startswith("error:") or k == "lost"}
    report: dict[str, Any] = {
        "requests": len(records), "completed": completed, "model_lines": kinds["line"],
        "busy": kinds["busy"], "fallbacks": sum(reasons.values()),
        "fallback_reasons": dict(reasons), "errors": sum(errors.values()),
        "error_kinds": errors, "duration_s": duration_s,
        "request_throughput": completed / duration_s,
        "output_throughput": out_tokens / duration_s,
        "total_output_tokens": out_tokens,
        "goodput": good / duration_s, "slo": {"ttft_ms": slo_ttft_ms, "e2el_ms": slo_e2el_ms},
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        for stat, v in _stats(values).items():
            report[f"{stat}_{name}_ms"] = v
    return report


# ---- driver ------------------------------------------------------------------------------

def _catalog(model_dir: str | None) -> dict[str, list[str]]:
    from runtime.paths import DEFAULT_MODEL_DIR

    cat = json.loads((Path(model_dir or DEFAULT_MODEL_DIR) / "catalog.json").read_text())
    return {k: list(cat[k]) for k in ("archetypes", "states", "intents")}


def run_dialogue_loadtest(cfg: DialogueLoadConfig, *, log: Any = print,
                          progress: Progress | None = None) -> dict[str, Any]:
    """Run the load test described by ``cfg``; returns the report (also written to
    ``cfg.out``/report.json, with plot.png when matplotlib is installed: the report's ``plot``
    is its path, or None). ``progress(stage, seconds)`` hears the stage (``open``, ``run``,
    ``drain``) and the seconds of arrivals so far (of ``cfg.duration``)."""
    if cfg.sessions < 1 or cfg.procs < 1 or cfg.rate <= 0 or not 0 < cfg.duration <= MAX_DURATION_S:
        raise ValueError(f"dialogue load test: need sessions >= 1, procs >= 1, rate > 0 and "
                         f"0 < duration <= {MAX_DURATION_S:g} (got {cfg.sessions}, {cfg.procs}, "
                         f"{cfg.rate}, {cfg.duration})")
    from .sync_loadtest import _cpu_seconds, stop_process, wait_ready, write_plot

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="flashnpc_dialogue_loadtest_"))
    secret = secrets.token_hex(16).encode()
    ready = tmp / "ready"
    # the server runs this checkout's code, whatever the installed package points at
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, FLASHNPC_SECRET=secret.decode(), PYTHONPATH=path)
    cmd = [sys.executable, "-m", "plugin.cli", "serve", "--host", "127.0.0.1", "--port", "0",
           "--http-port", "-1", "--world", "sim:1", "--tick-hz", "1", "--dialogue",
           "--device", cfg.device, "--max-batch", str(cfg.max_batch), "--engine", cfg.engine,
           "--cpu-threads", str(cfg.cpu_threads),
           "--dialogue-port", "0",
           "--dialogue-http-port", "0", "--rate", "1000", "--ready-file", str(ready)]
    if cfg.model_dir:
        cmd += ["--model-dir", cfg.model_dir]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, _, port, http_port = wait_ready(server, ready, 120.0)
        cpu0 = _cpu_seconds(server.pid)
        records = _drive(cfg, f"ws://127.0.0.1:{port}", secret, server, log,
                         progress or (lambda _stage, _s: None))
        cpu = _cpu_seconds(server.pid) - cpu0
        server_view = _server_view(f"http://127.0.0.1:{http_port}")
    finally:
        stop_process(server)
    # as vLLM's benchmark: throughput over the time until the last answer, not just arrivals
    span = max([cfg.duration, *(r[2] for r in records if r[2] is not None)])
    report = summarize(records, span, slo_ttft_ms=cfg.slo_ttft_ms, slo_e2el_ms=cfg.slo_e2el_ms)
    report["server_cpu_s"] = cpu
    report["server"] = server_view
    report["config"] = asdict(cfg)
    report["plot"] = write_plot(lambda path: _plot(records, report, path), out / "plot.png", log)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report


def _drive(cfg: DialogueLoadConfig, url: str, secret: bytes, server: subprocess.Popen[bytes],
           log: Any, progress: Progress) -> list[tuple[Any, ...]]:
    import queue

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    shares = [len(range(i, cfg.sessions, cfg.procs)) for i in range(cfg.procs)]
    # the start time, set once every session is open; perf_counter is CLOCK_MONOTONIC on
    # Linux, shared by processes on one host
    start = ctx.Value("d", 0.0)
    catalog = _catalog(cfg.model_dir)
    procs = [ctx.Process(target=_worker_main, args=(i, asdict(cfg), shares[i], url, secret,
                                                    catalog, start, q), daemon=True)
             for i in range(cfg.procs) if shares[i]]
    for p in procs:
        p.start()
    log(f"dialogue load test: {cfg.sessions} sessions, {cfg.rate:g} req/s "
        f"{'in bursts' if cfg.burst else 'Poisson'}, {cfg.duration:g} s")
    records: list[tuple[Any, ...]] = []
    done = ready = 0
    t_open = time.perf_counter()
    give_up = time.time() + 120.0 + cfg.sessions / 50.0  # opening the sessions
    try:
        while done < len(procs):
            if start.value:
                ran = time.perf_counter() - start.value
                progress("run" if ran < cfg.duration else "drain", max(0.0, ran))
            else:
                progress("open", 0.0)
            try:
                kind, i, payload = q.get(timeout=1.0)
            except queue.Empty:
                if server.poll() is not None:
                    raise RuntimeError(f"the server exited with code {server.returncode}") from None
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError("a client worker died") from None
                if time.time() > give_up:
                    raise RuntimeError("the client workers did not finish in time") from None
                continue
            if kind == "fatal":
                raise RuntimeError(f"client worker {i} failed: {payload}")
            if kind == "ready":
                ready += 1
                if ready == len(procs):
                    log(f"{cfg.sessions} sessions open after {time.perf_counter() - t_open:.1f} s")
                    start.value = time.perf_counter() + 1.0
                    give_up = time.time() + 1.0 + cfg.duration + cfg.deadline_ms / 1e3 + 60
                continue
            records.extend(payload)
            done += 1
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
    return records


def _server_view(base: str, settle_s: float = 5.0) -> dict[str, Any]:
    """The server's /health once the clients have gone: the server closes a connection's
    sessions when it sees the disconnect, which can land just after the workers exit, so read
    again (up to ``settle_s``) until no session is left open."""
    import urllib.error
    import urllib.request

    give_up = time.monotonic() + settle_s
    while True:
        try:
            with urllib.request.urlopen(base + "/health", timeout=10) as r:
                health = json.loads(r.read())
        except urllib.error.HTTPError as e:  # 503: degraded, the body says why
            health = json.loads(e.read())
        open_sessions = health.get("service", {}).get("sessions", 0)
        if not open_sessions or time.monotonic() >= give_up:
            return {"health": health}
        time.sleep(0.1)


def _plot(records: list[tuple[Any, ...]], report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [r for r in records if r[3] in ("line", "fallback")]
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6))
    for kind, color in (("line", "tab:blue"), ("fallback", "tab:orange")):
        pts = [(r[0], 1000.0 * (r[2] - r[0])) for r in lines if r[3] == kind]
        if pts:
            a.scatter(*zip(*pts, strict=True), s=4, color=color, label=f"{kind} e2el")
    ttft = [(r[0], 1000.0 * (r[1] - r[0])) for r in lines if r[3] == "line" and r[1] is not None]
    if ttft:
        a.scatter(*zip(*ttft, strict=True), s=4, color="tab:green", label="ttft")
    a.axhline(report["slo"]["e2el_ms"], color="grey", linestyle=":", label="e2el SLO")
    a.set_xlabel("seconds into the run (request sent)")
    a.set_ylabel("ms")
    a.legend(loc="upper left", fontsize=8)
    e2el = [1000.0 * (r[2] - r[0]) for r in lines]
    if e2el:
        b.hist(e2el, bins=50, color="tab:blue")
    b.set_xlabel("end-to-end latency (ms)")
    b.set_ylabel("lines")
    c = report["config"]
    fig.suptitle(f"flashnpc loadtest dialogue: {c['sessions']} sessions, {c['rate']:g} req/s"
                 f"{' (burst)' if c['burst'] else ''}, {report['request_throughput']:.1f} lines/s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
