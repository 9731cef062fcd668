"""Event-driven sleep and the TreeScheduler (fake clock, no real sleeps)."""

from __future__ import annotations

import pytest

from behavior_tree import Factory, Status, TreeScheduler

from .conftest import wrap

R, S = Status.RUNNING, Status.SUCCESS


def _idle_npc_factory(probes):
    def wait(ctx):
        probes.ticks["Wait"] += 1
        ctx.sleep()  # wake me when something I read changes
        return R

    probes.factory.register_action("Wait", wait)
    probes.factory.register_condition("Alarm", lambda ctx: ctx.blackboard.get("alarm", False))
    probes.action("Flee")
    return probes.factory


NPC = wrap("<ReactiveFallback><ReactiveSequence><Alarm/><Flee/></ReactiveSequence>"
           "<Wait/></ReactiveFallback>")


def test_a_tree_whose_running_leaves_all_sleep_is_asleep_until_a_read_key_changes(probes):
    factory = _idle_npc_factory(probes)
    tree = factory.create_tree(NPC)
    tree.track_reads = True
    assert tree.tick() is R
    assert tree.asleep and tree.wake_deadline == float("inf")
    tree.blackboard.set("unrelated", 1)
    assert tree.asleep
    tree.blackboard.set("alarm", True)  # read by Alarm during the tick (even while missing)
    assert not tree.asleep


def test_a_running_leaf_that_did_not_ask_keeps_the_tree_awake(factory, probes):
    probes.action("Busy")
    probes.set(Busy=R)
    tree = factory.create_tree(wrap("<Busy/>"))
    tree.track_reads = True
    tree.tick()
    assert not tree.asleep


def test_timers_bound_the_sleep(factory, clock):
    tree = factory.create_tree(wrap('<Delay delay_msec="500"><AlwaysSuccess/></Delay>'), clock=clock)
    assert tree.tick() is R
    assert tree.asleep and tree.wake_deadline == pytest.approx(clock() + 0.5)
    assert not tree.is_due(clock() + 0.4) and tree.is_due(clock() + 0.5)


def test_scheduler_spreads_trees_over_the_period_with_a_seeded_phase(factory):
    d = factory.load(wrap("<AlwaysSuccess/>"))
    sched = TreeScheduler(rate_hz=10, seed=3)
    trees = [d.instantiate() for _ in range(1000)]
    for t in trees:
        sched.add(t)
    per_frame = [sched.update(k / 100) for k in range(1, 11)]  # ten 10 ms frames = one period
    assert sum(per_frame) == 1000  # every tree exactly once per period
    assert max(per_frame) < 150  # spread, not all on one frame
    assert sched.update(0.11) > 0  # next period starts again


def test_scheduler_ticks_at_each_tree_rate(factory):
    d = factory.load(wrap("<AlwaysSuccess/>"))
    sched = TreeScheduler(seed=1)
    fast, slow = d.instantiate(), d.instantiate()
    sched.add(fast, rate_hz=20, phase=0.0)
    sched.add(slow, rate_hz=2, phase=0.0)
    for k in range(101):  # one second of 10 ms frames
        sched.update(k / 100)
    assert fast.tick_count == 21 and slow.tick_count == 3


def test_scheduler_skips_sleeping_trees_until_woken(probes):
    factory = _idle_npc_factory(probes)
    d = factory.load(NPC)
    sched = TreeScheduler(rate_hz=10, seed=0)
    trees = [d.instantiate() for _ in range(50)]
    for t in trees:
        sched.add(t)
    t = 0.0
    for _ in range(30):  # three seconds at 10 fps
        sched.update(t)
        t += 0.1
    assert all(tr.tick_count == 1 for tr in trees)  # ticked once, then asleep
    assert sched.sleeping == 50
    probes.set(Flee=R)
    trees[7].blackboard.set("alarm", True)
    assert sched.sleeping == 49
    for _ in range(2):
        sched.update(t)
        t += 0.1
    assert trees[7].tick_count == 2 and trees[7].status is R
    assert probes.ticks["Flee"] >= 1


def test_scheduler_wakes_trees_when_their_timer_fires(factory, clock):
    d = factory.load(wrap('<Sequence><Sleep msec="1000"/><AlwaysSuccess/></Sequence>'))
    tree = d.instantiate(clock=clock)
    sched = TreeScheduler(rate_hz=8, seed=0)
    sched.add(tree, phase=0.0, start=clock())
    ticks = []
    for _ in range(20):  # 2.5 s in 1/8 s frames (exact in binary floating point)
        if sched.update(clock()):
            ticks.append(clock() - 100)
        clock.advance(0.125)
    # asleep through each second; on waking it finishes, and the next slot starts over
    assert ticks == [0.0, 1.0, 1.125, 2.125, 2.25]


def test_a_tree_that_wrote_a_key_it_read_does_not_sleep(probes):
    factory = _idle_npc_factory(probes)
    tree = factory.create_tree(wrap(
        '<ReactiveFallback><ReactiveSequence><Alarm/><Flee/></ReactiveSequence>'
        '<Sequence><Script code="alarm := true"/><Wait/></Sequence></ReactiveFallback>'))
    tree.track_reads = True
    tree.tick()
    assert not tree.asleep


def test_removed_trees_are_not_ticked():
    f = Factory()
    d = f.load(wrap("<AlwaysSuccess/>"))
    sched = TreeScheduler()
    tree = d.instantiate()
    sched.add(tree, phase=0.0)
    sched.remove(tree)
    assert sched.update(1.0) == 0 and tree.tick_count == 0


def test_a_sleeping_tree_ticked_by_hand_returns_to_the_scheduler():
    factory = Factory()
    want_sleep = [True]

    def idle(ctx):
        if want_sleep[0]:
            ctx.sleep()
        return R

    factory.register_action("Idle", idle)
    tree = factory.create_tree(wrap("<Idle/>"))
    sched = TreeScheduler(rate_hz=10)
    sched.add(tree, phase=0.0)
    sched.update(0.0)
    assert sched.sleeping == 1 and sched.update(0.1) == 0
    want_sleep[0] = False  # nothing on the blackboard changed: only a manual tick notices
    tree.tick()
    assert not tree.asleep and sched.sleeping == 0
    assert sched.update(0.2) == 1


def test_halting_a_sleeping_tree_puts_it_back_on_the_grid():
    factory = Factory()

    def idle(ctx):
        ctx.sleep()
        return R

    factory.register_action("Idle", idle)
    tree = factory.create_tree(wrap("<Idle/>"))
    sched = TreeScheduler(rate_hz=10)
    sched.add(tree, phase=0.0)
    sched.update(0.0)
    assert sched.sleeping == 1
    tree.halt()
    assert sched.sleeping == 0 and tree.root.status is Status.IDLE
    assert sched.update(0.1) == 1


def test_a_timeout_above_a_sleeping_leaf_bounds_the_sleep(clock):
    factory = Factory()

    def idle(ctx):
        ctx.sleep(10.0)
        return R

    factory.register_action("Idle", idle)
    tree = factory.create_tree(wrap('<Timeout msec="500"><Idle/></Timeout>'), clock=clock)
    tree.track_reads = True
    assert tree.tick() is R
    assert tree.asleep and tree.wake_deadline == pytest.approx(clock() + 0.5)
    clock.advance(0.5)
    assert tree.is_due(clock()) and tree.tick() is Status.FAILURE


async def test_an_async_action_sleeps_the_tree_until_its_task_finishes():
    import asyncio

    factory = Factory()
    gate = asyncio.Event()

    async def fetch(ctx):
        await gate.wait()
        return True

    factory.register_action("Fetch", fetch)
    tree = factory.create_tree(wrap("<Fetch/>"))
    sched = TreeScheduler(rate_hz=10)
    sched.add(tree, phase=0.0)
    sched.update(0.0)
    assert tree.asleep and sched.sleeping == 1
    assert sched.update(0.5) == 0
    gate.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert sched.sleeping == 0
    sched.update(0.6)
    assert tree.status is S


def test_set_rate_moves_a_tree_to_a_slower_grid(factory):
    d = factory.load(wrap("<AlwaysSuccess/>"))
    sched = TreeScheduler(seed=2)
    tree = d.instantiate()
    sched.add(tree, rate_hz=10, phase=0.0)
    for k in range(10):  # 0.0 .. 0.9 s: 10 ticks at 10 Hz
        sched.update(k / 10)
    sched.set_rate(tree, 2)  # far from the player now
    for k in range(10, 30):  # 1.0 .. 2.9 s: slots at 1.0, 1.5, 2.0, 2.5
        sched.update(k / 10)
    assert tree.tick_count == 14
    with pytest.raises(ValueError):
        sched.set_rate(tree, 0)


def test_a_stale_timer_from_a_cut_short_sleep_does_not_strand_the_tree(factory, clock):
    """Sleep 1 s, get woken early by a key, sleep again: the first sleep's timer must not
    leave the tree marked awake but off the grid, deaf to the next key change."""
    ticked_at = []

    def watch(ctx):
        ticked_at.append(ctx.now() - 100)
        ctx.blackboard.get("alarm", 0)
        ctx.sleep(1.0)
        return R

    factory.register_action("Watch", watch)
    tree = factory.create_tree(wrap("<Watch/>"), clock=clock)
    sched = TreeScheduler(rate_hz=8, seed=0)
    sched.add(tree, phase=0.0, start=clock())
    for k in range(13):  # 1.5 s in 1/8 s frames
        if k == 4:  # t = 0.5: woken early, re-sleeps until 1.625
            tree.blackboard.set("alarm", 1)
        if k == 10:  # t = 1.25: after the stale 1.0 timer; must wake the tree again
            tree.blackboard.set("alarm", 2)
        sched.update(clock())
        clock.advance(0.125)
    assert ticked_at == [0.0, 0.5, 1.25]
