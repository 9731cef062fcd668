"""Errors raised by the plugin API."""

from __future__ import annotations

__all__ = ["WorldError"]


class WorldError(ValueError):
    """A World call got bad input (unknown id or archetype, bad tree, NaN position, ...).

    Raised by the call that made the mistake, before anything was changed.
    """
