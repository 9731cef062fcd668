"""``flashnpc loadtest sync``: load-test the sync server on loopback (see server_sync.loadtest).

    flashnpc loadtest sync --clients 5000 --duration 60 --churn 0.2
    flashnpc loadtest dialogue --sessions 200 --rate 20 --duration 20 [--burst]

``dialogue`` load-tests ``flashnpc serve --dialogue`` (see server_sync.dialogue_loadtest).
"""

from __future__ import annotations

import argparse
import json

from . import aio

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .loadtest import LoadConfig

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


def run(args: argparse.Namespace) -> int:
    if args.target == "dialogue":
        return _run_dialogue(args)
    from .loadtest import LoadConfig, run_loadtest

    if args.out is None:
        args.out = LoadConfig().out

    if not 0.0 <= args.churn <= 1.0 or args.clients < 1 or args.procs < 1:
        print("flashnpc loadtest: need --clients >= 1, --procs >= 1 and 0 <= --churn <= 1")
        return 2
    cfg = LoadConfig(clients=args.clients, duration=args.duration, churn=args.churn,
                     npcs=args.npcs, changes=args.changes, size=args.size, radius=args.radius,
                     tick_hz=args.tick_hz, procs=args.procs, move_hz=args.move_hz,
                     connect_rate=args.connect_rate, codec=args.codec, db=not args.no_db,
                     seed=args.seed, out=args.out,
                     client_nice=args.client_nice, profile_server=args.profile_server,
                     loop=args.loop, client_gc_freeze_s=args.client_gc_freeze)
    report = run_loadtest(cfg)
    summary = {k: v for k, v in report.items() if k not in ("timeline", "config")}
    print(json.dumps(summary, indent=2))
    print(f"report: {cfg.out}/report.json  plot: {cfg.out}/plot.png")
    return 0 if report["zero_lost_updates"] else 1


def _run_dialogue(args: argparse.Namespace) -> int:
    from .dialogue_loadtest import DialogueLoadConfig, run_dialogue_loadtest

    d = DialogueLoadConfig()
    cfg = DialogueLoadConfig(sessions=args.sessions, rate=args.rate, duration=args.duration,
                             burst=args.burst, stream=not args.no_stream, procs=args.procs,
                             device=args.device,
                             max_batch=args.max_batch, engine=args.engine,
                             cpu_threads=args.cpu_threads,
                             model_dir=args.model_dir,
                             deadline_ms=args.deadline_ms, slo_ttft_ms=args.slo_ttft_ms,
                             slo_e2el_ms=args.slo_e2el_ms, seed=args.seed,
                             out=args.out or d.out)
    try:
        report = run_dialogue_loadtest(cfg)
    except ValueError as exc:
        print(f"flashnpc loadtest dialogue: {exc}")
        return 2
    print(json.dumps({k: v for k, v in report.items() if k != "config"}, indent=2))
    print(f"report: {cfg.out}/report.json  plot: {cfg.out}/plot.png")
    return 0 if report["errors"] == 0 else 1
