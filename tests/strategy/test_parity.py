"""Exactness: distributed bits=32 training equals single-process plain PyG (SAR-style parity).

For GCN (normalize=True), GraphSAGE, GAT and GIN models of 2 and 3 layers, on Cora and on a
generated directed graph with isolated nodes and a rank without train nodes, at world sizes
1-4: full-graph logits, loss, every gradient after one step and parameters after 5 Adam steps
match the reference. Real processes over gloo, float64.
"""

from __future__ import annotations

import pytest

from tests.support.models import LAYERS
from tests.support.parity import assert_parity, load_records, run_parity

CONFIGS = [f"{kind}:{depth}:{graph}" for graph in ("cora", "awkward") for kind in LAYERS for depth in (2, 3)]


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("world_size", "partitioner", "halo_reduction"),
    [(1, "metis", "cover"), (2, "metis", "cover"), (3, "metis", "cover"), (4, "metis", "cover"),
     (2, "kaminpar", "none"), (3, "kaminpar", "cover"), (4, "kaminpar", "none")],
)  # fmt: skip
def test_parity_with_single_process_pyg(world_size: int, partitioner: str, halo_reduction: str, tmp_path) -> None:
    """Both partitioners (at one process there is nothing to partition), with halo partial sums
    (the default) and without (every ``halo_reduction`` is exact)."""
    run_parity(CONFIGS, world_size, tmp_path, extra=["--partitioner", partitioner, "--halo-reduction", halo_reduction])
    for config in CONFIGS:
        assert_parity(config, world_size, tmp_path)
    if world_size > 1 and partitioner == "metis":  # the generated graph is built around METIS' last part
        recs = load_records("gcn:2:awkward", world_size, tmp_path)
        assert any(r["n_train"] == 0 for r in recs), "the generated graph must leave one rank without train nodes"


SPARSE_CONFIGS = [f"{kind}:2:{graph}" for graph in ("cora", "awkward") for kind in ("gcn", "sage", "gin")]


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [1, 3])
def test_parity_with_sparse_adjacency(world_size: int, tmp_path) -> None:
    """Layers fed lightning_halo.sparse_adjacency(batch) (fused spmm) equal single-process PyG
    on the graph's sparse adjacency; the awkward graph has repeated edges and self-loops."""
    run_parity(SPARSE_CONFIGS, world_size, tmp_path, extra=["--sparse"])
    for config in SPARSE_CONFIGS:
        assert_parity(config, world_size, tmp_path, sparse=True)


LOSS_CONFIGS = ["sage:2:awkward", "gcn:2:cora"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("loss", ["subset", "sum", "weighted"])
def test_parity_for_losses_that_are_not_a_train_mean(loss: str, world_size: int, tmp_path) -> None:
    """A subset of the train nodes (UniMP's label trick), a sum and per-class weights: exact with
    lightning_halo.global_mean / a sum and HaloQuantStrategy(scale_loss="share")."""
    run_parity(LOSS_CONFIGS, world_size, tmp_path, extra=["--loss", loss])
    for config in LOSS_CONFIGS:
        assert_parity(config, world_size, tmp_path, loss=loss)


@pytest.mark.multiprocess
def test_parity_on_the_edge_index_path(tmp_path) -> None:
    """aggregation="edge_index" (PyG's per-edge path, today's behaviour before the fused default) is exact too."""
    configs = [f"{kind}:2:{graph}" for graph in ("cora", "awkward") for kind in LAYERS]
    run_parity(configs, 3, tmp_path, extra=["--aggregation", "edge_index"])
    for config in configs:
        assert_parity(config, 3, tmp_path)


EMB_CONFIGS = ["emb:2:cora", "emb:2:awkward"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_parity_of_node_embeddings_looked_up_by_n_id(world_size: int, tmp_path) -> None:
    """A learnable nn.Embedding(num_nodes, d) beside the features, looked up as self.emb(batch.n_id) (NeighborLoader's
    idiom), equals single-process PyG looking it up with torch.arange(N): logits, loss, every gradient (the
    embedding's included) and the parameters after 5 steps."""
    run_parity(EMB_CONFIGS, world_size, tmp_path)
    for config in EMB_CONFIGS:
        recs = assert_parity(config, world_size, tmp_path)
        for rec in recs:  # the embedding really trains: most rows get a gradient
            assert rec["grad0"]["emb.weight"].abs().sum(1).gt(0).sum() > len(rec["inner_global_id"]) / 2
