"""Blackboard: typed entries, remapping, SubTree scopes, @root keys, snapshots, observers."""

from __future__ import annotations

import json

import pytest

from behavior_tree import Blackboard, BlackboardError, BlackboardTypeError, Status

from .conftest import wrap


def test_a_key_type_is_fixed_by_its_first_write():
    bb = Blackboard()
    bb.set("hp", 10)
    bb.set("hp", "12")  # strings convert like XML literals
    assert bb.get("hp") == 12
    with pytest.raises(BlackboardTypeError, match="'hp' holds int"):
        bb.set("hp", [1])
    bb.set("speed", 1.5)
    bb.set("speed", 2)  # int widens to float
    assert bb.get("speed") == 2.0 and isinstance(bb.get("speed"), float)
    bb.set("hp", None)  # None is allowed for any type
    assert bb.type_of("hp") is int


def test_declare_fixes_a_type_before_the_first_value():
    bb = Blackboard()
    bb.declare("name", str)
    with pytest.raises(BlackboardTypeError):
        bb.set("name", 3)


def test_missing_keys_raise_a_key_error_or_return_the_default():
    bb = Blackboard()
    with pytest.raises(KeyError, match="'nope'"):
        bb.get("nope")
    with pytest.raises(BlackboardError):
        bb["nope"]
    assert bb.get("nope", 7) == 7
    assert "nope" not in bb


def test_observers_receive_key_old_new_only_on_change():
    bb = Blackboard()
    seen = []
    unsubscribe = bb.observe(lambda k, old, new: seen.append((k, old, new)))
    bb.set("mood", "calm")
    bb.set("mood", "calm")
    bb.set("mood", "angry")
    unsubscribe()
    bb.set("mood", "calm")
    assert seen == [("mood", None, "calm"), ("mood", "calm", "angry")]


def test_snapshot_and_restore_round_trip_through_json():
    bb = Blackboard.from_dict({"hp": 5, "name": "Ada", "state": Status.RUNNING,
                               "path": [1, 2], "ratio": 0.5})
    text = bb.to_json()
    json.loads(text)
    other = Blackboard()
    seen = []
    other.observe(lambda k, old, new: seen.append(k))
    other.restore_json(text)
    assert other.as_dict() == bb.as_dict()
    assert other.get("state") is Status.RUNNING
    assert other.type_of("ratio") is float
    assert sorted(seen) == sorted(bb.keys())


def test_snapshot_rejects_values_without_a_json_form():
    bb = Blackboard.from_dict({"obj": object()})
    with pytest.raises(BlackboardTypeError, match="'obj'"):
        bb.snapshot()


def test_child_blackboard_sees_only_remapped_keys():
    parent = Blackboard.from_dict({"hp": 3, "secret": 1})
    child = Blackboard(parent, remap={"health": "hp"})
    assert child.get("health") == 3
    assert "secret" not in child
    child.set("health", 9)
    assert parent.get("hp") == 9
    child.set("local", 1)
    assert "local" not in parent


def test_autoremap_shares_every_key_but_private_ones():
    parent = Blackboard.from_dict({"hp": 3})
    child = Blackboard(parent, autoremap=True)
    assert child.get("hp") == 3
    child.set("mood", "ok")
    child.set("_scratch", 1)
    assert parent.get("mood") == "ok"
    assert "_scratch" not in parent


def test_at_key_always_means_the_root_blackboard():
    root = Blackboard.from_dict({"time_of_day": "night"})
    mid = Blackboard(root)
    leaf = Blackboard(mid)
    assert leaf.get("@time_of_day") == "night"
    leaf.set("@alarm", True)
    assert root.get("alarm") is True
    root.set("@alarm", False)
    assert root.keys() == ["time_of_day", "alarm"]  # "@alarm" is an alias, not a key


def test_observers_on_the_root_see_writes_made_through_a_subtree(factory):
    xml = wrap('<SubTree ID="Inner" mood="{npc_mood}"/>',
               '<BehaviorTree ID="Inner"><Script code="mood := \'angry\'"/></BehaviorTree>')
    tree = factory.create_tree(xml)
    seen = []
    tree.blackboard.observe(lambda k, old, new: seen.append((k, old, new)))
    tree.tick()
    assert seen == [("npc_mood", None, "angry")]


def test_subtree_literal_ports_and_private_scope(factory):
    xml = wrap(
        '<Sequence><Script code="x := 1"/><SubTree ID="Inner" limit="5"/></Sequence>',
        '<BehaviorTree ID="Inner"><Script code="seen := limit"/></BehaviorTree>')
    tree = factory.create_tree(xml)
    assert tree.tick() is Status.SUCCESS
    assert "seen" not in tree.blackboard  # the subtree's own keys stay inside it
    assert tree.find("Inner").child.blackboard.get("seen") == 5  # typed as BT.CPP 4.10 does


def test_subtree_autoremap_in_xml(factory):
    xml = wrap('<SubTree ID="Inner" _autoremap="true"/>',
               '<BehaviorTree ID="Inner"><Script code="hp += 1; _tmp := 2"/></BehaviorTree>')
    bb = Blackboard.from_dict({"hp": 1})
    tree = factory.create_tree(xml, blackboard=bb)
    tree.tick()
    assert bb.get("hp") == 2 and "_tmp" not in bb


def test_port_remapping_with_same_name_shorthand(factory):
    factory.register_action("Say", lambda ctx: ctx.blackboard.set("said", ctx.get_input("line"))
                            or True, ports=["line"])
    tree = factory.create_tree(wrap('<Say line="{=}"/>'))
    tree.blackboard.set("line", "hello")
    tree.tick()
    assert tree.blackboard.get("said") == "hello"


def test_tree_snapshot_covers_subtree_blackboards_and_restores_into_a_fresh_tree(factory):
    xml = wrap('<Sequence><Script code="hp := 7"/><SubTree ID="Inner"/></Sequence>',
               '<BehaviorTree ID="Inner"><Script code="_seen := 3"/></BehaviorTree>')
    tree = factory.create_tree(xml)
    tree.tick()
    snap = json.loads(json.dumps(tree.snapshot()))
    fresh = factory.create_tree(xml)
    fresh.restore(snap)
    assert fresh.blackboard.get("hp") == 7
    assert fresh.find("Inner").child.blackboard.get("_seen") == 3
    with pytest.raises(ValueError, match="2 blackboards"):
        fresh.restore({"version": 1, "blackboards": []})
