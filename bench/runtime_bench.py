"""The local line engine, peers side by side in one run, on one intra-op thread.

    python bench/runtime_bench.py [--model DIR] [--checkpoint DIR] [--versus DIR] [--reps 5] [--lines 60] [--tokens 24]

Every line decodes exactly ``--tokens`` new tokens (``min_tokens = max_tokens``) for a request
drawn from a seeded village (24 NPCs with fixed archetype and persona; random state, intent and
context), the same requests for every peer. Peers run round-robin, one block of ``--lines``
lines each per repetition, so the machine's noise hits them alike; figures are the median over
``--reps`` repetitions of each block's p50 / p99 (of a line's latency, and for the word constraints
also of the thread CPU time a line takes, which other processes on a busy machine do not inflate).

Peers (all LineGenerator, the same weights but the versus pair):
  int4 sparse      the shipped graph (model.int4.onnx, QMoE: only the routed expert runs), cache on,
                   with the model's word constraints (vocabulary and signatures when it ships them)
  no text rules    the same, with the word constraints but without their text rules (punctuation,
                   case, doubled words: WordConstraint(text_rules=False)): their cost on its own
  no word cons.    the same, with the static banned words only (no vocabulary, no signatures, no
                   text rules, no word trigrams): the cost of the word constraints is the ratio of the
                   first and this
  no trigrams      the same word constraints without the word trigram check (when the model ships
                   them, runtime.client.trigrams): its cost on its own, redraws included
  no voice bonus   the same word constraints without the voice bonus (voice={}): its cost on its own
  bigrams / no bigrams  the same word constraints with the line book's word bigrams (derived from the
                   default book when the model ships none) / without them (when it ships them): their cost
  fp32             model.onnx (fp32, sparse gather), cache on
  int4 dense       every expert computed for every token, then gated (built from --checkpoint)
  int4 no-cache    the shipped graph with the prefix KV cache off
  versus / versus no word cons.  with ``--versus DIR``: another exported model (e.g. the one shipped
                   before), with its own word constraints / with the static banned words only, the
                   same requests in the same rounds: a new model's 24-token line against the old
                   one's in one run (issue #12's speed target)

``--pipeline`` runs only the engine's pipelined decode loop against its serial one
(``LineGenerator(pipelined=...)``: the next position's masks made on a mask thread while the
model runs, or between the steps), each with the word constraints and with the static banned words only
("no word cons."), in alternating order (reversed every other repetition), on ``--threads``
intra-op threads; it reports wall time, the calling thread's CPU and the process's CPU (the mask
thread and onnxruntime's pool included) per line, their ratios, and checks that both loops
wrote the same lines.

Also: the word constraints' CPU ratio on the first repetition's requests sent again (every mask
state met: the steady cost, without the first meetings); a crowd of 16 lines (mixed prompt
lengths) through ``generate_batch`` vs 16 single calls; load plus warm-up and resident memory in
a fresh process; whether onnxruntime IO binding pays for the KV loop; the share of prefill
tokens the prefix cache saves over the village's requests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from runtime.client.constraints import WordConstraint, read_constraints
from runtime.client.generator import LineGenerator, LineRequest
from runtime.client.onnx_model import DEFAULT_MODEL_DIR, FlashOnnx


@dataclass
class Peer:
    name: str
    gen: LineGenerator
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    cpu50: list[float] = field(default_factory=list)  # p50 of a line's thread CPU time (ms): immune to other processes
    proc50: list[float] = field(default_factory=list)  # p50 of a line's process CPU time (ms): every thread's
    lines: list[str] = field(default_factory=list)  # the texts of the last block's lines
    fallbacks: int = 0
    resampled: int = 0  # lines that took more than one sample (a dead end, a repeat)


def village(gen: LineGenerator, n_npcs: int = 24, seed: int = 0) -> list[dict]:
    """NPCs with a fixed archetype and persona (0-2 traits)."""
    cat = gen.catalog()
    rng = np.random.default_rng(seed)
    npcs = []
    for i in range(n_npcs):
        k = int(rng.integers(0, 3))
        persona = sorted(rng.choice(cat["persona_traits"], size=k, replace=False).tolist())
        npcs.append({"npc": cat["archetypes"][i % len(cat["archetypes"])], "persona": persona, "npc_id": i})
    return npcs


def requests(gen: LineGenerator, npcs: list[dict], n: int, tokens: int, seed: int) -> list[LineRequest]:
    cat = gen.catalog()
    rng = np.random.default_rng(seed)
    out = []
    for j in range(n):
        npc = npcs[int(rng.integers(len(npcs)))]
        slots = list(cat["context"])
        ctx = {s: str(rng.choice(cat["context"][s])) for s in rng.choice(slots, size=int(rng.integers(0, 3)),
                                                                        replace=False)}
        out.append(LineRequest(npc["npc"], str(rng.choice(cat["states"])), persona=npc["persona"],
                               intent=str(rng.choice(cat["intents"])), context=ctx, seed=seed * 100_000 + j,
                               max_tokens=tokens, min_tokens=tokens, npc_id=(npc["npc_id"], seed, j)))
    return out


def run_block(peer: Peer, reqs: list[LineRequest]) -> None:
    lat, ttft, cpu, proc = [], [], [], []
    peer.lines = []
    for r in reqs:
        t, c = time.thread_time(), time.process_time()
        line = peer.gen.generate_request(r)
        cpu.append((time.thread_time() - t) * 1e3)
        proc.append((time.process_time() - c) * 1e3)
        peer.lines.append(line.text)
        lat.append(line.latency_ms)
        if line.ttft_ms is not None:
            ttft.append(line.ttft_ms)
        peer.fallbacks += line.fallback
        peer.resampled += line.attempts > 1
    peer.p50.append(float(np.percentile(lat, 50)))
    peer.p99.append(float(np.percentile(lat, 99)))
    peer.cpu50.append(float(np.percentile(cpu, 50)))
    peer.proc50.append(float(np.percentile(proc, 50)))
    peer.ttft.append(float(np.percentile(ttft, 50)) if ttft else float("nan"))


def find_checkpoint(model_dir: Path, checkpoint: Path | None) -> Path | None:
    """The checkpoint (model.pt) the model was exported from: ``--checkpoint``, else beside it."""
    if checkpoint is not None:
        return checkpoint
    for p in (model_dir, model_dir.parent / "ckpt", model_dir.parent):
        if (p / "model.pt").is_file():
            return p
    return None


def variant_dir(model_dir: Path, ckpt: Path, tmp: Path, name: str, weights: str, moe: str) -> Path:
    """A copy of the model directory's side files with ``model.int4.onnx`` replaced by another
    graph of the same checkpoint (``weights``, ``moe`` as in :class:`runtime.factory.export.ExportOptions`)."""
    from runtime.factory.export import ExportOptions, build_onnx, load_checkpoint, save_model

    sd, cfg = load_checkpoint(ckpt)
    out = tmp / name
    out.mkdir()
    for f in model_dir.iterdir():
        if f.suffix == ".json":
            shutil.copyfile(f, out / f.name)
    info = json.loads((model_dir / "export.json").read_text()) if (model_dir / "export.json").is_file() else {}
    level = int(info.get("int4", {}).get("accuracy_level", 4))
    embedding = info.get("int4", {}).get("embedding", "fp16")
    opts = (ExportOptions("int4", moe, level, embedding) if weights == "int4"
            else ExportOptions("fp32", moe))
    save_model(build_onnx(sd, cfg, opts), out / "model.int4.onnx")
    return out


def fresh_process_figures(model_dir: Path, lines: int, tokens: int) -> dict:
    """Import + load + warm-up time, and resident memory after ``lines`` lines, in a new process."""
    code = f"""
import json, time
t0 = time.perf_counter()
from runtime import LineGenerator
gen = LineGenerator.load({str(model_dir)!r})
t1 = time.perf_counter()
first = gen.generate("guard", "patrol", seed=1, max_tokens={tokens}, min_tokens={tokens}).latency_ms
for i in range({lines}):
    gen.generate("guard", "patrol", seed=i, npc_id=i, max_tokens={tokens}, min_tokens={tokens})
status = dict(l.split(":", 1) for l in open("/proc/self/status") if l.startswith(("VmRSS", "VmHWM")))
print(json.dumps({{"import_load_ms": (t1 - t0) * 1e3, "load_ms": gen.load_ms, "first_line_ms": first,
                   "rss_mb": int(status["VmRSS"].split()[0]) / 1024, "hwm_mb": int(status["VmHWM"].split()[0]) / 1024}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def io_binding_vs_plain(model: FlashOnnx, prompt: list[int], tokens: int, reps: int
                        ) -> tuple[float, float, float, bool]:
    """Median ms for greedy decoding of ``tokens`` three ways: ``FlashOnnx.step`` (numpy in and
    out); IO binding keeping the KV tensors as OrtValues between steps; IO binding into
    preallocated ping-pong KV buffers reused every step (no allocation per step). Also whether
    all three decode the same tokens."""
    import onnxruntime as ort

    s = model.session
    names = [o.name for o in s.get_outputs()]
    present = [f"present_{k}_{i}" for i in range(model.n_layer) for k in ("key", "value")]
    past_names = [f"past_{k}_{i}" for i in range(model.n_layer) for k in ("key", "value")]
    ones = np.ones((1, model.block_size), np.int64)
    h, d = model.n_head, model.head_dim
    bufs = [[np.empty(h * model.block_size * d, np.float32) for _ in present] for _ in range(2)]
    logits_buf = np.empty((1, 1, int(model.config["vocab_size"])), np.float32)
    n_moe = sum(1 for i in range(model.n_layer) if i % int(model.config.get("moe_every", 1)) ==
                int(model.config.get("moe_every", 1)) - 1)
    router_buf = np.empty((n_moe, 1, int(model.config["n_expert"])), np.float32)

    def view(buf: np.ndarray, p: int) -> np.ndarray:
        return buf[: h * p * d].reshape(1, h, p, d)

    def plain(out: list[int]) -> float:
        t = time.perf_counter()
        logits, past, _ = model.step(np.asarray([prompt]), None)
        for _ in range(tokens):
            nxt = logits[:, -1:].argmax(-1)
            out.append(int(nxt[0, 0]))
            logits, past, _ = model.step(nxt, past)
        return (time.perf_counter() - t) * 1e3

    def bound(out: list[int]) -> float:
        t = time.perf_counter()
        logits, past, _ = model.step(np.asarray([prompt]), None)
        kv = [ort.OrtValue.ortvalue_from_numpy(a) for a in past]
        p = len(prompt)
        for _ in range(tokens):
            b = s.io_binding()
            nxt = logits[:, -1:].argmax(-1).astype(np.int64)
            out.append(int(nxt[0, 0]))
            b.bind_cpu_input("input_ids", nxt)
            b.bind_cpu_input("position_ids", np.asarray([[p]], np.int64))
            b.bind_cpu_input("attention_mask", ones[:, : p + 1])
            for n, v in zip(past_names, kv):
                b.bind_ortvalue_input(n, v)
            for n in names:
                b.bind_output(n, "cpu")
            s.run_with_iobinding(b)
            got = dict(zip(names, b.get_outputs()))
            kv = [got[n] for n in present]
            logits = got["logits"].numpy()
            p += 1
        return (time.perf_counter() - t) * 1e3

    def preallocated(out: list[int]) -> float:
        t = time.perf_counter()
        logits, past, _ = model.step(np.asarray([prompt]), None)
        p, cur = len(prompt), 0
        for j, a in enumerate(past):
            view(bufs[cur][j], p)[...] = a
        ids, pos = np.empty((1, 1), np.int64), np.empty((1, 1), np.int64)
        b = s.io_binding()
        for _ in range(tokens):
            ids[0, 0] = int(logits[0, -1].argmax())
            out.append(int(ids[0, 0]))
            pos[0, 0] = p
            b.clear_binding_inputs()
            b.clear_binding_outputs()
            b.bind_cpu_input("input_ids", ids)
            b.bind_cpu_input("position_ids", pos)
            b.bind_cpu_input("attention_mask", ones[:, : p + 1])
            for j, n in enumerate(past_names):
                v = view(bufs[cur][j], p)
                b.bind_input(n, "cpu", 0, np.float32, list(v.shape), v.ctypes.data)
            for j, n in enumerate(present):
                v = view(bufs[1 - cur][j], p + 1)
                b.bind_output(n, "cpu", 0, np.float32, list(v.shape), v.ctypes.data)
            b.bind_output("logits", "cpu", 0, np.float32, list(logits_buf.shape), logits_buf.ctypes.data)
            b.bind_output("router_probs", "cpu", 0, np.float32, list(router_buf.shape), router_buf.ctypes.data)
            s.run_with_iobinding(b)
            logits, cur, p = logits_buf, 1 - cur, p + 1
        return (time.perf_counter() - t) * 1e3

    times: list[list[float]] = [[], [], []]
    seqs: list[list[int]] = [[], [], []]
    for _ in range(reps * 10):
        for k, fn in enumerate((plain, bound, preallocated)):
            seqs[k] = []
            times[k].append(fn(seqs[k]))
    same = seqs[0] == seqs[1] == seqs[2]
    return statistics.median(times[0]), statistics.median(times[1]), statistics.median(times[2]), same


def banned_words_only(gen: LineGenerator) -> LineGenerator:
    """``gen`` with the static banned words only (no vocabulary, signatures or text rules): the
    "no word cons." peer (load it with ``trigrams=None``)."""
    gen.mask = WordConstraint(gen.banned_words, gen.tokenizer, text_rules=False)
    gen.mask.precompute()
    return gen


def pipeline_main(args: argparse.Namespace, opts: dict) -> int:
    """``--pipeline``: the pipelined decode loop against the serial one (see the module docstring)."""
    def load(pipelined: bool, plain: bool) -> LineGenerator:
        gen = LineGenerator.load(args.model, threads=args.threads, pipelined=pipelined, **opts,
                                 **({"trigrams": None} if plain else {}))
        return banned_words_only(gen) if plain else gen

    peers = [Peer("pipelined", load(True, False)), Peer("serial", load(False, False)),
             Peer("no word cons. pipelined", load(True, True)), Peer("no word cons. serial", load(False, True))]
    npcs = village(peers[0].gen)
    warm = [LineRequest(n["npc"], s, persona=n["persona"]) for n in npcs for s in peers[0].gen.catalog()["states"]]
    for p in peers:
        p.gen.warm_prefixes(warm)
    same = True
    for rep in range(args.reps):
        reqs = requests(peers[0].gen, npcs, args.lines, args.tokens, seed=rep + 1)
        for p in (peers if rep % 2 == 0 else peers[::-1]):
            run_block(p, reqs)
        same = same and peers[0].lines == peers[1].lines and peers[2].lines == peers[3].lines
    for p in peers:
        p.gen.close()
    med = statistics.median
    import onnxruntime

    print(f"\nmodel: {args.model}  ({args.tokens} new tokens per line, {args.threads} intra-op thread(s), "
          f"{args.reps} reps x {args.lines} lines per peer, order reversed every other rep)")
    print(f"onnxruntime {onnxruntime.__version__}, Python {sys.version.split()[0]}")
    print(f"{'peer':<26}{'wall p50':>10}{'wall p99':>10}{'thread CPU':>12}{'proc CPU':>10}{'fallbacks':>11}")
    for p in peers:
        print(f"{p.name:<26}{med(p.p50):>10.2f}{med(p.p99):>10.2f}{med(p.cpu50):>12.2f}{med(p.proc50):>10.2f}"
              f"{p.fallbacks:>11}")
    fig: dict[str, float] = {}
    for key, (a, b) in {"pipelined / serial": (0, 1), "no word cons. pipelined / serial": (2, 3),
                        "word constraints, pipelined": (0, 2), "word constraints, serial": (1, 3),
                        "pipelined with / serial without": (0, 3)}.items():
        pa, pb = peers[a], peers[b]
        for what, get in (("wall", lambda p: p.p50), ("thread", lambda p: p.cpu50), ("proc", lambda p: p.proc50)):
            fig[f"{key}: {what}"] = med(get(pa)) / med(get(pb))
        print(f"{key:<34} wall {fig[key + ': wall']:.3f}x  thread CPU {fig[key + ': thread']:.3f}x  "
              f"process CPU {fig[key + ': proc']:.3f}x")
    print(f"same lines, pipelined and serial: {same}")
    if args.json:
        args.json.write_text(json.dumps({
            "threads": args.threads, "same_lines": same, "ratios": fig,
            "peers": {p.name: {"p50_ms": med(p.p50), "p99_ms": med(p.p99), "cpu_p50_ms": med(p.cpu50),
                               "proc_p50_ms": med(p.proc50), "fallbacks": p.fallbacks, "resampled": p.resampled}
                      for p in peers}}, indent=2))
    return 0 if same else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="exported model directory")
    ap.add_argument("--checkpoint", type=Path, default=None, help="checkpoint dir (model.pt) for the dense peer")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--lines", type=int, default=60, help="lines per peer per repetition")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--versus", type=Path, default=None,
                    help="another exported model directory, timed beside --model in the same rounds")
    ap.add_argument("--accept-gibberish", action="store_true",
                    help="keep lines of a guessing (untrained) model instead of falling back (dev runs)")
    ap.add_argument("--fresh", type=int, default=3, help="fresh processes for load time and memory (median)")
    ap.add_argument("--pipeline", action="store_true",
                    help="only the pipelined decode loop against the serial one (see above)")
    ap.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads (--pipeline only)")
    args = ap.parse_args(argv)
    if args.pipeline:
        return pipeline_main(args, {"min_mean_logprob": None} if args.accept_gibberish else {})

    tmp = Path(tempfile.mkdtemp(prefix="flashnpc-bench-"))
    try:
        opts = {"min_mean_logprob": None} if args.accept_gibberish else {}
        base = LineGenerator.load(args.model, **opts)
        plain = banned_words_only(LineGenerator.load(args.model, **opts, trigrams=None))
        loose = LineGenerator.load(args.model, **opts)
        loose.mask = read_constraints(args.model).word_constraint(loose.tokenizer, text_rules=False)
        loose.mask.precompute()
        mute = LineGenerator.load(args.model, **opts, voice={})  # the word constraints without the voice bonus
        peers = [Peer("int4 sparse", base), Peer("no text rules", loose), Peer("no word cons.", plain),
                 Peer("no voice bonus", mute)]
        if read_constraints(args.model).trigrams is not None:  # the book's word trigrams: their cost alone
            peers.append(Peer("no trigrams", LineGenerator.load(args.model, **opts, trigrams=None)))
        if read_constraints(args.model).bigrams is not None:  # the book's word bigrams: with / without
            paired = (base, LineGenerator.load(args.model, **opts, bigrams=None))
            peers.append(Peer("no bigrams", paired[1]))
        else:
            from runtime.factory.export import book_bigrams
            from runtime.factory.linebook import load_line_book

            paired = (LineGenerator.load(args.model, **opts, bigrams=book_bigrams(load_line_book())), base)
            peers.append(Peer("bigrams", paired[0]))
        ckpt = find_checkpoint(args.model, args.checkpoint)
        if (args.model / "model.onnx").is_file():
            peers.append(Peer("fp32", LineGenerator.load(args.model, file="model.onnx", **opts)))
        elif ckpt is not None:
            peers.append(Peer("fp32", LineGenerator.load(variant_dir(args.model, ckpt, tmp, "fp32", "fp32", "gather"),
                                                         **opts)))
        if ckpt is not None:
            peers.append(Peer("int4 dense", LineGenerator.load(variant_dir(args.model, ckpt, tmp, "dense", "int4",
                                                                           "dense"), **opts)))
        if ckpt is None:
            print("(no checkpoint found: pass --checkpoint for the dense-all-experts peer, and for fp32 "
                  "when the model directory has no model.onnx)")
        peers.append(Peer("int4 no-cache", LineGenerator.load(args.model, use_prefix_cache=False, **opts)))
        if args.versus is not None:
            peers.append(Peer("versus", LineGenerator.load(args.versus, **opts)))
            peers.append(Peer("versus no word cons.", banned_words_only(LineGenerator.load(args.versus, **opts,
                                                                                           trigrams=None))))

        npcs = village(base)
        states = base.catalog()["states"]
        warm = [LineRequest(n["npc"], s, persona=n["persona"]) for n in npcs for s in states]
        for p in peers:
            p.gen.warm_prefixes(warm)  # the game's prefixes are warm (L2 preload or warm_prefixes)

        batch_single, batch_batched = [], []
        for rep in range(args.reps):
            reqs = requests(base, npcs, args.lines, args.tokens, seed=rep + 1)
            for p in peers:
                run_block(p, reqs)
            # a crowd of 16 NPCs (mixed personas, states, intents, contexts: prompts of mixed lengths)
            group = [replace(r, npc_id=("batch", rep, i))
                     for i, r in enumerate(requests(base, npcs, 16, args.tokens, seed=500 + rep))]
            t = time.perf_counter()
            for r in group:
                base.generate_request(replace(r, npc_id=("single", *r.npc_id)))
            batch_single.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            base.generate_batch(group)
            batch_batched.append((time.perf_counter() - t) * 1e3)

        # the first repetition's requests again (new npc ids: no repeat memory), every mask state
        # already met: what the word constraints cost once their first meetings are paid
        kept = [Peer("kept", base), Peer("kept plain", plain)]
        again = [replace(r, npc_id=("again", *r.npc_id)) for r in requests(base, npcs, args.lines, args.tokens, seed=1)]
        for p in kept:
            run_block(p, again)

        # share of prefill tokens served from the prefix cache over a fresh block of requests
        probe = LineGenerator.load(args.model)
        probe.warm_prefixes(warm)
        prompt_tokens = hit_tokens = 0
        for r in requests(probe, npcs, 200, 1, seed=999):
            ids, plen = probe.tokenizer.encode_prompt(r.npc, r.persona, r.state, r.intent, r.context or {})
            prompt_tokens += len(ids)
            hit_tokens += plen if probe.prefix_cache.get(ids[:plen], r.domain) is not None else 0

        runs = [fresh_process_figures(args.model, 50, args.tokens) for _ in range(max(1, args.fresh))]
        fresh = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        cat = base.catalog()
        prompt, _ = base.tokenizer.encode_prompt(cat["archetypes"][0], [], cat["states"][0], cat["intents"][0])
        plain_ms, bound_ms, prealloc_ms, same = io_binding_vs_plain(base.model, prompt, args.tokens, args.reps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = statistics.median
    ref = peers[0]
    import onnxruntime

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "unknown CPU") if Path("/proc/cpuinfo").is_file() else "unknown CPU"
    print(f"\nmodel: {args.model}  ({args.tokens} new tokens per line, 1 intra-op thread, "
          f"{args.reps} reps x {args.lines} lines per peer)")
    print(f"machine: {cpu}, onnxruntime {onnxruntime.__version__}, Python {sys.version.split()[0]}")
    print(f"{'peer':<16}{'p50 ms':>9}{'p99 ms':>9}{'TTFT p50':>10}{'p50 vs int4':>13}{'fallbacks':>11}")
    for p in peers:
        print(f"{p.name:<16}{med(p.p50):>9.2f}{med(p.p99):>9.2f}{med(p.ttft):>10.2f}"
              f"{med(p.p50) / med(ref.p50):>12.2f}x{p.fallbacks:>11}")
    plain_peer = next(p for p in peers if p.name == "no word cons.")
    vocab = (f"vocabulary of {len(base.mask.vocabulary)} words, {len(base.mask.tags) - 3} signature tags"
             if base.mask.vocabulary else "no vocabulary shipped")
    print(f"\nword constraints ({vocab}): p50 {med(ref.p50):.2f} ms with vs {med(plain_peer.p50):.2f} ms without "
          f"({med(ref.p50) / med(plain_peer.p50):.3f}x, +{100 * (med(ref.p50) / med(plain_peer.p50) - 1):.1f}% of a "
          f"line); p99 {med(ref.p99):.2f} vs {med(plain_peer.p99):.2f} ms; fallbacks {ref.fallbacks} vs "
          f"{plain_peer.fallbacks}; lines resampled {ref.resampled} vs {plain_peer.resampled} "
          f"(of {args.reps * args.lines})")
    cpu_ratio = med(ref.cpu50) / med(plain_peer.cpu50)
    print(f"word constraints, thread CPU time per line (the machine's other load left out): p50 {med(ref.cpu50):.2f} "
          f"ms with vs {med(plain_peer.cpu50):.2f} ms without ({cpu_ratio:.3f}x)")
    kept_ratio = med(kept[0].cpu50) / med(kept[1].cpu50)
    print(f"  the same {args.lines} requests again (every mask state already met): p50 {med(kept[0].cpu50):.2f} ms "
          f"with vs {med(kept[1].cpu50):.2f} ms without ({kept_ratio:.3f}x): the rest is the first meetings")
    loose_peer = next(p for p in peers if p.name == "no text rules")
    print(f"text rules: p50 {med(ref.p50):.2f} ms with vs {med(loose_peer.p50):.2f} ms without "
          f"({med(ref.p50) / med(loose_peer.p50):.3f}x); fallbacks {ref.fallbacks} vs {loose_peer.fallbacks}; "
          f"lines resampled {ref.resampled} vs {loose_peer.resampled}")
    mute_peer = next(p for p in peers if p.name == "no voice bonus")
    print(f"voice bonus: p50 {med(ref.p50):.2f} ms with vs {med(mute_peer.p50):.2f} ms without "
          f"({med(ref.p50) / med(mute_peer.p50):.3f}x); fallbacks {ref.fallbacks} vs {mute_peer.fallbacks}; "
          f"lines resampled {ref.resampled} vs {mute_peer.resampled}")
    with_b, without_b = (next(p for p in peers if p.gen is gen) for gen in paired)
    bigram_ratio = med(with_b.p50) / med(without_b.p50)
    print(f"word bigrams: p50 {med(with_b.p50):.2f} ms with vs {med(without_b.p50):.2f} ms without "
          f"({bigram_ratio:.3f}x); fallbacks {with_b.fallbacks} vs {without_b.fallbacks}; "
          f"lines resampled {with_b.resampled} vs {without_b.resampled}")
    nocache = next(p for p in peers if p.name == "int4 no-cache")
    share = hit_tokens / prompt_tokens
    print(f"\nprefix cache: TTFT p50 {med(ref.ttft):.2f} ms on a hit vs {med(nocache.ttft):.2f} ms without "
          f"({med(nocache.ttft) / med(ref.ttft):.2f}x); prefill tokens served from the cache: {share:.0%}")
    one, many = med(batch_single), med(batch_batched)
    print(f"batch of 16: {many:.1f} ms vs 16 single calls {one:.1f} ms "
          f"({many / 16:.2f} vs {one / 16:.2f} ms per line, {one / many:.2f}x)")
    print(f"io binding, {args.tokens} greedy steps: plain session.run {plain_ms:.2f} ms; KV as OrtValues "
          f"{bound_ms:.2f} ms ({plain_ms / bound_ms:.2f}x); preallocated reused KV buffers {prealloc_ms:.2f} ms "
          f"({plain_ms / prealloc_ms:.2f}x); same tokens: {same}")
    print(f"fresh process (median of {len(runs)}): import+load+warm-up {fresh['import_load_ms']:.0f} ms (load() itself "
          f"{fresh['load_ms']:.0f} ms), first line {fresh['first_line_ms']:.1f} ms, "
          f"RSS {fresh['rss_mb']:.0f} MB (peak {fresh['hwm_mb']:.0f} MB)")
    versus: dict[str, float] = {}
    if args.versus is not None:
        other, other_plain = (next(p for p in peers if p.name == n) for n in ("versus", "versus no word cons."))
        versus = {"versus_ratio": med(ref.p50) / med(other.p50),
                  "versus_no_word_cons_ratio": med(plain_peer.p50) / med(other_plain.p50)}
        print(f"versus {args.versus}: p50 {med(ref.p50):.2f} ms ({args.model}) vs {med(other.p50):.2f} ms "
              f"({versus['versus_ratio']:.3f}x) with their word constraints; {med(plain_peer.p50):.2f} vs "
              f"{med(other_plain.p50):.2f} ms ({versus['versus_no_word_cons_ratio']:.3f}x) with the static banned "
              f"words only; fallbacks {ref.fallbacks} vs {other.fallbacks}")
    if args.json:
        args.json.write_text(json.dumps({
            "peers": {p.name: {"p50_ms": med(p.p50), "p99_ms": med(p.p99), "ttft_p50_ms": med(p.ttft),
                               "cpu_p50_ms": med(p.cpu50),
                               "fallbacks": p.fallbacks, "resampled": p.resampled} for p in peers},
            "word_constraints_ratio": med(ref.p50) / med(plain_peer.p50),
            "word_constraints_cpu_ratio": cpu_ratio,
            "word_constraints_cpu_ratio_kept": kept_ratio,
            "text_rules_ratio": med(ref.p50) / med(loose_peer.p50),
            "voice_bonus_ratio": med(ref.p50) / med(mute_peer.p50),
            "bigrams_ratio": bigram_ratio,
            "prefix_share": share, "batch16_ms": many, "single16_ms": one,
            "iobinding_ms": bound_ms, "iobinding_prealloc_ms": prealloc_ms, "plain_ms": plain_ms, **fresh,
            **versus},
            indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
