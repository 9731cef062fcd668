"""``flashnpc bt``: validate and render BehaviorTree.CPP v4 XML files, run the demo.

    flashnpc bt validate examples/trees/*.xml
    flashnpc bt render examples/trees/guard.xml --format dot --out guard.dot
    flashnpc bt demo --seed 3 --ticks 20

``validate`` and ``render`` load files with a factory that knows the built-in
nodes. Custom node IDs the file declares in ``<TreeNodesModel>`` (as Groot2
writes them) are accepted with the declared ports and checked like any other
node; custom IDs used but not declared are errors. Errors name the file, the
line and the node, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .definition import Element, TreeDefinition
from .display import render
from .errors import BehaviorTreeError, TreeLoadError, XMLFormatError
from .factory import Factory
from .node import ControlNode, DecoratorNode, TreeNode
from .ports import BidirectionalPort, InputPort, OutputPort, Port, convert_from_string
from .status import Status
from .xml_io import parse_xml

__all__ = ["add_arguments", "load_for_tools", "run", "validation_factory"]

# BT.CPP / Groot2 type names in TreeNodesModel -> Python port types (others: untyped)
_MODEL_TYPES: dict[str, type] = {
    "std::string": str,
    "string": str,
    "str": str,
    "int": int,
    "unsigned": int,
    "unsigned int": int,
    "int32_t": int,
    "int64_t": int,
    "uint32_t": int,
    "uint64_t": int,
    "long": int,
    "size_t": int,
    "double": float,
    "float": float,
    "bool": bool,
}
_PORT_KINDS: dict[str, Callable[..., Port]] = {
    "input_port": InputPort,
    "output_port": OutputPort,
    "inout_port": BidirectionalPort,
}


def _declared_only(node: TreeNode) -> Status:
    """Tick of a node known only from TreeNodesModel: it has no implementation."""
    raise RuntimeError(
        f"node {node.name!r} ({node.id}) is only declared in TreeNodesModel; "
        "register an implementation to run it"
    )


def _model_ports(model: Element) -> list[Port]:
    ports: list[Port] = []
    for element in model.children:
        if element.tag == "MetadataFields":  # BT.CPP >= 4.6 writes these for Groot2
            continue
        make = _PORT_KINDS.get(element.tag)
        name = element.attrs.get("name")
        if make is None or not name:
            raise XMLFormatError(
                f"<{element.tag}> in the model of {model.attrs.get('ID')!r}: expected "
                "input_port, output_port or inout_port with a name",
                source=model.source,
                line=element.line,
                node=model.attrs.get("ID"),
            )
        port_type = _MODEL_TYPES.get(element.attrs.get("type", "").strip())
        description = element.attrs.get("description") or getattr(element, "text", "")
        kwargs: dict[str, Any] = {"type": port_type, "description": description.strip()}
        default = element.attrs.get("default")
        if default is not None and element.tag != "output_port":
            try:
                kwargs["default"] = convert_from_string(default, port_type)
            except ValueError:
                kwargs["default"] = default  # e.g. "{key}": left for the loader to judge
        ports.append(make(name, **kwargs))
    return ports


def validation_factory(root: Element, factory: Factory | None = None) -> tuple[Factory, list[str]]:
    """A factory for ``root`` (a parsed document): ``factory`` (or a new one with
    the built-ins) plus stand-ins for the custom nodes its ``<TreeNodesModel>``
    declares and nobody registered. Returns (factory, IDs of the stand-ins).

    Stand-ins have the declared kind and ports, count as synchronous (models do
    not say whether an action may return RUNNING), and refuse to tick.
    """
    factory = Factory() if factory is None else factory
    known = factory.registered
    added: list[str] = []
    for section in root.children:
        if section.tag != "TreeNodesModel":
            continue
        for model in section.children:
            node_id = model.attrs.get("ID")
            if model.tag == "SubTree" or not node_id or node_id in known:
                continue  # the loader reports missing IDs and checks registered ones
            ports = _model_ports(model)
            if model.tag == "Action":
                factory.register_action(node_id, _declared_only, ports=ports)
            elif model.tag == "Condition":
                factory.register_condition(node_id, _declared_only, ports=ports)
            elif model.tag in ("Control", "Decorator"):
                base = ControlNode if model.tag == "Control" else DecoratorNode
                cls = type(
                    node_id,
                    (base,),
                    {"__slots__": (), "ports": tuple(ports), "tick": _declared_only},
                )
                factory.register_node(node_id, cls)
            else:
                raise XMLFormatError(
                    f"unknown model kind <{model.tag}> (expected Action, Condition, Control, "
                    "Decorator or SubTree)",
                    source=model.source,
                    line=model.line,
                    node=node_id,
                )
            added.append(node_id)
    return factory, added


def load_for_tools(path: str | Path) -> tuple[dict[str, TreeDefinition], str | None, list[str]]:
    """Load every BehaviorTree of an XML file the way ``validate`` does.

    Returns ({tree ID: definition}, main tree ID, stand-in node IDs). The main
    tree is None for a library file: several trees and no
    ``main_tree_to_execute``. Raises TreeLoadError (or OSError) for the first
    problem found.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    source = str(path)
    root = parse_xml(text, source)
    factory, stand_ins = validation_factory(root)
    tree_ids = [el.attrs.get("ID") for el in root.children if el.tag == "BehaviorTree"]
    main: str | None = None
    definitions: dict[str, TreeDefinition] = {}
    if root.attrs.get("main_tree_to_execute") or len(tree_ids) <= 1:
        definition = factory.load(text, filename=source)  # checks the document and the main tree
        main = definition.main_tree
        definitions[main] = definition
    for tree_id in tree_ids:
        if tree_id not in definitions:
            definitions[tree_id] = factory.load(text, main_tree=tree_id, filename=source)
    return definitions, main, stand_ins


# --------------------------------------------------------------------------- commands


def _validate(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            definitions, main, stand_ins = load_for_tools(path)
        except (TreeLoadError, OSError, UnicodeDecodeError) as exc:
            print(f"error: {_describe_error(exc, path)}", file=sys.stderr)
            failed += 1
            continue
        trees = ", ".join(
            f"{tree_id} ({len(definition)} nodes{', main' if tree_id == main else ''})"
            for tree_id, definition in definitions.items()
        )
        custom = f"; custom nodes from TreeNodesModel: {', '.join(stand_ins)}" if stand_ins else ""
        print(f"{path}: OK: {len(definitions)} tree(s): {trees}{custom}")
    return 1 if failed else 0


def _describe_error(exc: BaseException, path: str) -> str:
    if isinstance(exc, TreeLoadError):
        text = str(exc)  # already "file:line, node ...: problem"
        if exc.problem.startswith("unknown node ID"):
            text += " (declare custom nodes in <TreeNodesModel> to validate without them)"
        return text
    if isinstance(exc, OSError):
        return f"{path}: cannot read: {exc.strerror or exc}"
    return f"{path}: {exc}"


def _render(args: argparse.Namespace) -> int:
    try:
        definitions, main, _ = load_for_tools(args.file)
    except (TreeLoadError, OSError, UnicodeDecodeError) as exc:
        print(f"error: {_describe_error(exc, args.file)}", file=sys.stderr)
        return 1
    tree_id = args.tree or main
    if tree_id is None:
        print(
            f"error: {args.file} has several trees and no main_tree_to_execute: pick one with "
            f"--tree (have: {', '.join(definitions)})",
            file=sys.stderr,
        )
        return 1
    if tree_id not in definitions:
        print(
            f"error: {args.file}: no BehaviorTree {tree_id!r} (have: {', '.join(definitions)})",
            file=sys.stderr,
        )
        return 1
    text = render(definitions[tree_id], args.format, show_ports=args.ports)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        Path(args.out).write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"error: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} ({args.format}, {len(definitions[tree_id])} nodes)")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    if args.ticks < 1:
        print("error: --ticks must be at least 1", file=sys.stderr)
        return 1
    return run_demo(seed=args.seed, ticks=args.ticks)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``validate``, ``render`` and ``demo`` subcommands to ``parser``."""
    sub = parser.add_subparsers(dest="bt_command", metavar="SUBCOMMAND")
    sub.required = True

    validate = sub.add_parser(
        "validate",
        help="check BT.CPP v4 XML files (structure, node IDs, ports, scripts)",
        description="Load each file as the runtime would and report the first problem in each. "
        "Custom nodes declared in <TreeNodesModel> are accepted with their declared ports.",
    )
    validate.add_argument("files", nargs="+", metavar="FILE.xml")
    validate.set_defaults(_bt=_validate)

    render_parser = sub.add_parser(
        "render", help="draw a tree as Graphviz DOT or a Mermaid flowchart"
    )
    render_parser.add_argument("file", metavar="FILE.xml")
    render_parser.add_argument("--format", choices=("dot", "mermaid"), default="mermaid")
    render_parser.add_argument("--out", metavar="PATH", help="write here instead of stdout")
    render_parser.add_argument(
        "--tree", metavar="ID", help="which BehaviorTree (default: the main tree)"
    )
    render_parser.add_argument("--ports", action="store_true", help="show port values in labels")
    render_parser.set_defaults(_bt=_render)

    demo = sub.add_parser("demo", help="tick the village guard example with a scripted evening")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--ticks", type=int, default=12)
    demo.set_defaults(_bt=_demo)


def run(args: argparse.Namespace) -> int:
    try:
        return int(args._bt(args))
    except BehaviorTreeError as exc:  # anything the loaders did not already report
        print(f"error: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """``python -m behavior_tree.cli ...`` (same as ``flashnpc bt ...``)."""
    parser = argparse.ArgumentParser(prog="flashnpc bt", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
