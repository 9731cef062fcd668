"""FlashNPC server_sync: authoritative world server, protocol and clients.

* :class:`SyncServer` / :class:`ServerConfig` - the asyncio server (``flashnpc serve``);
* :class:`Client` - the asyncio client keeping a replica of the NPCs in range;
* :class:`SyncCore`, :class:`Replica` and :mod:`server_sync.protocol` - the sans-I/O core;
* :class:`Store` - SQLite (WAL) snapshots plus journal;
* :func:`issue_token` / :func:`verify_token` - HMAC-signed expiring tokens.

Names are imported on first use, so ``flashnpc --help`` does not load websockets.
See docs/server_sync.md and docs/protocol.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "issue_token": "auth", "verify_token": "auth",
    "Client": "client", "FatalServerError": "client",
    "Session": "core", "SyncCore": "core",
    "Store": "persistence",
    "PROTOCOL_VERSION": "protocol", "ProtocolError": "protocol",
    "Change": "replica", "GapError": "replica", "Replica": "replica",
    "ServerConfig": "server", "SyncServer": "server",
    "SyncWorld": "world", "TreeWorld": "world", "sim_world": "world",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'server_sync' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
