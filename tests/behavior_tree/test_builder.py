"""The Python builder produces the same definitions as XML."""

from __future__ import annotations

import pytest

from behavior_tree import Factory, NodeConfigError, Status
from behavior_tree import builder as b

from .conftest import wrap


def test_builder_and_xml_give_equal_definitions():
    f = Factory()
    f.register_condition("Hungry", lambda ctx: ctx.blackboard.get("hunger") > 50)
    f.register_action("Eat", lambda ctx: True, ports=["food"])
    built = b.define(
        b.reactive_fallback(
            b.reactive_sequence(b.condition("Hungry"), b.action("Eat", food="{meal}")),
            b.repeat(b.action("AlwaysSuccess", name="idle"), num_cycles=2, _skipIf="busy"),
        ),
        factory=f, main_tree="Main",
    )
    xml = f.load(wrap(
        '<ReactiveFallback><ReactiveSequence><Hungry/><Eat food="{meal}"/></ReactiveSequence>'
        '<Repeat num_cycles="2" _skipIf="busy"><AlwaysSuccess name="idle"/></Repeat>'
        "</ReactiveFallback>"))
    assert built == xml
    assert f.load(built.to_xml()) == xml


def test_inline_functions_and_subtrees():
    seen = []
    d = b.define(
        b.sequence(b.condition(lambda ctx: True, name="ok"),
                   b.subtree("Greet", who="{player}")),
        subtrees={"Greet": b.action(lambda ctx: seen.append(ctx.get_input("who")) or True,
                                    name="say", ports=["who"], who="{who}")},
    )
    tree = d.instantiate()
    tree.blackboard.set("player", "Ada")
    assert tree.tick() is Status.SUCCESS
    assert seen == ["Ada"]
    assert "<SubTree" in d.to_xml()


def test_builder_errors_are_load_errors():
    with pytest.raises(NodeConfigError, match="unknown node ID 'Nope'"):
        b.define(b.action("Nope"))
    with pytest.raises(TypeError):
        b.sequence("not a node")


def test_switch_builder():
    d = b.define(b.switch("{mode}", ["a", "b"], b.action("AlwaysFailure"),
                          b.action("AlwaysSuccess"), b.action("AlwaysFailure")))
    tree = d.instantiate()
    tree.blackboard.set("mode", "b")
    assert tree.tick() is Status.SUCCESS


def test_anonymous_lambdas_are_named_after_their_kind():
    d = b.define(b.sequence(b.condition(lambda ctx: True), b.action(lambda ctx: True)))
    tree = d.instantiate()
    assert [n.name for n in tree.nodes()] == ["Sequence", "Condition", "Action"]
    assert tree.tick() is Status.SUCCESS


def test_builder_helpers_cover_the_bt_cpp_4_10_nodes():
    f = Factory()
    seen = []
    f.register_action("Use", lambda ctx: seen.append(ctx.get_input("v")) or True, ports=["v"])
    d = b.define(b.try_catch(
        b.async_sequence(b.loop(b.action("Use", v="{v}"), "1;2", "{v}"),
                         b.skip_unless_updated(b.action("Use", v="{v}"), "{v}")),
        b.unset_blackboard("v")), factory=f)
    tree = d.instantiate()
    while (st := tree.tick()) is Status.RUNNING:
        pass
    assert st is Status.SUCCESS and seen == [1, 2, 2]
    assert f.load(d.to_xml()) == d
