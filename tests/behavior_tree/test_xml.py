"""BT.CPP v4 XML: loading Groot2-style files, round trip, and load-time errors."""

from __future__ import annotations

import pytest

from behavior_tree import (
    Factory,
    InputPort,
    NodeConfigError,
    OutputPort,
    PortError,
    Status,
    TreeLoadError,
    XMLFormatError,
)

from .conftest import wrap

GROOT_STYLE = """<?xml version="1.0" encoding="UTF-8"?>
<root BTCPP_format="4" main_tree_to_execute="Guard">
  <!-- authored in Groot2 -->
  <BehaviorTree ID="Guard">
    <ReactiveFallback name="root">
      <ReactiveSequence name="engage">
        <IsEnemyVisible/>
        <Attack target="{enemy}" _onSuccess="kills += 1" _description="swing once"/>
      </ReactiveSequence>
      <SubTree ID="Patrol" route="{route}" _autoremap="false"/>
    </ReactiveFallback>
  </BehaviorTree>
  <BehaviorTree ID="Patrol">
    <Sequence>
      <Script code="leg := 0"/>
      <Repeat num_cycles="2">
        <MoveTo goal="{route}"/>
      </Repeat>
    </Sequence>
  </BehaviorTree>
  <TreeNodesModel>
    <Condition ID="IsEnemyVisible"/>
    <Action ID="Attack">
      <input_port name="target" type="std::string"/>
    </Action>
    <Action ID="MoveTo">
      <input_port name="goal">where to walk &amp; stop</input_port>
    </Action>
  </TreeNodesModel>
</root>
"""


@pytest.fixture
def guard_factory():
    f = Factory()
    f.register_condition("IsEnemyVisible", lambda ctx: ctx.blackboard.get("enemy", "") != "")
    f.register_action("Attack", lambda ctx: True, ports=[InputPort("target", type=str)])
    f.register_action("MoveTo", lambda ctx: True, ports=["goal"])
    return f


def test_a_groot_style_file_loads_and_runs(guard_factory):
    tree = guard_factory.create_tree(GROOT_STYLE)
    tree.blackboard.set("route", "A-B")
    tree.blackboard.set("kills", 0)
    assert tree.tick() is Status.RUNNING  # no enemy: patrol, one leg per tick
    assert tree.tick() is Status.SUCCESS
    tree.blackboard.set("enemy", "wolf")
    assert tree.tick() is Status.SUCCESS
    assert tree.blackboard.get("kills") == 1
    assert tree.definition.main_tree == "Guard"


def test_round_trip_reloads_to_an_equal_definition_and_is_stable(guard_factory):
    d1 = guard_factory.load(GROOT_STYLE)
    text = d1.to_xml()
    d2 = guard_factory.load(text)
    assert d1 == d2
    assert d2.to_xml() == text
    assert 'BTCPP_format="4"' in text and "<TreeNodesModel>" in text
    assert '<input_port name="goal">where to walk &amp; stop</input_port>' in text


def test_writing_escapes_script_operators(guard_factory):
    d = guard_factory.load(wrap('<ScriptCondition code="a &lt; 1 &amp;&amp; b &gt; &quot;x&quot;"/>'))
    out = d.to_xml()
    assert "&lt;" in out and "&amp;&amp;" in out
    assert guard_factory.load(out) == d


def test_definitions_are_cached_and_shared_by_text(guard_factory):
    t1 = guard_factory.create_tree(GROOT_STYLE)
    t2 = guard_factory.create_tree(GROOT_STYLE)
    assert t1.definition is t2.definition
    assert t1.root is not t2.root and t1.blackboard is not t2.blackboard


def test_main_tree_can_be_chosen_by_the_caller(guard_factory):
    tree = guard_factory.create_tree(GROOT_STYLE, main_tree="Patrol")
    assert tree.root.id == "Sequence"


def test_generated_tree_nodes_model_lists_custom_nodes_with_ports():
    f = Factory()
    f.register_action("Give", lambda ctx: True,
                      ports=[InputPort("item", type=str, default="coin"),
                             OutputPort("given", type=int)])
    out = f.load(wrap('<Give given="{n}"/>')).to_xml()
    assert '<Action ID="Give">' in out
    assert '<input_port name="item" type="str" default="coin"/>' in out
    assert '<output_port name="given" type="int"/>' in out


# ---- errors ---------------------------------------------------------------------------

def test_malformed_xml_names_file_and_line():
    with pytest.raises(XMLFormatError) as e:
        Factory().load('<root BTCPP_format="4">\n<BehaviorTree ID="M">\n<Sequence>\n</root>',
                       filename="npc.xml")
    assert "npc.xml:4" in str(e.value) and "malformed" in str(e.value)


@pytest.mark.parametrize("doc", [
    '<!DOCTYPE root [<!ENTITY boom "boom">]><root><BehaviorTree ID="M"><Script code="&boom;"/>'
    "</BehaviorTree></root>",
    '<!DOCTYPE root SYSTEM "file:///etc/passwd"><root/>',
    '<!DOCTYPE root [<!ENTITY % p SYSTEM "http://example.invalid/x">%p;]><root/>',
])
def test_doctype_and_entities_are_rejected(doc):
    with pytest.raises(XMLFormatError, match="DOCTYPE"):
        Factory().load(doc)


def test_unknown_node_id_names_the_node_line_and_suggests(guard_factory):
    doc = wrap('<Sequence>\n<Atack target="x"/></Sequence>')
    with pytest.raises(NodeConfigError) as e:
        guard_factory.load(doc, filename="guard.xml")
    msg = str(e.value)
    assert "guard.xml:2" in msg and "'Atack'" in msg and "Attack" in msg


def test_missing_and_mistyped_ports(guard_factory):
    with pytest.raises(PortError, match="missing required input port 'target'"):
        guard_factory.load(wrap("<Attack/>"))
    with pytest.raises(PortError, match="unknown port 'victim'"):
        guard_factory.load(wrap('<Attack target="x" victim="y"/>'))
    with pytest.raises(PortError, match=r"'1\.5' is not a valid int"):
        guard_factory.load(wrap('<Repeat num_cycles="1.5"><AlwaysSuccess/></Repeat>'))


def test_output_ports_need_a_blackboard_key():
    f = Factory()
    f.register_action("Count", lambda ctx: True, ports=[OutputPort("n", type=int)])
    with pytest.raises(PortError, match="must name a blackboard key"):
        f.load(wrap('<Count n="3"/>'))


def test_subtree_cycles_are_detected():
    doc = wrap('<SubTree ID="A"/>',
               '<BehaviorTree ID="A"><Sequence><SubTree ID="B"/></Sequence></BehaviorTree>',
               '<BehaviorTree ID="B"><SubTree ID="A"/></BehaviorTree>')
    with pytest.raises(NodeConfigError, match="SubTree cycle: A -> B -> A"):
        Factory().load(doc)


def test_structure_errors():
    f = Factory()
    with pytest.raises(XMLFormatError, match="main_tree_to_execute"):
        f.load('<root BTCPP_format="4"><BehaviorTree ID="A"><AlwaysSuccess/></BehaviorTree>'
               '<BehaviorTree ID="B"><AlwaysSuccess/></BehaviorTree></root>')
    with pytest.raises(XMLFormatError, match='BTCPP_format="3"'):
        f.load('<root BTCPP_format="3"><BehaviorTree ID="A"><AlwaysSuccess/></BehaviorTree></root>')
    with pytest.raises(NodeConfigError, match="exactly 1 child, has 0 children"):
        f.load(wrap("<Inverter/>"))
    with pytest.raises(NodeConfigError, match="SubTree ID 'Nope' is not defined"):
        f.load(wrap('<SubTree ID="Nope"/>'))
    with pytest.raises(XMLFormatError, match="exactly one root node"):
        f.load('<root BTCPP_format="4"><BehaviorTree ID="A"/></root>')


def test_text_inside_elements_is_ignored_as_bt_cpp_does():
    tree = Factory().create_tree(wrap("<Sequence>hello;<AlwaysSuccess/>\\n</Sequence>"))
    assert tree.tick() is Status.SUCCESS


def test_tree_nodes_model_is_checked_against_registrations(guard_factory):
    doc = wrap('<Attack target="x"/>').replace(
        "</root>", '<TreeNodesModel><Action ID="Attack"><input_port name="weapon"/></Action>'
                   "</TreeNodesModel></root>")
    with pytest.raises(PortError, match="'weapon'"):
        guard_factory.load(doc)
    doc = wrap('<Attack target="x"/>').replace(
        "</root>", '<TreeNodesModel><Condition ID="Attack"/></TreeNodesModel></root>')
    with pytest.raises(NodeConfigError, match="registered as action"):
        guard_factory.load(doc)


def test_every_load_error_is_a_tree_load_error():
    assert issubclass(XMLFormatError, TreeLoadError) and issubclass(PortError, TreeLoadError)


def test_bt_cpp_v3_style_action_wrappers_are_accepted(guard_factory):
    tree = guard_factory.create_tree(wrap('<Action ID="MoveTo" goal="home"/>'))
    assert tree.tick() is Status.SUCCESS
