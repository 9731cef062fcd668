"""FlashNPC server_sync: authoritative world server, protocol and clients."""
