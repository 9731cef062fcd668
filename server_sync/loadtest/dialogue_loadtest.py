"""The dialogue load test: ``flashnpc serve --dialogue`` in one process, client worker
processes, all on loopback (127.0.0.1), for a bounded time; it stops by itself. With ``front``
(``--front URL``) no server is started: the clients go through that front (nginx before
``flashnpc serve --dialogue`` workers, docs/dialogue_front.md) and the figures come overall and
per worker (``workers``, keyed by the welcome's ``worker``).

:func:`run_dialogue_loadtest` starts the server (a one-NPC sync world next to the dialogue
server, whose model is ``model_dir``, default the shipped one), then ``procs`` worker
processes that each hold a share of ``sessions`` dialogue sessions, one WebSocket per
session, spoken by :class:`server_sync.dialogue.client.DialogueClient` (a lost worker's
requests are answered with its authored fallbacks, ``worker_lost`` / ``no_answer``, and the
session re-opens). Requests arrive as a Poisson process of ``rate`` requests/s over all sessions
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
reason, ``busy`` the requests refused, ``errors`` the error replies, sessions that could not
open and requests never answered (``lost``).
Output: ``out``/report.json and ``out``/plot.png.
"""

from __future__ import annotations

import asyncio
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
    front: str | None = None           # ws:// URL of a front (nginx before workers): start no server
    workers_http: tuple[str, ...] = ()  # the front's workers' http:// bases, for their /health


# ---- one request's record ----------------------------------------------------------------
# (sent_s, first_piece_s | None, end_s | None, kind, tokens, fallback_reason | "", piece_times,
#  worker | None)
# kind: "line", "fallback", "busy", "error:<code>" or "lost"; worker: the welcome's ``worker``


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
    from runtime.client.fallback import FallbackBook

    from ..dialogue.client import Busy, DialogueClient, DialogueSession, RequestError
    from ..transport.auth import issue_token

    rng = random.Random(cfg["seed"] * 1000 + index)
    book = Path(cfg["model_dir"]) / "fallbacks.json" if cfg["model_dir"] else None
    fallbacks = FallbackBook.from_json(book) if book and book.is_file() else FallbackBook.shipped()
    per_session_rate = cfg["rate"] / cfg["sessions"]
    drain_s = cfg["deadline_ms"] / 1000.0 + 5.0
    records: list[list[Any]] = []
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

    async def one(session: DialogueSession, intent: str) -> None:
        """One request, recorded as it is answered (``lost`` if it never is)."""
        rec: list[Any] = [time.perf_counter(), None, None, "lost", 0, "", [], session.client.worker]
        records.append(rec)

        def piece(_text: str) -> None:
            now = time.perf_counter()
            rec[1] = now if rec[1] is None else rec[1]
            rec[6].append(now)

        try:
            line = await session.request_line(intent, on_piece=piece if cfg["stream"] else None,
                                              max_tokens=cfg["max_tokens"] or None)
        except Busy:
            rec[3] = "busy"
        except RequestError as exc:
            rec[3] = f"error:{exc.code}"
        else:
            rec[3:6] = ["fallback" if line.fallback else "line", line.tokens, line.fallback_reason or ""]
            rec[7] = line.worker
        rec[2] = time.perf_counter()

    async def session_body(k: int, opened_now: Callable[[], None]) -> None:
        srng = random.Random(rng.randrange(1 << 30))
        c = DialogueClient(url, issue_token(secret, f"w{index}s{k}"), key=f"lt{cfg['seed']}-{index}-{k}",
                           fallbacks=fallbacks, deadline_ms=cfg["deadline_ms"], answer_grace_s=4.0,
                           open_timeout_s=60.0, seed=srng.randrange(1 << 30))
        await c.connect()
        try:
            session = await c.open_session(srng.choice(catalog["archetypes"]),
                                           srng.choice(catalog["states"]))
            opened_now()
            await started.wait()
            start_at = start.value
            stop_at = start_at + cfg["duration"]
            period = cfg["sessions"] / cfg["rate"]  # burst: one wave per period
            t = start_at - period if cfg["burst"] else start_at
            asked: list[asyncio.Task[None]] = []
            while True:
                t += period if cfg["burst"] else srng.expovariate(per_session_rate)
                if t >= stop_at:
                    break
                await asyncio.sleep(max(0.0, t - time.perf_counter()))
                asked.append(asyncio.create_task(one(session, srng.choice(catalog["intents"]))))
            if asked:  # every request is answered by its deadline plus the client's grace
                _, late = await asyncio.wait(asked, timeout=drain_s)
                for task in late:  # never answered: stays "lost"
                    task.cancel()
        finally:
            await c.close()

    results = await asyncio.gather(*[session(k) for k in range(n_sessions)],
                                   return_exceptions=True)
    start_task.cancel()
    start_at = start.value
    failed = [r for r in results if isinstance(r, BaseException)]
    records.extend([start_at, None, None, f"error:{type(e).__name__}", 0, "", [], None]
                   for e in failed)
    # times relative to the start, in seconds
    return [(r[0] - start_at, None if r[1] is None else r[1] - start_at,
             None if r[2] is None else r[2] - start_at, r[3], r[4], r[5],
             [p - start_at for p in r[6]], r[7]) for r in records]


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
    for sent, first, end, kind, tokens, reason, pieces, *_ in records:
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
    from .sync_loadtest import _cpu_seconds, stop_process, wait_ready

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.front:
        return _front_run(cfg, out, log, progress or (lambda _stage, _s: None))
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
           "--dialogue-http-port", "0", "--rate", "1000", "--worker-id", "w0",
           "--ready-file", str(ready)]
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
    return _report(cfg, out, records, log, server_cpu_s=cpu, server=server_view)


def _report(cfg: DialogueLoadConfig, out: Path, records: list[tuple[Any, ...]], log: Any,
            **extra: Any) -> dict[str, Any]:
    """The figures over all requests and per worker (``workers``: the welcome's ``worker``),
    plus ``extra``; written to ``out``/report.json (and plot.png)."""
    from .sync_loadtest import write_plot

    # as vLLM's benchmark: throughput over the time until the last answer, not just arrivals
    span = max([cfg.duration, *(r[2] for r in records if r[2] is not None)])
    slo = {"slo_ttft_ms": cfg.slo_ttft_ms, "slo_e2el_ms": cfg.slo_e2el_ms}
    report = summarize(records, span, **slo)
    names = sorted({r[7] for r in records if r[7] is not None})
    report["workers"] = {w: summarize([r for r in records if r[7] == w], span, **slo) for w in names}
    report.update(extra)
    report["config"] = asdict(cfg)
    report["plot"] = write_plot(lambda path: _plot(records, report, path), out / "plot.png", log)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report


def _front_run(cfg: DialogueLoadConfig, out: Path, log: Any, progress: Progress) -> dict[str, Any]:
    """``--front URL``: the clients go through the front (one connection per session, keyed
    by the session: the front spreads them over its workers); no server is started here. Tokens
    are signed with $FLASHNPC_SECRET, the workers' secret; each ``workers_http`` base's /health
    is read at the end (``server``: {url: health})."""
    from ..transport.auth import secret_from_env

    if not cfg.front or not cfg.front.startswith(("ws://", "wss://")):
        raise ValueError(f"--front {cfg.front!r}: expected a ws:// or wss:// URL")
    bad = [u for u in cfg.workers_http if not u.startswith(("http://", "https://"))]
    if bad:
        raise ValueError(f"--workers-http {bad[0]!r}: expected an http:// URL (a worker's "
                         f"--dialogue-http-port)")
    records = _drive(cfg, cfg.front, secret_from_env(), None, log, progress)
    views = {u: _server_view(u.rstrip("/")) for u in cfg.workers_http}
    return _report(cfg, out, records, log, server_cpu_s=None, server=views)


def _drive(cfg: DialogueLoadConfig, url: str, secret: bytes,
           server: subprocess.Popen[bytes] | None, log: Any,
           progress: Progress) -> list[tuple[Any, ...]]:
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
                if server is not None and server.poll() is not None:
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
