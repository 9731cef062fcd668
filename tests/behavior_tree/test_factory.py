"""Factory registration rules, nested SubTree scopes, and the context API's errors."""

from __future__ import annotations

import pytest

from behavior_tree import (
    ActionNode,
    Blackboard,
    BlackboardTypeError,
    Factory,
    InputPort,
    OutputPort,
    Status,
)

from .conftest import wrap


def test_duplicate_and_reserved_registrations_are_rejected():
    f = Factory()
    f.register_action("Eat", lambda ctx: True)
    with pytest.raises(ValueError, match="already registered"):
        f.register_action("Eat", lambda ctx: False)
    f.register_action("Eat", lambda ctx: False, replace=True)
    assert f.create_tree(wrap("<Eat/>")).tick() is Status.FAILURE
    with pytest.raises(ValueError, match="built-in"):
        f.register_action("Sequence", lambda ctx: True, replace=True)
    with pytest.raises(ValueError, match="reserved"):
        f.register_action("SubTree", lambda ctx: True)
    with pytest.raises(ValueError, match="invalid node ID"):
        f.register_action("two words", lambda ctx: True)


def test_registering_invalidates_cached_definitions():
    f = Factory()
    f.register_action("Eat", lambda ctx: True)
    d1 = f.load(wrap("<Eat/>"))
    f.register_action("Drink", lambda ctx: True)
    assert f.load(wrap("<Eat/>")) is not d1


def test_class_nodes_with_ports_override():
    class Shout(ActionNode):
        def tick(self):
            self.set_output("heard", self.get_input("text").upper())
            self.status = Status.SUCCESS
            return Status.SUCCESS

    f = Factory()
    f.register_action("Shout", Shout, ports=[InputPort("text", type=str),
                                             OutputPort("heard", type=str)])
    tree = f.create_tree(wrap('<Shout text="hey" heard="{out}"/>'))
    assert tree.tick() is Status.SUCCESS and tree.blackboard.get("out") == "HEY"


def test_nested_subtrees_get_nested_blackboards():
    xml = wrap('<SubTree ID="Outer" mood="{npc_mood}"/>',
               '<BehaviorTree ID="Outer"><Sequence><Script code="_depth := 1"/>'
               '<SubTree ID="Inner" feeling="{mood}"/></Sequence></BehaviorTree>',
               '<BehaviorTree ID="Inner"><Script code="feeling := \'calm\'; @seen := true"/>'
               "</BehaviorTree>")
    tree = Factory().create_tree(xml)
    assert tree.tick() is Status.SUCCESS
    assert tree.blackboard.get("npc_mood") == "calm"
    assert tree.blackboard.get("seen") is True
    inner = tree.find("Inner")
    outer = tree.find("Outer")
    assert inner.child.blackboard.parent is outer.child.blackboard
    assert outer.child.blackboard.parent is tree.blackboard


def test_an_input_of_the_wrong_type_on_the_blackboard_is_a_recorded_error():
    f = Factory()
    f.register_action("Wait", lambda ctx: ctx.get_input("seconds") > 0,
                      ports=[InputPort("seconds", type=float)])
    tree = f.create_tree(wrap('<Wait seconds="{t}"/>'))
    tree.blackboard.set("t", [1])
    assert tree.tick() is Status.FAILURE
    assert isinstance(tree.errors[0].exception, BlackboardTypeError)
    assert "'seconds' expects float" in str(tree.errors[0].exception)


def test_a_missing_blackboard_key_falls_back_to_the_port_default():
    f = Factory()
    f.register_action("Say", lambda ctx: ctx.blackboard.set("said", ctx.get_input("line")) or True,
                      ports=[InputPort("line", type=str, default="hello")])
    tree = f.create_tree(wrap('<Say line="{greeting}"/>'))
    tree.tick()
    assert tree.blackboard.get("said") == "hello"


def test_trees_share_a_blackboard_when_given_one():
    f = Factory()
    bb = Blackboard.from_dict({"n": 0})
    d = f.load(wrap('<Script code="n += 1"/>'))
    a, b = d.instantiate(bb), d.instantiate(bb)
    a.tick()
    b.tick()
    assert bb.get("n") == 2


def test_instantiate_many_builds_independent_trees_and_restores_the_gc():
    import gc

    d = Factory().load(wrap('<Script code="n := 1"/>'))
    bbs = [Blackboard() for _ in range(3)]
    trees = d.instantiate_many(3, bbs)
    assert [t.blackboard for t in trees] == bbs and gc.isenabled()
    trees[0].tick()
    assert "n" in bbs[0] and "n" not in bbs[1]
