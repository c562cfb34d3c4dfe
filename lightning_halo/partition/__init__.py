"""Pure functions that split a graph into owner-compute partitions with halos.

Nothing here touches Lightning or torch.distributed: every function takes tensors and
returns tensors, so it is tested on its own and reused by the DataModule and the CLI.
"""

from lightning_halo.partition.adjacency import sparse_adjacency
from lightning_halo.partition.graph import partition_graph, symmetric_csr
from lightning_halo.partition.halo import build_halo_partitions, partition_stats

__all__ = ["build_halo_partitions", "partition_graph", "partition_stats", "sparse_adjacency", "symmetric_csr"]
