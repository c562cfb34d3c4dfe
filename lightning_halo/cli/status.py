"""How a verb ends: its exit status, and which errors are a mistake in the command (one line, no traceback).

Only a mistake in the command line or the configuration is shortened to one line: a
:class:`CommandError`, or an error the library raised on purpose about what it was given.
Everything else (a run that timed out, a failure while training, a bug) keeps its traceback
and an exit status of its own, so that it can be told apart from a bad command and debugged.
Nothing here imports torch or Lightning.
"""

from __future__ import annotations

import contextlib
import enum
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

#: lightning_halo/: an error raised in a file under it was raised by the library.
_PACKAGE_DIR = Path(__file__).resolve().parents[1]

#: What the library raises on purpose about its input (a file, an option, a graph): ``GraphValidationError``,
#: ``UnsupportedLayerError``, ``FileExistsError`` of a partition directory, ``KaMinParUnavailableError``, ...
INPUT_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, OSError, ImportError)
#: What the library raises on purpose while building the configured classes (``RuntimeError`` included:
#: ``PartitionFileError`` of a partition directory that is damaged).
BUILD_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, RuntimeError, OSError, ImportError)


class ExitStatus(enum.IntEnum):
    """The exit statuses of ``lightning-halo`` (docs/cli.md#exit-status).

    Example:
        >>> int(ExitStatus.USAGE)
        2
    """

    OK = 0  #: done (``verify``: exact)
    NOT_EXACT = 1  #: ``verify`` ran and found a difference, or could not compare something
    USAGE = 2  #: a mistake in the command line or the configuration: one line, no traceback
    TIMEOUT = 3  #: a run did not finish within its time limit: the message and its traceback
    ERROR = 4  #: anything else went wrong while running: the traceback


class CommandError(Exception):
    """A mistake in the command line or the configuration: printed as one line, exit status 2."""


def library_error(err: BaseException, kinds: tuple[type[BaseException], ...] = BUILD_ERRORS) -> Optional[BaseException]:
    """The first exception in ``err``'s chain that lightning-halo raised on purpose, or None.

    On purpose: raised in the package, of the kinds its checks raise (``kinds``: by default
    ``ValueError``, ``TypeError``, ``RuntimeError``, ``OSError``, ``ImportError`` and their
    subclasses). Anything else (an ``AttributeError``, an ``AssertionError``, ...) would be a
    bug: its traceback stays.

    Args:
        err (BaseException): the exception caught.
        kinds (tuple): the exception types that count. (default: :data:`BUILD_ERRORS`)

    Example:
        >>> library_error(ValueError("raised outside the package")) is None
        True
    """
    seen: set[int] = set()
    current: Optional[BaseException] = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = traceback.extract_tb(current.__traceback__)
        raised_here = bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(_PACKAGE_DIR)
        if raised_here and isinstance(current, kinds):
            return current
        current = current.__cause__ or current.__context__
    return None


@contextlib.contextmanager
def input_errors_are_command_errors() -> Iterator[None]:
    """Inside, an error the library raises on purpose about its input becomes a :class:`CommandError`.

    For the verbs that check their input as they work (``partition``, ``plan``, ``verify``):
    ``GraphValidationError: data='missing.pt' is neither ...`` is one line; any other error
    (a ``RuntimeError`` of a run, a bug) passes unchanged, with its traceback.

    Example:
        >>> with input_errors_are_command_errors():
        ...     pass
    """
    try:
        yield
    except INPUT_ERRORS as err:
        own = library_error(err, INPUT_ERRORS)
        if own is None:
            raise
        raise CommandError(f"{type(own).__name__}: {own}") from err


def exit_status(prog: str, err: Exception) -> ExitStatus:
    """Report ``err``, which ended the verb ``prog``, on stderr; return the exit status it means.

    A :class:`CommandError`: one line, ``USAGE``. A ``TimeoutError``: its traceback, ``TIMEOUT``.
    Anything else: its traceback, ``ERROR``.

    Example:
        >>> exit_status("lightning-halo fit", CommandError("no --ckpt_path"))  # doctest: +SKIP
        lightning-halo fit: error: no --ckpt_path
        <ExitStatus.USAGE: 2>
    """
    if isinstance(err, CommandError):
        print(f"{prog}: error: {err}", file=sys.stderr)
        return ExitStatus.USAGE
    traceback.print_exception(err, file=sys.stderr)
    return ExitStatus.TIMEOUT if isinstance(err, TimeoutError) else ExitStatus.ERROR
