"""Crash-safe world persistence in SQLite (WAL mode).

Layout: ``snapshots`` (whole-world saves), ``intents`` (every intent the server accepted,
in arrival order), ``changes`` (every synced state change), ``players`` (the highest
client sequence number applied per player) and ``meta`` (``applied_upto``: the last intent
id whose effects are in ``changes``).

The server commits once per tick, *before* it acknowledges anything: the tick's new
intents, the state changes the tick produced and the new ``applied_upto`` go in one
transaction. So after ``kill -9`` every acknowledged intent is on disk, and
:meth:`Store.recover` returns the last snapshot, the changes journaled after it, and the
intents whose effects were not yet journaled (to re-apply). With ``synchronous=NORMAL`` a
committed transaction survives a process crash; only an OS crash or power loss can lose
the last ones (pass ``synchronous="FULL"`` to pay an fsync per tick instead).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PLAYER_KEY", "POS_KEY", "IntentRecord", "Recovery", "Store"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (id INTEGER PRIMARY KEY, created REAL NOT NULL,
    change_upto INTEGER NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS intents (id INTEGER PRIMARY KEY, player TEXT NOT NULL,
    cseq INTEGER NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS changes (id INTEGER PRIMARY KEY AUTOINCREMENT, npc TEXT NOT NULL,
    key TEXT NOT NULL, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS players (player TEXT PRIMARY KEY, cseq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
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
    snapshot: dict[str, Any] | None
    changes: list[tuple[str, str, Any]] = field(default_factory=list)
    unapplied: list[IntentRecord] = field(default_factory=list)
    player_cseq: dict[str, int] = field(default_factory=dict)


class Store:
    """One SQLite file holding a world's snapshots and journal (see the module docstring)."""

    def __init__(self, path: str | Path, *, synchronous: str = "NORMAL") -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError("synchronous must be 'NORMAL' or 'FULL'")
        self.path = Path(path)
        self.db = sqlite3.connect(str(self.path), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.executescript(_SCHEMA)
        # intent ids keep growing across snapshots (which delete applied intents)
        self._last_intent_id = max(
            self._scalar("SELECT MAX(id) FROM intents") or 0,
            self._scalar("SELECT value FROM meta WHERE name = 'applied_upto'") or 0)

    def _scalar(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        row = self.db.execute(sql, args).fetchone()
        return row[0] if row else None

    def close(self) -> None:
        self.db.close()

    @property
    def journal_mode(self) -> str:
        return str(self._scalar("PRAGMA journal_mode"))

    def commit_tick(self, intents: Iterable[IntentRecord],
                    changes: Iterable[tuple[str, str, Any]]) -> None:
        """Journal a tick in one transaction: its accepted intents and the state changes it
        produced. Every intent journaled so far counts as applied afterwards
        (``applied_upto`` moves to the last one), so call it once the tick applied them."""
        intents = list(intents)
        db = self.db
        db.execute("BEGIN")
        try:
            if intents:
                first = self._last_intent_id + 1
                db.executemany(
                    "INSERT INTO intents (id, player, cseq, body) VALUES (?, ?, ?, ?)",
                    [(first + k, r.player, r.cseq, json.dumps(r.body))
                     for k, r in enumerate(intents)])
                best: dict[str, int] = {}
                for r in intents:
                    best[r.player] = max(best.get(r.player, 0), r.cseq)
                db.executemany(
                    "INSERT INTO players (player, cseq) VALUES (?, ?) ON CONFLICT(player) "
                    "DO UPDATE SET cseq = MAX(cseq, excluded.cseq)", list(best.items()))
            db.executemany("INSERT INTO changes (npc, key, value) VALUES (?, ?, ?)",
                           [(n, k, json.dumps(v)) for n, k, v in changes])
            last = self._last_intent_id + len(intents)
            db.execute("INSERT INTO meta (name, value) VALUES ('applied_upto', ?) "
                       "ON CONFLICT(name) DO UPDATE SET value = excluded.value", (last,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._last_intent_id = last

    def write_snapshot(self, world_state: dict[str, Any]) -> None:
        """Save the whole world and drop the journal it covers (intents are kept only while
        unapplied; the per-player cseq table keeps deduplication across restarts)."""
        db = self.db
        db.execute("BEGIN")
        try:
            upto = self._scalar("SELECT COALESCE(MAX(id), 0) FROM changes")
            applied = self._scalar("SELECT value FROM meta WHERE name = 'applied_upto'") or 0
            db.execute("INSERT INTO snapshots (created, change_upto, data) VALUES (?, ?, ?)",
                       (time.time(), upto, json.dumps(world_state)))
            db.execute("DELETE FROM snapshots WHERE id < (SELECT MAX(id) FROM snapshots)")
            db.execute("DELETE FROM changes WHERE id <= ?", (upto,))
            db.execute("DELETE FROM intents WHERE id <= ?", (applied,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def recover(self) -> Recovery:
        """What a restarting server needs: see :class:`Recovery`."""
        row = self.db.execute(
            "SELECT change_upto, data FROM snapshots ORDER BY id DESC LIMIT 1").fetchone()
        upto, snap = (row[0], json.loads(row[1])) if row else (0, None)
        changes = [(n, k, json.loads(v)) for n, k, v in self.db.execute(
            "SELECT npc, key, value FROM changes WHERE id > ? ORDER BY id", (upto,))]
        applied = self._scalar("SELECT value FROM meta WHERE name = 'applied_upto'") or 0
        unapplied = [IntentRecord(p, c, json.loads(b)) for p, c, b in self.db.execute(
            "SELECT player, cseq, body FROM intents WHERE id > ? ORDER BY id", (applied,))]
        cseq = dict(self.db.execute("SELECT player, cseq FROM players"))
        return Recovery(snap, changes, unapplied, cseq)
