"""Leaves: plain functions, StatefulAction, async actions, scripts, error capture."""

from __future__ import annotations

import asyncio

import pytest

from behavior_tree import (
    Factory,
    InputPort,
    OutputPort,
    PortError,
    StatefulAction,
    Status,
)

from .conftest import wrap

R, S, F, IDLE = Status.RUNNING, Status.SUCCESS, Status.FAILURE, Status.IDLE


def test_plain_functions_get_ports_and_blackboard_through_the_context(factory):
    def pick(ctx):
        ctx.set_output("choice", ctx.get_input("options")[0])
        return True

    factory.register_action("Pick", pick, ports=[InputPort("options", type=list),
                                                 OutputPort("choice", type=str)])
    factory.register_condition("Has", lambda ctx: ctx.blackboard.get("choice") == "apple")
    tree = factory.create_tree(wrap(
        '<Sequence><Pick options=\'["apple", "pear"]\' choice="{choice}"/><Has/></Sequence>'))
    assert tree.tick() is S
    assert tree.blackboard.get("choice") == "apple"
    assert tree.blackboard.type_of("choice") is str


def test_bool_and_status_results_are_both_accepted(factory):
    factory.register_action("Yes", lambda ctx: True)
    factory.register_action("No", lambda ctx: Status.FAILURE)
    assert factory.create_tree(wrap("<Yes/>")).tick() is S
    assert factory.create_tree(wrap("<No/>")).tick() is F


def test_a_raising_callback_fails_the_node_and_is_recorded(factory):
    def boom(ctx):
        raise RuntimeError("kaboom")

    factory.register_action("Boom", boom)
    tree = factory.create_tree(wrap('<Fallback><Boom name="b"/><AlwaysSuccess/></Fallback>'))
    assert tree.tick() is S  # the game goes on
    (err,) = tree.errors
    assert err.node_name == "b" and err.node_id == "Boom" and err.tick == 1
    assert isinstance(err.exception, RuntimeError)


def test_raise_errors_re_raises(factory):
    factory.register_action("Boom", lambda ctx: 1 / 0)
    tree = factory.create_tree(wrap("<Boom/>"), raise_errors=True)
    with pytest.raises(ZeroDivisionError):
        tree.tick()


def test_a_bad_return_value_is_recorded_as_an_error(factory):
    factory.register_condition("Odd", lambda ctx: "yes")
    tree = factory.create_tree(wrap("<Odd/>"))
    assert tree.tick() is F
    assert "returned 'yes'" in str(tree.errors[0].exception)
    factory.register_condition("Run", lambda ctx: Status.RUNNING)
    assert factory.create_tree(wrap("<Run/>")).tick() is F  # conditions cannot run


class Walk(StatefulAction):
    ports = (InputPort("steps", type=int),)

    def on_start(self):
        self.tree.blackboard.set("left", self.get_input("steps"))
        return self.on_running()

    def on_running(self):
        left = self.tree.blackboard.get("left") - 1
        self.tree.blackboard.set("left", left)
        return S if left <= 0 else R

    def on_halted(self):
        self.tree.blackboard.set("halted", True)


def test_stateful_action_life_cycle(factory):
    factory.register_action("Walk", Walk)
    tree = factory.create_tree(wrap('<Walk steps="3"/>'))
    assert [tree.tick() for _ in range(3)] == [R, R, S]
    tree.tick()
    tree.halt()
    assert tree.blackboard.get("halted") is True


def test_stateful_action_missing_port_is_a_load_error(factory):
    factory.register_action("Walk", Walk)
    with pytest.raises(PortError, match="steps"):
        factory.create_tree(wrap("<Walk/>"))


async def test_async_action_runs_as_a_task_and_halt_cancels_it():
    factory = Factory()
    gate = asyncio.Event()
    cancelled = []

    async def fetch(ctx):
        try:
            await gate.wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return True

    factory.register_action("Fetch", fetch)
    tree = factory.create_tree(wrap("<Fetch/>"))
    assert tree.tick() is R
    assert tree.tick() is R
    gate.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert tree.tick() is S
    gate.clear()
    assert tree.tick() is R
    await asyncio.sleep(0)  # let the task start waiting
    tree.halt()
    await asyncio.sleep(0)
    assert cancelled == [True]
    assert tree.root.status is IDLE


async def test_async_action_exception_is_recorded():
    factory = Factory()

    async def bad(ctx):
        raise ValueError("nope")

    factory.register_action("Bad", bad)
    tree = factory.create_tree(wrap("<Bad/>"))
    assert tree.tick() is R
    await asyncio.sleep(0)
    assert tree.tick() is F
    assert isinstance(tree.errors[0].exception, ValueError)


def test_async_action_without_a_running_loop_fails_cleanly():
    factory = Factory()

    async def noop(ctx):
        return True

    factory.register_action("Noop", noop)
    tree = factory.create_tree(wrap("<Noop/>"))
    assert tree.tick() is F
    assert "no running event loop" in str(tree.errors[0].exception)


def test_script_and_script_condition(factory):
    tree = factory.create_tree(wrap(
        '<Sequence><Script code="hp := 40; hp -= 15"/>'
        '<ScriptCondition code="hp &lt; 30"/></Sequence>'))
    assert tree.tick() is S
    assert tree.blackboard.get("hp") == 25


def test_script_code_must_be_a_literal(factory):
    with pytest.raises(PortError, match="literal script"):
        factory.create_tree(wrap('<Script code="{src}"/>'))


def test_set_blackboard_and_sleep(factory, clock):
    tree = factory.create_tree(wrap(
        '<Sequence><SetBlackboard output_key="mood" value="calm"/><Sleep msec="100"/></Sequence>'),
        clock=clock)
    assert tree.tick() is R
    assert tree.blackboard.get("mood") == "calm"
    clock.advance(0.1)
    assert tree.tick() is S


def test_set_blackboard_from_a_key_without_value_fails_as_in_bt_cpp(factory):
    tree = factory.create_tree(wrap('<SetBlackboard value="{first_point}" output_key="other"/>'))
    assert tree.tick() is Status.FAILURE and "other" not in tree.blackboard
    tree.blackboard.set("first_point", "1;2")
    assert tree.tick() is Status.SUCCESS and tree.blackboard.get("other") == "1;2"
