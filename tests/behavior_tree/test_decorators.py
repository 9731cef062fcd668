"""Decorators, tick by tick, with a fake clock for the timed ones."""

from __future__ import annotations

import pytest

from behavior_tree import PortError, Status

from .conftest import wrap

R, S, F, K, IDLE = (Status.RUNNING, Status.SUCCESS, Status.FAILURE, Status.SKIPPED, Status.IDLE)


@pytest.mark.parametrize(
    ("tag", "child", "expected"),
    [
        ("Inverter", S, F), ("Inverter", F, S), ("Inverter", R, R),
        ("ForceSuccess", F, S), ("ForceSuccess", S, S), ("ForceSuccess", R, R),
        ("ForceFailure", S, F), ("ForceFailure", F, F), ("ForceFailure", R, R),
    ],
)
def test_status_rewriting_decorators(factory, probes, tag, child, expected):
    probes.action("A")
    probes.set(A=child)
    tree = factory.create_tree(wrap(f"<{tag}><A/></{tag}>"))
    assert tree.tick() is expected
    assert tree.find("A").status is (R if child is R else IDLE)


def test_repeat_hands_control_back_after_each_synchronous_cycle(factory, probes):
    # BT.CPP 4.10: a cycle that started and finished in one tick ends the tick (RUNNING)
    probes.action("A")
    tree = factory.create_tree(wrap('<Repeat num_cycles="3"><A/></Repeat>'))
    assert [tree.tick() for _ in range(3)] == [R, R, S]
    assert probes.ticks["A"] == 3


def test_repeat_counts_across_ticks_and_fails_fast(factory, probes):
    probes.action("A")
    tree = factory.create_tree(wrap('<Repeat num_cycles="3"><A/></Repeat>'))
    probes.set(A=R)
    assert tree.tick() is R
    probes.set(A=S)
    assert tree.tick() is R  # cycle 1 finishes, cycle 2 runs at once and hands back
    assert probes.ticks["A"] == 3
    assert tree.tick() is S and probes.ticks["A"] == 4
    probes.reset_counts()
    probes.set(A=F)
    assert tree.tick() is F and probes.ticks["A"] == 1


def test_repeat_forever_yields_one_cycle_per_tick(factory, probes):
    probes.action("A")
    tree = factory.create_tree(wrap('<Repeat num_cycles="-1"><A/></Repeat>'))
    for _ in range(4):
        assert tree.tick() is R
    assert probes.ticks["A"] == 4


def test_retry_until_successful_counts_attempts(factory, probes):
    probes.action("A")
    probes.set(A=F)
    tree = factory.create_tree(wrap('<RetryUntilSuccessful num_attempts="3"><A/></RetryUntilSuccessful>'))
    assert [tree.tick() for _ in range(3)] == [R, R, F]  # one attempt per tick
    assert probes.ticks["A"] == 3
    probes.reset_counts()
    calls = iter([F, S])
    factory.register_action("Flaky", lambda ctx: next(calls))
    tree = factory.create_tree(wrap('<RetryUntilSuccessful num_attempts="5"><Flaky/></RetryUntilSuccessful>'))
    assert [tree.tick(), tree.tick()] == [R, S]


def test_keep_running_until_failure(factory, probes):
    probes.action("A")
    tree = factory.create_tree(wrap("<KeepRunningUntilFailure><A/></KeepRunningUntilFailure>"))
    assert tree.tick() is R and tree.tick() is R
    probes.set(A=F)
    assert tree.tick() is F
    assert probes.ticks["A"] == 3


def test_timeout_halts_a_slow_child(factory, probes, clock):
    probes.stateful("Slow")
    probes.set(Slow=R)
    tree = factory.create_tree(wrap('<Timeout msec="500"><Slow/></Timeout>'), clock=clock)
    assert tree.tick() is R
    clock.advance(0.4)
    assert tree.tick() is R
    clock.advance(0.1)
    assert tree.tick() is F
    assert probes.halts["Slow"] == 1 and probes.ticks["Slow"] == 2
    clock.advance(0.1)
    assert tree.tick() is R  # a new run gets a new deadline
    assert probes.starts["Slow"] == 2


def test_timeout_passes_through_a_child_that_finishes_in_time(factory, probes, clock):
    probes.action("A")
    tree = factory.create_tree(wrap('<Timeout msec="500"><A/></Timeout>'), clock=clock)
    assert tree.tick() is S


def test_delay_waits_then_ticks_the_child(factory, probes, clock):
    probes.action("A")
    tree = factory.create_tree(wrap('<Delay delay_msec="250"><A/></Delay>'), clock=clock)
    assert tree.tick() is R
    clock.advance(0.2)
    assert tree.tick() is R and probes.ticks["A"] == 0
    clock.advance(0.05)
    assert tree.tick() is S and probes.ticks["A"] == 1
    assert tree.tick() is R  # the next run waits again


def test_run_once_then_skips(factory, probes):
    probes.action("A")
    tree = factory.create_tree(wrap("<RunOnce><A/></RunOnce>"))
    assert tree.tick() is S
    assert tree.tick() is K
    assert probes.ticks["A"] == 1
    tree = factory.create_tree(wrap('<RunOnce then_skip="false"><A/></RunOnce>'))
    probes.set(A=F)
    assert tree.tick() is F and tree.tick() is F
    assert probes.ticks["A"] == 2


def test_cooldown_lets_the_child_run_once_per_period(factory, probes, clock):
    probes.action("Bark")
    tree = factory.create_tree(wrap(
        '<Fallback><Cooldown msec="10000"><Bark/></Cooldown><AlwaysSuccess name="Idle"/></Fallback>'),
        clock=clock)
    assert tree.tick() is S and probes.ticks["Bark"] == 1
    clock.advance(5)
    assert tree.tick() is S and probes.ticks["Bark"] == 1  # cooling down: fallback moves on
    assert tree.find("Cooldown").status is IDLE
    clock.advance(5)
    assert tree.tick() is S and probes.ticks["Bark"] == 2


def test_cooldown_never_interrupts_a_running_child(factory, probes, clock):
    probes.action("Bark")
    probes.set(Bark=R)
    tree = factory.create_tree(wrap('<Cooldown msec="1000"><Bark/></Cooldown>'), clock=clock)
    tree.tick()
    clock.advance(3)
    probes.set(Bark=S)
    assert tree.tick() is S  # the cooldown starts now
    clock.advance(0.5)
    assert tree.tick() is F
    clock.advance(0.5)
    assert tree.tick() is S


def test_precondition_gates_the_child(factory, probes):
    probes.action("Eat")
    tree = factory.create_tree(wrap(
        '<Precondition if="hunger &gt; 50" else="SKIPPED"><Eat/></Precondition>'))
    tree.blackboard.set("hunger", 10)
    assert tree.tick() is K and probes.ticks["Eat"] == 0
    tree.blackboard.set("hunger", 80)
    assert tree.tick() is S and probes.ticks["Eat"] == 1


def test_precondition_is_not_rechecked_while_the_child_runs(factory, probes):
    probes.action("Eat")
    probes.set(Eat=R)
    tree = factory.create_tree(wrap('<Precondition if="hunger &gt; 50"><Eat/></Precondition>'))
    tree.blackboard.set("hunger", 80)
    assert tree.tick() is R
    tree.blackboard.set("hunger", 0)
    assert tree.tick() is R
    probes.set(Eat=S)
    assert tree.tick() is S
    assert tree.tick() is F  # now the condition is false: else defaults to FAILURE


def test_decorator_ports_are_typed_at_load_time(factory, probes):
    probes.action("A")
    with pytest.raises(PortError, match="num_cycles") as e:
        factory.create_tree(wrap('<Repeat num_cycles="three"><A/></Repeat>'))
    assert "'three'" in str(e.value) and "int" in str(e.value)
    with pytest.raises(PortError, match="missing required input port 'msec'"):
        factory.create_tree(wrap("<Timeout><A/></Timeout>"))


def test_decorator_ports_can_read_the_blackboard(factory, probes):
    probes.action("A")
    tree = factory.create_tree(wrap('<Repeat num_cycles="{n}"><A/></Repeat>'))
    tree.blackboard.set("n", "2")  # strings convert to the port type on read
    assert [tree.tick(), tree.tick()] == [R, S] and probes.ticks["A"] == 2


def test_halting_a_delay_restarts_its_wait(factory, probes, clock):
    probes.action("A")
    tree = factory.create_tree(wrap('<Delay delay_msec="300"><A/></Delay>'), clock=clock)
    assert tree.tick() is R
    clock.advance(0.2)
    tree.halt()
    assert tree.tick() is R
    clock.advance(0.2)
    assert tree.tick() is R and probes.ticks["A"] == 0  # 0.2 s into the new wait
    clock.advance(0.1)
    assert tree.tick() is S


def test_halting_a_repeat_forgets_the_cycles_done(factory):
    script = iter([S, R])  # cycle 1 succeeds, cycle 2 is still running at the halt
    calls = []
    factory.register_action("A", lambda ctx: calls.append(1) or next(script, S))
    tree = factory.create_tree(wrap('<Repeat num_cycles="3"><A/></Repeat>'))
    assert [tree.tick(), tree.tick()] == [R, R] and len(calls) == 2
    tree.halt()
    assert [tree.tick() for _ in range(3)] == [R, R, S]
    assert len(calls) == 5  # three fresh cycles, not the two that were left
