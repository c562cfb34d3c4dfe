"""Where the project's shared folder is (datasets, the SLURM testbed): beside the checkout, or named by the environment.

Looked up in this order, the first that exists:

1. a variable naming the one thing directly, where there is one (``$LIGHTNING_HALO_DATASETS``
   for ``datasets``, ``$LIGHTNING_HALO_TESTBED`` for ``testbed/cluster.sh``);
2. ``$LIGHTNING_HALO_SHARED/<what>``: the shared folder, wherever it is;
3. ``../shared/<what>`` beside the repository root (the checkout's parent holds ``shared/``).

Never an absolute path of one machine (``tests/test_repo.py`` checks the code for them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
#: The environment variable naming the shared folder.
ENV = "LIGHTNING_HALO_SHARED"


def _candidates(what: str, env: Mapping[str, str], root: Path, override: Optional[str]) -> list[tuple[str, Path]]:
    found = []
    if override and env.get(override):
        found.append((f"${override}", Path(env[override])))
    if env.get(ENV):
        found.append((f"${ENV}/{what}", Path(env[ENV]) / what))
    found.append((f"../shared/{what} beside the checkout", root.parent / "shared" / what))
    return found


def find_shared(
    what: str, *, env: Mapping[str, str] = os.environ, root: Optional[Path] = None, override: Optional[str] = None
) -> Optional[Path]:
    """The path of ``what`` (e.g. ``"datasets"``) in the shared folder, or ``None`` if it is nowhere.

    Args:
        what (str): the path inside the shared folder.
        env (Mapping, optional): the environment. (default: ``os.environ``)
        root (Path, optional): the repository root. (default: this checkout's)
        override (str, optional): a variable that names ``what`` itself, looked at first.

    Example:
        >>> find_shared("datasets", env={"LIGHTNING_HALO_SHARED": "/nonexistent"}, root=Path("/nonexistent/repo"))
    """
    for _, path in _candidates(what, env, ROOT if root is None else root, override):
        if path.exists():
            return path
    return None


def shared_path(
    what: str, *, env: Mapping[str, str] = os.environ, root: Optional[Path] = None, override: Optional[str] = None
) -> Path:
    """As :func:`find_shared`, but a missing ``what`` is an error that names every place looked at.

    Raises:
        FileNotFoundError: naming ``$LIGHTNING_HALO_SHARED`` and ``../shared`` (and ``override``).

    Example:
        >>> shared_path("datasets")  # doctest: +SKIP
        PosixPath('/data/project/shared/datasets')
    """
    found = find_shared(what, env=env, root=root, override=override)
    if found is not None:
        return found
    looked = "; ".join(f"{label} ({path})" for label, path in _candidates(what, env, ROOT if root is None else root, override))
    unset = "" if env.get(ENV) else f" (${ENV} is not set)"
    raise FileNotFoundError(
        f"{what} not found in the shared folder. Looked at: {looked}{unset}. Set {ENV} to the folder that holds "
        f"{what}, or put it at ../shared/{what} beside the checkout" + (f", or set {override} to it" if override else "") + "."
    )
