"""The flow of ARCHITECTURE.md, checked on every import statement of the packages (ast).

Every ``import`` and ``from ... import`` counts, wherever it stands: at the top of a module, in a
function (a lazy import is still a dependency: the packaged client and a game install without
the extras break on it) or under ``if TYPE_CHECKING``. Relative imports are resolved.

* behavior_tree imports nothing of ours;
* runtime never imports plugin, server_sync, mobile_export or behavior_tree;
* the client engine (``runtime.client`` and the shared ``runtime`` modules it uses) imports only
  the standard library, numpy, onnxruntime and prometheus_client, and of ours only itself and
  the shared modules: never the model factory, serving, torch, onnx or PyYAML (one exception:
  the bundle signature check imports ``cryptography``, an extra, only when a game sets a key);
* server_sync's shared transport imports none of its servers, load tests, plugin or runtime; the
  sync server and the dialogue server do not import each other; nothing in server_sync imports
  mobile_export or does model math (torch);
* plugin uses the runtime through its public API (``from runtime import ...``) and imports
  neither server_sync nor mobile_export;
* mobile_export imports neither plugin nor server_sync, and what its packaged client runs
  (``mobile_export.client_main`` and all it imports) is client engine only.
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = ("behavior_tree", "runtime", "plugin", "server_sync", "mobile_export")
# the runtime modules every part may use: the client engine's closure
SHARED = ("runtime", "runtime.tokenizer", "runtime.paths")
CLIENT_THIRD_PARTY = {"numpy", "onnxruntime", "prometheus_client"}
# extras a client module imports lazily, only when a game asks for the feature
CLIENT_OPTIONAL = {"runtime.client.signature": {"cryptography"}}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    found = {}
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "assets" not in path.relative_to(ROOT).parts:
                found[module_name(path)] = path
    return found


@cache
def imports(module: str) -> tuple[tuple[str, int], ...]:
    """(imported module, line) for every import statement of ``module``; ``from X import y``
    counts as X, and as X.y when that is one of our modules."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            out.append((target, node.lineno))
            for alias in node.names:
                if f"{target}.{alias.name}" in modules():
                    out.append((f"{target}.{alias.name}", node.lineno))
    return tuple(out)


def within(name: str, prefixes: tuple[str, ...] | set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def client_engine(name: str) -> bool:
    """A module of the client engine, or a shared runtime module (the package itself counts)."""
    return within(name, ("runtime.client",)) or name in SHARED


def offending(sources: tuple[str, ...] | None, banned: tuple[str, ...]) -> list[str]:
    """Import statements of the modules under ``sources`` (None: the client engine's) that
    name a module under ``banned``."""
    return [f"{modules()[m].relative_to(ROOT)}:{line} imports {target}"
            for m in modules() if (client_engine(m) if sources is None else within(m, sources))
            for target, line in imports(m) if within(target, banned)]


def closure(start: str) -> set[str]:
    """Our modules ``start`` reaches through any chain of imports (packages' __init__ included)."""
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m in seen or m not in modules():
            continue
        seen.add(m)
        parts = m.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parents are imported first
        todo += [t for t, _ in imports(m) if t in modules()]
    return seen


def test_the_packages_are_where_the_architecture_says():
    assert set(SHARED) <= set(modules())
    for sub in ("runtime.client", "runtime.serving", "runtime.factory", "server_sync.sync",
                "server_sync.dialogue", "server_sync.transport", "server_sync.loadtest"):
        assert sub in modules(), sub
    for package in ("runtime", "server_sync", "mobile_export", "plugin", "behavior_tree"):
        assert f"{package}.cli" in modules(), f"{package} keeps its subcommands in {package}/cli.py"
    leftovers = [m for m in modules() if m.endswith("_cli")]
    assert not leftovers, f"subcommands belong in their package's cli.py: {leftovers}"


@pytest.mark.parametrize(("sources", "banned"), [
    pytest.param(("behavior_tree",), ("runtime", "plugin", "server_sync", "mobile_export"), id="behavior_tree"),
    pytest.param(("runtime",), ("plugin", "server_sync", "mobile_export", "behavior_tree"), id="runtime"),
    pytest.param(None, ("runtime.factory", "runtime.serving", "runtime.cli", "torch", "onnx", "yaml", "tqdm"),
                 id="client-engine"),
    pytest.param(("server_sync.transport",), ("server_sync.sync", "server_sync.dialogue", "server_sync.loadtest",
                                              "server_sync.cli", "plugin", "runtime"), id="transport"),
    pytest.param(("server_sync.sync",), ("server_sync.dialogue", "server_sync.loadtest", "server_sync.cli"),
                 id="sync-server"),
    pytest.param(("server_sync.dialogue",), ("server_sync.sync", "server_sync.loadtest", "server_sync.cli"),
                 id="dialogue-server"),
    pytest.param(("server_sync",), ("mobile_export", "torch"), id="server_sync"),
    pytest.param(("plugin",), ("server_sync", "mobile_export"), id="plugin"),
    pytest.param(("mobile_export",), ("plugin", "server_sync"), id="mobile_export"),
])
def test_no_import_runs_against_the_flow(sources, banned):
    assert offending(sources, banned) == []


def test_the_client_engine_needs_numpy_onnxruntime_and_prometheus_client_only():
    outside = [f"{modules()[m].relative_to(ROOT)}:{line} imports {target}"
               for m in modules() if client_engine(m)
               for target, line in imports(m)
               if target.split(".")[0] not in sys.stdlib_module_names
               and target.split(".")[0] not in CLIENT_THIRD_PARTY
               and target.split(".")[0] not in CLIENT_OPTIONAL.get(m, ())
               and not client_engine(target)]
    assert outside == []


def test_plugin_uses_the_runtime_through_its_public_api():
    deep = [f"{modules()[m].relative_to(ROOT)}:{line} imports {target}"
            for m in modules() if within(m, ("plugin",))
            for target, line in imports(m) if within(target, ("runtime",)) and target != "runtime"]
    assert deep == []


def test_the_packaged_client_runs_client_engine_code_only():
    reached = closure("mobile_export.client_main")
    runtime = {m for m in reached if within(m, ("runtime",))}
    assert "runtime.client.generator" in runtime
    assert {m for m in runtime if not client_engine(m)} == set()
    assert {m for m in reached if within(m, ("mobile_export",))} == {"mobile_export", "mobile_export.client_main"}
