"""FlashNPC server_sync: the authoritative world server, the dialogue server, and their load tests.

One subpackage each (docs/server_sync.md, docs/protocol.md):

* :mod:`server_sync.sync` - the sync server: the sans-I/O core (:class:`SyncCore`,
  :class:`Replica`, :mod:`server_sync.sync.protocol`), :class:`SyncServer` /
  :class:`ServerConfig` (``flashnpc serve``), the asyncio :class:`Client`, :class:`Store`
  (SQLite snapshots plus journal), interest management and the world adapters;
* :mod:`server_sync.dialogue` - the dialogue server (``flashnpc serve --dialogue``) and its protocol;
* :mod:`server_sync.transport` - what both servers share: the connection gate, the WebSocket
  I/O, the wire format (:mod:`server_sync.transport.wire`), the protocol tables' building
  blocks (:mod:`server_sync.transport.schema`), :func:`issue_token` / :func:`verify_token`
  (JWTs via PyJWT), the HTTP side port, the event loop and the GC policy;
* :mod:`server_sync.schemas` - the JSON Schemas of both protocols, generated from their tables;
* :mod:`server_sync.loadtest` - the load tests (``flashnpc loadtest sync | dialogue``).

The commands are :mod:`server_sync.cli`'s. Names are imported on first use, so
``flashnpc --help`` does not load websockets.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "issue_token": "transport.auth", "verify_token": "transport.auth",
    "PROTOCOL_VERSION": "transport.wire", "ProtocolError": "transport.wire",
    "Client": "sync.client", "FatalServerError": "sync.client",
    "Session": "sync.core", "SyncCore": "sync.core",
    "Store": "sync.persistence",
    "Change": "sync.replica", "GapError": "sync.replica", "Replica": "sync.replica",
    "ServerConfig": "sync.server", "SyncServer": "sync.server",
    "SyncWorld": "sync.world", "TreeWorld": "sync.world", "sim_world": "sync.world",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'server_sync' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
