"""What the sync server and the dialogue server share: everything between a socket and a message.

* :mod:`server_sync.transport.wire` - frames, codecs (msgpack / JSON), :class:`ProtocolError`
  and the limits every message shares; :mod:`server_sync.transport.schema` - the declarative
  field specs a protocol's table is made of (validators and JSON Schemas from one table);
* :mod:`server_sync.transport.ws_io` - WebSocket connections on asyncio protocols (sans-I/O
  websockets); :mod:`server_sync.transport.gate` - the per-connection gate (hello, auth,
  rate limits, slow consumers, close codes);
* :mod:`server_sync.transport.auth` - JWTs (PyJWT: HS256 with the secret, RS256 / ES256 /
  EdDSA with a public key) and the tokens revoked by ``bye``;
  :mod:`server_sync.transport.http` - the HTTP side port;
* :mod:`server_sync.transport.aio` - the event loop (uvloop where installed);
  :mod:`server_sync.transport.gc_policy` - garbage collection under thousands of connections.

It imports nothing of the servers (tests/test_layout.py checks it).
"""
