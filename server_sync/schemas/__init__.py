"""JSON Schemas (draft 2020-12) of every message of both protocols, shipped as files here.

They are generated from the tables the validators run (:data:`server_sync.sync.protocol.SYNC`,
:data:`server_sync.dialogue.dialogue_protocol.DIALOGUE`), never written by hand: one file per
protocol and direction, ``<protocol>_<client|server>.json``, each a ``oneOf`` over one
``$defs`` entry per message type. Regenerate after changing a table::

    python -m server_sync.schemas            # rewrites the files next to this module
    flashnpc serve --print-schemas           # prints them all as one JSON object

(a test fails while the shipped files differ from the tables).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA_DIR", "all_schemas", "load_schema", "schema_files", "write_schemas"]

SCHEMA_DIR = Path(__file__).resolve().parent


def _protocols() -> list[Any]:
    from ..dialogue.dialogue_protocol import DIALOGUE
    from ..sync.protocol import SYNC

    return [SYNC, DIALOGUE]


def all_schemas() -> dict[str, dict[str, Any]]:
    """``{"<protocol>_<direction>": schema}`` for both protocols and directions."""
    return {f"{p.name}_{d}": p.json_schema(d) for p in _protocols() for d in ("client", "server")}


def schema_files() -> dict[str, str]:
    """File name -> text of every shipped schema file, as :func:`write_schemas` writes it."""
    return {f"{name}.json": json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
            for name, schema in all_schemas().items()}


def write_schemas(directory: str | Path = SCHEMA_DIR) -> list[Path]:
    """Write every schema file into ``directory``; returns the paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in schema_files().items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def load_schema(protocol: str, direction: str) -> dict[str, Any]:
    """A shipped schema file, parsed (``protocol``: sync | dialogue; ``direction``: client |
    server)."""
    return json.loads((SCHEMA_DIR / f"{protocol}_{direction}.json").read_text(encoding="utf-8"))
