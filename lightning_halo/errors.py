"""The error for a broken invariant of lightning-halo itself, where an ``assert`` would vanish under ``python -O``."""

from __future__ import annotations

ISSUES = "https://github.com/lightning-halo/lightning-halo/issues"


class InternalError(AssertionError):
    """A condition lightning-halo guarantees by construction does not hold: a bug in lightning-halo, not in the input.

    Raised where a plain ``assert`` would guard correctness (``python -O`` removes asserts, and a
    broken invariant would then give a silently wrong result). An ``AssertionError``, so that no
    handler for bad input (``ValueError``, ``RuntimeError``) mistakes it for one.
    """


def internal_error(what: str) -> InternalError:
    """An :class:`InternalError` saying what broke, that it is a bug, and where to report it.

    Args:
        what (str): the invariant that does not hold, in a few words.

    Example:
        >>> err = internal_error("the halo cover misses an edge")
        >>> str(err).split(".")[0]
        'lightning-halo internal error: the halo cover misses an edge'
    """
    return InternalError(
        f"lightning-halo internal error: {what}. This is a bug in lightning-halo, not in your model or data: "
        f"please report it with this traceback at {ISSUES}"
    )
