"""The batched engine (server, PyTorch) against the single-stream client engine, side by side.

    python bench/serve_bench.py [--device cpu|cuda] [--dtype fp32|bf16|fp16] [--sweep 64 256]
                                [--seconds 5] [--tokens 24] [--check] [--graphs] [--json FILE]

Every line decodes exactly ``--tokens`` tokens (``min_tokens = max_tokens``), for prompts drawn
from a seeded village (archetype, persona, state, intent, context mixed), so throughput figures
count the same work for every peer.

Peers:
  client     runtime.LineGenerator (onnxruntime, the shipped INT4 graph, one intra-op thread),
             one line after another: the engine a game client runs
  ort        runtime.serving.ort_engine.OrtBatchedEngine (on a CPU, unless ``--no-ort``): the same
             closed loop through the shipped INT4 graph; the dialogue server's CPU engine
  batched    runtime.serving.batched_engine.BatchedEngine on ``--device``, closed loop: ``C`` sessions
             always have a request in flight (a finished line is replaced by a new request at
             once, so requests join and leave the running batch continuously), for each ``C``
             of ``--sweep``, ``--seconds`` each after a warm-up

Printed per batched point: lines/s (lines finished in the window), tokens/s, its ratio to the client's tokens/s, end-to-end
p50/p99, time to first token p50/p99, mean inter-token latency, mean rows per step, and the
prefix cache hit rate. ``--check`` first runs the correctness test: a batch of requests
(different prompts and seeds) decoded together must give the tokens each gives alone (fp32;
with a half dtype the agreement is reported too). ``--graphs`` adds CUDA-graph runs of the sweep.
``--json`` writes everything.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from runtime.client.constraints import read_constraints
from runtime.client.sampling import DEFAULT_TEMPERATURE, DEFAULT_TOP_P
from runtime.serving.batched_engine import BatchedEngine, GenRequest, GenResult, load_flash


def village_prompts(tok: Any, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts from a seeded mix of the catalog (the requests every peer serves)."""
    cat = tok.catalog
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(0, 3))
        persona = sorted(rng.choice(cat["persona_traits"], size=k, replace=False).tolist())
        ctx = {slot: str(rng.choice(vals)) for slot, vals in cat["context"].items() if rng.random() < 0.5}
        ids, _ = tok.encode_prompt(str(rng.choice(cat["archetypes"])), persona, str(rng.choice(cat["states"])),
                                   str(rng.choice(cat["intents"])), ctx)
        out.append(ids)
    return out


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


# --------------------------------------------------------------------------- peers


def client_peer(model_dir: Path | None, tokens: int, seconds: float) -> dict[str, Any]:
    """Single-stream client engine: lines one after another for ``seconds``."""
    try:
        from runtime.client.generator import LineGenerator
    except ImportError as exc:  # a bare machine without prometheus-client: the bare ONNX decoder
        return onnx_peer(model_dir, tokens, seconds, f"{exc}")

    try:
        gen = LineGenerator.load(model_dir, threads=1)
    except ImportError as exc:  # e.g. the line book's constraints need pyyaml
        return onnx_peer(model_dir, tokens, seconds, f"{exc}")
    cat = gen.catalog()
    rng = np.random.default_rng(1)
    lat: list[float] = []
    n_tok = 0
    t_end = time.perf_counter() + seconds
    t0 = time.perf_counter()
    i = 0
    while time.perf_counter() < t_end:
        line = gen.generate(str(rng.choice(cat["archetypes"])), str(rng.choice(cat["states"])),
                            intent=str(rng.choice(cat["intents"])), seed=i, max_tokens=tokens, min_tokens=tokens,
                            npc_id=i)
        lat.append(line.latency_ms)
        n_tok += len(line.tokens) if line.tokens else tokens
        i += 1
    dt = time.perf_counter() - t0
    return {"peer": "client (onnxruntime INT4, 1 thread, 1 stream)", "lines": i, "lines_per_s": i / dt,
            "tokens_per_s": n_tok / dt, "e2e_ms_p50": pct(lat, 50), "e2e_ms_p99": pct(lat, 99)}


def onnx_peer(model_dir: Path | None, tokens: int, seconds: float, why: str) -> dict[str, Any]:
    """The client's decoder without its masks and fallbacks (FlashOnnx.generate_ids, eos allowed)."""
    from runtime.client.onnx_model import FlashOnnx

    m = FlashOnnx.load(model_dir, threads=1)
    prompts = village_prompts(m.tokenizer, 256, seed=1)
    n_tok = lines = 0
    lat: list[float] = []
    t0 = time.perf_counter()
    t_end = t0 + seconds
    while time.perf_counter() < t_end:
        t = time.perf_counter()
        n_tok += len(m.generate_ids(prompts[lines % len(prompts)], max_tokens=tokens, seed=lines, top_k=50))
        lat.append((time.perf_counter() - t) * 1e3)
        lines += 1
    dt = time.perf_counter() - t0
    return {"peer": f"client decoder (FlashOnnx.generate_ids; LineGenerator unavailable: {why})", "lines": lines,
            "lines_per_s": lines / dt, "tokens_per_s": n_tok / dt, "e2e_ms_p50": pct(lat, 50),
            "e2e_ms_p99": pct(lat, 99)}


def banned_words(root: Path) -> list[str]:
    try:
        return read_constraints(root).banned_words
    except ImportError as exc:  # the line book needs pyyaml; a bare machine may lack it
        print(f"(banned-word masks off: {exc})", flush=True)
        return []


def closed_loop(engine: BatchedEngine, prompts: list[list[int]], concurrency: int, seconds: float,
                tokens: int, warmup_steps: int = 3) -> dict[str, Any]:
    """Keep ``concurrency`` requests in flight for ``seconds``; latency and throughput figures."""
    counter = [0]

    def submit() -> None:
        i = counter[0]
        counter[0] += 1
        engine.submit(GenRequest(prompts[i % len(prompts)], seed=i, max_tokens=tokens, min_tokens=tokens))

    for _ in range(concurrency):
        submit()
    for _ in range(warmup_steps):  # admission of the first wave, lazy kernels, graph capture
        for _res in engine.step():
            submit()
    sync(engine)
    cache = engine.block_cache
    q0 = cache.stats.queried_tokens if cache else 0
    h0 = sum(cache.stats.hits.values()) if cache else 0
    tok0 = engine.tokens_generated
    finished = 0
    done: list[GenResult] = []
    batch: list[int] = []
    steps = 0
    t0 = time.perf_counter()
    t_end = t0 + seconds
    while time.perf_counter() < t_end:
        res = engine.step()
        steps += 1
        batch.append(engine.last_batch)
        for r in res:
            finished += 1
            if r.t_submit >= t0:  # latency figures only for requests submitted in the window
                done.append(r)
            submit()
    sync(engine)
    dt = time.perf_counter() - t0
    n_tok = engine.tokens_generated - tok0  # every token decoded in the window, finished lines or not
    # drain, so the next point starts empty
    while engine.has_work():
        for h in list(engine.rows):
            h.cancelled = True
        with engine._lock:
            for s in engine._waiting:
                s.cancelled = True
        engine.step()
    e2e = [(r.t_done - r.t_submit) * 1e3 for r in done]
    ttft = [r.ttft_s * 1e3 for r in done if r.ttft_s is not None]
    itl = [(b - a) * 1e3 for r in done for a, b in zip(r.token_times, r.token_times[1:])]
    q1 = cache.stats.queried_tokens if cache else 0
    h1 = sum(cache.stats.hits.values()) if cache else 0
    return {"concurrency": concurrency, "lines": finished, "seconds": dt, "lines_per_s": finished / dt,
            "tokens_per_s": n_tok / dt, "e2e_ms_p50": pct(e2e, 50), "e2e_ms_p99": pct(e2e, 99),
            "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p99": pct(ttft, 99),
            "itl_ms_mean": statistics.fmean(itl) if itl else None, "batch_mean": statistics.fmean(batch) if batch else 0,
            "step_ms": dt * 1e3 / max(1, steps), "prefix_hit_rate": (h1 - h0) / (q1 - q0) if q1 > q0 else None}


def sync(engine: BatchedEngine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def correctness(model: Any, tok: Any, banned: list[str], device: str, dtype: str, n: int = 24,
                tokens: int = 24) -> dict[str, Any]:
    """Batched == single: ``n`` different requests together vs each alone, same seeds."""
    prompts = village_prompts(tok, n, seed=7)
    reqs = [GenRequest(p, seed=1000 + i, max_tokens=tokens, temperature=DEFAULT_TEMPERATURE, top_k=50, top_p=DEFAULT_TOP_P)
            for i, p in enumerate(prompts)]
    batched_engine = BatchedEngine(model, tok, device=device, dtype=dtype, max_batch=n, banned_words=banned)
    with torch.inference_mode():
        together = batched_engine.generate(reqs)
        single_engine = BatchedEngine(model, tok, device=device, dtype=dtype, max_batch=1, banned_words=banned,
                                      use_block_cache=False)
        alone = [single_engine.generate([r])[0] for r in reqs]
    same = [a.tokens == b.tokens for a, b in zip(together, alone)]
    first_diff = [next((k for k, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y),
                       min(len(a.tokens), len(b.tokens))) for a, b in zip(together, alone)]
    return {"dtype": dtype, "requests": n, "identical": sum(same),
            "token_agreement": float(np.mean([d / max(1, len(b.tokens)) if not s else 1.0
                                              for d, s, b in zip(first_diff, same, alone)])),
            "passed": all(same), "example": tok.decode(together[0].tokens),
            "mismatches": [{"request": i, "first_diff": d, "batched": a.tokens[d:d + 3], "alone": b.tokens[d:d + 3]}
                           for i, (s_, d, a, b) in enumerate(zip(same, first_diff, together, alone)) if not s_]}


def service_load(model_dir: Path | None, checkpoint: Path | None, device: str, dtype: str, sessions: int,
                 rate: float, seconds: float, tokens: int, max_batch: int, deadline_ms: float,
                 engine: str = "auto") -> dict[str, Any]:
    """The dialogue service in process: ``sessions`` open sessions, line requests with Poisson
    arrivals at ``rate`` per second for ``seconds`` (one asyncio loop, engine in its thread)."""
    import asyncio

    from runtime.serving.dialogue_service import Busy, DialogueService

    svc = DialogueService.load(model_dir, checkpoint=checkpoint, device=device, dtype=dtype, max_batch=max_batch,
                               engine=engine, max_queue=4 * max_batch, default_deadline_ms=deadline_ms,
                               latency_budget_ms=deadline_ms, max_tokens=tokens)
    cat = svc.catalog
    rng = np.random.default_rng(3)
    lines: list[Any] = []
    busy = [0]

    async def one(sid: str, intent: str, seed: int) -> None:
        try:
            lines.append(await svc.request_line(sid, intent, seed=seed))
        except Busy:
            busy[0] += 1

    async def run() -> float:
        async with svc:
            sids = []
            for i in range(sessions):
                k = int(rng.integers(0, 3))
                persona = sorted(rng.choice(cat["persona_traits"], size=k, replace=False).tolist())
                sids.append(svc.open_session(str(cat["archetypes"][i % len(cat["archetypes"])]), persona=persona,
                                             state=str(rng.choice(cat["states"])), context={"player": "Aria"}))
            tasks = []
            t0 = time.perf_counter()
            t_next = t0
            i = 0
            while t_next < t0 + seconds:
                await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
                tasks.append(asyncio.ensure_future(one(sids[int(rng.integers(sessions))],
                                                       str(rng.choice(cat["intents"])), i)))
                i += 1
                t_next += float(rng.exponential(1.0 / rate))
            await asyncio.gather(*tasks)
            return time.perf_counter() - t0

    dt = asyncio.run(run())
    e2e = [ln.latency_ms for ln in lines]
    reasons: dict[str, int] = {}
    for ln in lines:
        if ln.fallback:
            reasons[ln.fallback_reason or "?"] = reasons.get(ln.fallback_reason or "?", 0) + 1
    return {"sessions": sessions, "rate": rate, "seconds": dt, "lines": len(lines), "busy": busy[0],
            "lines_per_s": len(lines) / dt, "e2e_ms_p50": pct(e2e, 50), "e2e_ms_p99": pct(e2e, 99),
            "fallbacks": reasons, "model_lines": sum(1 for ln in lines if not ln.fallback),
            "attempts_mean": float(np.mean([ln.attempts for ln in lines])) if lines else None,
            "ttft_ms_p50": pct([ln.ttft_ms for ln in lines if ln.ttft_ms is not None], 50)}


# --------------------------------------------------------------------------- main


def fmt(v: Any, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="model directory (default: the shipped model)")
    ap.add_argument("--checkpoint", type=Path, default=None, help="model.pt directory instead of the INT4 graph")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="fp32 | bf16 | fp16 (default: bf16 on cuda, fp32 on cpu)")
    ap.add_argument("--sweep", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--client-seconds", type=float, default=5.0)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads on cpu (default 1, like the client engine; 0: torch's default)")
    ap.add_argument("--check", action="store_true", help="run the batched == single correctness test first")
    ap.add_argument("--graphs", action="store_true", help="also run the sweep with CUDA graphs")
    ap.add_argument("--moe", default="auto", choices=["auto", "loop", "grouped_mm"])
    ap.add_argument("--no-client", action="store_true")
    ap.add_argument("--no-ort", action="store_true",
                    help="on a CPU, skip the onnxruntime batched engine's sweep (runtime.serving.ort_engine)")
    ap.add_argument("--engine", default="auto", choices=["auto", "ort", "torch"],
                    help="the --service run's engine (auto: onnxruntime on a CPU)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--service", type=float, nargs=3, metavar=("SESSIONS", "RATE", "SECONDS"), default=None,
                    help="also run the dialogue service in process: sessions, Poisson line rate, duration")
    ap.add_argument("--deadline-ms", type=float, default=300.0, help="the service's request deadline")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="skip the sweep points that would end past this many seconds from the start (0: none)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    if args.threads and not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads)
    dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    t0 = time.perf_counter()
    model, tok, root = load_flash(args.model, checkpoint=args.checkpoint)
    banned = banned_words(root)
    report: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
                    "cpu_count": __import__("os").cpu_count(),
                    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
        "device": args.device, "dtype": dtype, "tokens_per_line": args.tokens,
        "load_s": time.perf_counter() - t0, "ok": True}
    print(f"# serve_bench  device={args.device} dtype={dtype} torch={torch.__version__} "
          f"gpu={report['machine']['gpu']}  load {report['load_s']:.1f}s", flush=True)

    if args.check:
        checks = []
        for dt in dict.fromkeys(["fp32", dtype]):
            try:
                c = correctness(model, tok, banned, args.device, dt, tokens=args.tokens)
            except Exception as exc:  # report and go on with the benchmark
                c = {"dtype": dt, "passed": False, "error": f"{type(exc).__name__}: {exc}"}
            checks.append(c)
            print(f"correctness [{dt}]: batched == single for {c.get('identical', 0)}/{c.get('requests', '?')} "
                  f"requests (token agreement {fmt(c.get('token_agreement'), '.3f')}) -> "
                  f"{('PASS' if c['passed'] else 'FAIL') if dt == 'fp32' else 'informational: half precision rounds differently per batch shape'}"
                  f" {c.get('error', '')}", flush=True)
            for m in c.get("mismatches", [])[:3]:
                print(f"    request {m['request']}: first difference at token {m['first_diff']}: "
                      f"batched {m['batched']} vs alone {m['alone']}", flush=True)
        report["correctness"] = checks
        report["ok"] = bool(checks[0]["passed"])
        if "example" in checks[0]:
            print(f"  example line: {checks[0]['example']!r}", flush=True)

    client = None
    if not args.no_client:
        try:
            client = client_peer(args.model, args.tokens, args.client_seconds)
        except Exception as exc:
            client = {"peer": "client", "error": f"{type(exc).__name__}: {exc}", "tokens_per_s": None}
        report["client"] = client

    prompts = village_prompts(tok, 4096)
    runs: list[dict[str, Any]] = []
    max_c = max(args.sweep)

    def sweep(engine: BatchedEngine) -> None:
        desc = engine.describe()
        for c in sorted(args.sweep):
            if args.budget_s and time.perf_counter() - t_start + args.seconds + 3 > args.budget_s:
                runs.append({"concurrency": c, "graphs": desc["cuda_graphs"], "error": "skipped: time budget"})
                print(f"  C={c} {desc['moe']}: skipped (time budget)", flush=True)
                continue
            engine.max_batch = c  # the KV slots were sized for the largest point
            try:
                with torch.inference_mode():
                    r = closed_loop(engine, prompts, c, args.seconds, args.tokens)
            except Exception as exc:
                r = {"concurrency": c, "error": f"{type(exc).__name__}: {exc}"}
                print(f"  C={c} {desc['moe']}: ERROR {r['error']}", flush=True)
            r.update(graphs=desc["cuda_graphs"], moe=desc["moe"])
            runs.append(r)
            if "error" not in r:
                print(f"  C={c:5d} graphs={int(desc['cuda_graphs'])} moe={desc['moe']}: {r['lines_per_s']:9.1f} lines/s "
                      f"{r['tokens_per_s']:10.0f} tok/s  p99 e2e {fmt(r['e2e_ms_p99'])} ms  "
                      f"({r['step_ms']:.2f} ms/step)", flush=True)

    modes = [False, True] if args.graphs and args.device.startswith("cuda") else [False]
    for graphs in modes:
        try:
            sweep(BatchedEngine(model, tok, device=args.device, dtype=dtype, max_batch=max_c, banned_words=banned,
                                cuda_graphs=graphs, moe=args.moe, max_prefill_tokens=max(1024, max_c * 2)))
        except Exception as exc:
            runs.append({"graphs": graphs, "error": f"{type(exc).__name__}: {exc}"})
    if args.device == "cpu" and not args.no_ort:
        from runtime.client.onnx_model import FlashOnnx
        from runtime.serving.ort_engine import OrtBatchedEngine

        onnx = FlashOnnx.load(args.model, threads=max(1, args.threads))
        sweep(OrtBatchedEngine(onnx, max_batch=max_c, banned_words=banned,
                               max_prefill_tokens=max(1024, max_c * 2)))
    report["batched"] = runs

    base = client.get("tokens_per_s") if client else None
    print()
    print(f"{client.get('peer') if client else 'client'}: {fmt(base, '.0f')} tok/s, "
          f"{fmt(client.get('lines_per_s') if client else None, '.1f')} lines/s, "
          f"p50 {fmt(client.get('e2e_ms_p50') if client else None)} ms")
    head = ("| sessions | graphs | moe | lines/s | tokens/s | x client | e2e p50 ms | e2e p99 ms | ttft p50 | ttft p99 "
            "| itl mean ms | rows/step | step ms | prefix hit |")
    print(head)
    print("|" + "|".join(["---"] * (head.count("|") - 1)) + "|")
    for r in runs:
        if "error" in r:
            print(f"| {r.get('concurrency', '-')} | {int(bool(r.get('graphs')))} | - | error: {r['error'][:80]} |")
            continue
        ratio = r["tokens_per_s"] / base if base else None
        print(f"| {r['concurrency']} | {int(r['graphs'])} | {r['moe']} | {r['lines_per_s']:.0f} | {r['tokens_per_s']:.0f} "
              f"| {fmt(ratio)} | {fmt(r['e2e_ms_p50'])} | {fmt(r['e2e_ms_p99'])} | {fmt(r['ttft_ms_p50'])} "
              f"| {fmt(r['ttft_ms_p99'])} | {fmt(r['itl_ms_mean'], '.2f')} | {r['batch_mean']:.0f} | {r['step_ms']:.2f} "
              f"| {fmt(r['prefix_hit_rate'], '.2f')} |")
        r["x_client"] = ratio
    if args.service:
        n_s, rate, secs = int(args.service[0]), args.service[1], args.service[2]
        try:
            sv = service_load(args.model, args.checkpoint, args.device, dtype, n_s, rate, secs, args.tokens,
                              max(args.sweep), args.deadline_ms, args.engine)
            print(f"service: {n_s} sessions, Poisson {rate:.0f} lines/s for {secs:.0f} s -> {sv['lines_per_s']:.0f} "
                  f"lines/s answered, e2e p50 {fmt(sv['e2e_ms_p50'])} / p99 {fmt(sv['e2e_ms_p99'])} ms, "
                  f"ttft p50 {fmt(sv['ttft_ms_p50'])} ms, {sv['model_lines']} model lines "
                  f"({fmt(sv['attempts_mean'], '.2f')} attempts each), fallbacks {sv['fallbacks']}, "
                  f"busy {sv['busy']}")
        except Exception as exc:
            sv = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"service: ERROR {sv['error']}")
        report["service"] = sv
    good = [r for r in runs if "error" not in r and r["e2e_ms_p99"] is not None]
    for slo in (100.0, 300.0):
        fit = [r for r in good if r["e2e_ms_p99"] <= slo]
        best = max(fit, key=lambda r: r["lines_per_s"]) if fit else None
        report[f"best_within_p99_{int(slo)}ms"] = best
        print(f"best within p99 e2e <= {slo:.0f} ms: " + (
            f"{best['lines_per_s']:.0f} lines/s, {best['tokens_per_s']:.0f} tok/s at {best['concurrency']} sessions "
            f"(graphs={int(best['graphs'])})" if best else "none"))
    if args.device.startswith("cuda") and torch.cuda.is_available():
        report["cuda_max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        print(f"peak CUDA memory allocated: {report['cuda_max_memory_gib']:.2f} GiB")
    report["wall_s"] = time.perf_counter() - t_start
    print(f"wall time {report['wall_s']:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nJSON: {args.json}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
