"""Where the compiled numba codec kernels are cached, so their JIT is paid once per machine.

The kernels are compiled on first use (~10 s for one bit width's encoder and decoder) and
cached by numba (``cache=True``) beside their source, in ``lightning_halo/quant/__pycache__``.
What numba does when that directory is not writable (a cluster or container install) is
tested in ``tests/quant/test_kernel_cache.py``: it falls back to its user-wide cache
(``~/.cache/numba``), and when that is not writable either it refuses to import the kernels
(``RuntimeError: cannot cache function ...``), which would leave only the ~40x slower torch
path.

So, when the package directory is not writable and the user did not choose
``NUMBA_CACHE_DIR`` (always respected), the kernels are cached in the first usable of

1. ``$LIGHTNING_HALO_CACHE/numba-<uid>`` (the partition cache's root, see ``docs/faq.md``),
2. ``~/.cache/lightning_halo/numba-<uid>``,
3. ``<tempdir>/lightning_halo-<uid>/numba`` (per job on many clusters: compiled once per job).

A directory is usable if this user can create a file in it and it is this user's own and not
writable by others (compiled machine code is loaded from it). The choice applies only to
the codec's own kernels: numba's global configuration is restored right after they are
defined.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional

__all__ = ["cache_root", "choose_numba_cache_dir", "is_private_writable", "is_writable", "numba_cache_dir"]

ENV_CACHE = "LIGHTNING_HALO_CACHE"
PACKAGE_DIR = Path(__file__).resolve().parent


def _uid() -> str:
    getuid = getattr(os, "getuid", None)
    return str(getuid()) if getuid else "user"


def cache_root(env: Mapping[str, str] = os.environ) -> Optional[Path]:
    """``$LIGHTNING_HALO_CACHE``, else ``~/.cache/lightning_halo`` (``None`` without a home directory).

    Example:
        >>> cache_root({"LIGHTNING_HALO_CACHE": "/scratch/halo"})
        PosixPath('/scratch/halo')
    """
    if env.get(ENV_CACHE):
        return Path(env[ENV_CACHE])
    try:
        return Path.home() / ".cache" / "lightning_halo"
    except RuntimeError:  # no HOME and no passwd entry
        return None


def is_writable(path: Path) -> bool:
    """numba's own test for a cache directory: create it if needed, then create a file in it.

    The same test as numba's, so that this module's decision agrees with what numba will do
    (``os.access`` differs: it ignores mode bits for root, for one).
    """
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def is_private_writable(path: Path) -> bool:
    """:func:`is_writable`, and the directory is this user's and not writable by group or others."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    getuid = getattr(os, "getuid", None)
    if not stat.S_ISDIR(st.st_mode) or (getuid is not None and st.st_uid != getuid()):
        return False
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return False
    return is_writable(path)


def choose_numba_cache_dir(
    package_dir: Path = PACKAGE_DIR,
    env: Mapping[str, str] = os.environ,
    writable: Callable[[Path], bool] = is_writable,
    private: Callable[[Path], bool] = is_private_writable,
) -> Optional[Path]:
    """The directory to cache the codec's numba kernels in, or ``None`` to leave it to numba.

    ``None`` when ``NUMBA_CACHE_DIR`` is set (the user's choice) or numba's default, the
    package's ``__pycache__``, is writable; otherwise the first usable directory of the list
    in this module's docstring (``None`` if there is none: numba then tries its own fallbacks).

    Args:
        package_dir: Directory of the kernels' source (``lightning_halo/quant``).
        env: Environment variables.
        writable: Test for numba's default directory.
        private: Test for our candidates (see :func:`is_private_writable`).

    Example:
        >>> choose_numba_cache_dir(env={"NUMBA_CACHE_DIR": "/x"}) is None
        True
    """
    if env.get("NUMBA_CACHE_DIR"):
        return None
    if writable(package_dir / "__pycache__"):
        return None
    user = f"numba-{_uid()}"
    candidates = []  # (directories that must all be private, in order; the last is the cache)
    if env.get(ENV_CACHE):
        candidates.append([Path(env[ENV_CACHE]) / user])
    home = cache_root({k: v for k, v in env.items() if k != ENV_CACHE})
    if home is not None:
        candidates.append([home / user])
    tmp = Path(tempfile.gettempdir()) / f"lightning_halo-{_uid()}"
    candidates.append([tmp, tmp / "numba"])  # in a shared temp dir the parent must be ours too
    for dirs in candidates:
        if all(private(d) for d in dirs):
            return dirs[-1]
    return None


@contextlib.contextmanager
def numba_cache_dir(path: Optional[Path]) -> Iterator[None]:
    """While defining the kernels, point numba's ``CACHE_DIR`` at ``path`` (no-op for ``None``).

    numba picks a function's cache directory when the ``@njit(cache=True)`` decorator runs,
    so restoring the global setting afterwards leaves other numba users unaffected.
    """
    if path is None:
        yield
        return
    from numba.core import config

    old = config.CACHE_DIR
    config.CACHE_DIR = str(path)
    try:
        yield
    finally:
        config.CACHE_DIR = old
