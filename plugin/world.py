"""The game-script API: a :class:`World` of NPCs driven by behavior trees, who speak.

    from plugin import World, Line

    world = World()                                    # the shipped Flash model
    world.add_npc("bram", "guard", "examples/village/guard.xml", persona=["gruff"],
                  position=(10, 4))
    world.add_player("p1", "Aria", (0, 0))
    while running:                                     # the game loop
        world.move_player("p1", player_pos)
        for event in world.update(dt):                 # never waits on the model
            if isinstance(event, Line):
                show_bubble(event.npc_id, event.text)

Each frame ``update`` advances game time, ticks the trees that are due (per-tree rate, random
phase, sleeping trees skipped: :class:`behavior_tree.TreeScheduler`), finds players entering
an NPC's approach radius (:class:`plugin.spatial.SpatialHash`), sends line requests to the
engine (:meth:`runtime.LineGenerator.submit`, or ``generate_stream`` in a worker thread when
streaming) and returns the events that became ready. This module holds the NPC and player
registry, the game-script API, proximity and the mapping of blackboards to prompts; the
requests in flight and the stale-line policy are :mod:`plugin.speech`'s. See docs/plugin.md
for the blackboard keys, the stale-line policy and deterministic mode.

In client mode (``World(mode="client")`` or :meth:`World.set_remote`) NPCs are remote: their
trees never tick here and :meth:`World.apply_remote_state` writes their state as a server
says, while proximity, lines and the stale-line policy run locally (docs/plugin.md).
"""

from __future__ import annotations

import logging
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from behavior_tree import (
    Blackboard,
    BlackboardTypeError,
    Factory,
    Tree,
    TreeDefinition,
    TreeLoadError,
    TreeScheduler,
)

from .errors import WorldError
from .events import Event, Line, StateChanged
from .spatial import SpatialHash
from .speech import Speech

if TYPE_CHECKING:
    from .speech import _Request

__all__ = ["DEFAULT_STATE_MAP", "NPC", "WORLD_KEYS", "Player", "World"]

log = logging.getLogger("flashnpc.plugin")

# Blackboard keys the world writes into every NPC's tree (inputs to the tree; never reported
# as StateChanged).
WORLD_KEYS = frozenset({
    "player_near", "hostile_near", "player_name", "is_night", "time_of_day", "weather",
    "recent_event", "last_intent",
})

# Tree vocabularies that differ from the model's states (examples/trees/ uses these).
DEFAULT_STATE_MAP: dict[str, str] = {
    "patrolling": "patrol", "resting": "rest", "sleeping": "rest", "closed": "rest",
    "trading": "working", "serving": "working", "fighting": "combat", "fleeing": "flee",
    "interrupted": "idle",
}

# blackboard key -> prompt context slot
DEFAULT_CONTEXT_KEYS: dict[str, str] = {
    "time_of_day": "time_of_day", "weather": "weather", "recent_event": "recent_event",
}

_DEFAULT_WORLD_CONTEXT = {"time_of_day": "day", "weather": "clear", "recent_event": "none"}


def _check_id(kind: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise WorldError(f"{kind} id must be a non-empty str or an int, got {value!r}")


def _check_position(where: str, position: Any) -> tuple[float, float]:
    try:
        x, y = position
        x, y = float(x), float(y)
    except (TypeError, ValueError) as exc:
        raise WorldError(f"{where}: position must be a pair of numbers (x, y), got {position!r}") from exc
    if not (math.isfinite(x) and math.isfinite(y)):
        raise WorldError(f"{where}: position must be finite, got {position!r}")
    return (x, y)


def _check_positive(where: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise WorldError(f"{where}: {name} must be a positive finite number, got {value!r}")
    return float(value)


@dataclass(eq=False)
class NPC:
    """One NPC: its tree, where it stands and its speech bookkeeping (read-only for games;
    change it through the World)."""

    id: Any
    archetype: str
    persona: tuple[str, ...]
    tree: Tree
    position: tuple[float, float]
    radius: float
    rate_hz: float
    speech_cooldown: float
    last_tick: float = 0.0  # game time of the tree's last tick
    cooldown_until: float = -math.inf
    state_version: int = 0
    remote: bool = False  # client mode: state comes from a server, the tree never ticks here
    remote_updates: int = 0  # remote writes applied (apply_remote_state)
    near: dict[Any, None] = field(default_factory=dict)  # players in the approach radius
    _unobserve: Callable[[], None] | None = None

    @property
    def blackboard(self) -> Blackboard:
        return self.tree.blackboard


@dataclass(eq=False)
class Player:
    """A player the NPCs can notice: ``name`` fills the line's ``{player}`` slot,
    ``reputation`` is the prompt's reputation context (``hostile`` ones make ``hostile_near``)."""

    id: Any
    name: str
    position: tuple[float, float]
    reputation: str = "unknown"


class World:
    """NPCs, players and the line engine, advanced by :meth:`update` once per frame.

    ``generator``: a :class:`runtime.LineGenerator` (default: ``LineGenerator.load()``, the
    shipped model). ``seed``: seeds tree phases and, in ``deterministic`` mode, every line's
    sampling seed. ``deterministic=True``: lines are generated synchronously inside
    ``update`` in a fixed order with derived seeds and no deadline, so the same calls give the
    same transcript (tests, replays); the default mode never blocks the frame.
    ``stream=True``: lines decode in a worker thread with ``generate_stream`` and arrive as
    :class:`LinePiece` events before the :class:`Line`. ``speech_cooldown``: game seconds
    before an NPC barks again at an approaching player. ``max_in_flight``: requests the engine
    may hold at once (more wait in a queue). ``deadline_ms``: engine deadline per line (an
    authored fallback answers a late line). ``tick_rate_hz``: default tree tick rate.
    ``approach_radius``: default radius. ``cell_size``: the spatial grid's cell side.
    ``state_key``: the blackboard key holding the behavior state; ``state_map`` maps tree
    state names to the model's states (merged over :data:`DEFAULT_STATE_MAP`);
    ``context_keys`` maps blackboard keys to prompt context slots. ``factory``: the
    behavior-tree factory (default: one with MoveTo, NextWaypoint, PlayAnimation registered);
    register your own nodes on ``world.factory``.

    ``mode="client"``: every NPC added is *remote* (see :meth:`set_remote`): its state comes
    from a server through :meth:`apply_remote_state` and its tree never ticks here, while
    proximity, lines and the stale-line policy run locally (docs/plugin.md, "Client mode").
    ``approach_barks=False``: players walking up to NPCs request no lines (only :meth:`talk`
    does), e.g. for a server world that runs trees only; the attribute of that name can be
    changed at any time.
    """

    def __init__(self, generator: Any = None, *, seed: int | None = None, deterministic: bool = False,
                 stream: bool = False, speech_cooldown: float = 20.0, max_in_flight: int = 8,
                 deadline_ms: float | None = 300.0, tick_rate_hz: float = 10.0,
                 approach_radius: float = 4.0, cell_size: float = 8.0, state_key: str = "state",
                 state_map: Mapping[str, str] | None = None,
                 context_keys: Mapping[str, str] | None = None, factory: Factory | None = None,
                 max_tokens: int = 48, max_regenerations: int = 2, recent_lines: int = 100,
                 mode: str = "local", approach_barks: bool = True) -> None:
        if mode not in ("local", "client"):
            raise WorldError(f"World: mode must be 'local' or 'client', got {mode!r}")
        if not isinstance(approach_barks, bool):
            raise WorldError(f"World: approach_barks must be a bool, got {approach_barks!r}")
        if not (isinstance(speech_cooldown, (int, float)) and math.isfinite(speech_cooldown)
                and speech_cooldown >= 0):
            raise WorldError(f"World: speech_cooldown must be a finite number >= 0, got {speech_cooldown!r}")
        for name, value, low in (("max_in_flight", max_in_flight, 1), ("max_tokens", max_tokens, 1),
                                 ("max_regenerations", max_regenerations, 0), ("recent_lines", recent_lines, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise WorldError(f"World: {name} must be an int >= {low}, got {value!r}")
        if deadline_ms is not None:
            _check_positive("World", "deadline_ms", deadline_ms)
        self._owns_generator = generator is None
        if generator is None:
            from runtime import LineGenerator

            generator = LineGenerator.load()
        self.generator = generator
        self.catalog: dict[str, Any] = generator.catalog()
        for name, state in (state_map or {}).items():
            if state not in self.catalog["states"]:
                raise WorldError(f"World: state_map maps {name!r} to {state!r}, which is not a model "
                                 f"state; known: {', '.join(self.catalog['states'])}")
        self.seed = seed
        self.mode = mode
        self.approach_barks = approach_barks
        self.deterministic = deterministic
        self.stream = stream
        self.speech_cooldown = float(speech_cooldown)
        self.max_in_flight = max_in_flight
        self.deadline_ms = None if deterministic else deadline_ms
        self.tick_rate_hz = _check_positive("World", "tick_rate_hz", tick_rate_hz)
        self.approach_radius = _check_positive("World", "approach_radius", approach_radius)
        self.state_key = state_key
        self.state_map = {**DEFAULT_STATE_MAP, **(state_map or {})}
        self.context_keys = dict(DEFAULT_CONTEXT_KEYS if context_keys is None else context_keys)
        self.max_tokens = max_tokens
        self.max_regenerations = max_regenerations
        if factory is None:
            from behavior_tree.generic_nodes import register_generic_nodes

            factory = register_generic_nodes(Factory())
        self.factory = factory
        self.time = 0.0
        self.frame = 0
        self.context: dict[str, str] = dict(_DEFAULT_WORLD_CONTEXT)
        self.npcs: dict[Any, NPC] = {}
        self.players: dict[Any, Player] = {}
        self.grid = SpatialHash(cell_size)
        self.scheduler = TreeScheduler(rate_hz=self.tick_rate_hz, seed=0 if seed is None else seed,
                                       on_tick=self._ticked)
        self.recent_lines: deque[Line] = deque(maxlen=recent_lines)
        self._rng = random.Random(seed)
        self._max_radius = self.approach_radius
        self._definitions: dict[str, TreeDefinition] = {}
        self._npc_of_tree: dict[Tree, NPC] = {}
        self._events: list[Event] = []
        self._callbacks: list[tuple[type, Callable[[Any], Any]]] = []
        self.counters: dict[str, int] = {
            "lines": 0, "fallbacks": 0, "requests": 0, "regenerated": 0, "dropped_stale": 0,
            "dropped_superseded": 0, "dropped_out_of_range": 0, "dropped_error": 0,
            "callback_errors": 0, "state_changes": 0, "remote_updates": 0,
        }
        self.speech = Speech(self)  # line requests queued and in flight; the stale-line policy
        self._near_npcs: dict[Any, None] = {}  # NPCs with a player in range last frame

    # ------------------------------------------------------------------ clock

    def _clock(self) -> float:
        return self.time

    # ------------------------------------------------------------------ NPCs

    def add_npc(self, npc_id: Any, archetype: str, tree: str | Path | Tree | TreeDefinition, *,
                persona: Sequence[str] | None = None, position: Sequence[float] = (0.0, 0.0),
                context: Mapping[str, Any] | None = None, radius: float | None = None,
                rate_hz: float | None = None, phase: float | None = None,
                speech_cooldown: float | None = None, remote: bool | None = None) -> NPC:
        """Add an NPC and schedule its tree; returns the :class:`NPC`.

        ``tree``: BehaviorTree.CPP v4 XML text, a path to an XML file, a
        :class:`behavior_tree.TreeDefinition`, or a :class:`behavior_tree.Tree` (used as is,
        and driven by the world's game clock from now on). ``persona``: trait tags from the
        model's catalog. ``context``: initial blackboard entries for this NPC (e.g.
        ``{"shift": "night", "location": "the market"}``; values of keys mapped to prompt
        context must be in the catalog's vocabulary; ``time_of_day``, ``weather`` and
        ``recent_event`` hold until the next :meth:`set_context` of that key). ``radius``:
        approach radius (default the world's). ``rate_hz``/``phase``: the tree's tick rate
        and phase. ``speech_cooldown``: this NPC's (default the world's). ``remote``: the NPC's
        state comes from a server and its tree never ticks here (default: True in client
        mode, False otherwise; see :meth:`set_remote`). Every argument is checked before
        anything is added: :class:`WorldError` otherwise.
        """
        where = f"add_npc({npc_id!r})"
        _check_id("NPC", npc_id)
        if npc_id in self.npcs:
            raise WorldError(f"{where}: an NPC with this id already exists")
        cat = self.catalog
        if archetype not in cat["archetypes"]:
            raise WorldError(f"{where}: unknown archetype {archetype!r}; known: {', '.join(cat['archetypes'])}")
        traits = self._check_persona(where, persona)
        pos = _check_position(where, position)
        r = self.approach_radius if radius is None else _check_positive(where, "radius", radius)
        rate = self.tick_rate_hz if rate_hz is None else _check_positive(where, "rate_hz", rate_hz)
        if speech_cooldown is not None and not (
                isinstance(speech_cooldown, (int, float)) and math.isfinite(speech_cooldown)
                and speech_cooldown >= 0):
            raise WorldError(f"{where}: speech_cooldown must be a finite number >= 0, got {speech_cooldown!r}")
        if phase is not None and not (isinstance(phase, (int, float)) and 0.0 <= phase < 1.0):
            raise WorldError(f"{where}: phase must be in [0, 1), got {phase!r}")
        if remote is not None and not isinstance(remote, bool):
            raise WorldError(f"{where}: remote must be a bool or None, got {remote!r}")
        initial = dict(context or {})
        for key, value in initial.items():
            if not isinstance(key, str) or not key:
                raise WorldError(f"{where}: context keys must be non-empty strings, got {key!r}")
            if key in WORLD_KEYS and key not in _DEFAULT_WORLD_CONTEXT:
                raise WorldError(f"{where}: {key!r} is written by the world from the players' "
                                 "positions and talk(); it cannot be set by add_npc")
            self._check_context_value(where, key, value)
        bb_values = {**self._world_entries(), self.state_key: "idle", **initial}
        t = self._make_tree(where, tree, bb_values)
        # nothing below can fail on user input
        npc = NPC(npc_id, archetype, traits, t, pos, r, rate,
                  self.speech_cooldown if speech_cooldown is None else float(speech_cooldown),
                  last_tick=self.time, remote=self.mode == "client" if remote is None else remote)
        npc._unobserve = t.blackboard.observe(
            lambda key, old, new, _npc=npc: self._on_blackboard(_npc, key, old, new))
        self.npcs[npc_id] = npc
        self._npc_of_tree[t] = npc
        self.grid.insert(npc_id, *pos)
        self._max_radius = max(self._max_radius, r)
        if not npc.remote:
            self.scheduler.add(t, rate_hz=rate, phase=phase, start=self.time)
        return npc

    def _check_persona(self, where: str, persona: Sequence[str] | None) -> tuple[str, ...]:
        if persona is None:
            return ()
        if isinstance(persona, str):
            persona = [persona]
        known = self.catalog["persona_traits"]
        for trait in persona:
            if trait not in known:
                raise WorldError(f"{where}: unknown persona trait {trait!r}; known: {', '.join(known)}")
        return tuple(persona)

    def _check_context_value(self, where: str, key: str, value: Any) -> None:
        slot = self.context_keys.get(key)
        if slot is not None:
            vocab = self.catalog["context"].get(slot, [])
            if value not in vocab:
                raise WorldError(f"{where}: {key}={value!r} is not a known {slot} value; known: "
                                 f"{', '.join(vocab)}")
        if key == self.state_key and self._model_state(value) is None:
            raise WorldError(f"{where}: {key}={value!r} is not a state the model knows; known: "
                             f"{', '.join(self.catalog['states'])} (or add it to state_map)")

    def _make_tree(self, where: str, tree: Any, values: Mapping[str, Any]) -> Tree:
        if isinstance(tree, Tree):
            if tree in self._npc_of_tree:
                raise WorldError(f"{where}: this Tree already drives another NPC")
            bb = tree.blackboard
            for k, v in values.items():
                kind = bb.type_of(k) if k in bb else None
                if kind is not None and v is not None and not isinstance(v, kind):
                    raise WorldError(f"{where}: the tree's blackboard key {k!r} holds {kind.__name__} "
                                     f"values, but the world writes {type(v).__name__} there")
            for k, v in values.items():
                if k not in bb:
                    bb.set(k, v)
            tree.clock = self._clock
            return tree
        if isinstance(tree, TreeDefinition):
            definition = tree
        elif isinstance(tree, (str, Path)):
            definition = self._load_definition(where, tree)
        else:
            raise WorldError(f"{where}: tree must be XML text, a path, a TreeDefinition or a Tree, "
                             f"got {type(tree).__name__}")
        try:
            return definition.instantiate(Blackboard.from_dict(dict(values)), clock=self._clock)
        except Exception as exc:  # e.g. a blackboard type clash with the tree's own SetBlackboard
            raise WorldError(f"{where}: cannot instantiate the tree: {exc}") from exc

    def _load_definition(self, where: str, tree: str | Path) -> TreeDefinition:
        text: str
        source: str
        if isinstance(tree, str) and tree.lstrip().startswith("<"):
            text, source = tree, f"<tree XML of {where}>"
        else:
            path = Path(tree)
            if not path.is_file():
                raise WorldError(f"{where}: tree file {str(path)!r} not found (pass XML text, "
                                 "a path, a TreeDefinition or a Tree)")
            text, source = path.read_text(encoding="utf-8"), str(path)
        definition = self._definitions.get(text)
        if definition is None:
            try:
                definition = self.factory.load(text, filename=source)
            except TreeLoadError as exc:
                raise WorldError(f"{where}: bad tree XML: {exc}") from exc
            self._definitions[text] = definition
        return definition

    def remove_npc(self, npc_id: Any) -> None:
        """Remove an NPC: its tree stops, its queued and in-flight lines are dropped silently."""
        npc = self._npc("remove_npc", npc_id)
        del self.npcs[npc_id]
        del self._npc_of_tree[npc.tree]
        self.scheduler.remove(npc.tree)
        self.grid.remove(npc_id)
        self._near_npcs.pop(npc_id, None)
        if npc._unobserve is not None:
            npc._unobserve()
        try:
            npc.tree.halt()
        except Exception:  # a user halt callback; the NPC is gone either way
            log.exception("halting the tree of removed NPC %r raised", npc_id)
        self.speech.forget_npc(npc)

    def move_npc(self, npc_id: Any, position: Sequence[float]) -> None:
        npc = self._npc("move_npc", npc_id)
        pos = _check_position(f"move_npc({npc_id!r})", position)
        npc.position = pos
        self.grid.move(npc_id, *pos)

    # ------------------------------------------------------------------ client mode

    def set_remote(self, npc_id: Any, remote: bool = True) -> None:
        """Make an NPC remote (its state is another machine's) or local again.

        A remote NPC's tree is taken off the scheduler and halted (halt callbacks run once,
        here): it never ticks in this world; its blackboard changes only through
        :meth:`apply_remote_state` (and the world's own input keys, :data:`WORLD_KEYS`, which
        this world keeps writing from its players and context). Everything else works as for a
        local NPC: proximity, approach barks, :meth:`talk`, :class:`StateChanged` events and
        the stale-line policy. A queued line request of a remote NPC waits for the next
        remote update, or two tick periods, instead of the next tick. ``remote=False``
        schedules the tree again from the current game time.
        """
        where = f"set_remote({npc_id!r})"
        npc = self._npc(where, npc_id)
        if not isinstance(remote, bool):
            raise WorldError(f"{where}: remote must be a bool, got {remote!r}")
        if remote == npc.remote:
            return
        if remote:
            self.scheduler.remove(npc.tree)
            try:  # still a local NPC here: what halt callbacks write is reported as local
                npc.tree.halt()
            except Exception:  # a user halt callback; the tree is off the scheduler either way
                log.exception("halting the tree of NPC %r (now remote) raised", npc_id)
        else:
            npc.last_tick = self.time
            self.scheduler.add(npc.tree, rate_hz=npc.rate_hz, start=self.time)
        npc.remote = remote
        self.speech.restart_waits(npc)

    def apply_remote_state(self, npc_id: Any, key: str, value: Any) -> None:
        """Write blackboard ``key`` of remote NPC ``npc_id`` as the server says.

        The write goes through the NPC's blackboard exactly like a write by its tree: a
        change is reported as :class:`StateChanged` (with ``remote=True``) on the next
        :meth:`update`, a change of the behavior state makes the NPC's lines in flight stale
        (regenerated or dropped by the policy), and keys such as ``silent`` or the free-text
        slots take effect on the next line. Writing an unchanged value does nothing but count
        as an update (``stats()['remote_updates']``). Raises :class:`WorldError` if the NPC is
        unknown or not remote, if ``key`` is not a non-empty string or is one of the world's
        own input keys (:data:`WORLD_KEYS`), or if the blackboard refuses the value's type.
        """
        where = f"apply_remote_state({npc_id!r}, {key!r})"
        npc = self._npc(where, npc_id)
        if not npc.remote:
            raise WorldError(f"{where}: NPC {npc_id!r} is local (its tree ticks here); "
                             "call set_remote first or create the world with mode='client'")
        if not isinstance(key, str) or not key:
            raise WorldError(f"{where}: key must be a non-empty string")
        if key in WORLD_KEYS:
            raise WorldError(f"{where}: {key!r} is written by this world from its players and "
                             "context; it cannot be applied from a server")
        try:
            npc.blackboard.set(key, value)
        except BlackboardTypeError as exc:  # the key's type was fixed by an earlier value
            raise WorldError(f"{where}: {exc}") from exc
        npc.remote_updates += 1
        self.counters["remote_updates"] += 1

    def _progress(self, npc: NPC) -> int:
        """What a queued request waits to see advance: tree ticks, or remote updates."""
        return npc.remote_updates if npc.remote else npc.tree.tick_count

    def _npc(self, where: str, npc_id: Any) -> NPC:
        try:
            return self.npcs[npc_id]
        except (KeyError, TypeError):
            raise WorldError(f"{where}: no NPC with id {npc_id!r}") from None

    def _player(self, where: str, player_id: Any) -> Player:
        try:
            return self.players[player_id]
        except (KeyError, TypeError):
            raise WorldError(f"{where}: no player with id {player_id!r}") from None

    # ------------------------------------------------------------------ players

    def add_player(self, player_id: Any, name: str, position: Sequence[float], *,
                   reputation: str = "unknown") -> Player:
        """Add a player; NPCs notice it from the next :meth:`update`."""
        where = f"add_player({player_id!r})"
        _check_id("player", player_id)
        if player_id in self.players:
            raise WorldError(f"{where}: a player with this id already exists")
        if not isinstance(name, str) or not name.strip():
            raise WorldError(f"{where}: name must be a non-empty string, got {name!r}")
        pos = _check_position(where, position)
        self._check_reputation(where, reputation)
        player = Player(player_id, name, pos, reputation)
        self.players[player_id] = player
        return player

    def _check_reputation(self, where: str, reputation: str) -> None:
        known = self.catalog["context"].get("reputation", [])
        if reputation not in known:
            raise WorldError(f"{where}: unknown reputation {reputation!r}; known: {', '.join(known)}")

    def move_player(self, player_id: Any, position: Sequence[float]) -> None:
        player = self._player("move_player", player_id)
        player.position = _check_position(f"move_player({player_id!r})", position)

    def set_reputation(self, player_id: Any, reputation: str) -> None:
        player = self._player("set_reputation", player_id)
        self._check_reputation(f"set_reputation({player_id!r})", reputation)
        player.reputation = reputation
        for npc in self.npcs.values():
            if player_id in npc.near:
                self._write_near(npc)

    def remove_player(self, player_id: Any) -> None:
        """Remove a player: NPCs stop seeing it; lines for it are dropped silently."""
        player = self._player("remove_player", player_id)
        del self.players[player_id]
        for npc in self.npcs.values():
            if player_id in npc.near:
                del npc.near[player_id]
                self._write_near(npc)
        self.speech.forget_player(player)

    # ------------------------------------------------------------------ world context

    def set_context(self, **values: str) -> None:
        """Set world-wide context (``time_of_day``, ``weather``, ``recent_event``): written to
        every NPC's blackboard (plus ``is_night``) and used in every prompt."""
        for key, value in values.items():
            if key not in _DEFAULT_WORLD_CONTEXT:
                raise WorldError(f"set_context: unknown key {key!r}; known: {', '.join(_DEFAULT_WORLD_CONTEXT)}")
            vocab = self.catalog["context"].get(key, [])
            if value not in vocab:
                raise WorldError(f"set_context: {key}={value!r} is not known; known: {', '.join(vocab)}")
        self.context.update(values)
        entries = self._world_entries()
        for npc in self.npcs.values():
            bb = npc.blackboard
            for key, value in entries.items():
                if key in values or key == "is_night":
                    bb.set(key, value)

    def _world_entries(self) -> dict[str, Any]:
        return {**self.context, "is_night": self.context["time_of_day"] == "night",
                "player_near": False, "hostile_near": False, "player_name": "", "last_intent": ""}

    # ------------------------------------------------------------------ talking

    def talk(self, npc_id: Any, player_id: Any, intent: str) -> int:
        """A dialogue turn chosen by the player (``greet``, ``ask_rumors``, ``trade``,
        ``threaten``, ``farewell``, ...); returns the request id its :class:`Line` will carry.

        The intent is written to the NPC's ``last_intent`` blackboard key at once, so its tree
        can react (a threatened guard turns to combat); the request is sent on the next
        :meth:`update`, after the trees ticked, so the reply conditions on the NPC's state
        then and on the intent. An ambient line of this NPC still in flight is dropped
        (``superseded``). Talking ignores the speech cooldown and restarts it.
        """
        where = f"talk({npc_id!r}, {player_id!r})"
        npc = self._npc(where, npc_id)
        player = self._player(where, player_id)
        if intent not in self.catalog["intents"]:
            raise WorldError(f"{where}: unknown intent {intent!r}; known: {', '.join(self.catalog['intents'])}")
        self.speech.supersede(npc)
        npc.cooldown_until = self.time + npc.speech_cooldown
        npc.blackboard.set("last_intent", intent)
        return self.speech.request(npc, player, intent, "talk")

    # ------------------------------------------------------------------ callbacks

    def on(self, event_type: type[Event], callback: Callable[[Any], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` for each event of ``event_type`` (a class from
        :mod:`plugin.events`; ``Event`` for all) as :meth:`update` delivers it. A callback that
        raises is logged and counted (``stats()['callback_errors']``); the world goes on.
        Returns a function that unsubscribes."""
        if not (isinstance(event_type, type) and issubclass(event_type, Event)):
            raise WorldError(f"on: event_type must be an Event class, got {event_type!r}")
        if not callable(callback):
            raise WorldError(f"on: callback must be callable, got {callback!r}")
        entry = (event_type, callback)
        self._callbacks.append(entry)

        def unsubscribe() -> None:
            if entry in self._callbacks:
                self._callbacks.remove(entry)

        return unsubscribe

    # ------------------------------------------------------------------ the frame

    def update(self, dt: float) -> list[Event]:
        """Advance game time by ``dt`` seconds and return the events ready this frame.

        Order within a frame: players entering or leaving approach radii are found (written to
        the NPCs' blackboards); trees that are due tick (their writes become
        :class:`StateChanged` events); lines that finished are delivered, stale ones dropped
        or regenerated (docs/plugin.md); queued line requests whose NPC has ticked since go
        to the engine (up to ``max_in_flight``). Only in
        deterministic mode does this wait for the model.
        """
        if isinstance(dt, bool) or not isinstance(dt, (int, float)) or not math.isfinite(dt) or dt < 0:
            raise WorldError(f"update: dt must be a finite number of seconds >= 0, got {dt!r}")
        self.time += dt
        self.frame += 1
        self._proximity()
        self.scheduler.update(self.time)
        self.speech.collect()  # first, so that finished lines free their slots for this frame's sends
        self.speech.send()
        if self.deterministic:
            self.speech.collect()  # lines generated just now, synchronously
        events, self._events = self._events, []
        if self._callbacks:
            for event in events:
                self._dispatch(event)
        return events

    def drain(self, timeout: float | None = 10.0) -> list[Event]:
        """Wait (wall clock, at most ``timeout`` s) until every queued and in-flight line is
        finished, without advancing game time; return the events. For tests, tools and the end
        of a scripted run, not for a frame."""
        from concurrent.futures import wait

        events: list[Event] = []
        speech = self.speech
        while speech.pending():
            speech.send(force=True)
            pending = [f.future for f in speech.flights if not f.future.done()]
            if pending:
                done, _ = wait(pending, timeout=timeout)
                if not done:
                    break
            speech.collect()
            batch, self._events = self._events, []
            for event in batch:
                self._dispatch(event)
            events.extend(batch)
        return events

    def _dispatch(self, event: Event) -> None:
        for event_type, callback in list(self._callbacks):
            if isinstance(event, event_type):
                try:
                    callback(event)
                except Exception:
                    self.counters["callback_errors"] += 1
                    log.exception("world callback %r raised on %r", callback, event)

    # ------------------------------------------------------------------ proximity

    def _proximity(self) -> None:
        npcs = self.npcs
        grid = self.grid
        r = self._max_radius
        now: dict[Any, dict[Any, None]] = {}
        for pid, player in self.players.items():
            px, py = player.position
            for nid in grid.candidates(px, py, r):
                npc = npcs[nid]
                nx, ny = npc.position
                dx, dy = nx - px, ny - py
                if dx * dx + dy * dy <= npc.radius * npc.radius:
                    now.setdefault(nid, {})[pid] = None
        for nid in [n for n in self._near_npcs if n not in now]:
            npc = npcs[nid]
            npc.near = {}
            self._write_near(npc)
        self._near_npcs = dict.fromkeys(now)
        for nid, players in now.items():
            npc = npcs[nid]
            if players.keys() == npc.near.keys():
                continue
            entered = [pid for pid in players if pid not in npc.near]
            npc.near = players
            self._write_near(npc)
            for pid in entered:
                self._approach(npc, self.players[pid])

    def _ticked(self, tree: Tree, status: Any) -> None:
        self._npc_of_tree[tree].last_tick = self.time

    def _write_near(self, npc: NPC) -> None:
        bb = npc.blackboard
        near = npc.near
        bb.set("player_near", bool(near))
        bb.set("hostile_near", any(self.players[p].reputation == "hostile" for p in near))
        bb.set("player_name", self.players[next(iter(near))].name if near else "")
        if not near:
            bb.set("last_intent", "")

    def _approach(self, npc: NPC, player: Player) -> None:
        if not self.approach_barks or npc.cooldown_until > self.time:
            return
        if self.speech.speaking(npc):
            return
        if npc.blackboard.get("silent", False) is True:
            return
        npc.cooldown_until = self.time + npc.speech_cooldown
        self.speech.request(npc, player, "approach", "approach")

    # ------------------------------------------------------------------ prompts

    def _model_state(self, value: Any) -> str | None:
        if not isinstance(value, str):
            return None
        if value in self.catalog["states"]:
            return value
        mapped = self.state_map.get(value)
        return mapped if mapped in self.catalog["states"] else None

    def npc_state(self, npc_id: Any) -> str:
        """The NPC's behavior state as the model knows it (``idle`` if the tree wrote a state
        the model does not know and ``state_map`` does not map)."""
        npc = self._npc("npc_state", npc_id)
        return self._state_of(npc)

    def _state_of(self, npc: NPC) -> str:
        return self._model_state(npc.blackboard.get(self.state_key, None)) or "idle"

    def _prompt(self, req: _Request) -> dict[str, Any]:
        npc = req.npc
        bb = npc.blackboard
        cat_ctx = self.catalog["context"]
        context: dict[str, str] = {}
        for key, slot in self.context_keys.items():
            value = bb.get(key, None)
            if value is not None and value in cat_ctx.get(slot, ()):
                context[slot] = value
        slots = self.catalog.get("slots", [])
        if req.player is not None:
            context["reputation"] = req.player.reputation
            if "player" in slots:
                context["player"] = req.player.name
        for slot in ("location", "item"):
            value = bb.get(slot, None)
            if slot in slots and isinstance(value, str) and value:
                context[slot] = value.replace("_", " ")
        kwargs: dict[str, Any] = {
            "persona": list(npc.persona), "intent": req.intent, "context": context,
            "max_tokens": self.max_tokens, "npc_id": npc.id,
            "player_id": None if req.player is None else req.player.id,
        }
        if self.deterministic or self.seed is not None:
            kwargs["seed"] = self._rng.getrandbits(31)
        if self.deadline_ms is not None:
            kwargs["deadline_ms"] = self.deadline_ms
        return kwargs

    # ------------------------------------------------------------------ blackboard changes

    def _on_blackboard(self, npc: NPC, key: str, old: Any, new: Any) -> None:
        if key in WORLD_KEYS or key.startswith("_"):
            return
        self.counters["state_changes"] += 1
        self._events.append(StateChanged(npc.id, key, old, new, self.time, npc.remote))
        if key != self.state_key or self._model_state(old) == self._model_state(new):
            return
        npc.state_version += 1
        self.speech.state_changed(npc)

    # ------------------------------------------------------------------ inspection

    def stats(self) -> dict[str, Any]:
        """World counters plus line latency percentiles (ms) and the prefix-cache hit rate of
        delivered lines."""
        speech = self.speech
        lines = self.counters["lines"]
        return {
            **self.counters,
            "npcs": len(self.npcs), "players": len(self.players), "time": self.time,
            "remote_npcs": sum(1 for n in self.npcs.values() if n.remote),
            "frame": self.frame, "in_flight": speech.active(), "queued": len(speech.queue),
            "tree_ticks": self.scheduler.ticks, "trees_sleeping": self.scheduler.sleeping,
            "latency_ms_p50": speech.latency_ms(50), "latency_ms_p99": speech.latency_ms(99),
            "prefix_cache_hit_rate": (speech.cache_hits / lines) if lines else None,
        }

    def close(self) -> None:
        """Stop the streaming worker (if any), and the generator if the world loaded it (one
        passed in is left open: it may be shared)."""
        self.speech.close()
        if self._owns_generator:
            self.generator.close()

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def npcs_near(self, position: Sequence[float], radius: float) -> list[Any]:
        """Ids of the NPCs within ``radius`` of ``position`` (grid query)."""
        x, y = _check_position("npcs_near", position)
        return self.grid.query(x, y, _check_positive("npcs_near", "radius", radius))

    def all_npcs(self) -> Iterable[NPC]:
        return self.npcs.values()
