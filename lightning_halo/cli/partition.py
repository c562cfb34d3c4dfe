"""The ``lightning-halo partition`` verb: partition a graph, print its statistics and traffic table.

    lightning-halo partition GRAPH --parts P --out DIR   # a partition directory for P ranks
    lightning-halo partition GRAPH --parts P             # into the partition cache
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Optional

from lightning_halo.cli.status import CommandError, ExitStatus, input_errors_are_command_errors
from lightning_halo.partition.halo import format_stats, partitioner_label
from lightning_halo.partition.options import BALANCES, PARTITIONERS
from lightning_halo.quant.format import SUPPORTED_BITS as BITS

_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-halo partition",
        description="Partition a graph into a partition directory (--out) or the cache, and print its statistics "
        "and the halo traffic per bit width.",
    )
    parser.add_argument(
        "graph", nargs="?", help="a graph directory of .npy files, a torch.save'd Data or HeteroData, a heterogeneous "
        "graph directory, a bundled name (cora), pyg:<Class>:<root>[:<name>], or a partition directory (to print its tables)",
    )  # fmt: skip
    parser.add_argument("--data", help=argparse.SUPPRESS)  # the graph, as in earlier versions
    parser.add_argument("--parts", "--num-parts", dest="parts", type=int, help="number of parts = training processes (not needed for a partition directory)")
    parser.add_argument("--out", default=None, help="write a partition directory here (else: into the cache)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing partition directory at --out")
    parser.add_argument(
        "--partitioner", choices=PARTITIONERS, default="metis",
        help="metis (pymetis; about 15x the graph's CSR in memory), kaminpar (a fraction of that, several times "
        "faster), auto (METIS if it fits half the machine's memory, else KaMinPar) or random",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=1,
        help="KaMinPar's threads (with --out only: one writer serves every rank, so a run-to-run different "
        "partition is harmless; 1 is deterministic)",
    )  # fmt: skip
    parser.add_argument("--balance", choices=BALANCES, default="nodes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None, help="cache root when --out is not given")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size of the model, for the traffic table")
    parser.add_argument("--layers", type=int, default=2, help="message-passing layers of the model")
    parser.add_argument("--gcn", action="store_true", help="the model uses GCN-style layers (one degree exchange)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    return parser


def main(argv: list[str]) -> ExitStatus:
    """Entry point of ``lightning-halo partition ...`` (``argv``: ``partition`` first).

    Example:
        $ lightning-halo partition cora --parts 4 --out parts/cora-4
    """
    parser = _parser()
    args = parser.parse_args(argv[1:])
    graph = args.graph or args.data
    if graph is None:
        parser.error("give the graph: lightning-halo partition GRAPH --parts P [--out DIR]")
    from lightning_halo.data.hetero import is_hetero_partition_dir, print_hetero_report, read_hetero_manifest
    from lightning_halo.data.partition_dir import PartitionFileError, is_partition_dir, read_manifest

    hetero = is_hetero_partition_dir(graph)
    if hetero or is_partition_dir(graph):  # written earlier: print its tables
        try:
            manifest = read_hetero_manifest(graph) if hetero else read_manifest(graph)
        except PartitionFileError as err:
            raise CommandError(f"{type(err).__name__}: {err}") from err
        problem = partition_dir_errors(graph, manifest, args.parts, args.out)
        if problem:
            raise CommandError(problem)
        if hetero:
            print_hetero_report(manifest, str(graph), args.json)
        else:
            print_report(manifest, str(graph), args, place="partition directory")
        return ExitStatus.OK
    if args.parts is None:
        parser.error("--parts is required to partition a graph: the number of training processes")
    if args.out is None and args.threads != 1:
        parser.error(
            "--threads applies to --out only: the partition cache is written on every node, and KaMinPar with "
            "several threads may give each node a different partition"
        )
    with input_errors_are_command_errors():
        from lightning_halo.data.hetero import open_hetero

        hetero = open_hetero(graph)
        manifest, where = partition(graph if hetero is None else hetero, args)
    if hetero is not None:
        print_hetero_report(manifest, where, args.json)
        return ExitStatus.OK
    print_report(manifest, where, args)
    return ExitStatus.OK


def partition(graph: Any, args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Partition ``graph`` (a path, or a loaded HeteroData) as ``args`` say, into ``--out`` or the cache:
    ``(its manifest, where it is)``.

    Example:
        >>> manifest, where = partition("cora", _parser().parse_args(["cora", "--parts", "2"]))  # doctest: +SKIP
    """
    options = dict(partitioner=args.partitioner, balance=args.balance, seed=args.seed)
    if args.out is not None and not isinstance(graph, str):  # a heterogeneous graph (lightning_halo.data.hetero)
        from pathlib import Path

        from lightning_halo.data.hetero import write_hetero_partition_dir

        out = Path(args.out)
        if out.exists() and any(out.iterdir()):
            if not args.overwrite:
                raise CommandError(f"{out} is not empty; pass --overwrite to replace it, or choose another --out")
            import shutil

            shutil.rmtree(out)
        return write_hetero_partition_dir(graph, out, args.parts, partitioner=args.partitioner, seed=args.seed), args.out
    if args.out is not None:
        from lightning_halo.data.offline import partition_to_dir

        manifest = partition_to_dir(graph, args.out, args.parts, overwrite=args.overwrite, threads=args.threads, **options)
        return manifest, args.out
    from lightning_halo.data import HaloDataModule

    dm = HaloDataModule(graph, num_parts=args.parts, cache_dir=args.cache_dir, **options)  # type: ignore[arg-type]
    return dm.build(args.parts), str(dm.cache_for(args.parts).dir)


def partition_dir_errors(directory: str, manifest: dict[str, Any], parts: int | None, out: str | None) -> str:
    """What is wrong with asking for ``--parts`` / ``--out`` of an existing partition directory ("" if nothing).

    Example:
        >>> partition_dir_errors("parts/cora-2", {"num_parts": 2}, 3, None)[:55]
        'parts/cora-2 is a partition directory of 2 parts, not 3'
    """
    held = int(manifest["num_parts"])
    if parts is not None and parts != held:
        return (
            f"{directory} is a partition directory of {held} parts, not {parts}: its part count was fixed when it was "
            f"written. Leave out --parts to print its tables, or partition the original graph into {parts}: "
            f"`lightning-halo partition GRAPH --parts {parts} --out NEW_DIR`."
        )
    if out is not None:
        return (
            f"{directory} is a partition directory, not a graph: it cannot be partitioned again. To write a new "
            f"partitioning, give the original graph: `lightning-halo partition GRAPH --parts P --out {out}`."
        )
    return ""


def print_report(manifest: dict[str, Any], where: str, args: argparse.Namespace, place: str | None = None) -> None:
    from lightning_halo.exchange import predict_traffic

    stats, graph = manifest["stats"], manifest["graph"]
    stored = bool(manifest["halo_x"])
    cover = stats.get("halo_rows_cover")  # absent in directories written before partial sums

    def predict(bits: int, rows: Optional[int]) -> dict[str, int]:
        return predict_traffic(
            stats["halo_rows"], graph["num_features"], args.hidden, args.layers, bits,
            feature_bytes=_ITEMSIZE.get(graph["x_dtype"], 4), gcn=args.gcn, input_stored=stored, cover_rows=rows,
        )  # fmt: skip

    traffic = {bits: predict(bits, None) for bits in BITS}
    traffic_cover = {bits: predict(bits, cover) for bits in BITS} if cover is not None else None
    if args.json:
        print(json.dumps({"stats": stats, "traffic": traffic, "traffic_cover": traffic_cover, "cache": where,
                          "manifest": manifest}))  # fmt: skip
        return
    print(f"graph {graph['source']}: {graph['num_nodes']} nodes, {graph['num_edges']} edges, {graph['num_features']} features")
    print("\n".join(format_stats(stats, f"{partitioner_label(manifest)} into {manifest['num_parts']} parts")))
    print(f"\nhalo traffic per training epoch, all ranks, {args.layers} layers, hidden {args.hidden}:")
    head = f"{'bits':>6} {'forward MB':>12} {'backward MB':>12} {'vs fp32':>9}"
    print(head + (f" {'fwd MB, partial sums':>21} {'bwd MB, partial sums':>21}" if traffic_cover else ""))
    for bits, t in traffic.items():
        sent = t["fwd_per_epoch"] + t["bwd_per_epoch"]
        ratio = f"{t['fp32_per_epoch'] / sent:.1f}x" if sent else "-"
        line = f"{bits:>6} {t['fwd_per_epoch'] / 1e6:>12.4f} {t['bwd_per_epoch'] / 1e6:>12.4f} {ratio:>9}"
        if traffic_cover:
            c = traffic_cover[bits]
            line += f" {c['fwd_per_epoch'] / 1e6:>21.4f} {c['bwd_per_epoch'] / 1e6:>21.4f}"
        print(line)
    if traffic_cover:
        print(f"partial sums (halo_reduction='cover', the default): {cover} rows per exchange instead of "
              f"{stats['halo_rows']}, for layers that aggregate linearly (GCN, SAGE mean/sum, GIN, ...)")
    if stored:
        stored_mb = stats["halo_rows"] * graph["num_features"] * _ITEMSIZE.get(graph["x_dtype"], 4) / 1e6
        print(f"input features of the halo: stored in the partitions ({stored_mb:.3f} MB in all), not exchanged")
    else:
        print(f"plus once: input-feature halo {traffic[32]['input_once'] / 1e6:.3f} MB (full precision)")
    if args.gcn:
        print(f"plus once: GCN degrees of the halo {traffic[32]['aux_once'] / 1e6:.3f} MB")
    sizes = sum(f["bytes"] for f in manifest["files"].values())
    place = place or ("written to" if args.out else "cached in")
    print(f"{place} {where} ({manifest['num_parts']} part files, {sizes / 1e6:.1f} MB)")
