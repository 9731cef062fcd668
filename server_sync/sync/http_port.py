"""The sync server's HTTP side port (aiohttp), served with :func:`server_sync.transport.http.serve_app`.

Open: ``/health`` (200 ``ready`` or 503 ``degraded`` with reasons) and ``/metrics``.

Admin (``Authorization: Bearer <admin token>``; 401 without the right token, 403 when the
server has no admin token; docs/protocol.md lists the response formats):

* ``GET /admin/stats`` - counters; ``GET /admin/areas[?player=ID]`` - what each client should
  hold (``{player: {seq, player_pos, npcs}}``); ``POST /admin/freeze[?on=0]`` - stop (resume)
  the world's trees so replicas can be compared; ``POST /admin/teleport?player=ID&x=X&y=Y`` -
  an admin move (the only way past the speed rule);
* for a ``plugin.World``, the plugin's live inspector (``/`` and ``/api/...``): it shows every
  player and NPC, so it is admin-only too. A browser opens ``/?token=<admin token>`` once,
  which sets an HttpOnly, SameSite=Strict cookie its later requests carry.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..transport.http import serve_app

if TYPE_CHECKING:
    from .server import SyncServer

__all__ = ["start_http"]

_CONTENT_TYPE = "text/plain; version=0.0.4"
_COOKIE = "flashnpc_admin"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
        yield g("flashnpc_sync_journal_available", "1 while the journal can be written, else 0",
                value=0 if core.unavailable is not None else 1)
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
            ("refused_intents", "intents refused by a server-authority rule", core.refused_total),
            ("journal_outages", "times the journal could not be written (clients refused)",
             core.outages_total),
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
        yield from srv.extra_metrics()


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
    return {"tick_ms": _tick_ms(server, clear_ticks), "clients": len(server.conns),
            "sessions": len(core.sessions),
            "ticks": core.ticks, "tick_overruns": server.tick_overruns,
            "tick_seconds": server.tick_seconds, "state_changes": core.changes_total,
            "deltas": core.deltas_total, "snapshots": core.snapshots_total,
            "resumes": core.replays_total, "intents": core.intents_total,
            "duplicate_intents": core.duplicate_intents_total,
            "refused_intents": core.refused_total, "outages": core.outages_total,
            "unavailable": core.unavailable, "frames_out": server.frames_out,
            "bytes_out": server.bytes_out, "connections": server.connections_total,
            "errors": dict(server.errors), "frozen": core.frozen, "epoch": core.epoch,
            "gc_full": server.gc.stats()}


class _Admin:
    """The admin token check: constant-time, on bytes (a header may hold any characters)."""

    def __init__(self, token: str | None) -> None:
        self.token = None if token is None else token.encode()

    def _matches(self, given: str) -> bool:
        assert self.token is not None
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self.token)

    def check(self, request: web.Request) -> None:
        """Raise 403 without an admin token configured, 401 unless the request carries it
        (bearer header, or the inspector's cookie)."""
        if self.token is None:
            raise web.HTTPForbidden(text="the server has no admin token (FLASHNPC_ADMIN_TOKEN)")
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme == "Bearer" and self._matches(given):
            return
        cookie = request.cookies.get(_COOKIE)
        if cookie is not None and self._matches(cookie):
            return
        raise web.HTTPUnauthorized(text="admin token required",
                                   headers={"WWW-Authenticate": 'Bearer realm="flashnpc"'})

    def guard(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            self.check(request)
            return await handler(request)
        return guarded


def _mount_inspector(app: web.Application, server: SyncServer, admin: _Admin) -> None:
    """Serve plugin's live inspector (page ``/`` and ``/api/...``), admin-only, when the
    world is a ``plugin.World``; the server's own ``/metrics`` keeps its path."""
    from .plugin_world import PluginWorld

    world = server.core.world
    if not isinstance(world, PluginWorld):
        return
    from plugin.inspector import make_app

    for route in make_app(world.world).router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if not path or path == "/metrics" or route.method not in ("GET", "POST"):
            continue
        handler = _page_login(admin, route.handler) if path == "/" else admin.guard(route.handler)
        app.router.add_route(route.method, path, handler)


def _page_login(admin: _Admin, page: Handler) -> Handler:
    """The inspector page, admin-only; ``/?token=<admin token>`` sets the cookie the page's
    own requests then carry, and redirects to ``/``."""
    async def entry(request: web.Request) -> web.StreamResponse:
        token = request.query.get("token")
        if token is not None and admin.token is not None and admin._matches(token):
            redirect = web.HTTPSeeOther("/")
            redirect.set_cookie(_COOKIE, token, httponly=True, samesite="Strict")
            raise redirect
        admin.check(request)
        return await page(request)

    return entry


async def start_http(server: SyncServer, host: str, port: int) -> tuple[web.AppRunner, int]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(server))  # type: ignore[arg-type]
    admin = _Admin(server.config.admin_token)

    async def health(_: web.Request) -> web.Response:
        h = server.health()
        return web.json_response(h, status=200 if h["status"] == "ready" else 503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain",
                            charset="utf-8", headers={"X-Format": _CONTENT_TYPE})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(_stats(server, request.query.get("clear_ticks") == "1"))

    async def areas(request: web.Request) -> web.Response:
        player = request.query.get("player")
        return web.json_response(server.core.areas(None if player is None else [player]))

    async def freeze(request: web.Request) -> web.Response:
        server.core.frozen = request.query.get("on", "1") != "0"
        return web.json_response({"frozen": server.core.frozen})

    async def teleport(request: web.Request) -> web.Response:
        q = request.query
        try:
            player, x, y = q["player"], float(q["x"]), float(q["y"])
            server.core.teleport(player, (x, y))
        except (KeyError, ValueError) as exc:
            raise web.HTTPBadRequest(text=f"teleport needs player, x and y inside the world: "
                                          f"{exc}") from None
        return web.json_response({"player": player, "pos": [x, y]})

    app = web.Application()
    _mount_inspector(app, server, admin)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/stats", admin.guard(stats))
    app.router.add_get("/admin/areas", admin.guard(areas))
    app.router.add_post("/admin/freeze", admin.guard(freeze))
    app.router.add_post("/admin/teleport", admin.guard(teleport))
    return await serve_app(app, host, port)
