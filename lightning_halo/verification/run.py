r""":func:`verify`: is your model, with its code around the layers, exact on partitions?

The hooks make every message-passing layer exact on a partition; the code around the layers
(in ``forward`` and ``training_step``) runs on the partition's rows as written, and a line that
reads all nodes (``h - global_mean_pool(h, None)``) or positions
(``emb(torch.arange(x.size(0)))``) is silently per partition. :func:`verify` runs one training
step on one process and on :math:`P`, compares loss, logits and gradients, and names the first
module whose output differs.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
import torch

from lightning_halo.rendezvous import free_port
from lightning_halo.verification.compare import VerifyReport, compare_step
from lightning_halo.verification.options import EXACT_VALUES, STRATEGY_OPTIONS, Treatment, exact_notes, shown_options
from lightning_halo.verification.recorder import StepRecorder, no_dropout, trainer_options

#: dtypes :func:`verify` can run in.
DTYPES = (torch.float64, torch.float32)

log = logging.getLogger(__name__)


class VerifyError(RuntimeError):
    """:func:`~lightning_halo.verify` could not run the comparison (the one-process run failed, a timeout)."""


class VerifyTimeout(VerifyError, TimeoutError):
    """A run of :func:`~lightning_halo.verify` did not finish within its ``timeout``."""


class RankTraceback(Exception):
    """The traceback of an error in a rank of the check (a forked process): the cause of the error raised here."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text.rstrip()}\n"""'


@dataclass(frozen=True)
class RankError:
    """Why a run of the check stopped: the first failing rank's exception, one line, and its traceback."""

    message: str
    traceback: str = ""


def check_devices(devices: int) -> int:
    """``devices`` as the number of processes to compare with one (at least 2)."""
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 2:
        raise ValueError(f"verify compares one process with `devices` processes; devices={devices!r} must be an int >= 2.")
    return devices


def check_dtype(dtype: Optional[torch.dtype]) -> Optional[torch.dtype]:
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"verify runs in {' or '.join(map(str, DTYPES))} (or None: float64 if the model allows); got {dtype}.")
    return dtype


@dataclass(frozen=True)
class RunOptions:
    """What both runs share: their strategy's options that change the result (:mod:`~lightning_halo.verification.options`),
    the time limit and the seed."""

    strategy: dict[str, Any]
    timeout: float
    seed: int


def run_options(strategy: Optional[pl.strategies.Strategy], timeout: float, seed: int) -> RunOptions:
    """The options of both runs: ``strategy``'s carried ones (its defaults if None), the lossy ones exact.

    Example:
        >>> run_options(HaloQuantStrategy(halo_reduction="none"), 600.0, 0).strategy["halo_reduction"]
        'none'
    """
    from lightning_halo.strategy import HaloQuantStrategy

    if strategy is None:
        strategy = HaloQuantStrategy()
    if not isinstance(strategy, HaloQuantStrategy):
        raise TypeError(
            f"verify checks a HaloQuantStrategy (the strategy you train with, or None for its defaults), got "
            f"{type(strategy).__name__}: train partitions with strategy=HaloQuantStrategy(...) (in a config: "
            "trainer.strategy: lightning_halo.HaloQuantStrategy, or a name such as halo_exact)."
        )
    given = strategy.init_args
    carried = {name: given[name] for name, (how, _) in STRATEGY_OPTIONS.items() if how is Treatment.CARRIED}
    return RunOptions({**carried, **EXACT_VALUES}, float(timeout), int(seed))


def rank_strategy(opts: RunOptions) -> pl.strategies.Strategy:
    """The strategy of a rank of the check: ``opts.strategy``, on forked CPU processes bounded by ``opts.timeout``.

    Example:
        >>> rank_strategy(run_options(None, 600.0, 0)).bits
        32
    """
    from lightning.fabric.plugins.environments import LightningEnvironment

    from lightning_halo.strategy import HaloQuantStrategy

    return HaloQuantStrategy(
        **opts.strategy, halo_timeout=opts.timeout, timeout=timedelta(seconds=opts.timeout),
        cluster_environment=LightningEnvironment(), num_threads=1,
    )  # fmt: skip


def _quiet() -> None:
    """A rank of the check prints nothing but warnings (partition statistics, banners: the report says what counts)."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning_halo"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module=r"lightning\.")


def _rank_main(model: pl.LightningModule, datamodule: pl.LightningDataModule, rank: int, world_size: int, port: int,
               out: Path, dtype: torch.dtype, opts: RunOptions) -> None:  # fmt: skip
    """One rank of a run (a forked process): train one step with a :class:`StepRecorder`, or write why not."""
    from lightning_halo.data import HaloDataModule

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size), RANK=str(rank),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size), NODE_RANK="0", GROUP_RANK="0",
    )  # fmt: skip
    # A forked child must not enter a parallel region with more threads than one: OpenMP's pool
    # belongs to the parent and the child waits for it forever (seen in torch's index_put).
    torch.set_num_threads(1)
    _quiet()
    try:
        if isinstance(datamodule, HaloDataModule):
            datamodule.num_parts = None  # this forked copy's: its parts follow each run's process count
        trainer = pl.Trainer(
            accelerator="cpu", devices=world_size, num_nodes=1, strategy=rank_strategy(opts),
            precision="64-true" if dtype == torch.float64 else "32-true",
            callbacks=[StepRecorder(out / f"rank{rank}.pt", dtype)], **trainer_options(out),
        )  # fmt: skip
        torch.manual_seed(opts.seed)
        with no_dropout():
            trainer.fit(model, datamodule=datamodule)
    except BaseException as err:  # noqa: BLE001 - reported by the parent, which decides
        (out / f"rank{rank}.err").write_text("".join(traceback.format_exception_only(type(err), err)).strip())
        (out / f"rank{rank}.tb").write_text(traceback.format_exc())
        raise SystemExit(1) from None


def _wait(procs: list[Any], timeout: float, what: str) -> None:
    """Wait for every process; on the first failure give the others a moment, then stop them; never hang."""
    deadline = time.monotonic() + timeout
    failed_at: Optional[float] = None
    while any(p.is_alive() for p in procs):
        now = time.monotonic()
        if failed_at is None and any(p.exitcode not in (None, 0) for p in procs):
            failed_at = now
        if now > deadline or (failed_at is not None and now - failed_at > 10.0):
            for p in procs:
                if p.is_alive():
                    p.kill()
            for p in procs:
                p.join(5.0)
            if failed_at is None:
                raise VerifyTimeout(f"{what} did not finish within {timeout:g} s (raise timeout= if the graph is large)")
            return
        time.sleep(0.05)
    for p in procs:
        p.join()


def run_step(model: pl.LightningModule, datamodule: pl.LightningDataModule, world_size: int, dtype: torch.dtype,
             opts: RunOptions) -> tuple[list[dict[str, Any]], Optional[RankError]]:  # fmt: skip
    """One training step on ``world_size`` forked processes: their records, or the first failure."""
    if "fork" not in multiprocessing.get_all_start_methods():
        raise VerifyError("verify forks its ranks from this process, and this platform cannot fork; run it on Linux or macOS.")
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="lightning-halo-verify-") as tmp:
        out, port = Path(tmp), free_port()
        procs = [
            ctx.Process(target=_rank_main, args=(model, datamodule, r, world_size, port, out, dtype, opts), daemon=True)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        _wait(procs, opts.timeout, f"the {world_size}-process run")
        errors = sorted(out.glob("rank*.err"))
        if errors:
            for tb in sorted(out.glob("rank*.tb")):
                log.debug("%s:\n%s", tb.name, tb.read_text())
            first = errors[0]
            return [], RankError(f"{first.stem}: {first.read_text()}", first.with_suffix(".tb").read_text())
        missing = [r for r in range(world_size) if not (out / f"rank{r}.pt").is_file()]
        if missing:
            codes = [p.exitcode for p in procs]
            return [], RankError(f"rank(s) {missing} stopped without a record (exit codes {codes})")
        return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world_size)], None


def _reference(model: pl.LightningModule, datamodule: pl.LightningDataModule, dtype: Optional[torch.dtype],
               opts: RunOptions) -> tuple[dict[str, Any], torch.dtype, list[str]]:  # fmt: skip
    """The one-process record, in float64 if the model runs in it (unless ``dtype`` says which)."""
    notes: list[str] = []
    error: Optional[RankError] = None
    for candidate in (dtype,) if dtype is not None else DTYPES:
        recs, error = run_step(model, datamodule, 1, candidate, opts)
        if error is None:
            return recs[0], candidate, notes
        notes.append(f"one process in {str(candidate).replace('torch.', '')} failed: {error.message}")
    cause = RankTraceback(error.traceback) if error is not None and error.traceback else None
    raise VerifyError(
        "the model does not train one step on one process, so there is nothing to compare with:\n  " + "\n  ".join(notes)
    ) from cause


def verify(
    model: pl.LightningModule,
    datamodule: pl.LightningDataModule,
    devices: int = 2,
    *,
    strategy: Optional[pl.strategies.Strategy] = None,
    dtype: Optional[torch.dtype] = None,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    timeout: float = 600.0,
    seed: int = 0,
) -> VerifyReport:
    r"""Check that ``model`` trains on ``devices`` partitions exactly as on one process.

    The hooked layers are exact by construction; the code around them is yours. This runs one
    training step of ``model`` on ``datamodule`` twice, on the CPU with the options of
    ``strategy`` (the one you train with) at ``bits=32``: on one
    process (the whole graph) and on ``devices`` processes (one partition each), and compares
    the loss, the gradient of every parameter and the output of every module call, row by row
    in global node order. The first module whose output differs is named, and whether its
    input differed already (then the code before it, in ``forward`` or ``training_step``, reads
    all nodes or positions: ``h - global_mean_pool(h, None)``, ``emb(torch.arange(x.size(0)))``).

    Both runs use float64 if the model runs in it (else float32, with looser tolerances), the
    same initial weights (``model`` as it is) and no dropout (its masks are random per row).
    The ranks are forked from this process and write their records to a temporary directory;
    ``model`` and ``datamodule`` are left as they were. Run it on a small graph: every module's
    output is kept. ``lightning-halo verify --config x.yaml`` runs it on a config.

    Args:
        model (LightningModule): the model, with its ``training_step`` and ``configure_optimizers``.
        datamodule (LightningDataModule): a :class:`~lightning_halo.HaloDataModule` of the whole
            graph (not a partition directory: the one-process run needs the graph).
        devices (int, optional): processes to compare with one (at least 2). (default: ``2``)
        strategy (HaloQuantStrategy, optional): the strategy you train with. Every option that
            changes what an exact step computes (``scale_loss``, ``aggregation``,
            ``halo_reduction``, the DDP options, ...) is used by both runs; the lossy ones
            (``bits``, a ``ddp_comm_hook``) are checked at their exact values and the report
            says so; the others say how to run and do not apply to the check's forked CPU
            processes (:data:`~lightning_halo.verification.options.STRATEGY_OPTIONS`).
            (default: ``None``, ``HaloQuantStrategy()``'s options)
        dtype (torch.dtype, optional): ``torch.float64`` or ``torch.float32``. (default: float64
            if the model runs in it, else float32)
        rtol (float, optional): relative tolerance. (default: ``1e-7`` in float64, ``1e-4`` in float32)
        atol (float, optional): absolute tolerance, times ``max(1, max|value|)``. (default:
            ``1e-9`` in float64, ``1e-5`` in float32)
        timeout (float, optional): seconds each run may take before its processes are stopped.
            (default: ``600``)
        seed (int, optional): torch's seed in every process before the step. (default: ``0``)

    Returns:
        A :class:`~lightning_halo.verification.VerifyReport`: true when exact; ``print`` it.

    Raises:
        VerifyError: if the one-process run fails (nothing to compare with; the rank's traceback
            is its cause) or a run times out (:class:`VerifyTimeout`, also a ``TimeoutError``).
        TypeError: if ``strategy`` is not a :class:`~lightning_halo.HaloQuantStrategy`.

    Example:
        >>> report = lightning_halo.verify(MyGNN(), HaloDataModule("cora"), devices=2)  # doctest: +SKIP
        >>> print(report)  # doctest: +SKIP
        lightning-halo verify: NOT exact: one training step on 2 processes vs one process (float64)
          ...
          the first module whose output differs is `conv2` (GCNConv), call 1, and its input differs already: ...
    """
    from lightning_halo.data import HaloDataModule

    devices, dtype = check_devices(devices), check_dtype(dtype)
    if isinstance(datamodule, HaloDataModule) and datamodule.reads_partition_dir:
        raise ValueError(
            "verify compares with one process on the whole graph, but this HaloDataModule reads a partition "
            "directory (each rank's part only). Build it from the graph instead: HaloDataModule(<the graph or its file>)."
        )
    opts = run_options(strategy, timeout, seed)
    ref, used, notes = _reference(model, datamodule, dtype, opts)
    recs, error = run_step(model, datamodule, devices, used, opts)
    if error is not None:
        report = VerifyReport(devices=devices, dtype=used, ok=False, error=error.message)
    else:
        report = compare_step(ref, recs, rtol=rtol, atol=atol)
    report.strategy = shown_options(ref["strategy"])  # as the one-process rank built it
    report.notes += notes + exact_notes(strategy.init_args if strategy is not None else {})
    report.notes.append("dropout was off in both runs (its masks are drawn per row)")
    return report
