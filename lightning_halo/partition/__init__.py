"""Pure functions that split a graph into owner-compute partitions with halos.

Nothing here touches Lightning or torch.distributed: every function takes tensors and
returns tensors, so it is tested on its own and reused by the DataModule and the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_halo._lazy import lazy_module_attributes

__getattr__, __dir__, __all__ = lazy_module_attributes(
    __name__,
    {
        "lightning_halo.partition.adjacency": ["sparse_adjacency"],
        "lightning_halo.partition.graph": ["partition_graph", "symmetric_csr"],
        "lightning_halo.partition.halo": ["build_halo_partitions", "partition_stats"],
    },
)

if TYPE_CHECKING:
    from lightning_halo.partition.adjacency import sparse_adjacency
    from lightning_halo.partition.graph import partition_graph, symmetric_csr
    from lightning_halo.partition.halo import build_halo_partitions, partition_stats
