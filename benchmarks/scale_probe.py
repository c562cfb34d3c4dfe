"""Partition a benchmark graph for 2, 4, 8 ... parts through ``HaloDataModule``'s own cache path.

Prints (and the harness stores) the load time, METIS time, halo-planning time, cache-write time,
edge cut, balance and peak RSS of one process. Building the caches here also means the ranks of
the following multi-node runs only load their part instead of all partitioning at once.

    python -m benchmarks.scale_probe --graph sbm --parts 2 4 8 --cache-dir /tmp/cache
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from typing import Any


from benchmarks.graphs import graph_source
from lightning_halo import HaloDataModule


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--graph", default="sbm")
    p.add_argument("--parts", nargs="+", type=int, default=[2, 4, 8])
    p.add_argument("--cache-dir", default=None)
    a = p.parse_args()

    t = time.perf_counter()
    dm = HaloDataModule(graph_source(a.graph), cache_dir=a.cache_dir)
    data = dm.data
    out: dict[str, Any] = {"nodes": data.num_nodes, "edges": data.num_edges, "load_s": time.perf_counter() - t,
                           "graph_rss_mb": _rss_mb()}  # fmt: skip
    for parts in a.parts:
        cached = dm.cache_for(parts).is_complete()
        t = time.perf_counter()
        manifest = dm.build(parts)  # the writer records the time of each of its steps in the manifest
        total = time.perf_counter() - t
        stats = manifest["stats"]
        row = {"cached": cached, "build_s": total, "edge_cut": stats["edge_cut"], "halo_rows": stats["halo_rows"],
               "balance": stats["balance"]}  # fmt: skip
        if not cached:
            row.update(manifest["timings"], partitioner=manifest["partitioned_with"]["partitioner"])
        out[str(parts)] = row
        print(json.dumps({parts: row}), file=sys.stderr, flush=True)
    out["peak_rss_mb"] = _rss_mb()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
