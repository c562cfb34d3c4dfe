"""Where the numba kernels are cached (lightning_halo.quant.kernel_cache), decided and for real.

The decision is tested as a pure function; what numba does with a read-only package
directory, and that the codec still gets its numba kernels there, is tested by running a
copy of ``lightning_halo/quant`` in a directory the test process cannot write to: as user
``nobody`` when the tests run as root (root ignores mode bits), else as this user with the
directories ``chmod a-w``. Each probe is a process forked from a server that imported PyTorch
and numba (:func:`benchmarks.launch.run_forked`); it re-reads numba's configuration from its own
environment and imports the package copy itself, as a fresh interpreter would.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from benchmarks.launch import run_forked
from lightning_halo.quant import kernel_cache
from lightning_halo.quant.kernel_cache import choose_numba_cache_dir, is_private_writable

QUANT_SRC = Path(kernel_cache.__file__).resolve().parent
UID = str(os.getuid())
PROBE_UID = 65534 if os.getuid() == 0 else os.getuid()  # who runs the probes (nobody, if we are root)

# --------------------------------------------------------------------------- the decision


def decide(env: dict, usable: set, pkg_writable: bool = False):
    """choose_numba_cache_dir with fake tests: ``usable`` is the set of directories that pass."""
    pkg = Path("/site/lightning_halo/quant")
    return choose_numba_cache_dir(
        pkg,
        env,
        writable=lambda p: pkg_writable and p == pkg / "__pycache__",
        private=lambda p: p in usable,
    )


def test_user_choice_and_writable_package_dir_are_left_to_numba(monkeypatch) -> None:
    assert decide({"NUMBA_CACHE_DIR": "/mine"}, usable={Path("/any")}) is None
    assert decide({"NUMBA_CACHE_DIR": "/mine"}, usable=set(), pkg_writable=False) is None
    assert decide({"HOME": "/h"}, usable=set(), pkg_writable=True) is None


def test_read_only_package_dir_uses_the_first_usable_user_dir(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "u"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    home = tmp_path / "u" / ".cache" / "lightning_halo" / f"numba-{UID}"
    shared = Path("/scratch/halo") / f"numba-{UID}"
    tmp = tmp_path / f"lightning_halo-{UID}"
    env = {"LIGHTNING_HALO_CACHE": "/scratch/halo"}
    assert decide(env, usable={shared, home, tmp, tmp / "numba"}) == shared
    assert decide(env, usable={home, tmp, tmp / "numba"}) == home
    assert decide({}, usable={shared, home}) == home
    assert decide(env, usable={tmp, tmp / "numba"}) == tmp / "numba"
    # A temp-dir parent that is not ours (another user made it first) is never used.
    assert decide(env, usable={tmp / "numba"}) is None
    assert decide(env, usable=set()) is None


def test_private_means_ours_and_not_writable_by_others(tmp_path) -> None:
    fresh = tmp_path / "a" / "b"
    assert is_private_writable(fresh) and fresh.is_dir()
    assert stat.S_IMODE(fresh.stat().st_mode) & 0o077 == 0
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert not is_private_writable(shared)
    (tmp_path / "file").write_text("")
    assert not is_private_writable(tmp_path / "file")


# --------------------------------------------------------------------------- the real thing

PROBE = r"""
import json, sys, time
import numba.core.config
import numpy as np
import torch
numba.core.config.reload_config()  # forked from a server that imported numba: this process's environment
mode = sys.argv[1]
out = {}
if mode == "raw":  # numba alone, no lightning-halo logic: what does cache=True do here?
    try:
        import qcopy._numba as mod
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    else:
        x = np.random.rand(4, 16).astype(np.float32)
        rec = np.zeros((4, 16 + 5), dtype=np.uint8)
        mod.quantize_rows(x, rec, 1, 8)
        out["cache_path"] = str(mod.dispatchers(8)[0].stats.cache_path)
else:
    import qcopy
    from qcopy import dequantize, get_impl, quantize
    x = torch.randn(50, 16)
    y = dequantize(quantize(x, 8, torch.Generator().manual_seed(0)))
    out["impl"] = get_impl()
    out["max_err"] = float((y - x).abs().max())
    st = sys.modules["qcopy._numba"].dispatchers(8)[0].stats
    out["cache_path"] = str(st.cache_path)
    out["hits"], out["misses"] = sum(st.cache_hits.values()), sum(st.cache_misses.values())
print("PROBE " + json.dumps(out))
"""


#: What the probes' server imports once (most of a probe's start); each probe then reads numba's configuration
#: from its own environment, as a fresh interpreter's import of numba does, and imports the package copy itself.
PROBE_PRELOAD = ("numpy", "torch", "numba", "json")


def _other_user() -> int | None:
    """The uid to run the probes as: someone who cannot write what this process can (``None``: this user)."""
    return PROBE_UID if os.getuid() == 0 else None


@pytest.fixture
def sandbox():
    """A copy of lightning_halo/quant the probe cannot write to, and helpers for dirs it can."""
    user = _other_user()
    root = Path(tempfile.mkdtemp(prefix="halo-ro-"))
    root.chmod(0o755)
    try:
        pkg = root / "site" / "qcopy"
        shutil.copytree(QUANT_SRC, pkg, ignore=shutil.ignore_patterns("__pycache__"))
        (root / "probe.py").write_text(PROBE)
        # As nobody, root-owned 0755 directories are read-only; as a plain user, 0555 ones are.
        for d in (pkg, pkg.parent):
            d.chmod(0o755 if user is not None else 0o555)

        def writable_dir(name: str) -> Path:
            d = root / name
            d.mkdir(mode=0o755)
            if user is not None:
                os.chown(d, PROBE_UID, PROBE_UID)
            return d

        def read_only_dir(name: str) -> Path:
            d = root / name
            d.mkdir(mode=0o755 if user is not None else 0o555)
            return d

        def run(mode: str, **env: str) -> tuple[dict, str]:
            full = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "LIGHTNING_HALO", "XDG_"))}
            full.update(PYTHONPATH=str(root / "site"), PYTHONDONTWRITEBYTECODE="1", **env)
            # forked from a server that imported PyTorch (benchmarks.launch.run_forked), as ``user``
            res = run_forked([str(root / "probe.py"), mode], full, root, PROBE_PRELOAD, timeout=300, user=user)
            line = [ln for ln in res.stdout.splitlines() if ln.startswith("PROBE ")]
            assert res.returncode == 0 and line, res.stdout + res.stderr
            return json.loads(line[0][6:]), res.stderr

        yield pkg, writable_dir, read_only_dir, run
    finally:
        for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
            d.chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)


def _cache_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.rglob("*") if p.suffix in (".nbi", ".nbc"))


def test_read_only_install_still_gets_cached_numba_kernels(sandbox) -> None:
    pkg, writable_dir, read_only_dir, run = sandbox
    home = writable_dir("home")
    no_home = read_only_dir("no-home")
    tmp = writable_dir("tmp")

    # What numba itself does with cache=True when the source directory is read-only:
    # it falls back to its user-wide cache under ~/.cache/numba ...
    out, _ = run("raw", HOME=str(home))
    assert out.get("cache_path", "").startswith(str(home / ".cache" / "numba")), out
    # ... and, when that is not writable either, refuses to define the kernels at all.
    out, _ = run("raw", HOME=str(no_home))
    assert "cannot cache function" in out.get("error", ""), out

    # The codec in the same situation: numba kernels, cached in a per-user temp dir.
    out, err = run("codec", HOME=str(no_home), TMPDIR=str(tmp))
    cache = tmp / f"lightning_halo-{PROBE_UID}" / "numba"
    assert out["impl"] == "numba" and out["max_err"] < 0.05, out
    assert out["cache_path"].startswith(str(cache)) and out["misses"] > 0, out
    assert "compiled the numba codec kernels for bits=8" in err and str(cache) in err, err
    assert _cache_files(cache), "the compiled kernels must be on disk"
    assert not (pkg / "__pycache__").exists(), "nothing may be written beside the read-only package"
    # The next process loads them instead of compiling, and says nothing.
    out, err = run("codec", HOME=str(no_home), TMPDIR=str(tmp))
    assert out["impl"] == "numba" and out["hits"] > 0 and out["misses"] == 0, out
    assert "compiled the numba codec kernels" not in err, err

    # $LIGHTNING_HALO_CACHE comes first; an explicit NUMBA_CACHE_DIR is the user's choice.
    shared = writable_dir("shared")
    out, _ = run("codec", HOME=str(no_home), TMPDIR=str(tmp), LIGHTNING_HALO_CACHE=str(shared))
    assert out["cache_path"].startswith(str(shared / f"numba-{PROBE_UID}")), out
    mine = writable_dir("mine")
    out, _ = run("codec", HOME=str(home), NUMBA_CACHE_DIR=str(mine), LIGHTNING_HALO_CACHE=str(shared))
    assert out["cache_path"].startswith(str(mine)) and out["impl"] == "numba", out
