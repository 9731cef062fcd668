"""The dialogue front: nginx as the WebSocket load balancer of several ``flashnpc serve
--dialogue`` workers, and the health watcher that open-source nginx lacks.

What is rendered here (:func:`render_conf`, an ``http``-level snippet for ``conf.d/``):

* one ``upstream`` with every worker, balanced by ``hash $flashnpc_dialogue_key consistent``:
  the key is the ``session`` query argument of the WebSocket URL
  (``ws://front:8080/?session=KEY``). A dialogue session lives on the connection that opened
  it, so a client keeps one connection per affinity key (the key of the session, or of a
  player's group of sessions), and every connection with that key reaches the same worker,
  where its prefix cache lives. A URL without a key is spread at random (``$request_id``).
  Consistent hashing (ketama) means adding or removing a worker moves only about 1/N of the
  keys; the others keep their worker and its warm cache.
* passive health: ``max_fails`` failed connects within ``fail_timeout`` take a worker out for
  ``fail_timeout``; a connection that cannot reach its worker is passed to the next one on the
  hash ring (``proxy_next_upstream error timeout``), so a client re-opening after its worker
  died lands on a live one.
* WebSocket proxying: HTTP/1.1 upstream, ``Upgrade`` / ``Connection`` headers, no buffering,
  and read/send timeouts longer than the dialogue server's 20 s keepalive ping (an idle
  connection is not cut).

Why a watcher (:class:`HealthWatcher`, ``flashnpc serve --front``): open-source nginx has no
active health checks (``health_check`` is NGINX Plus), and a worker whose circuit breaker is
open still accepts connections, so passive checks never take it out. The watcher polls every
worker's ``/health``; when one answers 503 (``degraded``) or cannot be reached ``fall`` times in
a row it rewrites the upstream with that worker marked ``down`` and runs ``nginx -s reload``;
after ``rise`` good answers it puts it back the same way. ``down`` (rather than removing the
line) keeps the worker's points on the hash ring, so only its own keys move. When every worker
is unhealthy none is marked down: nginx's passive checks still skip dead ones, and a degraded
worker answers with authored fallback lines, which beats a 502 for every client. A reload
leaves open connections where they are (nginx's old worker processes keep them); new
connections follow the new upstream.

:class:`Nginx` runs a private nginx (tests, ``serve --front --run-nginx DIR``) with every path
inside its prefix directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["AFFINITY_ARG", "FrontConfig", "HealthWatcher", "Nginx", "NginxError", "Worker",
           "find_nginx", "parse_listen", "parse_workers", "reload_command", "render_conf",
           "render_main_conf", "run_front", "write_atomic"]

log = logging.getLogger("flashnpc.server_sync.front")

#: the query argument of the WebSocket URL that carries the affinity key
AFFINITY_ARG = "session"
UPSTREAM = "flashnpc_dialogue"


class NginxError(RuntimeError):
    """nginx refused a configuration or did not start; the message has its error output."""


@dataclass(frozen=True)
class Worker:
    """One ``flashnpc serve --dialogue`` worker: its WebSocket address (what nginx proxies to)
    and its HTTP side port (``/health``, ``/metrics``; what the watcher polls)."""

    host: str
    port: int
    http_port: int

    @property
    def address(self) -> str:
        """``host:port`` of the WebSocket listener, as nginx's ``server`` line names it."""
        return f"{self.host}:{self.port}"

    @property
    def health_url(self) -> str:
        return f"http://{self.host}:{self.http_port}/health"


def parse_workers(spec: str | Sequence[str]) -> list[Worker]:
    """Workers from ``HOST:PORT:HTTP_PORT[,HOST:PORT:HTTP_PORT...]`` (a string or a list of
    items). ValueError naming the bad item; duplicates are refused."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    workers: list[Worker] = []
    for raw in items:
        item = raw.strip()
        host, _, ports = item.partition(":")
        ws, _, http = ports.partition(":")
        try:
            worker = Worker(host, int(ws), int(http))
        except ValueError:
            raise ValueError(f"--workers {item!r}: expected HOST:PORT:HTTP_PORT "
                             f"(e.g. 127.0.0.1:8767:8768)") from None
        if not host or not (0 < worker.port < 65536 and 0 < worker.http_port < 65536):
            raise ValueError(f"--workers {item!r}: need a host and ports 1..65535")
        if any(w.address == worker.address for w in workers):
            raise ValueError(f"--workers {item!r}: {worker.address} is listed twice")
        workers.append(worker)
    if not workers:
        raise ValueError("--workers: name at least one worker")
    return workers


def parse_listen(spec: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``PORT``: 127.0.0.1) for nginx's ``listen``; ValueError if malformed."""
    host, _, port = spec.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"--front-listen {spec!r}: expected HOST:PORT, e.g. 0.0.0.0:8080") from None
    if not 0 < number < 65536:
        raise ValueError(f"--front-listen {spec!r}: port must be 1..65535")
    return host or "127.0.0.1", number


@dataclass
class FrontConfig:
    """What the rendered nginx configuration says (see the module docstring)."""

    workers: list[Worker]
    listen: tuple[str, int] = ("127.0.0.1", 8080)
    max_fails: int = 1
    fail_timeout_s: int = 5
    connect_timeout_s: int = 2
    # longer than the dialogue server's keepalive ping (20 s): idle connections stay
    idle_timeout_s: int = 75
    next_upstream_tries: int = 0  # 0: try every worker on the ring before giving up

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError("FrontConfig: needs at least one worker")
        if self.max_fails < 1 or self.fail_timeout_s < 1 or self.connect_timeout_s < 1:
            raise ValueError("FrontConfig: max_fails, fail_timeout_s and connect_timeout_s must be >= 1")
        if self.idle_timeout_s <= 20:
            raise ValueError(f"FrontConfig: idle_timeout_s must exceed the dialogue server's 20 s "
                             f"keepalive ping, got {self.idle_timeout_s}")


def render_conf(config: FrontConfig, down: frozenset[str] | set[str] = frozenset()) -> str:
    """The ``http``-level nginx snippet for ``config`` (``conf.d/flashnpc-dialogue.conf``), the
    workers whose ``address`` is in ``down`` marked ``down``."""
    unknown = set(down) - {w.address for w in config.workers}
    if unknown:
        raise ValueError(f"render_conf: down names workers not in the config: {sorted(unknown)}")
    servers = "\n".join(
        f"    server {w.address} max_fails={config.max_fails} fail_timeout={config.fail_timeout_s}s"
        f"{' down' if w.address in down else ''};  # health: {w.health_url}"
        for w in config.workers)
    host, port = config.listen
    return f"""\
# FlashNPC dialogue front: nginx in front of `flashnpc serve --dialogue` workers.
# Rendered by server_sync.dialogue.front (flashnpc serve --front); the health watcher rewrites
# the `down` marks and reloads nginx. See docs/dialogue_front.md.

# affinity key: the `{AFFINITY_ARG}` query argument (ws://front/?{AFFINITY_ARG}=KEY); none: random
map $arg_{AFFINITY_ARG} $flashnpc_dialogue_key {{
    ""      $request_id;
    default $arg_{AFFINITY_ARG};
}}

map $http_upgrade $flashnpc_dialogue_connection {{
    default upgrade;
    ""      close;
}}

upstream {UPSTREAM} {{
    hash $flashnpc_dialogue_key consistent;
{servers}
}}

server {{
    listen {host}:{port};

    location / {{
        proxy_pass http://{UPSTREAM};
        proxy_http_version 1.1;
        proxy_set_header Upgrade $http_upgrade;
        proxy_set_header Connection $flashnpc_dialogue_connection;
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_buffering off;
        proxy_connect_timeout {config.connect_timeout_s}s;
        proxy_read_timeout {config.idle_timeout_s}s;
        proxy_send_timeout {config.idle_timeout_s}s;
        proxy_next_upstream error timeout;
        proxy_next_upstream_tries {config.next_upstream_tries};
    }}
}}
"""


def render_main_conf(prefix: Path, include: Path) -> str:
    """A whole ``nginx.conf`` for a private nginx whose logs and temp files are inside
    ``prefix``, including the snippet ``include`` (the pid file comes with ``-g``, see
    :class:`Nginx`). As root its workers run as root (the prefix may sit in a directory other
    users cannot enter)."""
    p = prefix.resolve()
    user = "user root root;\n" if os.geteuid() == 0 else ""
    temps = "\n".join(f"    {name}_temp_path {p / (name + '_temp')};"
                      for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""\
{user}worker_processes 1;
error_log {p / 'error.log'} warn;

events {{
    worker_connections 4096;
}}

http {{
    access_log {p / 'access.log'};
{temps}
    include {include.resolve()};
}}
"""


def find_nginx(binary: str | None = None) -> str | None:
    """The nginx executable: ``binary`` if given, else ``nginx`` on PATH or /usr/sbin/nginx."""
    if binary:
        return shutil.which(binary)
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (nginx never reads half)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class Nginx:
    """A private nginx process: ``nginx -p PREFIX -c PREFIX/nginx.conf -g 'daemon off; ...'``,
    its snippet in ``PREFIX/flashnpc-dialogue.conf`` (or ``conf``), logs and pid inside PREFIX.

    :meth:`start` validates the configuration (``nginx -t``) and waits until nginx listens;
    :meth:`reload` is ``nginx -s reload`` for this instance; :meth:`stop` ends it (SIGTERM, then
    SIGKILL). NginxError carries nginx's own error output."""

    def __init__(self, prefix: Path, *, binary: str | None = None, conf: Path | None = None) -> None:
        found = find_nginx(binary)
        if found is None:
            raise NginxError(f"nginx not found ({binary or 'nginx'}); on Debian: apt-get install nginx")
        self.binary = found
        self.prefix = prefix.resolve()
        self.conf = (conf or self.prefix / "flashnpc-dialogue.conf").resolve()
        self.main_conf = self.prefix / "nginx.conf"
        self.proc: subprocess.Popen[bytes] | None = None

    def _cmd(self, *extra: str, foreground: bool = False) -> list[str]:
        g = f"pid {self.prefix / 'nginx.pid'};" + (" daemon off;" if foreground else "")
        return [self.binary, "-p", str(self.prefix), "-c", str(self.main_conf), "-g", g, *extra]

    def _check(self) -> None:
        r = subprocess.run(self._cmd("-t"), capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise NginxError(f"nginx -t refused {self.conf}: {r.stderr.strip()}")

    def start(self, snippet: str, listen: tuple[str, int], timeout_s: float = 10.0) -> None:
        """Write ``snippet`` and the main configuration, check them, start nginx and wait until
        ``listen`` accepts connections."""
        import socket

        self.prefix.mkdir(parents=True, exist_ok=True)
        write_atomic(self.conf, snippet)
        write_atomic(self.main_conf, render_main_conf(self.prefix, self.conf))
        self._check()
        self.proc = subprocess.Popen(self._cmd(foreground=True), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise NginxError(f"nginx exited with {self.proc.returncode}: {err.strip()}")
            with contextlib.suppress(OSError), socket.create_connection(listen, timeout=0.5):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise NginxError(f"nginx did not listen on {listen[0]}:{listen[1]} within {timeout_s:g} s")
            time.sleep(0.05)  # a child process starting: nothing to await on

    def reload(self) -> None:
        """``nginx -s reload`` for this instance, after ``nginx -t`` (a refused configuration
        raises NginxError and the running one stays)."""
        self._check()
        r = subprocess.run(self._cmd("-s", "reload"), capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise NginxError(f"nginx -s reload failed: {r.stderr.strip()}")

    def workers_pids(self) -> set[int]:
        """The pids of the master's worker processes (a reload replaces them)."""
        if self.proc is None:
            return set()
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        return {int(p) for p in out.stdout.split()}

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # fast shutdown: master and workers exit
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def __enter__(self) -> Nginx:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def reload_command(cmd: str) -> Callable[[], None]:
    """A reload callable that runs the shell-style ``cmd`` (e.g. ``nginx -s reload`` or
    ``systemctl reload nginx``); NginxError with its output if it fails."""
    argv = shlex.split(cmd)
    if not argv:
        raise ValueError("--nginx-reload: empty command")

    def run() -> None:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise NginxError(f"{cmd!r} failed ({r.returncode}): {r.stderr.strip()}")

    return run


@dataclass
class _State:
    up: bool = True
    streak: int = 0           # consecutive polls disagreeing with ``up``
    last: str = "unknown"     # the last poll's outcome: "ready", "degraded (503)", "unreachable: ..."


@dataclass
class HealthWatcher:
    """Poll every worker's ``/health`` every ``interval_s``; take a worker out after ``fall``
    bad polls in a row (503, another status, or no answer within ``timeout_s``) and put it back
    after ``rise`` good ones (200), each time writing :func:`render_conf` to ``conf_path`` and
    calling ``reload`` (see the module docstring for the all-down rule). Workers start up.

    ``reload`` is a callable run in a thread (``Nginx.reload``, or :func:`reload_command`); if
    it fails the watcher logs it and tries again at the next poll. ``on_change(down)`` hears
    every new set of workers marked down."""

    config: FrontConfig
    conf_path: Path
    reload: Callable[[], None]
    interval_s: float = 1.0
    timeout_s: float = 1.0
    fall: int = 1
    rise: int = 2
    on_change: Callable[[frozenset[str]], None] | None = None
    states: dict[str, _State] = field(default_factory=dict)
    applied: frozenset[str] | None = None  # the down set nginx last reloaded with
    reloads: int = 0

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.timeout_s <= 0 or self.fall < 1 or self.rise < 1:
            raise ValueError("HealthWatcher: need interval_s > 0, timeout_s > 0, fall >= 1, rise >= 1")
        self.states = {w.address: _State() for w in self.config.workers}

    @property
    def down(self) -> frozenset[str]:
        """The workers to mark down now: the unhealthy ones, unless that is every worker."""
        bad = frozenset(a for a, s in self.states.items() if not s.up)
        return frozenset() if len(bad) == len(self.states) else bad

    async def _poll(self, session: Any, worker: Worker) -> bool:
        import aiohttp

        st = self.states[worker.address]
        try:
            async with session.get(worker.health_url) as r:
                ok = r.status == 200
                st.last = "ready" if ok else f"degraded ({r.status})"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            ok, st.last = False, f"unreachable: {type(exc).__name__}"
        return ok

    async def poll_once(self, session: Any) -> bool:
        """One round over every worker (concurrently); rewrites and reloads when the down set
        changed (or the last reload failed). Returns whether nginx was reloaded."""
        results = await asyncio.gather(*[self._poll(session, w) for w in self.config.workers])
        for worker, ok in zip(self.config.workers, results, strict=True):
            st = self.states[worker.address]
            if ok == st.up:
                st.streak = 0
                continue
            st.streak += 1
            if st.streak >= (self.rise if ok else self.fall):
                st.up, st.streak = ok, 0
                log.warning("dialogue front: worker %s %s (%s)", worker.address,
                            "back in" if ok else "taken out", st.last)
        down = self.down
        if down == self.applied:
            return False
        write_atomic(self.conf_path, render_conf(self.config, down))
        try:
            await asyncio.to_thread(self.reload)
        except Exception as exc:  # keep polling; the next round tries again
            log.error("dialogue front: reload failed: %s", exc)
            return False
        self.applied = down
        self.reloads += 1
        if self.on_change is not None:
            self.on_change(down)
        return True

    async def run(self, stop: Awaitable[Any] | None = None) -> None:
        """Poll until cancelled (or until ``stop`` completes)."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        stopper = asyncio.ensure_future(stop) if stop is not None else None
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                while stopper is None or not stopper.done():
                    t0 = time.monotonic()
                    await self.poll_once(session)
                    wait = max(0.0, self.interval_s - (time.monotonic() - t0))
                    if stopper is None:
                        await asyncio.sleep(wait)
                    else:
                        await asyncio.wait([stopper], timeout=wait)
        finally:
            if stopper is not None and not stopper.done():
                stopper.cancel()

    def snapshot(self) -> dict[str, Any]:
        """Every worker's state, for logs and the CLI: ``{address: {up, last}}`` plus ``down``."""
        return {"workers": {a: {"up": s.up, "last": s.last} for a, s in self.states.items()},
                "down": sorted(self.down), "reloads": self.reloads}


async def run_front(config: FrontConfig, *, conf_path: Path | None = None,
                    nginx_prefix: Path | None = None, reload_cmd: str = "nginx -s reload",
                    interval_s: float = 1.0, timeout_s: float = 1.0, fall: int = 1, rise: int = 2,
                    ready: Callable[[], None] | None = None,
                    stop: asyncio.Event | None = None) -> None:
    """``flashnpc serve --front``: write the configuration, then watch the workers until
    ``stop`` is set. With ``nginx_prefix`` a private :class:`Nginx` is started there (and
    stopped at the end) and reloaded directly; otherwise ``conf_path`` is written for the
    system's nginx and ``reload_cmd`` reloads it (it runs once at the start, so nginx picks the
    file up). ``ready()`` is called once nginx has the configuration."""
    nginx: Nginx | None = None
    if nginx_prefix is not None:
        nginx = Nginx(nginx_prefix, conf=conf_path)
        await asyncio.to_thread(nginx.start, render_conf(config), config.listen)
        path, reload = nginx.conf, nginx.reload
    else:
        if conf_path is None:
            raise ValueError("run_front: need conf_path (the file the system's nginx includes) "
                             "or nginx_prefix")
        path, reload = conf_path, reload_command(reload_cmd)
    watcher = HealthWatcher(config, path, reload, interval_s=interval_s, timeout_s=timeout_s,
                            fall=fall, rise=rise)
    try:
        if nginx is None:
            write_atomic(path, render_conf(config))
            await asyncio.to_thread(reload)
            watcher.applied = frozenset()
        if ready is not None:
            ready()
        await watcher.run(stop.wait() if stop is not None else None)
    finally:
        if nginx is not None:
            await asyncio.to_thread(nginx.stop)
