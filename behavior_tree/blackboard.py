"""The blackboard: typed key/value entries shared by the nodes of a tree.

* A key's type is fixed by its first write of a non-None value (or by
  :meth:`Blackboard.declare`); later writes must fit: strings convert as XML
  literals do, ints widen to float, anything else raises
  :class:`BlackboardTypeError`. ``None`` may be written to any key.
* A SubTree gets its own blackboard whose ``parent`` is the caller's. Keys reach
  the parent only through explicit remapping (``remap={"inner": "outer"}``) or,
  with ``autoremap=True``, by name for every key not starting with ``_``
  (keys starting with ``_`` are private to their blackboard). ``@key`` always
  means ``key`` on the root blackboard.
* Observers registered with :meth:`Blackboard.observe` receive
  ``(key, old, new)`` after every write that changes a value owned by that
  blackboard (``old`` is None for a new key).
* :meth:`snapshot` / :meth:`restore` (and the JSON forms) save and load the
  entries owned by one blackboard.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .errors import BlackboardError, BlackboardTypeError
from .ports import coerce, type_from_name, type_name
from .status import Status

__all__ = ["Blackboard", "Observer"]

Observer = Callable[[str, Any, Any], None]


class _Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()
_MISSING: Any = object()


class Entry:
    """One key's storage. Remapped keys share the owner's Entry object."""

    __slots__ = ("key", "owner", "removed", "seq", "type", "value", "waiters")

    def __init__(self, key: str, owner: Blackboard) -> None:
        self.key = key
        self.owner = owner
        self.value: Any = _UNSET
        self.type: type | None = None
        self.seq = 0  # bumped by every write, equal or not (BT.CPP's sequence_id)
        self.removed = False  # unset(): the key no longer exists (until written again)
        # objects with a ``wake()`` method waiting for this entry to change (sleeping trees)
        self.waiters: set[Any] | None = None


class Blackboard:
    """Key/value storage for one tree (or one SubTree), see the module docstring."""

    __slots__ = ("__weakref__", "_entries", "_observers", "_reads", "_remap", "autoremap", "parent")

    def __init__(
        self,
        parent: Blackboard | None = None,
        *,
        remap: Mapping[str, str] | None = None,
        autoremap: bool = False,
    ) -> None:
        self.parent = parent
        self._remap: dict[str, str] = dict(remap or {})
        self.autoremap = autoremap
        if (self._remap or autoremap) and parent is None:
            raise ValueError("remap/autoremap need a parent blackboard")
        self._entries: dict[str, Entry] = {}
        self._observers: list[Observer] = []
        # Sleep tracking (set by Tree.track_reads): a log with ``entries`` (every Entry read
        # through this blackboard) and ``dirty`` (one of them was written since).
        self._reads: Any = None

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Blackboard:
        bb = cls()
        for k, v in values.items():
            bb.set(k, v)
        return bb

    # ---- resolution ---------------------------------------------------------------
    @property
    def root(self) -> Blackboard:
        bb = self
        while bb.parent is not None:
            bb = bb.parent
        return bb

    def _lookup(self, key: str) -> Entry | None:
        """The entry ``key`` names from here, following @/remapping; cached when found."""
        e = self._entries.get(key)
        if e is not None:
            return e
        if key[:1] == "@":
            e = self.root._lookup(key[1:])
        elif self.parent is not None:
            target = self._remap.get(key)
            if target is not None:
                e = self.parent._lookup(target)
            elif self.autoremap and key[:1] != "_":
                e = self.parent._lookup(key)
        if e is not None:
            self._entries[key] = e
        return e

    def _create(self, key: str) -> Entry:
        """Create ``key`` where it belongs (root for @, parent when remapped)."""
        if key[:1] == "@":
            e = self.root._entry_for_write(key[1:])
        elif self.parent is not None and key in self._remap:
            e = self.parent._entry_for_write(self._remap[key])
        elif self.parent is not None and self.autoremap and key[:1] != "_":
            e = self.parent._entry_for_write(key)
        else:
            e = Entry(key, self)
        self._entries[key] = e
        return e

    def _entry_for_write(self, key: str) -> Entry:
        e = self._entries.get(key)
        if e is None:
            e = self._lookup(key) or self._create(key)
        return e

    # ---- reading -------------------------------------------------------------------
    def get(self, key: str, default: Any = _MISSING) -> Any:
        """The value of ``key``; ``default`` if given and the key is missing, else KeyError."""
        e = self._entries.get(key)
        if e is None:
            e = self._lookup(key)
            if e is None:
                if self._reads is None:
                    if default is _MISSING:
                        raise BlackboardError(f"blackboard has no key {key!r}")
                    return default
                # a sleeping tree must wake when this key appears
                e = self._create(key)
        if self._reads is not None:
            self._reads.entries.add(e)
        v = e.value
        if v is _UNSET:
            if default is _MISSING:
                raise BlackboardError(f"blackboard has no key {key!r}")
            return default
        return v

    def __getitem__(self, key: str) -> Any:
        return self.get(key)

    def __setitem__(self, key: str, value: Any) -> None:
        self.set(key, value)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        e = self._lookup(key)
        return e is not None and e.value is not _UNSET

    def type_of(self, key: str) -> type | None:
        """The type ``key`` is fixed to (None: not fixed yet, or missing)."""
        e = self._lookup(key)
        return None if e is None else e.type

    def keys(self) -> list[str]:
        """Keys owned by this blackboard (not the parent's), in insertion order."""
        return [k for k, e in self._entries.items()
                if e.owner is self and e.key == k and e.value is not _UNSET]

    def items(self) -> Iterator[tuple[str, Any]]:
        for k in self.keys():
            yield k, self._entries[k].value

    def as_dict(self) -> dict[str, Any]:
        return dict(self.items())

    # ---- writing -------------------------------------------------------------------
    def declare(self, key: str, type: type | None) -> None:
        """Fix ``key``'s type before it has a value (or check that it already matches)."""
        e = self._entry_for_write(key)
        if e.type is None:
            if e.value is not _UNSET and e.value is not None and type is not None:
                e.value = self._fit(e, e.value, type)
            e.type = type
        elif type is not None and e.type is not type:
            raise BlackboardTypeError(
                f"blackboard key {key!r} is {type_name(e.type)}, cannot declare it {type_name(type)}"
            )

    def set_local(self, key: str, value: Any) -> None:
        """Write ``key`` in this blackboard itself, whatever the remapping (a SubTree's
        literal port: each instance keeps its own value, the caller's is untouched)."""
        e = self._entries.get(key)
        if e is None or e.owner is not self:
            self._entries[key] = Entry(key, self)
        self.set(key, value)

    def update_count(self, key: str) -> int | None:
        """How many times ``key`` was written (None while it has no value): the
        WasEntryUpdated / SkipUnlessUpdated / WaitValueUpdate nodes compare it."""
        e = self._lookup(key)
        if e is None or e.value is _UNSET:
            return None
        if self._reads is not None:
            self._reads.entries.add(e)
        return e.seq

    def has_entry(self, key: str) -> bool:
        """Whether ``key`` exists from here, even without a value yet (BT.CPP creates the
        entry of every ``{key}`` port when the tree is built)."""
        e = self._lookup(key)
        return e is not None and not e.removed

    def set(self, key: str, value: Any) -> None:
        """Write ``key`` (creating it where it belongs) and notify on change."""
        e = self._entries.get(key)
        if e is None:
            e = self._lookup(key) or self._create(key)
        t = e.type
        if t is None:
            if value is not None:
                e.type = value.__class__
        elif value.__class__ is not t and value is not None:
            value = self._fit(e, value, t)
        old = e.value
        e.value = value
        e.seq += 1
        if old is value:
            return
        e.removed = False
        reads = self._reads
        if reads is not None and e in reads.entries:
            reads.dirty = True
        try:
            if old == value:
                return
        except Exception:  # e.g. numpy arrays: treat as changed
            pass
        waiters = e.waiters
        if waiters:
            e.waiters = None
            for w in waiters:
                w.wake()
        observers = e.owner._observers
        if observers:
            if old is _UNSET:
                old = None
            for cb in tuple(observers):
                cb(e.key, old, value)

    @staticmethod
    def _fit(e: Entry, value: Any, t: type) -> Any:
        try:
            return coerce(value, t)
        except (TypeError, ValueError):
            raise BlackboardTypeError(
                f"blackboard key {e.key!r} holds {type_name(t)}; cannot store {value!r} "
                f"({type(value).__name__})"
            ) from None

    def unset(self, key: str) -> None:
        """Remove ``key`` (its fixed type stays, for when it is written again); ``has_entry``
        is then False, as after BT.CPP's ``unset``. Observers see new=None."""
        e = self._lookup(key)
        if e is None:
            return
        if e.value is _UNSET:
            e.removed = True
            return
        old = e.value
        e.value = _UNSET
        e.removed = True
        e.seq += 1
        if e.waiters:
            waiters, e.waiters = e.waiters, None
            for w in waiters:
                w.wake()
        for cb in tuple(e.owner._observers):
            cb(e.key, old, None)

    # ---- observers -----------------------------------------------------------------
    def observe(self, callback: Observer) -> Callable[[], None]:
        """Call ``callback(key, old, new)`` on every change of a key this blackboard owns.

        Returns a function that unsubscribes the callback.
        """
        self._observers.append(callback)

        def unsubscribe() -> None:
            if callback in self._observers:
                self._observers.remove(callback)

        return unsubscribe

    # ---- snapshots -----------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """JSON-compatible copy of the entries this blackboard owns (values and types)."""
        entries: dict[str, Any] = {}
        for key in self.keys():
            e = self._entries[key]
            value = e.value
            if isinstance(value, Status):
                value = value.name
            elif value is not None and not isinstance(value, (bool, int, float, str, list, dict)):
                raise BlackboardTypeError(
                    f"blackboard key {key!r} holds a {type(value).__name__}, which has no JSON form"
                )
            entries[key] = {"type": type_name(e.type), "value": value}
        return {"version": 1, "entries": entries}

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """Write back a :meth:`snapshot` (observers are notified of each change)."""
        if snapshot.get("version") != 1 or not isinstance(snapshot.get("entries"), Mapping):
            raise ValueError("not a blackboard snapshot (expected version 1 with 'entries')")
        for key, item in snapshot["entries"].items():
            t = type_from_name(item["type"])
            value = item["value"]
            if t is Status and isinstance(value, str):
                value = Status.parse(value)
            e = self._entry_for_write(key)
            if e.type is None and t is not None:
                e.type = t
            self.set(key, value)

    def to_json(self) -> str:
        return json.dumps(self.snapshot(), sort_keys=True)

    def restore_json(self, text: str) -> None:
        self.restore(json.loads(text))

    def __repr__(self) -> str:
        return f"Blackboard({self.as_dict()!r})"
