"""The sync load test: one server process, client worker processes, all on loopback.

:func:`run_loadtest` starts ``flashnpc serve`` (the sim world, with a SQLite journal) in a
child process, then ``procs`` worker processes that each run a share of the clients
(:class:`~server_sync.sync.client.Client`, asyncio). Phases:

1. ramp: clients connect at ``connect_rate`` per second;
2. run (``duration`` s): players random-walk (``move_hz`` intents per client per second,
   one in ``talk_every`` is a dialogue choice to an NPC in range), trees change NPC states
   (``changes`` per second world-wide); ``churn`` of the clients drop their socket and
   resume (half of them together, mid-run: the reconnect storm);
3. settle: moves stop, every intent is acknowledged, the server freezes its world and its
   deltas drain;
4. verify: every client compares its replica and last seq with the server's view of its
   area (``/admin/areas``).

Measured: connected clients, server state changes/s, propagation latency (server tick
time of a change to client receipt, same host clock) p50/p95/p99, bytes per client per
second against full-state-every-tick at ``baseline_hz`` (each client's area encoded as a
snapshot), reconnects, resumes, errors, gaps, mismatches, server CPU. Output: a JSON report
and a PNG plot.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import math
import multiprocessing as mp
import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..transport import aio
from ..transport.gc_policy import GcPolicy

__all__ = ["LoadConfig", "OneServer", "drive", "run_loadtest", "serve_command"]


@dataclass
class LoadConfig:
    clients: int = 5000
    duration: float = 60.0
    churn: float = 0.2
    npcs: int = 2000
    changes: float = 1000.0  # synced state changes per second, world-wide
    size: float = 4000.0     # map side
    radius: float = 100.0
    tick_hz: float = 20.0
    procs: int = 2
    move_hz: float = 0.5
    talk_every: int = 20
    speed: float = 10.0      # distance per move
    connect_rate: float = 500.0
    codec: str = "msgpack"
    baseline_hz: float = 20.0
    db: bool = True
    seed: int = 0
    out: str = "runs/loadtest_sync"
    settle_timeout: float = 30.0
    client_nice: int = 0     # niceness of the client worker processes (10: server first)
    profile_server: str | None = None  # write the server's cProfile stats here
    loop: str = "auto"       # event loop of the server and the workers (server_sync.transport.aio)
    client_gc_freeze_s: float = 0.0  # workers' GcPolicy after the ramp (0: CPython's default)


# ---- worker process ----------------------------------------------------------------------

def _http(url: str, token: str, method: str = "GET") -> Any:
    req = urllib.request.Request(url, method=method,
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _worker_main(index: int, cfg: dict[str, Any], players: list[str], url: str, secret: bytes,
                 q: Any, go: Any, stop_moving: Any, verify_path: Any, verify_go: Any) -> None:
    if cfg["client_nice"]:
        os.nice(cfg["client_nice"])  # the load generator must not starve the server under test
    try:
        aio.run(_worker(index, cfg, players, url, secret, q, go, stop_moving,
                        verify_path, verify_go), loop=cfg["loop"])
    except Exception as exc:
        q.put(("fatal", index, repr(exc)))
        raise


async def _worker(index: int, cfg: dict[str, Any], players: list[str], url: str,
                  secret: bytes, q: Any, go: Any, stop_moving: Any, verify_path: Any,
                  verify_go: Any) -> None:
    import numpy as np

    from ..sync.client import Client, FatalServerError
    from ..transport.auth import issue_token
    from ..transport.wire import encode

    rng = random.Random(cfg["seed"] * 1000 + index)
    size, radius = cfg["size"], cfg["radius"]
    lat: list[float] = []
    nodes = [url] if isinstance(url, str) else list(url)  # a cluster: spread over its nodes
    lat_by_node: dict[str, list[float]] = {u: [] for u in nodes}
    area = cfg.get("area_size")  # a cluster's area side: count the moves across borders
    crossings = 0
    stats = {"bytes": 0, "baseline": 0.0}
    # Latency counts live deltas only: after each (re)connect, deltas built before the
    # connection's first message are replays of what the client missed while away.
    live_since: dict[int, float] = {}
    seen_connects: dict[int, int] = {}
    clients: list[Client] = []

    def make(pid: str, k: int) -> Client:
        def on_message(msg: dict[str, Any], nbytes: int) -> None:
            stats["bytes"] += nbytes
            now = time.time() * 1000.0
            connects = clients[k].connects
            if seen_connects.get(k) != connects:
                seen_connects[k] = connects
                live_since[k] = now
            if msg["t"] == "delta" and msg["time"] >= live_since[k]:
                lat.append(now - msg["time"])
                if len(nodes) > 1:
                    lat_by_node[clients[k].url].append(now - msg["time"])

        pos = (rng.uniform(0, size), rng.uniform(0, size))
        first = k % len(nodes)
        return Client(nodes[first:] + nodes[:first], lambda: issue_token(secret, pid, ttl_s=3600),
                      position=pos,
                      codec=cfg["codec"], on_message=on_message, seed=rng.randrange(1 << 30),
                      backoff_initial_s=0.1, backoff_max_s=2.0, open_timeout_s=30)

    clients = [make(p, k) for k, p in enumerate(players)]
    fatal: list[str] = []

    async def runner(c: Client) -> None:
        try:
            await c.run()
        except FatalServerError as exc:
            fatal.append(exc.code)

    tasks: list[asyncio.Task[None]] = []
    per_proc_rate = cfg["connect_rate"] / cfg["procs"]
    t0 = time.monotonic()
    for k, c in enumerate(clients):
        due = t0 + k / per_proc_rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(runner(c)))
    await asyncio.wait_for(asyncio.gather(*(c.synced.wait() for c in clients)), timeout=120)
    q.put(("ramped", index, time.time()))
    gc_policy = GcPolicy(cfg["client_gc_freeze_s"])
    gc_policy.start()
    while not go.is_set():
        await asyncio.sleep(0.01)

    # churn plan: (time offset, client index)
    n_churn = round(cfg["churn"] * len(clients))
    chosen = rng.sample(range(len(clients)), n_churn)
    storm = chosen[: n_churn // 2]
    spread = chosen[n_churn // 2:]
    dur = cfg["duration"]
    plan = sorted([(0.5 * dur, k) for k in storm]
                  + [(rng.uniform(0.1, 0.8) * dur, k) for k in spread])
    period = 1.0 / cfg["move_hz"]
    due = [(rng.uniform(0, period), k) for k in range(len(clients))]
    heapq.heapify(due)
    start = time.monotonic()
    cpu_start = time.process_time()
    last_report = start
    report_no = 0
    moves = talks = 0
    base_by_client = [0] * len(clients)
    while not stop_moving.is_set():
        now = time.monotonic() - start
        while plan and plan[0][0] <= now:
            _, k = plan.pop(0)
            await clients[k].drop_connection()
        while due[0][0] <= now:
            t_due, k = due[0]
            heapq.heapreplace(due, (t_due + period, k))
            c = clients[k]
            x, y = c.position or (0.0, 0.0)
            ang = rng.uniform(0, 2 * math.pi)
            x0, y0 = x, y
            x = min(size, max(0.0, x + cfg["speed"] * math.cos(ang)))
            y = min(size, max(0.0, y + cfg["speed"] * math.sin(ang)))
            if area and (x0 // area, y0 // area) != (x // area, y // area):
                crossings += 1
            talk = None
            moves += 1
            if cfg["talk_every"] and moves % cfg["talk_every"] == 0:
                near = _in_talk_range(c.replica.npcs, (x, y), radius)
                if near:  # like a player: an NPC it can see and reach
                    talk = (rng.choice(near), "greet")
                    talks += 1
            await c.send_intent(pos=(x, y), talk=talk)
        t = time.monotonic()
        if t - last_report >= 1.0:
            last_report += 1.0
            report_no += 1
            # the full-state baseline: each client's area encoded as one snapshot; a fifth
            # of the clients is re-measured per second (encoding all would stall this loop)
            connected = base = 0
            for k, c in enumerate(clients):
                if c.connected and c.synced.is_set():
                    connected += 1
                    if k % 5 == report_no % 5 or not base_by_client[k]:
                        base_by_client[k] = len(encode(
                            {"t": "snapshot", "v": 1, "epoch": c.replica.epoch or "",
                             "seq": c.replica.seq, "time": time.time() * 1000.0,
                             "radius": radius, "npcs": c.replica.npcs}, cfg["codec"]))
                    base += base_by_client[k]
            arr = np.asarray(lat, dtype=np.float32)
            lat.clear()
            q.put(("second", index, {"n": report_no, "connected": connected,
                                     "lat": arr.tobytes(), "bytes": stats["bytes"],
                                     "baseline_per_s": base * cfg["baseline_hz"],
                                     "moves": moves, "talks": talks}))
            stats["bytes"] = 0
        gc_policy.step()
        await asyncio.sleep(0.02)

    cpu_run = time.process_time() - cpu_start
    gc_policy.stop()
    wall_run = time.monotonic() - start
    # settle: wait until every intent is acknowledged
    deadline = time.monotonic() + cfg["settle_timeout"]
    while any(c.pending_intents for c in clients) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    unacked = sum(c.pending_intents for c in clients)
    q.put(("settled", index, unacked))
    while not verify_go.is_set():
        await asyncio.sleep(0.05)
    areas = json.loads(Path(verify_path.value.decode()).read_text())
    mismatched = missing = 0
    per_node = {u: {"clients": 0, "mismatched": 0, "missing": 0, "gaps": 0} for u in nodes}
    for pid, c in zip(players, clients):
        here = areas["by_node"].get(c.url, {}) if "by_node" in areas else areas
        theirs = here.get(pid)
        row = per_node[c.url]
        row["clients"] += 1
        row["gaps"] += c.gaps
        if theirs is None or not c.connected:
            missing += 1
            row["missing"] += 1
        elif theirs["seq"] != c.replica.seq or theirs["npcs"] != c.replica.npcs:
            mismatched += 1
            row["mismatched"] += 1
    for u, row in per_node.items():
        row["lat"] = np.asarray(lat_by_node[u], dtype=np.float32).tobytes()
    result = {
        "clients": len(clients), "mismatched": mismatched, "missing": missing,
        "unacked": unacked, "gaps": sum(c.gaps for c in clients),
        "reconnects": sum(max(0, c.connects - 1) for c in clients),
        "errors": [c.last_error[0] for c in clients if c.last_error] + fatal,
        "intents": sum(c.cseq for c in clients), "talks": talks,
        "churned": n_churn, "cpu_util": cpu_run / wall_run, "gc_full": gc_policy.stats(),
        "crossings": crossings, "per_node": per_node,
        "players": {pid: {"acked": c.acked, "pos": c.position, "node": c.url}
                    for pid, c in zip(players, clients)},
    }
    for c in clients:
        await c.close()
    await asyncio.gather(*tasks, return_exceptions=True)
    q.put(("done", index, result))


def _in_talk_range(npcs: dict[str, Any], pos: tuple[float, float], reach: float) -> list[str]:
    """The NPCs of a replica within ``reach`` of ``pos`` (the server's talk range is its
    interest radius by default), sorted."""
    return sorted(n for n, e in npcs.items()
                  if math.hypot(e["pos"][0] - pos[0], e["pos"][1] - pos[1]) <= reach)


# ---- orchestrator ------------------------------------------------------------------------

def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def wait_ready(server: subprocess.Popen[bytes], ready: Path, timeout_s: float) -> list[str]:
    """Wait for a `flashnpc serve` child to write its ready file; return the file's fields
    (the ports it bound). RuntimeError with the server's stderr if it exits or takes too long."""
    deadline = time.time() + timeout_s
    while not ready.exists():
        if server.poll() is not None or time.time() > deadline:
            raise RuntimeError("server did not start: "
                               + server.stderr.read().decode()[-2000:])  # type: ignore[union-attr]
        time.sleep(0.1)  # a child process: there is nothing to await on
    return ready.read_text().split()


def _pct(values: Any, q: float) -> float | None:
    import numpy as np

    return None if len(values) == 0 else float(np.percentile(values, q))


# progress(stage, seconds): the stage under way ("ramp", "run", "verify") and the seconds of
# the measured run done so far (of cfg.duration)
Progress = Callable[[str, float], None]


def write_plot(draw: Callable[[Path], None], path: Path, log: Any) -> str | None:
    """``draw(path)`` with matplotlib; returns the path written, or None after a one-line note
    when matplotlib is not installed (it is optional: the report is complete without the plot)."""
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        log(f"note: {path.name} not drawn: matplotlib is not installed (pip install matplotlib)")
        return None
    draw(path)
    return str(path)


def run_loadtest(cfg: LoadConfig, *, log: Any = print, progress: Progress | None = None) -> dict[str, Any]:
    """Run the load test described by ``cfg``; returns the report (also written to
    ``cfg.out``/report.json, with plot.png when matplotlib is installed: the report's
    ``plot`` is its path, or None). ``progress`` hears the stage and the seconds run so far."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="flashnpc_loadtest_"))
    secret = secrets.token_hex(16).encode()
    admin = secrets.token_hex(16)
    ready = tmp / "ready"
    env = dict(os.environ, FLASHNPC_SECRET=secret.decode(), FLASHNPC_ADMIN_TOKEN=admin)
    cmd = serve_command(cfg, ready)
    if cfg.db:
        cmd += ["--db", str(tmp / "world.sqlite")]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        port, http_port = wait_ready(server, ready, 60.0)
        url = f"ws://127.0.0.1:{port}"
        admin_url = f"http://127.0.0.1:{http_port}/admin"
        return drive(cfg, OneServer(server, admin_url, admin), url, secret, tmp, out, log,
                     progress or (lambda _stage, _s: None))
    finally:
        stop_process(server)


def serve_command(cfg: LoadConfig, ready: Path) -> list[str]:
    """The ``flashnpc serve`` command line of the server under test (sim world, loopback)."""
    prefix = ["-m", "cProfile", "-o", cfg.profile_server] if cfg.profile_server else []
    return [sys.executable, *prefix, "-m", "plugin.cli", "serve", "--port", "0", "--http-port", "0",
            "--world", f"sim:{cfg.npcs}:{cfg.changes}:{cfg.size}", "--tick-hz", str(cfg.tick_hz),
            "--radius", str(cfg.radius), "--ready-file", str(ready), "--seed", str(cfg.seed),
            "--grace", "60", "--ring", "128", "--loop", cfg.loop]


class OneServer:
    """What :func:`drive` needs of the servers under test, for one ``flashnpc serve``
    (server_sync.loadtest.cluster_loadtest has the same for a cluster)."""

    def __init__(self, proc: subprocess.Popen[bytes], admin_url: str, admin: str) -> None:
        self.proc = proc
        self.admin_url = admin_url
        self.admin = admin

    def dead(self) -> str | None:
        """Why the servers cannot go on (a process exited), or None."""
        code = self.proc.poll()
        return None if code is None else f"the server exited with code {code}"

    def stats(self, clear_ticks: bool = False) -> dict[str, Any]:
        return _http(f"{self.admin_url}/stats" + ("?clear_ticks=1" if clear_ticks else ""),
                     self.admin)

    def freeze(self) -> None:
        _http(f"{self.admin_url}/freeze", self.admin, "POST")

    def areas(self) -> dict[str, Any]:
        return _http(f"{self.admin_url}/areas", self.admin)

    def cpu_seconds(self) -> float:
        return _cpu_seconds(self.proc.pid)

    def during_run(self, seconds: float) -> None:
        """Called about once a second of the measured run (the cluster kills a node here)."""

    def finish(self, report: dict[str, Any], results: list[dict[str, Any]]) -> bool:
        """Add the servers' own checks to ``report``; False when one failed."""
        return True


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate ``proc`` if it still runs; kill it if it has not exited 10 s later."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _next(q: Any, procs: list[Any], servers: OneServer,
          timeout: float) -> tuple[str, int, Any]:
    """The next worker message; fails fast if a worker or the server died."""
    import queue

    deadline = time.time() + timeout
    while True:
        try:
            return q.get(timeout=1.0)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a client worker exited with code {dead[0]}") from None
            dead = servers.dead()
            if dead is not None:
                raise RuntimeError(dead) from None
            if time.time() > deadline:
                raise RuntimeError(f"no word from the client workers in {timeout:.0f} s") from None


def drive(cfg: LoadConfig, servers: OneServer, url: str | list[str], secret: bytes, tmp: Path,
          out: Path, log: Any, progress: Progress) -> dict[str, Any]:
    """Run the clients against ``servers`` (``url``: a server, or a cluster's nodes) through
    the phases of the module docstring; returns the report."""
    import numpy as np

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    go = ctx.Event()
    stop_moving = ctx.Event()
    verify_go = ctx.Event()
    verify_path = ctx.Array("c", 512)
    players = [f"p{k}" for k in range(cfg.clients)]
    shares = [players[i::cfg.procs] for i in range(cfg.procs)]
    wcfg = asdict(cfg)
    procs = [ctx.Process(target=_worker_main, args=(i, wcfg, shares[i], url, secret, q, go,
                                                    stop_moving, verify_path, verify_go),
                         daemon=True) for i in range(cfg.procs)]
    for p in procs:
        p.start()
    t_start = time.time()
    ramped = 0
    while ramped < cfg.procs:
        kind, i, payload = _next(q, procs, servers, 300)
        if kind == "fatal":
            raise RuntimeError(f"worker {i} failed: {payload}")
        if kind == "ramped":
            ramped += 1
            progress("ramp", 0.0)
    ramp_s = time.time() - t_start
    log(f"ramp: {cfg.clients} clients connected in {ramp_s:.1f} s")
    s0 = servers.stats(clear_ticks=True)
    cpu0, wall0 = servers.cpu_seconds(), time.time()
    go.set()
    per_second: dict[int, dict[str, Any]] = {}
    lat_all: list[Any] = []
    run_end = wall0 + cfg.duration
    while time.time() < run_end:
        progress("run", time.time() - wall0)
        servers.during_run(time.time() - wall0)
        try:
            kind, i, payload = q.get(timeout=max(0.1, min(1.0, run_end - time.time())))
        except Exception:
            continue
        if kind == "fatal":
            raise RuntimeError(f"worker {i} failed: {payload}")
        if kind == "second":
            sec = payload["n"] - 1
            row = per_second.setdefault(sec, {"connected": 0, "lat": [], "bytes": 0,
                                              "baseline": 0.0})
            lats = np.frombuffer(payload["lat"], dtype=np.float32)
            row["connected"] += payload["connected"]
            row["lat"].append(lats)
            row["bytes"] += payload["bytes"]
            row["baseline"] += payload["baseline_per_s"]
            lat_all.append(lats)
            if i == 0 and sec >= 1:
                r = per_second.get(sec - 1)
                if r is not None:
                    la = np.concatenate(r["lat"]) if r["lat"] else np.zeros(0)
                    log(f"t={sec:3d}s connected={r['connected']} deltas={len(la)} "
                        f"p99={_pct(la, 99) or 0:.1f} ms")
    s1 = servers.stats()
    cpu1, wall1 = servers.cpu_seconds(), time.time()
    progress("verify", cfg.duration)
    stop_moving.set()
    settled = unacked = 0
    while settled < cfg.procs:
        kind, i, payload = _next(q, procs, servers, cfg.settle_timeout + 60)
        if kind == "fatal":
            raise RuntimeError(f"worker {i} failed: {payload}")
        if kind == "settled":
            settled += 1
            unacked += payload
    servers.freeze()
    last = -1
    deadline = time.time() + cfg.settle_timeout
    while time.time() < deadline:  # wait until the server builds no more deltas
        time.sleep(1.0)
        d = servers.stats()["deltas"]
        if d == last:
            break
        last = d
    time.sleep(1.0)  # frames of the last tick are in flight on loopback
    areas_file = tmp / "areas.json"
    areas_file.write_text(json.dumps(servers.areas()))
    verify_path.value = str(areas_file).encode()
    verify_go.set()
    results = []
    while len(results) < cfg.procs:
        kind, i, payload = _next(q, procs, servers, 300)
        if kind == "fatal":
            raise RuntimeError(f"worker {i} failed: {payload}")
        if kind == "done":
            results.append(payload)
    for p in procs:
        p.join(30)
    s2 = servers.stats()
    lat = np.concatenate(lat_all) if lat_all else np.zeros(0)
    elapsed = wall1 - wall0
    changes_per_s = (s1["state_changes"] - s0["state_changes"]) / elapsed
    rows = [(s, r) for s, r in sorted(per_second.items()) if 0 <= s < int(cfg.duration)]
    full = [r for _, r in rows if r["connected"]]
    bytes_pc = (sum(r["bytes"] for r in full) / max(1, sum(r["connected"] for r in full)))
    base_pc = (sum(r["baseline"] for r in full) / max(1, sum(r["connected"] for r in full)))
    report = {
        "config": asdict(cfg),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                    "loop": aio.loop_name(cfg.loop)},
        "ramp_s": ramp_s,
        "connected_min": min((r["connected"] for _, r in rows), default=0),
        "connected_max": max((r["connected"] for _, r in rows), default=0),
        "state_changes_per_s": changes_per_s,
        "latency_ms": {"p50": _pct(lat, 50), "p95": _pct(lat, 95), "p99": _pct(lat, 99),
                       "max": float(lat.max()) if len(lat) else None, "samples": len(lat)},
        "bytes_per_client_per_s": bytes_pc,
        "full_state_bytes_per_client_per_s": base_pc,
        "bytes_reduction_x": (base_pc / bytes_pc) if bytes_pc else None,
        "reconnects": sum(r["reconnects"] for r in results),
        "churned_clients": sum(r["churned"] for r in results),
        "server_resumes": s2["resumes"] - s0["resumes"],
        "server_snapshots": s2["snapshots"] - s0["snapshots"],
        "gaps": sum(r["gaps"] for r in results),
        "unacked_intents": unacked,
        "intents": sum(r["intents"] for r in results),
        "mismatched_replicas": sum(r["mismatched"] for r in results),
        "missing_clients": sum(r["missing"] for r in results),
        "client_errors": sorted(e for r in results for e in r["errors"]),
        "server_errors": s2["errors"],
        "server_refused_intents": s2.get("refused_intents", 0) - s0.get("refused_intents", 0),
        "server_tick_overruns": s1["tick_overruns"] - s0["tick_overruns"],
        "server_ticks": s1["ticks"] - s0["ticks"],
        # the server's own share of propagation: a change made during a tick is written
        # to the sockets by the end of that tick
        "server_tick_ms": s1["tick_ms"],
        "server_gc_full": {"n": s1["gc_full"]["n"] - s0["gc_full"]["n"],
                           "total_ms": s1["gc_full"]["total_ms"] - s0["gc_full"]["total_ms"],
                           "max_ms_whole_life": s1["gc_full"]["max_ms"]},
        "server_cpu_util": (cpu1 - cpu0) / elapsed,
        "server_frames_out_per_s": (s1["frames_out"] - s0["frames_out"]) / elapsed,
        "server_intents_per_s": (s1["intents"] - s0["intents"]) / elapsed,
        # server CPU per frame sent, all work included (ticks, inbound, journal)
        "server_cpu_us_per_frame_out": 1e6 * (cpu1 - cpu0)
        / max(1, s1["frames_out"] - s0["frames_out"]),
        "clients_cpu_util": sum(r["cpu_util"] for r in results),
        "clients_gc_full": {"n": sum(r["gc_full"]["n"] for r in results),
                            "max_ms": max(r["gc_full"]["max_ms"] for r in results)},
        "machine_load_avg_1m": os.getloadavg()[0],
        "timeline": [{"s": s, "connected": r["connected"],
                      "p50": _pct(np.concatenate(r["lat"]), 50) if r["lat"] else None,
                      "p99": _pct(np.concatenate(r["lat"]), 99) if r["lat"] else None}
                     for s, r in rows],
    }
    servers_ok = servers.finish(report, results)
    report["zero_lost_updates"] = (report["gaps"] == 0 and report["mismatched_replicas"] == 0
                                   and report["missing_clients"] == 0
                                   and report["unacked_intents"] == 0 and servers_ok)
    report["plot"] = write_plot(lambda path: _plot(report, path), out / "plot.png", log)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = report["timeline"]
    s = [r["s"] for r in tl]
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    a.plot(s, [r["p50"] or 0 for r in tl], label="p50")
    a.plot(s, [r["p99"] or 0 for r in tl], label="p99")
    a.axhline(100, color="grey", linestyle=":", label="goal p99 100 ms")
    a.set_ylabel("propagation latency (ms)")
    a.legend()
    b.plot(s, [r["connected"] for r in tl], color="tab:green")
    b.set_ylabel("connected clients")
    b.set_xlabel("seconds into the run")
    c = report["config"]
    if c.get("kill_node_at") is not None and report.get("killed_node"):
        t0 = c["kill_node_at"]
        for ax in (a, b):
            ax.axvline(t0, color="tab:red", linestyle="--")
            if report.get("takeover_s"):
                ax.axvspan(t0, t0 + report["takeover_s"], color="tab:red", alpha=0.12)
        a.text(t0, a.get_ylim()[1] * 0.8, f" {report['killed_node']} killed (kill -9); "
               f"areas taken over in {report.get('takeover_s') or 0:.2f} s", color="tab:red",
               fontsize=8)
    b.set_ylim(0, max([r["connected"] for r in tl] + [1]) * 1.15)
    fig.suptitle(f"flashnpc loadtest sync: {c['clients']} clients, churn {c['churn']}, "
                 f"{report['state_changes_per_s']:.0f} changes/s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
