"""One dialogue server with one model against the same server with two (base + a fine-tune),
side by side in one run: lines/s and end-to-end p50/p99 at the same closed-loop load.

    python bench/multi_model_bench.py --finetune runs/pirate_port [--sessions 32] [--seconds 15]
                                      [--rounds 2] [--tokens 24] [--json FILE]

Peers (each a real ``flashnpc serve --dialogue`` process on loopback, same flags):
  one   ``--dialogue``: every session on the base model (the shipped one, or ``--base``)
  two   ``--dialogue --model pirate=FINETUNE``: half the sessions on ``base``, half on
        ``pirate`` (opened with ``model: pirate`` and the fine-tune's own archetypes)

The load (this process, ``websockets``): ``--sessions`` sessions on ``--sessions / 4``
connections, each session always has one ``request_line`` in flight (closed loop, ``max_tokens``
``--tokens``, seeded); lines count from a ``--warmup`` of seconds after every session has
opened until ``--seconds`` later. The peers run in turn, ``--rounds`` times (one, two, one,
two, ...), so a noisy neighbour on a shared machine shows as spread between rounds; the ratio
printed is two/one per round and their median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import connect

from server_sync.transport.auth import issue_token

SECRET = "multi-model-bench-secret-0123456789"
BASE_NPCS = [("guard", "patrol"), ("merchant", "working"), ("innkeeper", "idle"), ("farmer", "working")]
INTENTS = ["greet", "ask_rumors", "trade", "approach"]


def studio_npcs(finetune: Path) -> list[tuple[str, str]]:
    """(archetype, state) pairs of the fine-tune's new archetypes, from its studio lines."""
    rows = [json.loads(r) for r in (finetune / "studio_lines.jsonl").read_text().splitlines()]
    added = set(json.loads((finetune / "finetune.json").read_text())["added"]["archetypes"])
    return sorted({(r["archetype"], r["state"]) for r in rows if r["archetype"] in added})


def start_server(flags: list[str], tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    ready = tmp / f"ready-{time.monotonic_ns()}"
    env = {**os.environ, "FLASHNPC_SECRET": SECRET}
    proc = subprocess.Popen(
        [sys.executable, "-m", "plugin.cli", "serve", "--world", "sim:5", "--port", "0", "--http-port", "-1",
         "--dialogue", "--dialogue-port", "0", "--dialogue-http-port", "-1", "--rate", "10000",
         "--ready-file", str(ready), *flags], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("serve did not get ready in 180 s")
        time.sleep(0.1)  # a child process: nothing to await
    return proc, int(ready.read_text().split()[2])


async def drive(port: int, npcs: list[tuple[str | None, str, str]], *, seconds: float, warmup: float,
                tokens: int) -> dict[str, Any]:
    """Closed loop over ``npcs`` (model, archetype, state); latencies by model in the window."""
    per_conn = 4
    t_start = t_end = 0.0
    started = asyncio.Event()
    lat: dict[str, list[float]] = {}
    served: dict[str, int] = {}

    async def connection(group: list[tuple[str | None, str, str]], c: int) -> None:
        async with connect(f"ws://127.0.0.1:{port}", max_size=2**20, compression=None) as ws:
            await ws.send(json.dumps({"t": "hello", "v": 1, "token": issue_token(SECRET.encode(), f"p{c}")}))
            json.loads(await ws.recv())
            sids: dict[int, tuple[str, str]] = {}
            for i, (model, arch, state) in enumerate(group):
                msg: dict[str, Any] = {"t": "open_session", "rid": i + 1, "archetype": arch, "state": state}
                if model is not None:
                    msg["model"] = model
                await ws.send(json.dumps(msg))
                reply = json.loads(await ws.recv())
                if reply["t"] != "session":
                    raise RuntimeError(f"open_session {msg}: {reply}")
                sids[i] = (reply["session"], model or "base")
            await started.wait()
            rid = 1000
            sent: dict[int, tuple[float, str]] = {}

            async def ask(i: int) -> None:
                nonlocal rid
                rid += 1
                sent[rid] = (time.perf_counter(), sids[i][1])
                await ws.send(json.dumps({"t": "request_line", "rid": rid, "session": sids[i][0],
                                          "intent": INTENTS[rid % len(INTENTS)], "seed": rid * 7 + c,
                                          "max_tokens": tokens}))
                owner[rid] = i

            owner: dict[int, int] = {}
            for i in sids:
                await ask(i)
            while time.perf_counter() < t_end:
                try:
                    m = json.loads(await asyncio.wait_for(ws.recv(), timeout=max(0.1, t_end - time.perf_counter())))
                except TimeoutError:
                    break
                if m["t"] not in ("line", "busy", "error"):
                    continue
                t0, model = sent.pop(m["rid"])
                now = time.perf_counter()
                if m["t"] == "line" and t_start <= t0 and now <= t_end:
                    lat.setdefault(model, []).append((now - t0) * 1e3)
                    key = m.get("served_by", "?") + (f" ({m['fallback_reason']})" if m.get("fallback") else "")
                    served[key] = served.get(key, 0) + 1
                await ask(owner.pop(m["rid"]))

    groups = [npcs[i:i + per_conn] for i in range(0, len(npcs), per_conn)]
    tasks = [asyncio.create_task(connection(g, c)) for c, g in enumerate(groups)]
    await asyncio.sleep(0.5)  # let every connection open its sessions
    t_start = time.perf_counter() + warmup
    t_end = t_start + seconds
    started.set()
    await asyncio.gather(*tasks)
    out: dict[str, Any] = {"served_by": served}
    every = [x for v in lat.values() for x in v]
    for name, values in [("all", every), *sorted(lat.items())]:
        a = np.asarray(values)
        out[name] = {"lines": len(a), "lines_per_s": len(a) / seconds,
                     "p50_ms": float(np.percentile(a, 50)) if len(a) else None,
                     "p99_ms": float(np.percentile(a, 99)) if len(a) else None}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--finetune", type=Path, required=True, help="an exported fine-tune (flashnpc finetune --out)")
    ap.add_argument("--base", type=Path, default=None, help="the base model directory (default: the shipped one)")
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.sessions < 2 or args.sessions % 2:
        ap.error("--sessions must be an even number >= 2")

    common = ["--max-batch", str(args.max_batch)] + (["--model-dir", str(args.base)] if args.base else [])
    studio = studio_npcs(args.finetune)
    half = args.sessions // 2
    peers = {
        "one": (common, [(None, *BASE_NPCS[i % len(BASE_NPCS)]) for i in range(args.sessions)]),
        "two": ([*common, "--model", f"pirate={args.finetune}"],
                [(None, *BASE_NPCS[i % len(BASE_NPCS)]) for i in range(half)]
                + [("pirate", *studio[i % len(studio)]) for i in range(half)]),
    }
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, (flags, npcs) in peers.items():
                proc, port = start_server(flags, Path(tmp))
                try:
                    res = asyncio.run(drive(port, npcs, seconds=args.seconds, warmup=args.warmup, tokens=args.tokens))
                finally:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                res.update(peer=name, round=r)
                results.append(res)
                a = res["all"]
                per = "  ".join(f"{k}: {v['lines_per_s']:.1f}/s p99 {v['p99_ms']:.0f}" for k, v in res.items()
                                if k not in ("all", "served_by", "peer", "round"))
                print(f"round {r} {name}: {a['lines_per_s']:.1f} lines/s, p50 {a['p50_ms']:.0f} ms, "
                      f"p99 {a['p99_ms']:.0f} ms  ({per}; served_by {res['served_by']})", flush=True)
    ratios = []
    for r in range(args.rounds):
        one, two = (next(x["all"] for x in results if x["round"] == r and x["peer"] == p) for p in ("one", "two"))
        ratios.append({"lines_per_s": two["lines_per_s"] / one["lines_per_s"], "p99": two["p99_ms"] / one["p99_ms"]})
    med = {k: statistics.median(x[k] for x in ratios) for k in ("lines_per_s", "p99")}
    each = ", ".join(f"{x['lines_per_s']:.2f}/{x['p99']:.2f}" for x in ratios)
    print(f"two models / one model: lines/s x{med['lines_per_s']:.2f}, p99 x{med['p99']:.2f} "
          f"(median of {args.rounds} rounds, lines/s / p99 each: {each})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "machine": f"{platform.processor() or platform.machine()}, "
                                                    f"{os.cpu_count()} cpus",
                                         "results": results, "ratios": ratios, "median": med}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
