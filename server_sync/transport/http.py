"""Serving an aiohttp application on a side port, for both servers' /health and /metrics
(the sync server's routes: :mod:`server_sync.sync.http_port`; the dialogue server's:
:mod:`server_sync.dialogue.dialogue_server`)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

__all__ = ["serve_app"]


async def serve_app(app: Any, host: str, port: int) -> tuple[Any, int]:
    """Start the aiohttp ``app`` on ``host:port`` (0: any free port); (runner, bound port)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, bound
