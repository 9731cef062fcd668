"""FlashNPC plugin: the game-script API (World, NPC, players, events)."""
