"""The errors a game sees when a model or bundle can't be used (stdlib only)."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """A model directory or file could not be loaded; the message names the file."""


class BundleError(ModelLoadError, ValueError):
    """A bundle that cannot be used: the message names the bundle, the file and what is wrong.

    A :class:`ModelLoadError`, so a game that handles load failures handles a refused bundle
    too; a ValueError for code written when it was one.
    """


__all__ = ["BundleError", "ModelLoadError"]
