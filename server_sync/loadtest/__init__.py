"""Load tests on loopback (``flashnpc loadtest``): a real server process and many real clients.

* :mod:`server_sync.loadtest.sync_loadtest` - ``flashnpc loadtest sync``: thousands of sync
  clients with churn, zero lost updates;
* :mod:`server_sync.loadtest.dialogue_loadtest` - ``flashnpc loadtest dialogue``: dialogue
  sessions against ``flashnpc serve --dialogue`` (TTFT, ITL, goodput).
"""
