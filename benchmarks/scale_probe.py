"""Partition a benchmark graph for 2, 4, 8 ... parts through ``HaloDataModule``'s own cache path.

Prints (and the harness stores) the load time, METIS time, halo-planning time, cache-write time,
edge cut, balance and peak RSS of one process. Building the caches here also means the ranks of
the following multi-node runs only load their part instead of all partitioning at once.

    python benchmarks/scale_probe.py --graph sbm --parts 2 4 8 --cache-dir /tmp/cache
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning_halo.data.datamodule as datamodule  # noqa: E402
from benchmarks.graphs import graph_source  # noqa: E402
from lightning_halo import HaloDataModule  # noqa: E402


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--graph", default="sbm")
    p.add_argument("--parts", nargs="+", type=int, default=[2, 4, 8])
    p.add_argument("--cache-dir", default=None)
    a = p.parse_args()

    timings: dict[str, float] = {}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                timings[name] = time.perf_counter() - t

        return wrapper

    # time the pure steps inside the DataModule's own build, without changing what it does
    datamodule.partition_graph = timed("metis_s", datamodule.partition_graph)
    datamodule.build_halo_partitions = timed("halo_s", datamodule.build_halo_partitions)

    t = time.perf_counter()
    dm = HaloDataModule(graph_source(a.graph), cache_dir=a.cache_dir)
    data = dm.data
    out: dict[str, Any] = {"nodes": data.num_nodes, "edges": data.num_edges, "load_s": time.perf_counter() - t,
                           "graph_rss_mb": _rss_mb()}  # fmt: skip
    for parts in a.parts:
        cache = dm._cache(parts)
        timings.clear()
        t = time.perf_counter()
        cached = cache.is_complete()
        if not cached:
            dm._build(cache, parts)
        total = time.perf_counter() - t
        stats = cache.read_meta()["stats"]
        row = {"cached": cached, "build_s": total, **timings, "edge_cut": stats["edge_cut"],
               "halo_rows": stats["halo_rows"], "balance": stats["balance"]}  # fmt: skip
        if not cached:
            row["write_s"] = total - timings.get("metis_s", 0.0) - timings.get("halo_s", 0.0)
        out[str(parts)] = row
        print(json.dumps({parts: row}), file=sys.stderr, flush=True)
    out["peak_rss_mb"] = _rss_mb()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
