"""server_sync's commands: ``flashnpc serve`` and ``flashnpc loadtest``.

``flashnpc serve``: run the authoritative world server.

    FLASHNPC_SECRET=... flashnpc serve --world examples/village --db world.sqlite
    FLASHNPC_SECRET=... flashnpc serve --issue-token alice     # print a token and exit
    flashnpc serve --print-schemas                              # the protocols' JSON Schemas

``--world`` is ``examples/village`` (the default: plugin's example village, served with
``plugin.World``, trees only) or ``sim:NPCS[:CHANGES_PER_S[:SIZE]]``, the seeded load-test
village of :func:`server_sync.sync.world.sim_world`.

``--dialogue`` also serves NPC dialogue (:class:`server_sync.dialogue.dialogue_server.DialogueServer`
over the model in ``--model-dir``, default the shipped one) on its own WebSocket port
``--dialogue-port`` (default 8767) with /health and /metrics on ``--dialogue-http-port``
(default 8768); ``--device cpu|cuda`` and ``--max-batch N`` configure its batched engine.

``flashnpc loadtest sync``: load-test the sync server on loopback (see
:mod:`server_sync.loadtest.sync_loadtest`); ``dialogue`` load-tests ``flashnpc serve
--dialogue`` (see :mod:`server_sync.loadtest.dialogue_loadtest`).

    flashnpc loadtest sync --clients 5000 --duration 60 --churn 0.2
    flashnpc loadtest dialogue --sessions 200 --rate 20 --duration 20 [--burst]

A load test shows a progress bar on stderr (``--no-progress``: none) and prints its main
figures; ``--json`` prints the whole report (less the timeline) as JSON instead. It writes
``report.json`` and, when matplotlib is installed, ``plot.png`` to ``--out`` (without
matplotlib a one-line note says the plot was skipped). Exit 1 when the run lost updates
(sync) or had errors (dialogue), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from typing import Any

from .transport import aio

__all__ = ["EXPECTED_ERRORS", "add_loadtest_arguments", "add_serve_arguments", "build_world",
           "print_schemas", "run_loadtest", "run_serve"]

# errors the `flashnpc` dispatcher reports as one line (module:class, resolved once loaded)
EXPECTED_ERRORS = ("runtime.client.errors:ModelLoadError",)

# --------------------------------------------------------------------------- flashnpc serve

ADMIN_TOKEN_ENV = "FLASHNPC_ADMIN_TOKEN"


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; 0.0.0.0 exposes the server)")
    parser.add_argument("--port", type=int, default=8765, help="WebSocket port (default 8765)")
    parser.add_argument("--http-port", type=int, default=8766,
                        help="HTTP port for /health and /metrics (default 8766; -1: none)")
    parser.add_argument("--world", default=None,
                        help="examples/village (the default), or sim:NPCS[:CHANGES_PER_S[:SIZE]]")
    parser.add_argument("--npcs", type=int, default=10, help="villagers for a directory world")
    parser.add_argument("--db", default=None,
                        help="SQLite file for snapshots + journal (recovered on start)")
    parser.add_argument("--redis", default=None, metavar="URL",
                        help="scale out: share the world with other nodes through the Redis at "
                             "URL (redis://host:port/db) instead of --db (docs/scale_out.md)")
    parser.add_argument("--node-id", default=None,
                        help="this node's name in the cluster (with --redis; default: random)")
    parser.add_argument("--area-size", type=float, default=250.0,
                        help="side of the areas nodes own (with --redis; default 250)")
    parser.add_argument("--lease-ms", type=int, default=2000,
                        help="area lease: a dead node's areas move after about this plus a "
                             "quarter of it (with --redis; default 2000)")
    parser.add_argument("--tick-hz", type=float, default=20.0, help="server tick rate")
    parser.add_argument("--radius", type=float, default=100.0, help="interest radius")
    parser.add_argument("--ring", type=int, default=64, help="deltas kept per client for resume")
    parser.add_argument("--grace", type=float, default=30.0,
                        help="seconds a disconnected client's session waits for a resume")
    parser.add_argument("--max-frame", type=int, default=4096, help="inbound frame limit (bytes)")
    parser.add_argument("--rate", type=float, default=20.0, help="inbound messages/s per client")
    parser.add_argument("--max-outbound", type=int, default=256 * 1024,
                        help="unsent bytes per client before it is dropped as too slow")
    parser.add_argument("--snapshot-every", type=float, default=60.0,
                        help="seconds between world snapshots in --db")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loop", choices=aio.LOOPS, default="auto",
                        help="event loop: uvloop where installed (auto), or force one")
    parser.add_argument("--issue-token", metavar="PLAYER", default=None,
                        help="print a token (an HS256 JWT signed with $FLASHNPC_SECRET) for "
                             "PLAYER and exit")
    parser.add_argument("--ttl", type=float, default=3600.0, help="token lifetime (seconds)")
    parser.add_argument("--audience", default="flashnpc",
                        help="the 'aud' claim tokens must carry (default flashnpc)")
    parser.add_argument("--public-key", metavar="PEM_FILE", default=None,
                        help="also accept tokens signed by this RSA (RS256), EC P-256 (ES256) or "
                             "Ed25519 (EdDSA) public key")
    parser.add_argument("--max-speed", type=float, default=50.0,
                        help="fastest a player may move, units/s (server authority)")
    parser.add_argument("--move-burst", type=float, default=2.0,
                        help="seconds of movement a player may bank (default 2)")
    parser.add_argument("--talk-range", type=float, default=None,
                        help="farthest NPC a player may talk to (default: --radius)")
    parser.add_argument("--bounds", default=None, metavar="X0,Y0,X1,Y1",
                        help="world bounds for players (default: the NPCs' box grown by --radius)")
    parser.add_argument("--print-schemas", action="store_true",
                        help="print the JSON Schemas of both protocols' messages and exit")
    parser.add_argument("--ready-file", default=None,
                        help="write 'PORT HTTP_PORT' here once listening (for scripts; with "
                             "--dialogue followed by 'DIALOGUE_PORT DIALOGUE_HTTP_PORT')")
    parser.add_argument("--dialogue", action="store_true",
                        help="also serve NPC dialogue over WebSockets (see docs/protocol.md)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="device of the dialogue model (with --dialogue)")
    parser.add_argument("--max-batch", type=int, default=256,
                        help="dialogue engine batch size (with --dialogue)")
    parser.add_argument("--cpu-threads", type=int, default=1,
                        help="intra-op threads of the dialogue engine on a CPU (with --dialogue)")
    parser.add_argument("--engine", choices=["auto", "ort", "torch"], default="auto",
                        help="dialogue engine: onnxruntime INT4 graph (ort, CPU), PyTorch (torch), "
                             "or auto: ort on a CPU, torch on a GPU (with --dialogue)")
    parser.add_argument("--model-dir", default=None,
                        help="exported model for --dialogue (default: the shipped model)")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=DIR",
                        help="also serve this exported model (a fine-tune) as NAME; repeatable; "
                             "sessions pick one with open_session's 'model' (with --dialogue)")
    parser.add_argument("--fallback-model", default=None, metavar="NAME",
                        help="the loaded model that serves non-essential sessions while their "
                             "model is short of capacity (default: authored lines; with --dialogue)")
    parser.add_argument("--capacity-hit-rate", type=float, default=0.6, metavar="RATE",
                        help="shed a model's non-essential sessions while its prefix-cache hit "
                             "rate stays under RATE (0..1, default 0.6; 0: never; with --dialogue)")
    parser.add_argument("--capacity-window", type=float, default=30.0, metavar="SECONDS",
                        help="the capacity rule's sliding window (default 30 s; with --dialogue)")
    parser.add_argument("--dialogue-port", type=int, default=8767,
                        help="dialogue WebSocket port (with --dialogue)")
    parser.add_argument("--dialogue-http-port", type=int, default=8768,
                        help="dialogue /health and /metrics port (with --dialogue; -1: none)")
    parser.add_argument("--worker-id", default=None,
                        help="this dialogue worker's id, sent in the welcome's 'worker' field "
                             "(with --dialogue behind a front: per-worker figures)")
    f = parser.add_argument_group("dialogue front (--front; see docs/dialogue_front.md)")
    f.add_argument("--front", action="store_true",
                   help="no world server: render the nginx config for --workers, poll their "
                        "/health, mark unhealthy ones down and reload nginx")
    f.add_argument("--workers", default=None, metavar="HOST:PORT:HTTP_PORT,...",
                   help="the dialogue workers: WebSocket port and /health port of each")
    f.add_argument("--front-listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                   help="where nginx listens for clients (default 127.0.0.1:8080)")
    f.add_argument("--nginx-conf", default=None, metavar="PATH",
                   help="the config file to write (e.g. /etc/nginx/conf.d/flashnpc-dialogue.conf; "
                        "default with --run-nginx: DIR/flashnpc-dialogue.conf)")
    f.add_argument("--nginx-reload", default="nginx -s reload", metavar="CMD",
                   help="how to reload the system's nginx (default 'nginx -s reload')")
    f.add_argument("--run-nginx", default=None, metavar="DIR",
                   help="start a private nginx with its pid, logs and config in DIR (stopped on exit)")
    f.add_argument("--health-interval", type=float, default=1.0, metavar="S",
                   help="seconds between /health polls (default 1)")
    f.add_argument("--print-conf", action="store_true",
                   help="print the nginx config for --workers and exit")


def build_world(spec: str | None, *, npcs: int = 10, seed: int = 0) -> Any:
    """The world named by ``--world`` (see the module docstring; None: the village)."""
    if spec is not None and spec.startswith("sim"):
        from .sync.world import sim_world

        parts = spec.split(":")[1:]
        try:
            n = int(parts[0]) if parts else 200
            rate = float(parts[1]) if len(parts) > 1 else 100.0
            size = float(parts[2]) if len(parts) > 2 else 1000.0
        except ValueError:
            raise ValueError(f"--world {spec}: expected sim:NPCS[:CHANGES_PER_S[:SIZE]]") from None
        return sim_world(n, changes_per_s=rate, size=size, seed=seed)
    from .sync.plugin_world import village_world

    return village_world(spec, npcs, seed=seed)


def print_schemas(write: Any = print) -> None:
    """``flashnpc serve --print-schemas``: every protocol's JSON Schemas as one JSON object
    (``{"sync_client": ..., "sync_server": ..., "dialogue_client": ..., ...}``)."""
    from .schemas import all_schemas

    write(json.dumps(all_schemas(), indent=2, ensure_ascii=False))


def _bounds(spec: str | None) -> tuple[float, float, float, float] | None:
    if spec is None:
        return None
    try:
        x0, y0, x1, y1 = (float(v) for v in spec.split(","))
    except ValueError:
        raise ValueError(f"--bounds {spec}: expected X0,Y0,X1,Y1") from None
    return (x0, y0, x1, y1)


def _token_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The gate's token settings from ``--audience`` / ``--public-key``."""
    key = None
    if args.public_key:
        with open(args.public_key, encoding="utf-8") as f:
            key = f.read()
    return {"audience": args.audience, "public_key": key}


async def _serve(args: argparse.Namespace, secret: bytes) -> None:
    from .sync.persistence import Store
    from .sync.server import ServerConfig, SyncServer

    world = build_world(args.world, npcs=args.npcs, seed=args.seed)
    config = ServerConfig(
        secret=secret, host=args.host, port=args.port,
        http_port=None if args.http_port < 0 else args.http_port, tick_hz=args.tick_hz,
        radius=args.radius, ring_size=args.ring, grace_s=args.grace, max_frame=args.max_frame,
        rate_per_s=args.rate, rate_burst=2 * args.rate, max_outbound_bytes=args.max_outbound,
        snapshot_every_s=args.snapshot_every,
        admin_token=os.environ.get(ADMIN_TOKEN_ENV) or None, max_speed=args.max_speed,
        move_burst_s=args.move_burst, talk_range=args.talk_range, bounds=_bounds(args.bounds),
        **_token_settings(args))
    if args.redis:
        if args.db:
            raise ValueError("--redis and --db: a cluster node journals into Redis, not SQLite")
        from .cluster.node import build_node

        server: SyncServer = build_node(world, config, args.redis, node_id=args.node_id,
                                        area_size=args.area_size, lease_ms=args.lease_ms)
    else:
        server = SyncServer(world, config, Store(args.db) if args.db else None)
    dialogue = _dialogue_server(args, secret) if args.dialogue else None
    await server.start()
    print(f"flashnpc serve: ws://{args.host}:{server.port}  http://{args.host}:{server.http_port}"
          f"  epoch {server.core.epoch}", flush=True)
    ready = f"{server.port} {server.http_port}"
    if dialogue is not None:
        await dialogue.start()
        print(f"flashnpc serve: dialogue ws://{args.host}:{dialogue.port}  "
              f"http://{args.host}:{dialogue.http_port}  ({args.device}, max batch "
              f"{args.max_batch}; models {', '.join(dialogue.service.models)})", flush=True)
        ready += f" {dialogue.port} {dialogue.http_port}"
    if args.ready_file:
        with open(args.ready_file + ".tmp", "w") as f:
            f.write(ready + "\n")
        os.replace(args.ready_file + ".tmp", args.ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if dialogue is not None:
        await dialogue.stop()
    await server.stop()


def _dialogue_server(args: argparse.Namespace, secret: bytes) -> Any:
    try:
        from runtime.serving.model_router import CapacityRule, ModelRouter, parse_model_specs
    except ImportError as exc:  # torch is an extra: a game client never installs it
        raise ValueError(f"--dialogue needs PyTorch (pip install 'flashnpc[gpu]'; on the "
                         f"project machines torch==2.13.0): {exc}") from exc

    from .dialogue.dialogue_server import DialogueConfig, DialogueServer

    if args.cpu_threads < 1:
        raise ValueError(f"--cpu-threads must be >= 1, got {args.cpu_threads}")
    models = parse_model_specs(args.model, args.model_dir)
    capacity = CapacityRule(min_hit_rate=args.capacity_hit_rate, window_s=args.capacity_window,
                            fallback_model=args.fallback_model)
    capacity.check_models(list(models))  # before the models load
    service = ModelRouter.load(models, capacity=capacity, device=args.device, max_batch=args.max_batch,
                               engine=args.engine, cpu_threads=args.cpu_threads)
    return DialogueServer(service, DialogueConfig(
        secret=secret, host=args.host, port=args.dialogue_port,
        http_port=None if args.dialogue_http_port < 0 else args.dialogue_http_port,
        max_frame=args.max_frame, rate_per_s=args.rate, rate_burst=2 * args.rate,
        max_outbound_bytes=args.max_outbound, worker_id=args.worker_id, **_token_settings(args)))


def run_serve(args: argparse.Namespace) -> int:
    from .transport.auth import issue_token, secret_from_env

    if args.print_schemas:
        print_schemas()
        return 0
    if args.front or args.print_conf:
        return _run_front(args)
    try:
        secret = secret_from_env()
    except ValueError as exc:
        print(f"flashnpc serve: error: {exc}", file=sys.stderr)
        return 2
    if args.issue_token:
        print(issue_token(secret, args.issue_token, ttl_s=args.ttl, audience=args.audience))
        return 0
    logging.basicConfig(level=logging.WARNING)
    try:
        aio.run(_serve(args, secret), loop=args.loop)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"flashnpc serve: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _run_front(args: argparse.Namespace) -> int:
    """``flashnpc serve --front`` (and ``--print-conf``): see server_sync.dialogue.front."""
    from pathlib import Path

    from .dialogue import front

    try:
        if not args.workers:
            raise ValueError("--front needs --workers HOST:PORT:HTTP_PORT,...")
        if not args.health_interval > 0:
            raise ValueError(f"--health-interval must be > 0, got {args.health_interval}")
        config = front.FrontConfig(front.parse_workers(args.workers),
                                   listen=front.parse_listen(args.front_listen))
    except ValueError as exc:
        print(f"flashnpc serve: error: {exc}", file=sys.stderr)
        return 2
    if args.print_conf:
        print(front.render_conf(config), end="")
        return 0
    logging.basicConfig(level=logging.WARNING)

    async def main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)

        def ready() -> None:
            print(f"flashnpc serve: dialogue front ws://{args.front_listen} over "
                  f"{len(config.workers)} workers", flush=True)
            if args.ready_file:
                front.write_atomic(Path(args.ready_file), f"{config.listen[1]}\n")

        await front.run_front(config, conf_path=Path(args.nginx_conf) if args.nginx_conf else None,
                              nginx_prefix=Path(args.run_nginx) if args.run_nginx else None,
                              reload_cmd=args.nginx_reload, interval_s=args.health_interval,
                              ready=ready, stop=stop)

    try:
        aio.run(main(), loop=args.loop)
    except (ValueError, OSError, front.NginxError) as exc:
        print(f"flashnpc serve: error: {exc}", file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------- flashnpc loadtest

def add_loadtest_arguments(parser: argparse.ArgumentParser) -> None:
    from .loadtest.sync_loadtest import LoadConfig

    d = LoadConfig()
    parser.add_argument("target", choices=["sync", "dialogue"], help="what to load-test")
    parser.add_argument("--clients", type=int, default=d.clients)
    parser.add_argument("--duration", type=float, default=d.duration, help="seconds measured")
    parser.add_argument("--churn", type=float, default=d.churn,
                        help="share of clients that drop and resume during the run")
    parser.add_argument("--npcs", type=int, default=d.npcs)
    parser.add_argument("--changes", type=float, default=d.changes,
                        help="NPC state changes per second, world-wide")
    parser.add_argument("--size", type=float, default=d.size, help="map side")
    parser.add_argument("--radius", type=float, default=d.radius, help="interest radius")
    parser.add_argument("--tick-hz", type=float, default=d.tick_hz)
    parser.add_argument("--procs", type=int, default=d.procs, help="client worker processes")
    parser.add_argument("--move-hz", type=float, default=d.move_hz,
                        help="move intents per client per second")
    parser.add_argument("--connect-rate", type=float, default=d.connect_rate,
                        help="new connections per second during the ramp")
    parser.add_argument("--codec", choices=["msgpack", "json"], default=d.codec)
    parser.add_argument("--no-db", action="store_true", help="run the server without SQLite")
    c = parser.add_argument_group("sync cluster (docs/scale_out.md)")
    c.add_argument("--nodes", type=int, default=1,
                   help="sync: run N `flashnpc serve --redis` nodes and spread the clients over "
                        "them (default 1: one server with SQLite)")
    c.add_argument("--redis", default=None, metavar="URL",
                   help="sync with --nodes: use this Redis (default: start a redis-server)")
    c.add_argument("--area-size", type=float, default=250.0, help="sync with --nodes: area side")
    c.add_argument("--lease-ms", type=int, default=2000, help="sync with --nodes: area lease")
    c.add_argument("--kill-node-at", type=float, default=None, metavar="S",
                   help="sync with --nodes: kill -9 node n0 S seconds into the run")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--client-nice", type=int, default=d.client_nice,
                        help="niceness of the client worker processes (0: same as the server)")
    parser.add_argument("--loop", choices=aio.LOOPS, default="auto",
                        help="event loop of the server and the clients (auto: uvloop if installed)")
    parser.add_argument("--client-gc-freeze", type=float, default=d.client_gc_freeze_s,
                        metavar="S", help="client workers freeze GC survivors every S seconds "
                                          "(0: CPython's default collections)")
    parser.add_argument("--profile-server", default=None, metavar="FILE",
                        help="run the server under cProfile and write its stats to FILE")
    parser.add_argument("--out", default=None,
                        help=f"directory for report.json and plot.png (default {d.out}, "
                             f"dialogue: runs/loadtest_dialogue)")
    parser.add_argument("--json", action="store_true",
                        help="print the report (less the timeline) as JSON instead of the main figures")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    g = parser.add_argument_group("dialogue")
    g.add_argument("--sessions", type=int, default=200, help="dialogue sessions")
    g.add_argument("--rate", type=float, default=20.0, help="line requests/s, all sessions")
    g.add_argument("--no-stream", action="store_true",
                   help="ask for whole lines instead of streamed pieces (no TTFT/ITL figures)")
    g.add_argument("--burst", action="store_true",
                   help="all sessions ask at once, one wave every sessions/rate seconds")
    g.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    g.add_argument("--max-batch", type=int, default=64)
    g.add_argument("--engine", choices=["auto", "ort", "torch"], default="auto",
                   help="the server's dialogue engine (auto: onnxruntime on a CPU)")
    g.add_argument("--cpu-threads", type=int, default=1,
                   help="the server engine's intra-op threads on a CPU")
    g.add_argument("--model-dir", default=None, help="exported model (default: the shipped one)")
    g.add_argument("--deadline-ms", type=int, default=1000, help="deadline of each request")
    g.add_argument("--slo-ttft-ms", type=float, default=200.0, help="goodput SLO on TTFT")
    g.add_argument("--slo-e2el-ms", type=float, default=1000.0, help="goodput SLO on E2EL")
    g.add_argument("--front", default=None, metavar="URL",
                   help="ws:// URL of a dialogue front (nginx before workers): start no server, "
                        "report per worker (tokens signed with $FLASHNPC_SECRET)")
    g.add_argument("--workers-http", default="", metavar="URL,...",
                   help="with --front: the workers' http:// bases, whose /health the report keeps")


def run_loadtest(args: argparse.Namespace) -> int:
    """``flashnpc loadtest sync | dialogue`` (see the module docstring)."""
    if args.target == "dialogue":
        return _run_dialogue(args)
    from .loadtest.sync_loadtest import LoadConfig
    from .loadtest.sync_loadtest import run_loadtest as run_sync_loadtest

    if not 0.0 <= args.churn <= 1.0 or args.clients < 1 or args.procs < 1 or not args.duration > 0:
        print("flashnpc loadtest: error: need --clients >= 1, --procs >= 1, --duration > 0 and "
              "0 <= --churn <= 1", file=sys.stderr)
        return 2
    settings = dict(clients=args.clients, duration=args.duration, churn=args.churn,
                    npcs=args.npcs, changes=args.changes, size=args.size, radius=args.radius,
                    tick_hz=args.tick_hz, procs=args.procs, move_hz=args.move_hz,
                    connect_rate=args.connect_rate, codec=args.codec, db=not args.no_db,
                    seed=args.seed, out=args.out or LoadConfig().out,
                    client_nice=args.client_nice, profile_server=args.profile_server,
                    loop=args.loop, client_gc_freeze_s=args.client_gc_freeze)
    stages = {"ramp": f"connecting {args.clients} clients", "run": "measuring",
              "verify": "settling and checking every replica"}
    if args.nodes > 1:
        from .loadtest.cluster_loadtest import ClusterLoadConfig, run_cluster_loadtest

        settings["out"] = args.out or "runs/loadtest_sync_cluster"
        cfg: LoadConfig = ClusterLoadConfig(**settings, nodes=args.nodes, redis=args.redis,
                                            area_size=args.area_size, lease_ms=args.lease_ms,
                                            kill_node_at=args.kill_node_at)
        run = run_cluster_loadtest
    else:
        cfg, run = LoadConfig(**settings), run_sync_loadtest
    try:
        with _LoadBar(cfg.duration, stages, enabled=not args.no_progress) as bar:
            report = run(cfg, log=bar.write, progress=bar.progress)  # type: ignore[arg-type]
    except ValueError as exc:
        print(f"flashnpc loadtest sync: error: {exc}", file=sys.stderr)
        return 2
    summary = {k: v for k, v in report.items() if k not in ("timeline", "config")}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        lat = report["latency_ms"]
        _print_rows([
            ("clients connected", f"{report['connected_min']}-{report['connected_max']} "
                                  f"(ramp {report['ramp_s']:.1f} s)"),
            ("state changes", f"{report['state_changes_per_s']:.0f}/s"),
            ("delta latency p50 / p99 / max", f"{_ms(lat['p50'])} / {_ms(lat['p99'])} / {_ms(lat['max'])}"),
            ("bytes per client", f"{report['bytes_per_client_per_s']:.0f}/s "
                                 f"({_x(report['bytes_reduction_x'])} less than full state)"),
            ("churned clients / reconnects", f"{report['churned_clients']} / {report['reconnects']}"),
            ("gaps / mismatched / missing / unacked", f"{report['gaps']} / {report['mismatched_replicas']} / "
                                                      f"{report['missing_clients']} / {report['unacked_intents']}"),
            ("server CPU", f"{100 * report['server_cpu_util']:.0f}%"),
            *_cluster_rows(report),
            ("zero lost updates", "yes" if report["zero_lost_updates"] else "NO"),
        ])
    _say_where(cfg.out, report, args.json)
    return 0 if report["zero_lost_updates"] else 1


def _cluster_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The cluster load test's own rows: per node, then the cluster checks."""
    if "per_node" not in report:
        return []
    rows = [(f"node {n['node']}" + (" (killed)" if n["killed"] else ""),
             f"{n['clients_at_end']} clients at end, p50 / p99 {_ms(n['latency_ms']['p50'])} / "
             f"{_ms(n['latency_ms']['p99'])}, gaps {n['gaps']}, mismatched {n['mismatched']}, "
             f"{n['areas_owned_at_end']} areas") for n in report["per_node"]]
    takeover = report["takeover_s"]
    rows += [
        ("acked intents lost / pending in streams", f"{report['acked_intents_lost']} / "
                                                    f"{report['intents_pending_in_streams']}"),
        ("cross-node mismatches / border crossings", f"{report['cross_node_mismatches']} / "
                                                     f"{report['border_crossings']}"),
        ("takeover", "-" if takeover is None else
         f"{takeover:.2f} s for {report['victim_areas']} areas (bound "
         f"{report['takeover_bound_s']:.2f} s)"),
    ]
    redis = report.get("redis")
    if redis:
        rows.append(("Redis", f"{redis['commands_per_s']:.0f} commands/s "
                              f"({redis['scripts_per_s']:.0f} scripts/s), CPU "
                              f"{100 * redis['cpu_util']:.0f}%"))
    return rows


def _run_dialogue(args: argparse.Namespace) -> int:
    from .loadtest.dialogue_loadtest import DialogueLoadConfig, run_dialogue_loadtest

    d = DialogueLoadConfig()
    cfg = DialogueLoadConfig(sessions=args.sessions, rate=args.rate, duration=args.duration,
                             burst=args.burst, stream=not args.no_stream, procs=args.procs,
                             device=args.device,
                             max_batch=args.max_batch, engine=args.engine,
                             cpu_threads=args.cpu_threads,
                             model_dir=args.model_dir,
                             deadline_ms=args.deadline_ms, slo_ttft_ms=args.slo_ttft_ms,
                             slo_e2el_ms=args.slo_e2el_ms, seed=args.seed,
                             out=args.out or d.out, front=args.front,
                             workers_http=tuple(u for u in args.workers_http.split(",") if u))
    stages = {"open": f"opening {cfg.sessions} sessions", "run": "sending requests",
              "drain": "waiting for the last lines"}
    try:
        with _LoadBar(cfg.duration, stages, enabled=not args.no_progress) as bar:
            report = run_dialogue_loadtest(cfg, log=bar.write, progress=bar.progress)
    except ValueError as exc:
        print(f"flashnpc loadtest dialogue: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "config"}, indent=2))
    else:
        _print_rows([
            ("requests / completed", f"{report['requests']} / {report['completed']} "
                                     f"({report['model_lines']} model lines, {report['fallbacks']} fallbacks)"),
            ("busy / errors", f"{report['busy']} / {report['errors']}"),
            ("throughput", f"{report['request_throughput']:.1f} lines/s, "
                           f"{report['output_throughput']:.0f} tokens/s"),
            ("goodput", f"{report['goodput']:.1f} lines/s within the SLO"),
            ("TTFT p50 / p99", f"{_ms(report.get('median_ttft_ms'))} / {_ms(report.get('p99_ttft_ms'))}"),
            ("E2EL p50 / p99", f"{_ms(report.get('median_e2el_ms'))} / {_ms(report.get('p99_e2el_ms'))}"),
            *((f"worker {w}", f"{r['completed']} lines ({r['fallbacks']} fallbacks), "
                              f"{r['request_throughput']:.1f} lines/s, TTFT p99 {_ms(r['p99_ttft_ms'])}, "
                              f"E2EL p99 {_ms(r['p99_e2el_ms'])}")
              for w, r in report["workers"].items() if cfg.front),
        ])
    _say_where(cfg.out, report, args.json)
    return 0 if report["errors"] == 0 else 1


class _LoadBar:
    """A load test's progress bar: the seconds of the measured run, labelled by stage."""

    def __init__(self, duration: float, stages: dict[str, str], *, enabled: bool) -> None:
        from runtime.console import Progress

        self.stages = stages
        self.stage: str | None = None
        self.bar = Progress("load test", total=duration, unit="s", enabled=enabled)

    def progress(self, stage: str, seconds: float) -> None:
        if stage != self.stage:
            self.stage = stage
            self.bar.stage(self.stages.get(stage, stage))
        self.bar.set(int(seconds))

    def write(self, message: str) -> None:
        self.bar.write(message)

    def __enter__(self) -> _LoadBar:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None and self.bar.total is not None:
            self.bar.set(self.bar.total)  # the run is over, however the last second was reported
        self.bar.close()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"


def _print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")


def _say_where(out: str, report: dict[str, Any], as_json: bool) -> None:
    plot = report.get("plot")
    note = f"report: {out}/report.json" + (f"  plot: {plot}" if plot else "  (no plot: matplotlib is missing)")
    print(note, file=sys.stderr if as_json else sys.stdout)
