"""Documents as BT.CPP 4.10 reads them: <include>, registered trees, a lone <BehaviorTree>
without ID, what tinyxml2 tolerates, and the name rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from behavior_tree import Factory, NodeConfigError, Status, XMLFormatError

S = Status.SUCCESS


def doc(*trees: str, head: str = "") -> str:
    return f'<root BTCPP_format="4">{head}{"".join(trees)}</root>'


def bt(tree_id: str, body: str) -> str:
    return f'<BehaviorTree ID="{tree_id}">{body}</BehaviorTree>'


@pytest.fixture
def library(tmp_path: Path) -> Path:
    """main.xml includes sub/talk.xml, which includes ../common.xml."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "common.xml").write_text(doc(bt("Common", "<AlwaysSuccess/>")))
    (tmp_path / "sub" / "talk.xml").write_text(doc(
        bt("Talk", '<Sequence><SubTree ID="Common"/><Script code="said := 1"/></Sequence>'),
        head='<include path="../common.xml"/>'))
    (tmp_path / "main.xml").write_text(doc(
        bt("Main", '<SubTree ID="Talk" _autoremap="true"/>'), head='<include path="sub/talk.xml"/>'))
    return tmp_path


def test_include_paths_are_relative_to_the_including_file(library):
    tree = Factory().create_tree_from_file(library / "main.xml")
    assert tree.tick() is S and tree.blackboard.get("said") == 1


def test_registering_a_file_registers_the_trees_of_its_includes(library):
    f = Factory()
    assert f.register_behavior_tree_from_file(library / "main.xml") == ["Common", "Talk", "Main"]
    assert f.create_tree_by_id("Talk").tick() is S


def test_an_include_outside_the_allowed_folder_is_refused(library):
    # loading sub/talk.xml alone allows only sub/: its ../common.xml is outside
    with pytest.raises(XMLFormatError, match=r"outside .*sub") as e:
        Factory().load_file(library / "sub" / "talk.xml")
    assert e.value.source.endswith("talk.xml") and e.value.line == 1
    # the caller may allow the wider folder
    assert Factory().load_file(library / "sub" / "talk.xml", include_root=library)


def test_an_absolute_include_path_is_held_to_the_allowed_folder_too(library, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "x.xml"
    elsewhere.write_text(doc(bt("X", "<AlwaysSuccess/>")))
    (library / "abs.xml").write_text(doc(bt("Main", "<AlwaysSuccess/>"),
                                         head=f'<include path="{elsewhere}"/>'))
    with pytest.raises(XMLFormatError, match="outside"):
        Factory().load_file(library / "abs.xml")


def test_an_include_cycle_is_an_error_naming_the_cycle(tmp_path):
    (tmp_path / "a.xml").write_text(doc(bt("A", "<AlwaysSuccess/>"), head='<include path="b.xml"/>'))
    (tmp_path / "b.xml").write_text(doc(bt("B", "<AlwaysSuccess/>"), head='<include path="a.xml"/>'))
    with pytest.raises(XMLFormatError, match=r"include cycle: a\.xml -> b\.xml -> a\.xml") as e:
        Factory().load_file(tmp_path / "a.xml")
    assert e.value.source.endswith("b.xml")


def test_a_missing_include_names_the_file_and_line(tmp_path):
    (tmp_path / "a.xml").write_text('<root BTCPP_format="4">\n<include path="gone.xml"/>\n'
                                    + bt("A", "<AlwaysSuccess/>") + "</root>")
    with pytest.raises(XMLFormatError, match="cannot read") as e:
        Factory().load_file(tmp_path / "a.xml")
    assert e.value.line == 2


def test_xml_text_can_include_only_with_an_include_root(library):
    text = doc(bt("Main", '<SubTree ID="Common"/>'), head='<include path="common.xml"/>')
    with pytest.raises(XMLFormatError, match="include_root"):
        Factory().load(text)
    assert Factory().create_tree(text, include_root=library).tick() is S


def test_a_later_document_uses_the_trees_registered_before(tmp_path):
    f = Factory()
    f.register_behavior_tree_from_text(doc(bt("Greet", "<Script code=\"hi := 'yes'\"/>")))
    tree = f.create_tree(doc(bt("Main", '<SubTree ID="Greet" _autoremap="true"/>')))
    assert tree.tick() is S and tree.blackboard.get("hi") == "yes"
    assert f.registered_behavior_trees() == ["Greet"]


def test_a_lone_behavior_tree_without_id_is_the_main_tree():
    tree = Factory().create_tree('<root BTCPP_format="4"><BehaviorTree><AlwaysSuccess/>'
                                 "</BehaviorTree></root>")
    assert tree.tick() is S and tree.definition.main_tree == "BehaviorTree_0"
    f = Factory()
    lone = '<root BTCPP_format="4"><BehaviorTree><AlwaysSuccess/></BehaviorTree></root>'
    assert f.register_behavior_tree_from_text(lone) == ["BehaviorTree_0"]
    assert f.register_behavior_tree_from_text(lone) == ["BehaviorTree_1"]


def test_a_tree_without_id_next_to_other_elements_is_an_error():
    with pytest.raises(XMLFormatError, match="needs an ID") as e:
        Factory().load(doc(bt("A", "<AlwaysSuccess/>"),
                           "\n<BehaviorTree><AlwaysSuccess/></BehaviorTree>"))
    assert e.value.line == 2


def test_attribute_values_with_bare_lt_and_ampersands_load_as_in_tinyxml2():
    tree = Factory().create_tree(
        '<root BTCPP_format="4">\n<BehaviorTree ID="M">\n<Sequence>\n'
        '<Script code="a := 1; b := 2"/>\n'
        '<ScriptCondition code="a<b && b > 1 &amp;&amp; a != 2"/>\n'
        '</Sequence>\n</BehaviorTree>\n</root>')
    assert tree.tick() is S


def test_text_before_the_root_and_a_late_xml_declaration_are_tolerated():
    text = ('\n  <?xml version="1.0"?>\n// clang-format off\n<root BTCPP_format="4">\n'
            '<BehaviorTree ID="M"><Inverter/></BehaviorTree></root>')
    with pytest.raises(NodeConfigError) as e:  # a real error still names its line
        Factory().load(text)
    assert e.value.line == 5


def test_xml_that_stays_malformed_names_the_line_and_the_fix():
    with pytest.raises(XMLFormatError, match=r"write < as &lt;") as e:
        Factory().load('<root BTCPP_format="4">\n<BehaviorTree ID="M">\n'
                       '<Script code="x := \'a\'/>\n</BehaviorTree>\n</root>')
    assert e.value.line is not None


@pytest.mark.parametrize(("tree_id", "problem"), [
    ("Main Tree", "forbidden character ' '"),
    ("Main.Tree", "forbidden character '.'"),
    ("Root", "reserved name"),
    ("Sequence", "ID of a registered node"),
])
def test_tree_ids_follow_bt_cpp_name_rules(tree_id, problem):
    with pytest.raises(XMLFormatError, match=problem):
        Factory().load(doc(bt(tree_id, "<AlwaysSuccess/>")))


def test_two_subtrees_with_the_same_name_in_one_tree_are_an_error():
    with pytest.raises(NodeConfigError, match="two SubTrees named 'w'"):
        Factory().load(doc(bt("Main", '<Sequence><SubTree ID="W" name="w"/>'
                                      '<SubTree ID="W" name="w"/></Sequence>'),
                           bt("W", "<AlwaysSuccess/>"), head="").replace(
            'BTCPP_format="4"', 'BTCPP_format="4" main_tree_to_execute="Main"'))


def test_attributes_that_are_not_port_names_are_ignored_but_misspelt_guards_are_not(factory,
                                                                                     probes):
    probes.action("A")
    tree = factory.create_tree(doc(bt("M", '<A _comment="kept for tools" _not_a_port="1"/>')))
    assert tree.tick() is S
    with pytest.raises(NodeConfigError, match="did you mean '_skipIf'"):
        factory.load(doc(bt("M", '<A _skipif="true"/>')))
