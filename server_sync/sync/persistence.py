"""Crash-safe world persistence in SQLite (WAL mode).

Layout: ``snapshots`` (the last whole-world save), ``journal`` (one row per server tick:
the intents the tick applied and the state changes it produced, as JSON arrays) and
``players`` (the highest client sequence number applied per player, for deduplication).

The server commits once per tick, *before* it acknowledges anything: the tick's intents,
its changes and the players' new sequence numbers go in one transaction. So after
``kill -9`` every acknowledged intent is on disk together with its effects, and
:meth:`Store.recover` returns the last snapshot plus every change journaled after it.
With ``synchronous=NORMAL`` a committed transaction survives a process crash; only an OS
crash or power loss can lose the last ones (``synchronous="FULL"`` pays an fsync per tick
instead).

Every failure (the disk is full, the file is read-only or corrupt, a value SQLite cannot
store) raises :class:`StoreError` with the real cause, after the transaction was rolled back
(or SQLite rolled it back itself): the database holds exactly the ticks that committed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PLAYER_KEY", "POS_KEY", "IntentRecord", "Recovery", "Store", "StoreError"]

_FAILURES = (sqlite3.Error, ValueError, TypeError, OverflowError)


class StoreError(OSError):
    """The world database cannot be opened, read or written; the message names the cause
    (an OSError: like a file that cannot be opened, it is the storage's fault)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (id INTEGER PRIMARY KEY, created REAL NOT NULL,
    journal_upto INTEGER NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS journal (id INTEGER PRIMARY KEY AUTOINCREMENT,
    intents TEXT NOT NULL, changes TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS players (player TEXT PRIMARY KEY, cseq INTEGER NOT NULL);
"""

#: ``key`` used in the changes journal for an NPC position (value: [x, y])
POS_KEY = "@pos"
#: ``key`` used in the changes journal for a player position (``npc`` holds the player id;
#: value: [x, y], or None when the player left)
PLAYER_KEY = "@player"


@dataclass(frozen=True)
class IntentRecord:
    player: str
    cseq: int
    body: dict[str, Any]  # the intent message without 't'/'cseq'


@dataclass
class Recovery:
    """What a restarting server loads: the last snapshot (None if never saved), every
    change ``(npc, key, value)`` journaled after it in order, the intents journaled after
    it (already applied: their effects are in ``changes``) and the per-player highest
    applied ``cseq``."""

    snapshot: dict[str, Any] | None
    changes: list[tuple[str, str, Any]] = field(default_factory=list)
    intents: list[IntentRecord] = field(default_factory=list)
    player_cseq: dict[str, int] = field(default_factory=dict)


class Store:
    """One SQLite file holding a world's snapshot and journal (see the module docstring)."""

    def __init__(self, path: str | Path, *, synchronous: str = "NORMAL") -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError("synchronous must be 'NORMAL' or 'FULL'")
        self.path = Path(path)
        try:
            self.db = sqlite3.connect(str(self.path), isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            # truncate the WAL when it restarts: its file does not keep 4 MB of old pages, so a
            # full disk fails the next tick instead of after those pages are reused
            self.db.execute("PRAGMA journal_size_limit=0")
            self.db.execute(f"PRAGMA synchronous={synchronous}")
            self.db.executescript(_SCHEMA)
        except _FAILURES as exc:
            hint = "" if _writable(self.path) else " (read-only: the server journals into it)"
            raise StoreError(f"cannot open the world database {self.path}: {exc}{hint}") from None

    def _scalar(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        row = self.db.execute(sql, args).fetchone()
        return row[0] if row else None

    def close(self) -> None:
        self.db.close()

    @property
    def journal_mode(self) -> str:
        return str(self._scalar("PRAGMA journal_mode"))

    def _rollback(self) -> None:
        """Roll back the open transaction, if SQLite has not already (it does on a full
        disk): a failed ROLLBACK must not hide the error that caused it."""
        with contextlib.suppress(sqlite3.Error):  # also: a closed connection
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")

    @contextlib.contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction's error handling: anything that fails inside is rolled back;
        a database or encoding failure becomes StoreError naming ``what``."""
        try:
            yield self.db
        except _FAILURES as exc:
            self._rollback()
            raise StoreError(f"{what} failed: {exc}") from None
        except BaseException:
            self._rollback()
            raise

    def commit_tick(self, intents: Iterable[IntentRecord],
                    changes: Iterable[tuple[str, str, Any]]) -> None:
        """Journal one tick in one transaction: the intents it applied and the changes
        ``(npc, key, value)`` it produced; StoreError if it could not (nothing written)."""
        intents = list(intents)
        changes = list(changes)
        if not intents and not changes:
            return
        best: dict[str, int] = {}
        for r in intents:
            best[r.player] = max(best.get(r.player, 0), r.cseq)
        with self._write("journal write") as db:
            row = (_dumps([[r.player, r.cseq, r.body] for r in intents]), _dumps(changes))
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO journal (intents, changes) VALUES (?, ?)", row)
            if best:
                db.executemany(
                    "INSERT INTO players (player, cseq) VALUES (?, ?) ON CONFLICT(player) "
                    "DO UPDATE SET cseq = MAX(cseq, excluded.cseq)", list(best.items()))
            db.execute("COMMIT")

    def write_snapshot(self, world_state: dict[str, Any]) -> None:
        """Save the whole world and drop the journal rows it covers; StoreError if it could
        not (nothing written)."""
        with self._write("snapshot write") as db:
            data = _dumps(world_state)
            db.execute("BEGIN IMMEDIATE")
            upto = self._scalar("SELECT COALESCE(MAX(id), 0) FROM journal")
            db.execute("INSERT INTO snapshots (created, journal_upto, data) VALUES (?, ?, ?)",
                       (time.time(), upto, data))
            db.execute("DELETE FROM snapshots WHERE id < (SELECT MAX(id) FROM snapshots)")
            db.execute("DELETE FROM journal WHERE id <= ?", (upto,))
            db.execute("COMMIT")

    def recover(self) -> Recovery:
        """What a restarting server needs: see :class:`Recovery`; StoreError if the database
        cannot be read."""
        try:
            row = self.db.execute(
                "SELECT journal_upto, data FROM snapshots ORDER BY id DESC LIMIT 1").fetchone()
            upto, snap = (row[0], json.loads(row[1])) if row else (0, None)
            rec = Recovery(snap, player_cseq=dict(self.db.execute(
                "SELECT player, cseq FROM players")))
            for intents, changes in self.db.execute(
                    "SELECT intents, changes FROM journal WHERE id > ? ORDER BY id", (upto,)):
                rec.intents += [IntentRecord(p, c, b) for p, c, b in json.loads(intents)]
                rec.changes += [(n, k, v) for n, k, v in json.loads(changes)]
        except _FAILURES as exc:
            raise StoreError(f"cannot read the world database {self.path}: {exc}") from None
        return rec


_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _writable(path: Path) -> bool:
    """Whether the database file (or, before it exists, its directory) can be written."""
    return os.access(path if path.exists() else path.parent, os.W_OK)
