"""Bad inputs and the errors they must produce: used by the tests and rendered into docs/errors.md.

Every in-process case is executed by the tests (and by ``tools/gen_docs.py`` to capture the
real message), so the documented table cannot drift from the code.
"""

from __future__ import annotations

import sys
from typing import Callable

import numpy as np
import torch
from torch_geometric.data import Data


def good_graph(n: int = 6) -> Data:
    return Data(
        x=torch.randn(n, 3),
        edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]),
        y=torch.zeros(n, dtype=torch.long),
        train_mask=torch.ones(n, dtype=torch.bool),
        val_mask=torch.zeros(n, dtype=torch.bool),
        test_mask=torch.zeros(n, dtype=torch.bool),
    )


def _drop(key: str) -> Callable[[Data], None]:
    def f(d: Data) -> None:
        del d[key]

    return f


def _set(key: str, value) -> Callable[[Data], None]:
    def f(d: Data) -> None:
        d[key] = value

    return f


#: (case, mutation of good_graph(), expected message fragment)
GRAPH_CASES = [
    ("missing x", _drop("x"), "no node features `x`"),
    ("x not 2-D", _set("x", torch.randn(6)), "`x` must be 2-D"),
    ("x integer", _set("x", torch.ones(6, 2, dtype=torch.long)), "`x` must be floating point"),
    ("x with NaN", _set("x", torch.tensor([[0.0], [float("nan")], [0], [0], [0], [0]])), "NaN or Inf (first at node 1)"),
    ("missing edge_index", _drop("edge_index"), "no `edge_index`"),
    ("edge_index wrong shape", _set("edge_index", torch.tensor([[0, 1, 2]])), "shape [2, num_edges]"),
    ("edge_index transposed", _set("edge_index", torch.tensor([[0, 1], [1, 2], [2, 3]])), "looks transposed"),
    ("edge_index float", _set("edge_index", torch.tensor([[0.0, 1.0], [1.0, 2.0]])), "must be an integer tensor"),
    ("edge_index out of range", _set("edge_index", torch.tensor([[0, 6], [1, 2]])), "refers to node 6, outside [0, 6)"),
    ("edge_index negative", _set("edge_index", torch.tensor([[0, -1], [1, 2]])), "refers to node -1"),
    ("missing y", _drop("y"), "no labels `y`"),
    ("y wrong length", _set("y", torch.zeros(5, dtype=torch.long)), "`y` has 5 rows but there are 6 nodes"),
    ("missing train_mask", _drop("train_mask"), "no `train_mask`"),
    ("missing val_mask", _drop("val_mask"), "no `val_mask`"),
    ("missing test_mask", _drop("test_mask"), "no `test_mask`"),
    ("mask not bool", _set("train_mask", torch.tensor([0, 1, 2])), "must be a bool mask"),
    ("mask length mismatch", _set("val_mask", torch.zeros(5, dtype=torch.bool)), "`val_mask` has shape (5,) but must be [6]"),
    ("mask with several splits", _set("test_mask", torch.zeros(6, 10, dtype=torch.bool)), "pick one"),
    ("no nodes", lambda d: d.update({"x": torch.zeros(0, 3)}), "has no nodes"),
    ("num_nodes disagrees with x", _set("num_nodes", 9), "data.num_nodes=9 but x has 6 rows"),
    ("an attribute named like what partitions add", _set("global_id", torch.arange(6)), "'global_id', name(s) lightning-halo gives"),
    ("an n_id: partitions derive it", _set("n_id", torch.arange(6)), "Every partition batch has `n_id` already"),
    ("a list with one entry per node", _set("names", [f"n{i}" for i in range(6)]), "`names` is a list with one entry per node"),
    ("a tuple with one entry per edge", _set("tags", ("a", "b", "c")), "`tags` is a tuple with one entry per edge"),
    ("a NumPy array", _set("year", np.arange(6)), "`year` is a NumPy array; partitions carry tensors"),
]


def _graph_case(mutate: Callable[[Data], None]) -> Callable[[], object]:
    def run() -> object:
        from lightning_halo.data import validate_graph

        data = good_graph()
        mutate(data)
        return validate_graph(data)

    return run


def _call(fn: Callable[[], object]) -> Callable[[], object]:
    return fn


def _sparse_adjacency(**kwargs) -> object:
    from lightning_halo import sparse_adjacency

    return sparse_adjacency(good_graph(), **kwargs)


def _in_scratch(fn: Callable[[], object]) -> Callable[[], object]:
    """Run ``fn`` inside a fresh temporary working directory (relative paths keep messages stable)."""

    def run() -> object:
        import os
        import tempfile

        here = os.getcwd()
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)
            try:
                return fn()
            finally:
                os.chdir(here)

    return run


def _damaged_partition_dir(damage: str) -> object:
    from pathlib import Path

    from lightning_halo.data import PartitionDirectory
    from lightning_halo.data.offline import partition_to_dir

    partition_to_dir(good_graph(), "parts", 2)
    part = Path("parts/part_1.pt")
    if damage == "missing":
        part.unlink()
    elif damage == "truncated":
        part.write_bytes(part.read_bytes()[:-8])
    else:  # same size, other bytes
        raw = bytearray(part.read_bytes())
        raw[-100] ^= 0xFF
        part.write_bytes(bytes(raw))
    return PartitionDirectory("parts").load_part(1)


def _partition_dir_for_three() -> object:
    from lightning_halo import HaloDataModule
    from lightning_halo.data.offline import partition_to_dir

    partition_to_dir(good_graph(), "parts", 3)
    return HaloDataModule("parts").cache_for(2)  # what setup() asks for with 2 processes


def _graph_dir(mutate: str) -> object:
    from pathlib import Path

    import numpy as np

    from lightning_halo.data import load_npy_graph, save_npy_graph

    save_npy_graph(good_graph(), "graph")
    if mutate == "short x":
        np.save("graph/x.npy", np.zeros((5, 3), dtype=np.float32))
    else:
        Path("graph/x.npy").unlink()
    return load_npy_graph("graph")


def _busy_out_dir() -> object:
    from pathlib import Path

    from lightning_halo.data.offline import partition_to_dir

    Path("parts").mkdir()
    Path("parts/notes.txt").write_text("mine")
    return partition_to_dir(good_graph(), "parts", 2)


def _sparse_strict() -> object:
    from torch import nn
    from torch_geometric.nn import GATConv

    from tests.support.graphs import awkward_graph
    from tests.support.threaded import run_threaded

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = GATConv(8, 3)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    return run_threaded(Net().double(), awkward_graph(2), 2, aggregation="sparse", timeout=20)


def _checkpoint_for(verb: str, ckpt_path: object) -> object:
    from lightning_halo.cli import checkpoint_for

    return checkpoint_for(verb, ckpt_path)  # type: ignore[arg-type]


def _gather_one_part(prediction_of: Callable[[object], object]) -> object:
    """``gather_predictions`` of what ``prediction_of(part)`` returns, on one process."""
    from lightning_halo import build_halo_partitions, partition_graph
    from lightning_halo.data.predictions import gather_predictions

    data = good_graph()
    (part,) = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 1), 1)
    return gather_predictions(prediction_of(part), part)


def _other_cases() -> list[tuple[str, Callable[[], object], str]]:
    from torch import nn
    from torch_geometric.nn import EGConv, MessagePassing, SAGEConv

    from lightning_halo import HaloQuantStrategy, HaloSchedule, partition_graph, register_layer
    from lightning_halo.data import load_graph
    from lightning_halo.layers.registry import layer_kind
    from lightning_halo.quant import quantize
    from tests.support.graphs import awkward_graph
    from tests.support.threaded import run_threaded

    class CustomConv(MessagePassing):
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

    class TwoHop(MessagePassing):  # propagates twice per call, registered as one step
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=self.propagate(edge_index, x=x))

    class Net(nn.Module):
        def __init__(self, conv: nn.Module, edges: Callable) -> None:
            super().__init__()
            self.lin, self.conv, self.edges = nn.Linear(8, 8), conv, edges

        def forward(self, x, edge_index):
            return self.conv(self.lin(x), self.edges(edge_index))

    def on_two_ranks(conv: nn.Module, edges: Callable = lambda e: e) -> object:
        data = awkward_graph(2)
        return run_threaded(Net(conv, edges).double(), data, 2, timeout=20)

    def mis_registered() -> object:
        register_layer(TwoHop, "full")
        return on_two_ranks(TwoHop())

    return [
        ("edges transformed on a partition (an edge dropped)",
         lambda: on_two_ranks(SAGEConv(8, 8), lambda e: e[:, 1:]), "not this partition's"),
        ("multi-hop layer registered as one step", mis_registered, "called propagate 2 times in one forward"),
        ("aggregation='sparse' with a layer that has no fused path (GATConv)", _sparse_strict,
         "cannot use the fused sparse aggregation"),
        ("unknown reduce of sparse_adjacency", lambda: _sparse_adjacency(reduce="add"), "reduce must be 'sum', 'mean'"),
        ("unknown bundled dataset name", lambda: load_graph("pubmed-offline"), "neither an existing file nor a bundled"),
        ("unsupported bits", lambda: HaloQuantStrategy(bits=3), "choose one of (1, 2, 4, 8, 16, 32)"),
        ("non-positive halo_timeout", lambda: HaloQuantStrategy(halo_timeout=0), "halo_timeout must be positive"),
        ("unsupported layer (EGConv)", lambda: layer_kind(EGConv(4, 4, num_heads=1, num_bases=1)), "cannot run on graph partitions"),
        ("unknown custom layer", lambda: layer_kind(CustomConv()), "lightning_halo.register_layer"),
        ("num_parts larger than the graph", lambda: partition_graph(torch.tensor([[0], [1]]), 2, 3), "exceeds the number of nodes"),
        ("unknown partitioner", lambda: partition_graph(torch.tensor([[0], [1]]), 2, 2, partitioner="kahip"), "unknown partitioner"),  # type: ignore[arg-type]
        ("partitioner='kaminpar' without the kaminpar package", _without_kaminpar, "use partitioner='metis'"),
        ("unknown HaloSchedule mode", lambda: HaloSchedule(mode="async"), "unknown mode"),  # type: ignore[arg-type]
        ("sync_every outside pipelined or adaptive mode", lambda: HaloSchedule(mode="sync", sync_every=3), "applies to mode='pipelined' or 'adaptive' only"),
        ("drift_threshold outside adaptive mode", lambda: HaloSchedule(mode="pipelined", drift_threshold=0.1), "applies to mode='adaptive' only"),
        ("wait_threshold outside adaptive mode", lambda: HaloSchedule(mode="pipelined", wait_threshold=0.1), "wait_threshold applies to mode='adaptive' only"),
        ("bit_target below 0", lambda: HaloQuantStrategy(bits="adaptive", bit_target=-0.1), "bit_target=-0.1 is below 0"),
        ("bit_mode neither min nor max", lambda: HaloQuantStrategy(bits="adaptive", bit_monitor="val_acc", bit_mode="up"),
         "bit_mode='up' must be 'min'"),  # fmt: skip
        ("NaN in halo rows", lambda: quantize(torch.tensor([[0.0, float("nan")]]), 1, where="halo fwd rows of layer 'conv2' on rank 1"),
         "halo fwd rows of layer 'conv2' on rank 1"),  # fmt: skip
        ("partition directory: a part file is missing", _in_scratch(lambda: _damaged_partition_dir("missing")),
         "parts/part_1.pt is missing"),  # fmt: skip
        ("partition directory: a part file is truncated", _in_scratch(lambda: _damaged_partition_dir("truncated")),
         "truncated or an incomplete copy"),  # fmt: skip
        ("partition directory: a part file changed after partitioning", _in_scratch(lambda: _damaged_partition_dir("changed")),
         "it changed after partitioning"),  # fmt: skip
        ("partition directory for another number of processes", _in_scratch(_partition_dir_for_three),
         "holds 3 parts but the Trainer runs 2 processes"),  # fmt: skip
        ("graph directory: a feature array of the wrong length", _in_scratch(lambda: _graph_dir("short x")),
         "y.npy has 6 rows but x.npy has 5"),  # fmt: skip
        ("graph directory without x.npy", _in_scratch(lambda: _graph_dir("no x")), "has no x.npy"),
        ("partition --out directory holds other files", _in_scratch(_busy_out_dir), "holds other files; choose a new --out"),
        ("predict_step returns a value that is not a tensor",
         lambda: _gather_one_part(lambda p: {"logits": torch.zeros(int(p.n_inner), 2), "loss": 0.5}),
         "prediction['loss'] is a float, not a tensor"),  # fmt: skip
        ("predict_step returns rows of some nodes only (out[mask])", lambda: _gather_one_part(lambda p: torch.zeros(2, 2)),
         "prediction has shape (2, 2), but this rank owns 6 nodes"),  # fmt: skip
        ("lightning-halo test without --ckpt_path", lambda: _checkpoint_for("test", None),
         "no --ckpt_path: test would run the model with its freshly initialised, random weights"),  # fmt: skip
        ("training resumed with another HaloSchedule than the checkpoint's", _resume_with_another_schedule,
         "cannot resume: the checkpoint was written with HaloSchedule(mode='pipelined', sync_every=5)"),  # fmt: skip
        ("assigning batch.n_id (derived from global_id)", _assign_n_id, "is derived from global_id and n_inner"),
        ("Trainer(precision='64-true') with float32 features", _double_precision_on_float32,
         "runs the model in torch.float64, but the partition's features `x` are torch.float32"),  # fmt: skip
    ]


def _resume_with_another_schedule() -> object:
    """What fit(ckpt_path=...) meets with HaloSchedule("pipelined", sync_every=5) in the checkpoint and none now."""
    from lightning_halo.callbacks.schedule import check_resume
    from lightning_halo.exchange.policy import HaloPolicy

    return check_resume(HaloPolicy("pipelined", sync_every=5), None)


def _assign_n_id() -> object:
    from lightning_halo.partition import build_halo_partitions, partition_graph

    data = good_graph()
    (part,) = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 1), 1)
    part.n_id = torch.arange(6)
    return part


def _double_precision_on_float32() -> object:
    """What the strategy meets at the first step of Trainer(precision="64-true") on a float32 graph."""
    from lightning.pytorch.plugins.precision import DoublePrecision

    from lightning_halo.partition import build_halo_partitions, partition_graph
    from lightning_halo.strategy import check_input_dtype

    data = good_graph()
    (part,) = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 1), 1)
    return check_input_dtype(part, DoublePrecision())


#: Runtime cases checked by multi-process tests (tests/strategy/test_errors.py, test_rank_loss.py).
MULTIPROCESS_CASES = [
    ("model without message-passing layer", "UnsupportedLayerError", "has no torch_geometric MessagePassing layer"),
    ("tuple (x_src, x_dst) into GCNConv", "UnsupportedLayerError", "does not take bipartite input"),
    ("layer called with the wrong number of rows", "ValueError", "got x with 10 rows, but this rank owns"),
    ("training_step returns None", "RuntimeError", "training_step returned None"),
    ("num_parts differs from the world size", "ValueError", "num_parts=3) but the Trainer runs 2 processes"),
    ("one rank's part file is damaged (the others learn which)", "PartitionFileError", "rank 1 cannot load its partition: ..."),
    ("ranks partitioned different graphs", "ValueError", "the exchange plan disagrees with rank"),
    ("a parameter without gradient (DirGNNConv over SAGEConv)", "RuntimeError",
     "enable DDP's detection of unused parameters: strategy=HaloQuantStrategy(find_unused_parameters=True)"),  # fmt: skip
    ("NaN in a rank's halo rows during training", "NonFiniteError", "non-finite value in halo fwd rows of layer 'conv2' on rank 1"),
    ("a peer process is killed", "HaloExchangeError", "halo exchange failed on rank 0 ... Connection reset by peer"),
    ("a peer process freezes", "HaloExchangeError", "halo exchange failed on rank 0 ... Timed out waiting"),
]


def _without_kaminpar() -> object:
    from lightning_halo.partition import partition_graph

    saved = sys.modules.get("kaminpar")
    sys.modules["kaminpar"] = None  # type: ignore[assignment]  # `import kaminpar` raises ImportError
    try:
        return partition_graph(torch.tensor([[0, 1], [1, 0]]), 2, 2, partitioner="kaminpar")
    finally:
        if saved is None:
            del sys.modules["kaminpar"]
        else:
            sys.modules["kaminpar"] = saved


def in_process_cases() -> list[tuple[str, Callable[[], object], str]]:
    return [(c, _graph_case(m), f) for c, m, f in GRAPH_CASES] + _other_cases()


def all_cases() -> list[tuple[str, str, str]]:
    """(case, exception type, message) for the docs: in-process messages are the real ones."""
    rows = []
    for case, run, fragment in in_process_cases():
        try:
            run()
        except Exception as err:  # noqa: BLE001
            msg = str(err)
            rows.append((case, type(err).__name__, msg if len(msg) < 260 else msg[:257] + "..."))
        else:
            raise AssertionError(f"{case}: no error raised")
    rows += [(c, t, m + " (multi-process test)") for c, t, m in MULTIPROCESS_CASES]
    return rows
