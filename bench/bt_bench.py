"""Behavior-tree benchmark: our tick vs py_trees side by side, NPC-scale scheduling, instantiation.

    python3 bench/bt_bench.py            # full run (about a minute on a 2-core machine)
    python3 bench/bt_bench.py --quick    # fewer repeats
    python3 bench/bt_bench.py --btcpp-driver /tmp/btcpp/driver/bench   # + BT.CPP side by side

Reference tree: a reactive fallback over 4 sequences of [condition, action]; conditions 1-3
fail, condition 4 passes and its action returns RUNNING, so 10 nodes are ticked per tick
(ours: ReactiveFallback over ReactiveSequence; py_trees 2.x: Selector(memory=False) over
Sequence(memory=False)). A second variant uses BT.CPP's Sequence, which resumes at the
running action (9 nodes per tick), against py_trees Sequence(memory=True).

BehaviorTree.CPP side by side: ``--btcpp-driver PATH`` names a small C++ program linked
with BehaviorTree.CPP 4.10 (not part of this repository; BENCHMARKS.md says how it was
built) that holds the same two trees and answers, one line per command on stdin,
``<variant> <ticks>`` with the microseconds per tick: ``rs`` / ``seq`` time
``tree.rootNode()->executeTick()``, ``rs_once`` / ``seq_once`` ``tree.tickExactlyOnce()``.
Its rounds are interleaved with ours and py_trees', and the bench checks the targets
(ours >= 1.2x BT.CPP's executeTick, >= 20x py_trees). Without it, the BT.CPP figure
printed is the one recorded in BENCHMARKS.md (marked "recorded").

Every figure is the median of several repeats; the machine is shared, so compare the ratios.
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable

from behavior_tree import FAILURE, RUNNING, SUCCESS, Factory, Status, TreeScheduler

# BehaviorTree.CPP 4.10 executeTick, us per tick, as recorded in BENCHMARKS.md (2026-12-01)
BTCPP_RECORDED_US = {"ReactiveSequence": 1.20, "Sequence": 1.10}
TARGET_VS_BTCPP, TARGET_VS_PY_TREES = 1.2, 20.0


class BTCPPDriver:
    """The BT.CPP driver process (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.proc = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)

    def us_per_tick(self, variant: str, ticks: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{variant} {ticks}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the BT.CPP driver stopped answering")
        return float(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)


def _median_us(fn: Callable[[], object], number: int, repeats: int) -> float:
    timings = []
    for _ in range(repeats):
        gc.disable()
        t0 = time.perf_counter()
        for _ in range(number // 10):
            fn(); fn(); fn(); fn(); fn(); fn(); fn(); fn(); fn(); fn()  # noqa: E702
        timings.append((time.perf_counter() - t0) / (number // 10 * 10) * 1e6)
        gc.enable()
        gc.collect()  # py_trees leaves cyclic garbage behind; don't let it slow later sections
    return statistics.median(timings)


# ---- reference tree ---------------------------------------------------------------------
def ours_reference(sequence_tag: str):
    f = Factory()
    f.register_condition("No", lambda ctx: False)
    f.register_condition("Yes", lambda ctx: True)
    f.register_action("Act", lambda ctx: RUNNING)  # constants: see behavior_tree.status
    branch = f"<{sequence_tag}><No/><Act/></{sequence_tag}>"
    last = f"<{sequence_tag}><Yes/><Act/></{sequence_tag}>"
    xml = (f'<root BTCPP_format="4"><BehaviorTree ID="Ref"><ReactiveFallback>'
           f"{branch * 3}{last}</ReactiveFallback></BehaviorTree></root>")
    tree = f.create_tree(xml)
    assert tree.tick() is Status.RUNNING
    return tree


def py_trees_reference(memory: bool):
    import py_trees
    from py_trees.common import Status as PS

    class Fixed(py_trees.behaviour.Behaviour):
        def __init__(self, name: str, result: PS) -> None:
            super().__init__(name)
            self.result = result

        def update(self) -> PS:
            return self.result

    seqs = [
        py_trees.composites.Sequence(
            f"seq{i}", memory=memory,
            children=[Fixed(f"cond{i}", PS.SUCCESS if i == 3 else PS.FAILURE),
                      Fixed(f"act{i}", PS.RUNNING)])
        for i in range(4)
    ]
    root = py_trees.composites.Selector("root", memory=False, children=seqs)
    root.tick_once()
    assert root.status == PS.RUNNING
    return root


# ---- floor: a plain recursive tick, no status bookkeeping ---------------------------------
class _PlainLeaf:
    __slots__ = ("fn", "status")

    def __init__(self, fn: Callable[[object], Status]) -> None:
        self.fn, self.status = fn, Status.IDLE

    def tick(self) -> Status:
        r = self.fn(self)
        self.status = r
        return r


class _PlainSequence:
    __slots__ = ("children", "status")

    def __init__(self, *children: _PlainLeaf) -> None:
        self.children, self.status = children, Status.IDLE

    def tick(self) -> Status:
        for c in self.children:
            r = c.tick()
            if r is not SUCCESS:
                self.status = r
                return r
        self.status = SUCCESS
        return SUCCESS


class _PlainFallback(_PlainSequence):
    __slots__ = ()

    def tick(self) -> Status:
        for c in self.children:
            r = c.tick()
            if r is not FAILURE:
                self.status = r
                return r
        self.status = FAILURE
        return FAILURE


def plain_reference() -> _PlainFallback:
    """The reference tree as bare recursion: what tracking, resets and halting cost on top."""
    no, yes, act = (lambda n: FAILURE), (lambda n: SUCCESS), (lambda n: RUNNING)
    branches = [_PlainSequence(_PlainLeaf(no), _PlainLeaf(act)) for _ in range(3)]
    return _PlainFallback(*branches, _PlainSequence(_PlainLeaf(yes), _PlainLeaf(act)))


# ---- realistic NPC tree ---------------------------------------------------------------------
NPC_XML = """<root BTCPP_format="4" main_tree_to_execute="Villager">
  <BehaviorTree ID="Villager">
    <ReactiveFallback name="villager">
      <ReactiveSequence name="flee">
        <IsThreatened/>
        <RunFrom threat="{threat}"/>
      </ReactiveSequence>
      <ReactiveSequence name="greet">
        <PlayerNear/>
        <Cooldown msec="10000">
          <Bark line="greeting"/>
        </Cooldown>
        <FacePlayer/>
      </ReactiveSequence>
      <SubTree ID="DailyRoutine" _autoremap="true"/>
    </ReactiveFallback>
  </BehaviorTree>
  <BehaviorTree ID="DailyRoutine">
    <Sequence name="routine">
      <Script code="_leg := 1"/>
      <WalkToWaypoint/>
      <Fallback>
        <Inverter><IsTired/></Inverter>
        <Sleep msec="3000"/>
      </Fallback>
      <Sleep msec="2000"/>
    </Sequence>
  </BehaviorTree>
</root>"""


def npc_factory(rng: random.Random) -> Factory:
    f = Factory()
    f.register_condition("IsThreatened", lambda ctx: ctx.blackboard.get("threat", "") != "")
    f.register_condition("PlayerNear", lambda ctx: ctx.blackboard.get("player_near", False))
    f.register_condition("IsTired", lambda ctx: ctx.blackboard.get("stamina", 10) < 3)
    f.register_action("RunFrom", lambda ctx: RUNNING, ports=["threat"])
    f.register_action("Bark", lambda ctx: True, ports=["line"])
    f.register_action("FacePlayer", lambda ctx: RUNNING)

    def walk(ctx):  # walking to the next waypoint takes 1-6 s: sleep until arrival
        if ctx.status is RUNNING:
            return SUCCESS
        ctx.sleep(1.0 + 5.0 * rng.random())
        return RUNNING

    f.register_action("WalkToWaypoint", walk)
    return f


def npc_cpu(n_npcs: int, seconds: float, fps: float, use_sleep: bool, seed: int = 0) -> dict:
    """Simulated game time with a fake clock; returns CPU share of one core, ticks/s."""
    rng = random.Random(seed)
    f = npc_factory(rng)
    now = [0.0]
    definition = f.load(NPC_XML)
    trees = definition.instantiate_many(n_npcs, clock=lambda: now[0])
    sched = TreeScheduler(rate_hz=10, seed=seed, sleep=use_sleep)
    for t in trees:
        sched.add(t)
    frames = int(seconds * fps)
    events_per_frame = max(1, int(n_npcs * 0.02 / fps))  # 2% of NPCs see something each second
    gc.collect()
    cpu0 = time.process_time()
    ticks0 = sched.ticks
    for k in range(frames):
        now[0] = k / fps
        for _ in range(events_per_frame):  # players come and go, threats appear and vanish
            bb = trees[rng.randrange(n_npcs)].blackboard
            r = rng.random()
            if r < 0.6:
                bb.set("player_near", not bb.get("player_near", False))
            elif r < 0.8:
                bb.set("threat", "" if bb.get("threat", "") else "wolf")
            else:
                bb.set("stamina", rng.randrange(10))
        sched.update(now[0])
    cpu = time.process_time() - cpu0
    return {"cpu_pct": 100.0 * cpu / seconds, "ticks_per_s": (sched.ticks - ticks0) / seconds,
            "sleeping": sched.sleeping, "errors": sum(len(t.errors) for t in trees)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--npcs", type=int, default=10_000)
    ap.add_argument("--btcpp-driver", metavar="PATH",
                    help="BT.CPP 4.10 driver to time side by side (see the docstring)")
    ap.add_argument("--reference-only", action="store_true",
                    help="only the reference tree (no NPC-scale sections)")
    args = ap.parse_args(argv)
    repeats = 5 if args.quick else 9
    number = 50_000 if args.quick else 200_000

    print(f"# behavior_tree benchmark  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# {platform.processor() or platform.machine()}, {platform.python_implementation()} "
          f"{platform.python_version()}, {sys.platform}")

    print("\n## Reference tree: reactive fallback over 4 x [condition, action] (median us/tick)")
    driver = BTCPPDriver(args.btcpp_driver) if args.btcpp_driver else None
    missed = []
    for label, ours_tag, memory, variant in (
        ("reactive sequences (10 nodes/tick)", "ReactiveSequence", False, "rs"),
        ("BT.CPP Sequence   (9 nodes/tick)", "Sequence", True, "seq"),
    ):
        ours = ours_reference(ours_tag)
        peer = py_trees_reference(memory)
        # interleave so all see the same machine load
        o, p, b, bo = [], [], [], []
        for _ in range(repeats):
            o.append(_median_us(ours.tick, number, 1))
            p.append(_median_us(peer.tick_once, number // 20, 1))
            if driver is not None:
                b.append(driver.us_per_tick(variant, number))
                bo.append(driver.us_per_tick(variant + "_once", number))
        ours_us, peer_us = statistics.median(o), statistics.median(p)
        if driver is not None:
            btcpp_us, how = statistics.median(b), "measured"
            extra = f" (tickExactlyOnce {statistics.median(bo):.3f} us)"
        else:
            btcpp_us, how, extra = BTCPP_RECORDED_US[ours_tag], "recorded", ""
        vs_btcpp, vs_peer = btcpp_us / ours_us, peer_us / ours_us
        print(f"{label}: ours {ours_us:.3f} us | py_trees {peer_us:.2f} us ({vs_peer:.1f}x) | "
              f"BT.CPP executeTick ({how}) {btcpp_us:.3f} us{extra} -> ours {vs_btcpp:.2f}x")
        if vs_peer < TARGET_VS_PY_TREES:
            missed.append(f"{label}: {vs_peer:.1f}x py_trees < {TARGET_VS_PY_TREES}x")
        if driver is not None and vs_btcpp < TARGET_VS_BTCPP:
            missed.append(f"{label}: {vs_btcpp:.2f}x BT.CPP < {TARGET_VS_BTCPP}x")
    if driver is not None:
        driver.close()
    print("targets: " + ("met" if not missed else "MISSED: " + "; ".join(missed)))
    if args.reference_only:
        return 1 if missed else 0

    plain = plain_reference()
    floor = statistics.median(_median_us(plain.tick, number, 1) for _ in range(repeats))
    print(f"floor: plain recursive tick of the same 10 nodes, no bookkeeping: {floor:.3f} us")

    print("\n## Instantiation of the NPC tree from one shared definition")
    f = npc_factory(random.Random(0))
    definition = f.load(NPC_XML)
    inst = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        trees = [definition.instantiate() for _ in range(2000)]
        inst.append((time.perf_counter() - t0) / 2000 * 1e6)
        del trees
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    trees = [definition.instantiate() for _ in range(1000)]
    per_npc = (tracemalloc.get_traced_memory()[0] - before) / 1000
    tracemalloc.stop()
    del trees
    print(f"{len(definition)} nodes: {statistics.median(inst):.1f} us per NPC (median of "
          f"batches of 2000 kept alive), {per_npc / 1024:.1f} KiB per NPC (tracemalloc)")
    many, plain = [], []
    for _ in range(3):
        gc.collect()
        t0 = time.perf_counter()
        trees = definition.instantiate_many(args.npcs)
        many.append((time.perf_counter() - t0) / args.npcs * 1e6)
        del trees
        gc.collect()
        t0 = time.perf_counter()
        trees = [definition.instantiate() for _ in range(args.npcs)]
        plain.append((time.perf_counter() - t0) / args.npcs * 1e6)
        del trees
    print(f"{args.npcs} at once: instantiate_many (GC paused) {statistics.median(many):.1f} us "
          f"per NPC; a plain loop with the cyclic GC running {statistics.median(plain):.1f} us")

    print(f"\n## {args.npcs} NPC trees at 10 Hz (scheduler, simulated game time, 30 fps)")
    seconds = 5.0 if args.quick else 10.0
    sleep_runs = [npc_cpu(args.npcs, seconds, 30, True, seed=s) for s in range(3)]
    med = statistics.median(r["cpu_pct"] for r in sleep_runs)
    tps = statistics.median(r["ticks_per_s"] for r in sleep_runs)
    print(f"with sleep: {med:.1f}% of one core, {tps:.0f} tree ticks/s, "
          f"{sleep_runs[0]['sleeping']} asleep at the end, errors {sleep_runs[0]['errors']}")
    awake = npc_cpu(args.npcs, 2.0, 30, False)
    print(f"without sleep (every tree ticks at 10 Hz): {awake['cpu_pct']:.1f}% of one core, "
          f"{awake['ticks_per_s']:.0f} tree ticks/s")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
