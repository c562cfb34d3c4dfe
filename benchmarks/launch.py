"""Launch local worker processes the way torchrun does (env rendezvous) and collect their exit.

Used by the benchmark harness (`--local`) and by the tests (through `tests.support.launch`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Sequence
from pathlib import Path

from lightning_halo.rendezvous import free_port

REPO = Path(__file__).resolve().parents[1]
#: What a rank imports: a rank forked from a server that imported these (``preload`` below) starts at once.
PRELOAD = ("torch", "lightning", "torch_geometric", "torch_geometric.nn", "torchmetrics", "lightning_halo.strategy",
           "lightning_halo.data.datamodule", "lightning_halo.callbacks", "lightning.pytorch.cli", "jsonargparse")  # fmt: skip
#: ``1``: the benchmark commands' local ranks (``--local``) fork from such a server instead of starting
#: fresh interpreters. The tests set it: a command's ranks then cost one interpreter's imports, not one each.
#: A measurement leaves it unset: its ranks are what a user's are.
PRELOAD_ENV = "LIGHTNING_HALO_BENCH_PRELOAD"


def local_preload() -> tuple[str, ...]:
    """The ``preload`` of the benchmark commands' local ranks: :data:`PRELOAD` where ``$LIGHTNING_HALO_BENCH_PRELOAD``
    is ``1``, else none (fresh interpreters)."""
    return PRELOAD if os.environ.get(PRELOAD_ENV) == "1" else ()


def run_workers(
    args: list[str],
    world_size: int,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    kill_on_failure: bool = True,
    until_rank_exits: int | None = None,
    preload: Sequence[str] = (),
    cwd: Path | None = None,
    stream: bool = False,
) -> list[subprocess.CompletedProcess]:
    """Run ``python *args`` as ``world_size`` ranks of one job; kill all on timeout or first failure.

    The ranks run in ``cwd`` (default: the repository root). ``kill_on_failure=False`` lets the
    other ranks run on after one fails (to observe how they stop); ``until_rank_exits=r`` kills
    the remaining ranks as soon as rank ``r`` has exited.

    Each rank gets MASTER_ADDR/PORT, WORLD_SIZE, RANK, LOCAL_RANK, so Lightning treats the
    processes as externally launched. Returns the completed processes (stdout/stderr text), or
    with ``stream=True`` lets the ranks write to this process's stdout and stderr as they run
    (long benchmarks; nothing is captured then, and the ranks are always fresh interpreters).

    ``preload`` (module names): fork the ranks from a server process that imported these once
    (:mod:`multiprocessing`'s forkserver) instead of starting fresh interpreters. Importing
    Lightning, PyTorch and PyG costs about 6 s of CPU per process; the tests launch hundreds.
    The ranks run the same script with the same environment; what differs is only that the
    modules are already imported, as in a DataLoader worker. ``LIGHTNING_HALO_FRESH_WORKERS=1``
    turns it off.
    """
    port = free_port()
    procs = []
    logs = []
    for rank in range(world_size):
        e = dict(os.environ)
        e.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE=str(world_size),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world_size),
            NODE_RANK="0",
            GROUP_RANK="0",
            PYTHONPATH=str(REPO) + os.pathsep + e.get("PYTHONPATH", ""),
            OMP_NUM_THREADS="1",
        )
        e.pop("SLURM_NTASKS", None)
        if env:
            e.update(env)
        if stream:
            logs.append(None)
            procs.append(subprocess.Popen([sys.executable, *args], env=e, cwd=cwd or REPO))
            continue
        out_path = (log_dir or Path(os.environ.get("TMPDIR", "/tmp"))) / f"worker-{port}-{rank}.log"
        f = open(out_path, "w+")
        logs.append(f)
        if preload and os.environ.get("LIGHTNING_HALO_FRESH_WORKERS") != "1":
            ctx = _forkserver(tuple(preload))
            procs.append(_Forked(ctx, list(args), e, str(out_path), Path(cwd or REPO), preload=preload))
        else:
            procs.append(subprocess.Popen([sys.executable, *args], env=e, stdout=f, stderr=subprocess.STDOUT, cwd=cwd or REPO))
    deadline = time.monotonic() + timeout
    failed = False
    while any(p.poll() is None for p in procs):
        failed = kill_on_failure and any(p.poll() not in (None, 0) for p in procs)
        if until_rank_exits is not None and procs[until_rank_exits].poll() is not None:
            failed = True
        if time.monotonic() > deadline or failed:
            grace = time.monotonic() + (5 if failed else 0)  # let a failing rank's peers report too
            while time.monotonic() < grace and any(p.poll() is None for p in procs):
                time.sleep(0.1)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.1)
    results = []
    for p, f in zip(procs, logs):
        p.wait()
        text = ""
        if f is not None:
            f.seek(0)
            text = f.read()
            f.close()
        results.append(subprocess.CompletedProcess(p.args, p.returncode, text, ""))
    return results


def check(results: list[subprocess.CompletedProcess]) -> None:
    """Fail with every rank's output tail if any rank failed."""
    if all(r.returncode == 0 for r in results):
        return
    tails = "\n".join(f"--- rank {i} rc={r.returncode}\n{r.stdout[-4000:]}" for i, r in enumerate(results))
    raise AssertionError(f"worker processes failed:\n{tails}")


_SERVERS: dict[tuple[str, ...], object] = {}
#: What the server this process was forked from had imported (set in :func:`_run_as_main`); empty in
#: a process that was not forked so.
_PRELOADED: tuple[str, ...] = ()


def _forkserver(preload: tuple[str, ...]):
    """One forkserver context per preload list, started on first use and kept for the run.

    A process forked from a server that imported ``preload`` already (a benchmark command the tests
    run with :func:`run_forked`) forks its own ranks instead: a second server would import it all again.
    """
    if _forks_itself(preload):
        import multiprocessing

        return multiprocessing.get_context("fork")
    if preload not in _SERVERS:
        import multiprocessing

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(preload))
        _SERVERS[preload] = ctx
    return _SERVERS[preload]


def _forks_itself(preload: tuple[str, ...]) -> bool:
    """Whether this process may fork ``preload``'s ranks from itself: it was forked from a server that
    imported them, and it has one thread (a fork copies no other thread: an OpenMP pool or a gloo
    worker would be left half there)."""
    if not set(preload) <= set(_PRELOADED):
        return False
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def run_forked(
    args: list[str], env: dict[str, str], cwd: Path, preload: Sequence[str], timeout: float = 600,
    user: int | None = None,
) -> subprocess.CompletedProcess:
    """``python *args`` in ``cwd`` with exactly ``env``, forked from the preloaded server (see :func:`run_workers`).

    What a fresh interpreter would print, without its imports: for tools that run many short
    commands (``tools/gen_docs.py``). Standard output and error come back apart, as
    ``subprocess.run(..., capture_output=True)`` gives them; ``LIGHTNING_HALO_FRESH_WORKERS=1``
    starts a fresh interpreter instead. ``user`` (a uid, root only): run as that user, with its uid as the
    group and no supplementary groups (as ``setpriv --reuid --regid --clear-groups`` would).

    Raises:
        subprocess.TimeoutExpired: the command ran past ``timeout`` seconds (it is killed).
    """
    if os.environ.get("LIGHTNING_HALO_FRESH_WORKERS") == "1":
        # setpriv where there is one: a user who cannot read the interpreter's own prefix (a pyenv build under
        # /root) still starts, from the system's; subprocess's own user= fails there
        setpriv = shutil.which("setpriv") if user is not None else None
        prefix = [setpriv, f"--reuid={user}", f"--regid={user}", "--clear-groups"] if setpriv else []
        who = dict(user=user, group=user, extra_groups=[]) if user is not None and not setpriv else {}
        return subprocess.run([*prefix, sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, **who)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="halo-forked-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        out.touch(), err.touch()
        proc = _Forked(_forkserver(tuple(preload)), list(args), env, str(out), Path(cwd), str(err), preload, user)
        proc._p.join(timeout)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired([sys.executable, *args], timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())


class _Forked:
    """A rank forked from the preloaded server, with the few methods of ``Popen`` we use."""

    def __init__(self, ctx, args: list[str], env: dict[str, str], log: str, cwd: Path, err_log: str | None = None,
                 preload: Sequence[str] = (), user: int | None = None) -> None:  # fmt: skip
        self.args = [sys.executable, *args]
        target_args = (args, env, log, str(cwd), err_log, tuple(preload), user)
        self._p = ctx.Process(target=_run_as_main, args=target_args, daemon=False)
        # multiprocessing re-imports the parent's main script in every child (spawn's rule);
        # the rank replaces __main__ with its own script, so it is given none to re-import.
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            self._p.start()
        finally:
            sys.modules["__main__"] = main

    @property
    def returncode(self) -> int | None:
        return self._p.exitcode

    def poll(self) -> int | None:
        return self._p.exitcode

    def kill(self) -> None:
        self._p.kill()

    def wait(self) -> int | None:
        self._p.join()
        return self._p.exitcode


def _run_as_main(args: list[str], env: dict[str, str], log: str, cwd: str, err_log: str | None = None,
                 preload: tuple[str, ...] = (), user: int | None = None) -> None:  # fmt: skip
    """In the forked rank: become ``python *args`` (environment, cwd, argv, output, ``user``), then run it.

    Standard output and error both go to ``log``, or error to ``err_log`` where given. ``preload``:
    what the server imported (the ranks this one launches with it fork from this process).
    """
    import gc
    import runpy

    global _PRELOADED
    _PRELOADED = tuple(preload)

    # The preloaded modules' objects never become garbage in the rank; left in the collector's
    # generations, every collection walks them (and, after fork, copies their pages): a rank's
    # closing gc.collect() (lightning_halo.shutdown) took 0.34 s of a 1.9 s single-fit launch.
    gc.freeze()
    sys.stdout.flush(), sys.stderr.flush()
    for target, path in ((1, log), (2, err_log or log)):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(fd, target)
        os.close(fd)
    if user is not None:  # after opening the logs (the caller's files): from here on, only what ``user`` may
        os.setgroups([])
        os.setgid(user)
        os.setuid(user)
    os.environ.clear()
    os.environ.update(env)
    # what a fresh interpreter would take from its environment at start
    for entry in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    tempfile.tempdir = None  # found again from this environment's TMPDIR at its first use, as in a fresh one
    os.chdir(cwd)
    if "torch" in sys.modules and env.get("OMP_NUM_THREADS"):
        # the OpenMP runtime read OMP_NUM_THREADS when the server imported torch
        sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path.insert(0, str((REPO / args[0]).resolve().parent))
        runpy.run_path(args[0], run_name="__main__")
