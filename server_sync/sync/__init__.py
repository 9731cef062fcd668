"""The sync server: an authoritative world whose NPC state changes reach every client in range.

* sans-I/O: :mod:`server_sync.sync.protocol` (the messages), :mod:`server_sync.sync.core`
  (:class:`SyncCore`: sessions, interest, coalesced deltas, resume, journaling, failing
  closed), :mod:`server_sync.sync.authority` (which intents are applied),
  :mod:`server_sync.sync.replica` (a client's copy), :mod:`server_sync.sync.interest` (the
  spatial grid), :mod:`server_sync.sync.world` (what a synced world is; the simulated one);
* I/O: :mod:`server_sync.sync.server` (:class:`SyncServer`, ``flashnpc serve``),
  :mod:`server_sync.sync.client` (:class:`Client`), :mod:`server_sync.sync.persistence`
  (SQLite snapshots plus journal), :mod:`server_sync.sync.http_port` (/health, /metrics, admin);
* :mod:`server_sync.sync.plugin_world` / :mod:`server_sync.sync.plugin_client` - a
  ``plugin.World`` served, and mirrored in a client.
"""
