"""The ``lightning-halo plan`` verb: memory per rank, bytes and epoch time before a run.

    lightning-halo plan GRAPH --ranks 2 4 8 --model gcn --hidden 256 --layers 3 --bits 32 1 \\
        --mode sync pipelined --bandwidth 10gbit [--json]
    lightning-halo plan PARTITION_DIR ...                 # the manifest only
    lightning-halo plan --nodes 111e6 --edges 3.2e9 --features 128 --classes 172 --cut-ratio 0.3 --ranks 64 128
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from lightning_halo.cli.status import ExitStatus, input_errors_are_command_errors
from lightning_halo.exchange.policy import MODES
from lightning_halo.layers.reduction import HALO_REDUCTIONS
from lightning_halo.partition.options import PARTITIONERS
from lightning_halo.planner.options import PLAN_MODELS
from lightning_halo.planner.timing import DUPLEX
from lightning_halo.quant.format import SUPPORTED_BITS

_COUNTS = ("nodes", "edges", "features", "classes")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lightning-halo plan", description="Predict each rank's peak memory, the halo bytes "
                                "and the epoch time for every rank count, bit width and mode, before a run.")  # fmt: skip
    p.add_argument("graph", nargs="?", help="a graph (as for partition; partitioned into the cache per rank count), or a "
                   "partition directory (its manifest only); leave out with --nodes/--edges/... for counts only")  # fmt: skip
    p.add_argument(
        "--ranks",
        type=int,
        nargs="+",
        default=None,
        help="rank counts to plan (default: 2 4 8; a partition directory: its own)",
    )
    p.add_argument("--model", choices=PLAN_MODELS, default="gcn")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2, help="message-passing layers")
    # "adaptive" is parsed so that the planner can say why it plans its bounds instead
    p.add_argument("--bits", type=lambda v: v if v == "adaptive" else int(v), nargs="+",
                   choices=(*SUPPORTED_BITS, "adaptive"), default=[32, 1])  # fmt: skip
    p.add_argument("--mode", dest="modes", nargs="+", choices=[m for m in MODES if m != "adaptive"], default=["sync", "pipelined"],
                   help="halo modes to plan (adaptive lies between sync and pipelined: plan those two)")
    p.add_argument("--bandwidth", default="10gbit", help="one rank's link: 10gbit, 100mbit, 1.25GB/s (default: 10gbit)")
    p.add_argument("--latency", default="50us", help="per message: 50us, 0.2ms (default: 50us)")
    p.add_argument("--duplex", choices=DUPLEX, default="half", help="half: a rank's sends and receives of one exchange "
                   "share its link time, as measured with gloo on the testbed (default); full: they overlap")  # fmt: skip
    p.add_argument("--halo-reduction", choices=HALO_REDUCTIONS, default="cover")
    p.add_argument("--refresh-every", type=int, default=10, help="periodic mode: epochs between refreshes")
    p.add_argument("--partitioner", choices=PARTITIONERS, default="metis", help="for a graph partitioned here")
    p.add_argument(
        "--memory",
        type=float,
        default=None,
        help="bytes one rank may use (e.g. 80e9); plans above it are not recommended",
    )
    for name in _COUNTS:
        p.add_argument(f"--{name}", type=float, default=None, help=f"counts only: the graph's {name}")
    p.add_argument(
        "--cut-ratio", type=float, default=None, help="counts only: the share of edges between parts (e.g. 0.3)"
    )
    p.add_argument("--threads", type=int, default=1, help="threads per rank (the calibration runs with as many)")
    p.add_argument("--ranks-per-host", type=int, default=1, help="ranks that share one host's cores (default: 1, a "
                   "host per rank): their kernels slow down as calibrated, more where they oversubscribe the cores")  # fmt: skip
    p.add_argument("--recalibrate", action="store_true", help="measure this machine's kernel rates again")
    p.add_argument("--calibration", default=os.environ.get("LIGHTNING_HALO_RATES"), help="read the kernel rates from "
                   "this JSON file instead (another machine's, or fixed ones for a reproducible plan; default: "
                   "$LIGHTNING_HALO_RATES, else this machine's stored calibration)")  # fmt: skip
    p.add_argument("--cache-dir", default=None, help="partition cache root")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    return p


def _counts(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, int] | None:
    given = {name: getattr(args, name) for name in _COUNTS if getattr(args, name) is not None}
    if not given:
        return None
    if args.graph is not None or len(given) < len(_COUNTS):
        parser.error(
            "planning from counts needs all of --nodes, --edges, --features, --classes (and --cut-ratio), and no GRAPH"
        )
    return {"num_nodes": int(given["nodes"]), "num_edges": int(given["edges"]),
            "num_features": int(given["features"]), "num_classes": int(given["classes"])}  # fmt: skip


def main(argv: list[str]) -> ExitStatus:
    """Entry point of ``lightning-halo plan ...`` (``argv``: ``plan`` first).

    Example:
        $ lightning-halo plan cora --ranks 2 4 --bits 32 1
    """
    parser = _parser()
    args = parser.parse_args(argv[1:])
    counts = _counts(args, parser)
    from lightning_halo.planner.calibrate import load_rates, read_rates
    from lightning_halo.planner.plan import plan
    from lightning_halo.planner.report import report

    # partitioning and calibrating report on stdout: keep it for the plan (and --json parseable)
    with input_errors_are_command_errors(), contextlib.redirect_stdout(sys.stderr):
        rates = read_rates(args.calibration) if args.calibration else load_rates(args.threads, recalibrate=args.recalibrate)
        result = plan(
            args.graph, args.ranks, args.model, args.hidden, args.layers, args.bits, args.modes, args.bandwidth,
            args.latency, partitioner=args.partitioner, halo_reduction=args.halo_reduction, duplex=args.duplex,
            refresh_every=args.refresh_every, memory=None if args.memory is None else int(args.memory),
            counts=counts, cut_ratio=args.cut_ratio, rates=rates, threads=args.threads, cache_dir=args.cache_dir,
            ranks_per_host=args.ranks_per_host,
        )  # fmt: skip
    print(json.dumps(result) if args.json else report(result))
    return ExitStatus.OK
