"""The sync server's HTTP side port (aiohttp): /health, /metrics, the admin hooks and, for a
``plugin.World``, the plugin's live inspector (``/`` and ``/api/...``); served with
:func:`server_sync.transport.http.serve_app`."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..transport.http import serve_app

if TYPE_CHECKING:
    from .server import SyncServer

__all__ = ["start_http"]

_CONTENT_TYPE = "text/plain; version=0.0.4"


class _Collector:
    """Reads the server's counters at scrape time (nothing to update on the hot path)."""

    def __init__(self, server: SyncServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        srv, core = self.server, self.server.core
        g = GaugeMetricFamily
        c = CounterMetricFamily
        yield g("flashnpc_sync_clients", "connected WebSocket clients", value=len(srv.conns))
        yield g("flashnpc_sync_sessions", "sessions (connected or in their resume grace)",
                value=len(core.sessions))
        yield from srv.tick_duration.collect()
        for name, doc, value in (
            ("ticks", "server ticks", core.ticks),
            ("tick_overruns", "ticks that started late", srv.tick_overruns),
            ("state_changes", "synced NPC state changes", core.changes_total),
            ("deltas", "delta messages built", core.deltas_total),
            ("snapshots", "snapshot messages built", core.snapshots_total),
            ("resumes", "reconnects resumed by replaying deltas", core.replays_total),
            ("intents", "intents applied", core.intents_total),
            ("duplicate_intents", "intents received again (not re-applied)",
             core.duplicate_intents_total),
            ("sent_frames", "frames sent", srv.frames_out),
            ("sent_bytes", "payload bytes sent", srv.bytes_out),
            ("connections", "connections accepted", srv.connections_total),
        ):
            yield c(f"flashnpc_sync_{name}", doc, value=value)
        errors = c("flashnpc_sync_errors", "connections refused or closed, by error code",
                   labels=["code"])
        for code, n in sorted(srv.errors.items()):
            errors.add_metric([code], n)
        yield errors


def _tick_ms(server: SyncServer, clear: bool) -> dict[str, Any]:
    ticks = sorted(server.tick_history)
    if clear:
        server.tick_history.clear()
    if not ticks:
        return {"n": 0}

    def pct(q: float) -> float:
        return 1000.0 * ticks[min(len(ticks) - 1, int(q / 100.0 * len(ticks)))]

    return {"n": len(ticks), "p50": pct(50), "p99": pct(99), "max": 1000.0 * ticks[-1]}


def _stats(server: SyncServer, clear_ticks: bool = False) -> dict[str, Any]:
    core = server.core
    return {"tick_ms": _tick_ms(server, clear_ticks),"clients": len(server.conns), "sessions": len(core.sessions),
            "ticks": core.ticks, "tick_overruns": server.tick_overruns,
            "tick_seconds": server.tick_seconds, "state_changes": core.changes_total,
            "deltas": core.deltas_total, "snapshots": core.snapshots_total,
            "resumes": core.replays_total, "intents": core.intents_total,
            "duplicate_intents": core.duplicate_intents_total, "frames_out": server.frames_out,
            "bytes_out": server.bytes_out, "connections": server.connections_total,
            "errors": dict(server.errors), "frozen": core.frozen, "epoch": core.epoch,
            "gc_full": server.gc.stats()}


def _mount_inspector(app: web.Application, server: SyncServer) -> None:
    """Serve plugin's live inspector (page ``/`` and ``/api/...``) when the world is a
    ``plugin.World``; the server's own ``/metrics`` keeps its path."""
    from .plugin_world import PluginWorld

    world = server.core.world
    if not isinstance(world, PluginWorld):
        return
    from plugin.inspector import make_app

    for route in make_app(world.world).router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if path and path != "/metrics" and route.method in ("GET", "POST"):
            app.router.add_route(route.method, path, route.handler)


async def start_http(server: SyncServer, host: str, port: int) -> tuple[web.AppRunner, int]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(server))  # type: ignore[arg-type]
    admin = server.config.admin_token

    def authorized(request: web.Request) -> bool:
        got = request.headers.get("Authorization", "")
        return admin is not None and hmac.compare_digest(got, f"Bearer {admin}")

    async def health(_: web.Request) -> web.Response:
        h = server.health()
        return web.json_response(h, status=200 if h["status"] == "ready" else 503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain",
                            charset="utf-8", headers={"X-Format": _CONTENT_TYPE})

    async def stats(request: web.Request) -> web.Response:
        if not authorized(request):
            raise web.HTTPForbidden(text="admin token required")
        return web.json_response(_stats(server, request.query.get("clear_ticks") == "1"))

    async def areas(request: web.Request) -> web.Response:
        if not authorized(request):
            raise web.HTTPForbidden(text="admin token required")
        return web.json_response(server.core.areas())

    async def freeze(request: web.Request) -> web.Response:
        if not authorized(request):
            raise web.HTTPForbidden(text="admin token required")
        server.core.frozen = request.query.get("on", "1") != "0"
        return web.json_response({"frozen": server.core.frozen})

    app = web.Application()
    _mount_inspector(app, server)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/stats", stats)
    app.router.add_get("/admin/areas", areas)
    app.router.add_post("/admin/freeze", freeze)
    return await serve_app(app, host, port)
