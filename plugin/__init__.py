"""FlashNPC plugin: the game-script API (World, NPC, players, events).

    from plugin import World, Line, StateChanged

See docs/plugin.md. Importing this package does not load a model or onnxruntime; ``World()``
does (``LineGenerator.load()``) unless given a generator.
"""

from .errors import WorldError
from .events import Event, Line, LineDropped, LinePiece, StateChanged
from .spatial import SpatialHash
from .world import NPC, Player, World

__all__ = ["NPC", "Event", "Line", "LineDropped", "LinePiece", "Player", "SpatialHash", "StateChanged",
           "World", "WorldError"]
