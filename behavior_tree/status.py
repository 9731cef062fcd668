"""Node status, as in BehaviorTree.CPP v4."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["FAILURE", "IDLE", "RUNNING", "SKIPPED", "SUCCESS", "Status"]


class Status(IntEnum):
    """The result of ticking a node, and the state a node is in between ticks.

    ``IDLE``: not started, or reset by its parent after completing.
    ``RUNNING``: started and not finished; the next tick resumes it.
    ``SUCCESS`` / ``FAILURE``: finished.
    ``SKIPPED``: returned to the parent only (a pre-condition said so); the
    node itself stays ``IDLE``.

    Members are singletons: compare with ``is``. The module constants
    ``RUNNING``, ``SUCCESS``, ... are the same objects and are faster to read in
    hot code than ``Status.RUNNING`` (an enum class attribute lookup).
    """

    IDLE = 0
    RUNNING = 1
    SUCCESS = 2
    FAILURE = 3
    SKIPPED = 4

    def __str__(self) -> str:
        return self.name

    @property
    def is_completed(self) -> bool:
        return self is Status.SUCCESS or self is Status.FAILURE

    @property
    def is_active(self) -> bool:
        """RUNNING, SUCCESS or FAILURE (BT.CPP's ``isStatusActive``)."""
        return self is not Status.IDLE and self is not Status.SKIPPED

    @classmethod
    def parse(cls, text: str) -> Status:
        """``"SUCCESS"`` (any case) -> ``Status.SUCCESS``; ValueError otherwise."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(
                f"{text!r} is not a status (expected one of {', '.join(cls.__members__)})"
            ) from None


IDLE = Status.IDLE
RUNNING = Status.RUNNING
SUCCESS = Status.SUCCESS
FAILURE = Status.FAILURE
SKIPPED = Status.SKIPPED
