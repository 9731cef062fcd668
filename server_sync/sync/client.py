"""``server_sync.Client``: the asyncio game client of the sync protocol.

    client = Client("ws://127.0.0.1:8765", token, position=(10, 20), on_change=print)
    task = asyncio.create_task(client.run())      # connects, reconnects, resumes
    await client.synced.wait()                    # first snapshot applied
    await client.send_intent(pos=(12, 20))        # acknowledged once durable on the server
    ...
    await client.close()

The client keeps ``client.replica`` (NPCs in range, see :class:`~server_sync.sync.replica.Replica`)
and calls ``on_change(change)`` for every :class:`~server_sync.sync.replica.Change`. When the
connection drops it reconnects with exponential backoff and full jitter, sends
``resume: {epoch, seq}`` so the server replays missed deltas (or sends a snapshot), and
re-sends every intent not yet acknowledged (the server ignores ones it already applied).
``url`` may be a list of nodes of one cluster (docs/scale_out.md): the client connects to the
first and, whenever a connection fails before it syncs, tries the next.
A delta out of order triggers a ``resync`` request. An intent the server refused (a
server-authority rule, docs/protocol.md) is counted in ``refused`` by rule and passed to
``on_refused(msg)``; where the server says the player stands (a snapshot, an admin move, a
refused move) becomes ``position`` unless a move of the client's is still unacknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake

from ..transport.wire import PROTOCOL_VERSION, Codec, ProtocolError, encode
from ..transport.ws_io import WsClientConnection, ws_connect
from .protocol import decode_server
from .replica import Change, GapError, Replica

__all__ = ["Client", "FatalServerError"]

#: error codes after which reconnecting cannot help
FATAL_CODES = frozenset({"auth_failed", "unsupported_version", "replaced"})


class FatalServerError(Exception):
    """The server refused this client for good (bad token, wrong version, replaced)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


class Client:
    """One player's connection; see the module docstring.

    ``token`` is a token string or a callable returning a fresh one (called per connect,
    so expiring tokens can be renewed). ``on_message(msg, nbytes)`` sees every decoded
    server message (load tests measure with it). Messages are handled synchronously as
    they arrive (:mod:`server_sync.transport.ws_io`), so callbacks must not block.
    """

    def __init__(self, url: str | Sequence[str], token: str | Callable[[], str], *,
                 position: tuple[float, float] | None = None, codec: Codec = "msgpack",
                 on_change: Callable[[Change], None] | None = None,
                 on_message: Callable[[dict[str, Any], int], None] | None = None,
                 on_refused: Callable[[dict[str, Any]], None] | None = None,
                 backoff_initial_s: float = 0.2, backoff_max_s: float = 10.0,
                 seed: int | None = None, open_timeout_s: float = 10.0) -> None:
        self.urls = [url] if isinstance(url, str) else list(url)
        if not self.urls:
            raise ValueError("Client needs a url (or a list of node urls)")
        self.url = self.urls[0]  # the node of the next connection
        self._token = token
        self.position = position
        self.codec: Codec = codec
        self.on_change = on_change
        self.on_message = on_message
        self.on_refused = on_refused
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.open_timeout_s = open_timeout_s
        self._rng = random.Random(seed)
        self.replica = Replica()
        self.synced = asyncio.Event()  # set while the replica is in sync with the server
        self.cseq = 0                  # last intent sequence number used
        self.acked = 0                 # highest intent seq the server acknowledged
        self._unacked: dict[int, dict[str, Any]] = {}
        self._ws: WsClientConnection | None = None
        self._closing = False
        self._awaiting_snapshot = False
        self._got_snapshot = False
        self._acked_event = asyncio.Event()
        # counters
        self.connects = 0
        self.gaps = 0
        self.bytes_in = 0
        self.frames_in = 0
        self.refused: Counter[str] = Counter()
        self.last_error: tuple[str, str] | None = None

    @property
    def connected(self) -> bool:
        return self._ws is not None

    def _token_now(self) -> str:
        return self._token() if callable(self._token) else self._token

    async def _send(self, msg: dict[str, Any]) -> None:
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(ConnectionClosed):
                ws.send(encode(msg, self.codec))

    # ---- intents -------------------------------------------------------------------------
    async def send_intent(self, *, pos: tuple[float, float] | None = None,
                          talk: tuple[str, str] | None = None) -> int:
        """Send a move (``pos``) and/or a dialogue choice (``talk=(npc_id, intent)``).
        Returns its sequence number; it is re-sent after reconnects until acknowledged."""
        if pos is None and talk is None:
            raise ValueError("send_intent needs pos or talk")
        self.cseq += 1
        msg: dict[str, Any] = {"t": "intent", "cseq": self.cseq}
        if pos is not None:
            msg["pos"] = [float(pos[0]), float(pos[1])]
            self.position = (float(pos[0]), float(pos[1]))
        if talk is not None:
            msg["talk"] = {"npc": talk[0], "intent": talk[1]}
        self._unacked[self.cseq] = msg
        await self._send(msg)
        return self.cseq

    async def wait_acked(self, cseq: int | None = None) -> None:
        """Wait until intent ``cseq`` (default: the last sent) is acknowledged."""
        target = self.cseq if cseq is None else cseq
        while self.acked < target:
            self._acked_event.clear()
            await self._acked_event.wait()

    @property
    def pending_intents(self) -> int:
        return len(self._unacked)

    # ---- connection loop -----------------------------------------------------------------
    async def run(self) -> None:
        """Connect and stay connected until :meth:`close` (or a fatal server error)."""
        attempt = 0
        while not self._closing:
            self._got_snapshot = False
            with contextlib.suppress(OSError, ConnectionClosed, InvalidHandshake,
                                     asyncio.TimeoutError, ProtocolError):
                await self._session()  # returns or raises when the connection ends
            if self._closing:
                break
            if self._got_snapshot:
                attempt = 0  # the last connection worked: start the backoff over
            elif self.url in self.urls:  # this node failed us: try the next one
                self.url = self.urls[(self.urls.index(self.url) + 1) % len(self.urls)]
            delay = self._rng.uniform(0, min(self.backoff_max_s,
                                             self.backoff_initial_s * 2 ** attempt))
            attempt += 1
            await asyncio.sleep(delay)

    async def _session(self) -> None:
        ws = await ws_connect(self.url, self._on_frame, open_timeout_s=self.open_timeout_s)
        try:
            hello: dict[str, Any] = {"t": "hello", "v": PROTOCOL_VERSION,
                                     "token": self._token_now()}
            resume = self.replica.resume_token()
            if resume is not None:
                hello["resume"] = resume
            if self.position is not None:
                hello["pos"] = [float(self.position[0]), float(self.position[1])]
            ws.send(encode(hello, self.codec))
            # the server handles messages in order: these come after the hello is accepted
            for msg in list(self._unacked.values()):
                ws.send(encode(msg, self.codec))
            self._ws = ws
            self.connects += 1
            await ws.wait_closed()  # raises what _on_frame raised (FatalServerError)
        finally:
            ws.abort()
            self._ws = None
            self.synced.clear()

    def _on_frame(self, frame: bytes | str) -> None:
        self.frames_in += 1
        self.bytes_in += len(frame)
        msg, _ = decode_server(frame)
        if self.on_message is not None:
            self.on_message(msg, len(frame))
        t = msg["t"]
        if t == "delta" and "ack" in msg:
            self._on_ack(msg["ack"])
        if t == "snapshot" or t == "delta":
            try:
                changes = self.replica.apply(msg)
            except GapError:
                if not self._awaiting_snapshot:
                    self.gaps += 1
                    self._awaiting_snapshot = True
                    self.synced.clear()
                    asyncio.get_running_loop().create_task(
                        self._send({"t": "resync", "seq": self.replica.seq}))
                return
            self._got_snapshot = True
            if t == "snapshot":
                self._awaiting_snapshot = False
            if t == "snapshot" or "pos" in msg:
                self._server_moved(self.replica.player_pos)
            self.synced.set()
            if self.on_change is not None:
                for ch in changes:
                    self.on_change(ch)
        elif t == "ack":
            if self.replica.synced and not self._awaiting_snapshot:
                self._got_snapshot = True
                self.synced.set()  # the answer to a resume with nothing to replay
            self._on_ack(msg["cseq"])
        elif t == "refused":
            self.refused[msg["rule"]] += 1
            self._unacked.pop(msg["cseq"], None)  # processed: its ack follows
            if "pos" in msg:
                self._server_moved(msg["pos"])
            if self.on_refused is not None:
                self.on_refused(msg)
        elif t == "error":
            self.last_error = (msg["code"], msg["reason"])
            if msg["code"] in FATAL_CODES:
                raise FatalServerError(msg["code"], msg["reason"])
        elif t == "bye":
            self.last_error = ("bye", msg.get("reason", ""))

    def _server_moved(self, pos: list[float] | None) -> None:
        if pos is not None and not any("pos" in m for m in self._unacked.values()):
            self.position = (float(pos[0]), float(pos[1]))

    def _on_ack(self, cseq: int) -> None:
        if cseq > self.acked:
            self.acked = cseq
            for k in [k for k in self._unacked if k <= cseq]:
                del self._unacked[k]
            self._acked_event.set()

    async def drop_connection(self) -> None:
        """Close the socket without saying bye (the client will reconnect and resume);
        load tests use it to simulate a network drop."""
        if self._ws is not None:
            self._ws.abort()

    async def close(self) -> None:
        """Say bye (the server forgets the session) and stop reconnecting."""
        self._closing = True
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(ConnectionClosed):
                ws.send(encode({"t": "bye"}, self.codec))
                ws.close()
            with contextlib.suppress(Exception):
                await ws.wait_closed()
