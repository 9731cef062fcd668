"""``flashnpc loadtest sync --nodes N``: the sync load test against a cluster.

:func:`run_cluster_loadtest` starts a redis-server (AOF on, ``appendfsync always``; or uses
``redis``), ``nodes`` ``flashnpc serve --redis`` processes, waits until every area has an
owner, and then runs the phases and checkers of :mod:`server_sync.loadtest.sync_loadtest`
with the clients spread over the nodes (client ``k`` starts on node ``k % nodes`` with the
others as its fallbacks). ``kill_node_at`` seconds into the measured run, node 0 is killed
with SIGKILL: its clients resume on the other nodes and its areas are taken over; the
takeover time is measured from the kill until each of its areas has a new owner in Redis.

Checks, on top of the single-node ones (gaps, mismatched and missing replicas, unacknowledged
intents): every intent a client saw acknowledged is durable (the player's ``cseq`` in Redis
is at least its client's ``acked``), no forwarded intent is left unapplied in an area's
intent stream, and every NPC any two nodes both show a client is the same on both. Figures
per node (clients, p50/p99, the node's CPU and ticks) and overall, plus Redis's commands per
second and CPU over the run. The run stops itself: every phase has a timeout, and after
``hard_limit_s`` every process is killed.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .sync_loadtest import (
    LoadConfig,
    Progress,
    _cpu_seconds,
    _http,
    _pct,
    drive,
    serve_command,
    stop_process,
    wait_ready,
)

__all__ = ["ClusterLoadConfig", "run_cluster_loadtest"]


@dataclass
class ClusterLoadConfig(LoadConfig):
    nodes: int = 3
    area_size: float = 250.0
    lease_ms: int = 2000
    kill_node_at: float | None = None  # seconds into the run: kill -9 node 0
    redis: str | None = None           # an existing Redis to use (None: start one)
    appendfsync: str = "always"        # of the redis-server started here
    hard_limit_s: float = 900.0        # everything is killed after this long


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(directory: Path, appendfsync: str = "always") -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server on a free loopback port, AOF on, data in ``directory``; (process, URL).
    RuntimeError when redis-server is missing or does not answer within 20 s."""
    import redis

    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server), "
                           "or pass --redis URL")
    port = _free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--dir",
                             str(directory), "--appendonly", "yes", "--appendfsync", appendfsync,
                             "--save", "", "--logfile", str(directory / "redis.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while True:
        try:
            redis.Redis(port=port, socket_timeout=1).ping()
            return proc, f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            if proc.poll() is not None or time.time() > deadline:
                stop_process(proc)
                raise RuntimeError("redis-server did not start") from None
            time.sleep(0.05)  # a child process: there is nothing to await on


class Cluster:
    """The nodes and Redis under test: what :func:`~server_sync.loadtest.sync_loadtest.drive`
    needs of its servers (see :class:`~server_sync.loadtest.sync_loadtest.OneServer`)."""

    def __init__(self, cfg: ClusterLoadConfig, procs: list[subprocess.Popen[bytes]],
                 ports: list[tuple[str, str]], admin: str, redis_url: str, logs: list[Path]) -> None:
        import redis

        self.cfg = cfg
        self.procs = procs
        self.ws = [f"ws://127.0.0.1:{p}" for p, _ in ports]
        self.http = [f"http://127.0.0.1:{h}" for _, h in ports]
        self.admin = admin
        self.logs = logs
        self.r = redis.Redis.from_url(redis_url, decode_responses=True)
        self.killed: int | None = None
        self.kill_at_wall: float | None = None
        self.takeover_s: float | None = None
        self.victim_areas: list[str] = []
        self._last: dict[int, dict[str, Any]] = {}
        self._first: dict[int, dict[str, Any]] = {}
        self._cpu: dict[int, float] = {}
        self._redis0: dict[str, Any] | None = None
        self._redis1: dict[str, Any] | None = None
        self._running = False
        self._watch: threading.Thread | None = None

    def live(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if i != self.killed and p.poll() is None]

    def health(self, i: int) -> dict[str, Any]:
        try:
            return _http(f"{self.http[i]}/health", self.admin)
        except OSError as exc:  # 503 (degraded) still has the body
            body = getattr(exc, "read", None)
            return json.loads(body()) if callable(body) else {}

    def dead(self) -> str | None:
        for i, p in enumerate(self.procs):
            if i != self.killed and p.poll() is not None:
                return f"node n{i} exited with code {p.returncode}: " + \
                    self.logs[i].read_text(errors="replace")[-1500:]
        return None

    def _refresh(self, clear_ticks: bool = False) -> None:
        for i in self.live():
            s = _http(f"{self.http[i]}/admin/stats" + ("?clear_ticks=1" if clear_ticks else ""),
                      self.admin)
            self._last[i] = s
            self._cpu[i] = _cpu_seconds(self.procs[i].pid)
            if clear_ticks:
                self._first[i] = s

    def stats(self, clear_ticks: bool = False) -> dict[str, Any]:
        self._refresh(clear_ticks)
        if clear_ticks:
            self._redis0 = _redis_info(self.r)
        elif self._running:
            self._running = False
            self._redis1 = _redis_info(self.r)  # the first figures after the run
        nodes = list(self._last.values())
        merged: dict[str, Any] = {k: sum(s[k] for s in nodes) for k in (
            "resumes", "snapshots", "refused_intents", "tick_overruns", "ticks", "frames_out",
            "intents", "deltas")}
        merged["state_changes"] = max(s["state_changes"] for s in nodes)  # each sees the world
        merged["tick_ms"] = max((s["tick_ms"] for s in nodes), key=lambda t: t.get("p99", 0))
        merged["gc_full"] = {"n": sum(s["gc_full"]["n"] for s in nodes),
                             "total_ms": sum(s["gc_full"]["total_ms"] for s in nodes),
                             "max_ms": max(s["gc_full"]["max_ms"] for s in nodes)}
        errors: dict[str, int] = {}
        for s in nodes:
            for code, n in s["errors"].items():
                errors[code] = errors.get(code, 0) + n
        merged["errors"] = errors
        return merged

    def cpu_seconds(self) -> float:
        for i in self.live():
            self._cpu[i] = _cpu_seconds(self.procs[i].pid)
        return sum(self._cpu.values())

    def freeze(self) -> None:
        for i in self.live():
            _http(f"{self.http[i]}/admin/freeze", self.admin, "POST")

    def areas(self) -> dict[str, Any]:
        return {"by_node": {self.ws[i]: _http(f"{self.http[i]}/admin/areas", self.admin)
                            for i in self.live()}}

    def during_run(self, seconds: float) -> None:
        self._running = True
        at = self.cfg.kill_node_at
        if at is None or self.killed is not None or seconds < at:
            return
        self._refresh()  # the victim's last figures
        self.victim_areas = self.health(0).get("cluster", {}).get("areas_owned", [])
        self.procs[0].send_signal(signal.SIGKILL)
        self.kill_at_wall = time.monotonic()
        self.killed = 0
        self.procs[0].wait(10)
        self._watch = threading.Thread(target=self._watch_takeover, daemon=True)
        self._watch.start()

    def _watch_takeover(self) -> None:
        """Poll the victim's leases until each has another owner: the takeover time."""
        keys = [f"{{flashnpc}}:lease:{a}" for a in self.victim_areas]
        deadline = time.monotonic() + 60
        while keys and time.monotonic() < deadline:
            holders = self.r.mget(keys)
            if all(h and h != "n0" for h in holders):
                assert self.kill_at_wall is not None
                self.takeover_s = time.monotonic() - self.kill_at_wall
                return
            time.sleep(0.005)  # polling Redis from a thread: 5 ms resolution

    def finish(self, report: dict[str, Any], results: list[dict[str, Any]]) -> bool:
        import numpy as np

        if self._watch is not None:
            self._watch.join(60)
        players = {p: v for r in results for p, v in r["players"].items()}
        cseq = self.r.hgetall("{flashnpc}:cseq")
        acked_lost = sum(max(0, v["acked"] - int(cseq.get(p, 0))) for p, v in players.items())
        pending = _pending_intents(self.r)
        view = self.areas()["by_node"]
        cross = _cross_node_mismatches(view)
        per_node = []
        for i, ws in enumerate(self.ws):
            rows = [r["per_node"][ws] for r in results if ws in r["per_node"]]
            lat = np.concatenate([np.frombuffer(r["lat"], dtype=np.float32) for r in rows]) \
                if rows else np.zeros(0)
            s0, s1 = self._first.get(i, {}), self._last.get(i, {})
            h = self.health(i) if i != self.killed else {}
            per_node.append({
                "node": f"n{i}", "killed": i == self.killed,
                "clients_at_end": sum(r["clients"] for r in rows),
                "gaps": sum(r["gaps"] for r in rows),
                "mismatched": sum(r["mismatched"] for r in rows),
                "missing": sum(r["missing"] for r in rows),
                "latency_ms": {"p50": _pct(lat, 50), "p99": _pct(lat, 99), "samples": len(lat)},
                "deltas": s1.get("deltas", 0) - s0.get("deltas", 0),
                "intents": s1.get("intents", 0) - s0.get("intents", 0),
                "resumes": s1.get("resumes", 0) - s0.get("resumes", 0),
                "snapshots": s1.get("snapshots", 0) - s0.get("snapshots", 0),
                "tick_ms": s1.get("tick_ms"),
                "areas_owned_at_end": len(h.get("cluster", {}).get("areas_owned", [])),
            })
        report["per_node"] = per_node
        report["acked_intents_lost"] = acked_lost
        report["intents_pending_in_streams"] = pending
        report["cross_node_mismatches"] = cross
        report["border_crossings"] = sum(r["crossings"] for r in results)
        report["killed_node"] = None if self.killed is None else f"n{self.killed}"
        report["victim_areas"] = len(self.victim_areas)
        report["takeover_s"] = self.takeover_s
        report["takeover_bound_s"] = takeover_bound_s(self.cfg.lease_ms, self.cfg.tick_hz)
        report["redis"] = _redis_rates(self._redis0, self._redis1, report["config"]["duration"])
        return acked_lost == 0 and pending == 0 and cross == 0 and (
            self.killed is None or self.takeover_s is not None)


def takeover_bound_s(lease_ms: int, tick_hz: float) -> float:
    """How long a dead node's areas stay without an owner at most: its lease (renewed every
    quarter lease, so it expires at most one lease after the kill), the survivors' next scan
    (a quarter lease), one tick, and 0.25 s for a loaded machine's scheduling."""
    return 1.25 * lease_ms / 1000.0 + 1.0 / tick_hz + 0.25


def _pending_intents(r: Any) -> int:
    consumed = r.hgetall("{flashnpc}:consumed")
    n = 0
    for key in r.scan_iter(match="{flashnpc}:intents:*"):
        area = key.rsplit(":", 2)[-2] + ":" + key.rsplit(":", 1)[-1]
        n += len(r.xrange(key, min=f"({consumed.get(area, '0-0')}"))
    return n


def _cross_node_mismatches(by_node: dict[str, dict[str, Any]]) -> int:
    """NPCs shown by two nodes (to their clients) with different positions or states."""
    seen: dict[str, Any] = {}
    bad: set[str] = set()
    for areas in by_node.values():
        for area in areas.values():
            for n, e in area["npcs"].items():
                if n in seen and seen[n] != e:
                    bad.add(n)
                seen.setdefault(n, e)
    return len(bad)


def _redis_info(r: Any) -> dict[str, Any]:
    return {"t": time.monotonic(), "commands": r.info("commandstats"), "cpu": r.info("cpu"),
            "processed": r.info("stats")["total_commands_processed"]}


def _redis_rates(a: dict[str, Any] | None, b: dict[str, Any] | None, duration: float
                 ) -> dict[str, Any] | None:
    """Redis's work over the run: every command executed per second (those scripts run
    included), the scripts alone, by command, and Redis's CPU."""
    if a is None or b is None:
        return None
    dt = max(1e-9, b["t"] - a["t"])
    calls = {k.removeprefix("cmdstat_"): (v["calls"] - a["commands"].get(k, {}).get("calls", 0)) / dt
             for k, v in b["commands"].items()}
    cpu = (b["cpu"]["used_cpu_sys"] + b["cpu"]["used_cpu_user"]
           - a["cpu"]["used_cpu_sys"] - a["cpu"]["used_cpu_user"])
    return {"seconds": dt, "commands_per_s": (b["processed"] - a["processed"]) / dt,
            "scripts_per_s": calls.get("evalsha", 0.0),
            "by_command_per_s": dict(sorted(((k, round(v, 1)) for k, v in calls.items() if v),
                                            key=lambda kv: -kv[1])),
            "cpu_util": cpu / dt}


def run_cluster_loadtest(cfg: ClusterLoadConfig, *, log: Any = print,
                         progress: Progress | None = None) -> dict[str, Any]:
    """Run the cluster load test of the module docstring; returns the report (also in
    ``cfg.out``/report.json)."""
    if cfg.nodes < 2:
        raise ValueError(f"--nodes must be >= 2 for a cluster, got {cfg.nodes}")
    if cfg.kill_node_at is not None and not 0 < cfg.kill_node_at < cfg.duration:
        raise ValueError(f"--kill-node-at must be inside the run (0 < S < {cfg.duration})")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="flashnpc_cluster_loadtest_"))
    secret = secrets.token_hex(16).encode()
    admin = secrets.token_hex(16)
    env = dict(os.environ, FLASHNPC_SECRET=secret.decode(), FLASHNPC_ADMIN_TOKEN=admin)
    redis_proc = None
    if cfg.redis is None:
        (tmp / "redis").mkdir()
        redis_proc, redis_url = start_redis(tmp / "redis", cfg.appendfsync)
    else:
        redis_url = cfg.redis
    procs: list[subprocess.Popen[bytes]] = []
    logs = [tmp / f"n{i}.log" for i in range(cfg.nodes)]
    everything = [*procs]
    limit = threading.Timer(cfg.hard_limit_s, lambda: [p.kill() for p in everything])
    limit.daemon = True
    limit.start()
    try:
        readies = []
        for i in range(cfg.nodes):
            ready = tmp / f"n{i}.ready"
            cmd = [*serve_command(cfg, ready), "--redis", redis_url, "--node-id", f"n{i}",
                   "--area-size", str(cfg.area_size), "--lease-ms", str(cfg.lease_ms)]
            with open(logs[i], "wb") as err:
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                              stderr=err))
            everything.append(procs[-1])
            readies.append(ready)
        if redis_proc is not None:
            everything.append(redis_proc)
        ports = []
        for p, ready in zip(procs, readies):
            ports.append(tuple(_wait(p, ready, logs[len(ports)])))
        cluster = Cluster(cfg, procs, ports, admin, redis_url, logs)  # type: ignore[arg-type]
        _wait_owned(cluster, 60.0)
        log(f"cluster: {cfg.nodes} nodes own every area ({redis_url})")
        report = drive(cfg, cluster, cluster.ws, secret, tmp, out, log,  # type: ignore[arg-type]
                       progress or (lambda _stage, _s: None))
        (out / "report.json").write_text(json.dumps(report, indent=2))
        return report
    finally:
        limit.cancel()
        for p in procs:
            stop_process(p)
        if redis_proc is not None:
            stop_process(redis_proc)


def _wait(proc: subprocess.Popen[bytes], ready: Path, log_file: Path) -> list[str]:
    try:
        return wait_ready(proc, ready, 60.0)[:2]
    except (RuntimeError, AttributeError):
        raise RuntimeError(f"node did not start: {log_file.read_text(errors='replace')[-2000:]}") \
            from None


def _wait_owned(cluster: Cluster, timeout_s: float) -> None:
    """Until every area has an owner and every node owns some."""
    deadline = time.time() + timeout_s
    while True:
        hs = [cluster.health(i).get("cluster", {}) for i in range(len(cluster.procs))]
        owned = [len(h.get("areas_owned", [])) for h in hs]
        areas = hs[0].get("areas", 0)
        if areas and sum(owned) == areas and all(owned):
            return
        dead = cluster.dead()
        if dead is not None or time.time() > deadline:
            raise RuntimeError(dead or f"areas not all owned after {timeout_s:.0f} s: {owned} "
                                       f"of {areas}")
        time.sleep(0.1)  # other processes: poll their /health
