"""Switch cases and script comparisons convert between strings, numbers and booleans as
BT.CPP 4.10 does, and scripting enums registered on the factory work in both."""

from __future__ import annotations

from enum import IntEnum

import pytest

from behavior_tree import Factory, Status

from .conftest import wrap

S, F = Status.SUCCESS, Status.FAILURE


class Color(IntEnum):
    RED = 1
    GREEN = 2


def switch_tree(factory: Factory, script: str) -> tuple[object, list[str]]:
    chosen: list[str] = []
    for name in ("A", "B", "C", "Default"):
        factory.register_action(name, lambda ctx, n=name: chosen.append(n) or True)
    xml = wrap(f'<Sequence><Script code="{script}"/>'
               '<Switch3 variable="{v}" case_1="4" case_2="5" case_3="RED">'
               "<A/><B/><C/><Default/></Switch3></Sequence>")
    return factory.create_tree(xml), chosen


@pytest.mark.parametrize(("script", "expected"), [
    ("v := '5.0'", "B"),  # '5.0' and "5" are the same number
    ("v := 5.0", "B"),
    ("v := 4", "A"),
    ("v := '4'", "A"),
    ("v := RED", "C"),  # the enum's value, 1, matches case "RED"
    ("v := 'RED'", "C"),
    ("v := 1", "C"),
    ("v := 'five'", "Default"),
    ("v := 4.5", "Default"),
])
def test_switch_compares_cases_as_text_then_as_numbers(script, expected):
    f = Factory()
    f.register_scripting_enums(Color)
    tree, chosen = switch_tree(f, script)
    assert tree.tick() is S and chosen == [expected]


def test_registered_enums_are_constants_in_scripts():
    f = Factory()
    f.register_scripting_enum("THE_ANSWER", 42)
    f.register_scripting_enums({"SLOW": 1, "FAST": 2})
    tree = f.create_tree(wrap(
        '<Sequence><Script code="a := THE_ANSWER; speed := FAST; label := \'SLOW\'"/>'
        '<ScriptCondition code="a == 42 &amp;&amp; speed &gt; SLOW &amp;&amp; label == 1"/>'
        "</Sequence>"))
    assert tree.tick() is S, tree.errors
    assert tree.blackboard.get("speed") == 2 and f.scripting_enums["THE_ANSWER"] == 42


def test_an_enum_name_cannot_be_registered_twice_with_another_value():
    f = Factory()
    f.register_scripting_enum("RED", 1)
    f.register_scripting_enum("RED", 1)  # the same again is fine
    with pytest.raises(ValueError, match="already registered"):
        f.register_scripting_enum("RED", 2)
    with pytest.raises(TypeError, match="must be an int"):
        f.register_scripting_enum("HALF", 0.5)  # type: ignore[arg-type]


def test_registering_an_enum_refreshes_cached_definitions():
    f = Factory()
    xml = wrap('<ScriptCondition code="mode == 2"/>')
    t1 = f.create_tree(xml)
    t1.blackboard.set("mode", "ALERT")
    assert t1.tick() is F  # 'ALERT' is no number yet: the comparison fails (recorded)
    f.register_scripting_enum("ALERT", 2)
    t2 = f.create_tree(xml)
    t2.blackboard.set("mode", "ALERT")
    assert t2.tick() is S


@pytest.mark.parametrize(("condition", "result"), [
    ("param == true", S),  # a SubTree literal "true" is a string; compared with true -> 1
    ("param != false", S),
    ("n == 42 &amp;&amp; n + 1 == 43", S),  # "42" is stored as an int
    ("x == 0.5", S),
])
def test_subtree_literals_compare_with_booleans_and_numbers(condition, result):
    tree = Factory().create_tree(wrap(
        '<SubTree ID="Sub" param="true" n="42" x="0.5"/>',
        f'<BehaviorTree ID="Sub"><ScriptCondition code="{condition}"/></BehaviorTree>'))
    assert tree.tick() is result, tree.errors
