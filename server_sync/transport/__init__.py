"""What the sync server and the dialogue server share: everything between a socket and a message.

* :mod:`server_sync.transport.wire` - frames, codecs (msgpack / JSON), :class:`ProtocolError`
  and the schema checks' building blocks;
* :mod:`server_sync.transport.ws_io` - WebSocket connections on asyncio protocols (sans-I/O
  websockets); :mod:`server_sync.transport.gate` - the per-connection gate (hello, auth,
  rate limits, slow consumers, close codes);
* :mod:`server_sync.transport.auth` - HMAC-signed expiring tokens;
  :mod:`server_sync.transport.http` - the HTTP side port;
* :mod:`server_sync.transport.aio` - the event loop (uvloop where installed);
  :mod:`server_sync.transport.gc_policy` - garbage collection under thousands of connections.

It imports nothing of the servers (tests/test_layout.py checks it).
"""
