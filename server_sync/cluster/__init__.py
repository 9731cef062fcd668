"""Scale-out: several ``flashnpc serve --redis URL`` nodes share one world through Redis.

* :mod:`server_sync.cluster.keys` - every Redis key of a world, and the areas of the map;
* :mod:`server_sync.cluster.leases` - area ownership: leases, fencing tokens, node liveness;
* :mod:`server_sync.cluster.backplane` - the Lua scripts: each tick's fenced commit, the
  fenced checkpoints, the poll of the change and intent streams, the durable view;
* :mod:`server_sync.cluster.cluster_world` - :class:`ClusterWorld`, the
  :class:`~server_sync.sync.world.SyncWorld` a node serves: owned NPCs are simulated, every
  other NPC mirrors the change stream;
* :mod:`server_sync.cluster.store` - :class:`RedisStore`, the durability contract of the
  SQLite :class:`~server_sync.sync.persistence.Store` on Redis;
* :mod:`server_sync.cluster.node` - :class:`ClusterCore` / :class:`ClusterServer`, one node.

``redis`` (redis-py) is imported only here, so single-node serving does not need it.
docs/scale_out.md describes the deployment and the guarantees.
"""
