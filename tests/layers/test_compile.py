"""torch.compile: compiled message passing is refused naming torch.compile and what works;
compiling the parts without message passing runs exactly (ranks as threads)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv

from lightning_halo.layers import UnsupportedLayerError
from lightning_halo.layers.hooks import check_model
from tests.support.graphs import awkward_graph
from tests.support.models import build_any
from tests.support.threaded import reference, run_threaded

WHAT_WORKS = "Compile only the parts of the model without message passing"


class Holder(nn.Module):
    """A LightningModule-like holder of a compiled GNN."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = torch.compile(net, backend="eager")


def test_a_compiled_gnn_is_refused_before_it_runs() -> None:
    data = awkward_graph(2)
    net = build_any("gcn:2", data)
    for model in (Holder(net), torch.compile(net, backend="eager")):
        with pytest.raises(UnsupportedLayerError, match="torch.compile") as err:
            check_model(model)
        assert WHAT_WORKS in str(err.value)


def test_a_compiled_method_reaching_layers_is_refused_before_it_runs() -> None:
    """``@torch.compile`` on a module's forward (or a step method) that reaches PyG layers: refused by name."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = GCNConv(4, 2)

        @torch.compile(backend="eager")
        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    class Head(nn.Module):  # compiled, but no message passing under it: accepted
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        @torch.compile(backend="eager")
        def forward(self, h):
            return self.lin(h)

    with pytest.raises(UnsupportedLayerError, match=r"'Net.forward' is compiled with torch.compile.*" + WHAT_WORKS):
        check_model(Net())
    holder = nn.Module()
    holder.gnn, holder.head = GCNConv(4, 2), Head()
    check_model(holder)


class CompiledHead(nn.Module):
    """GCN layers uncompiled, an MLP head compiled: what the refusal recommends."""

    def __init__(self, d_in: int, n_cls: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(d_in, 8), GCNConv(8, 8)
        self.mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, n_cls))

    def compile_head(self) -> CompiledHead:
        self.mlp = torch.compile(self.mlp, backend="aot_eager")
        return self

    def forward(self, x, edge_index):
        return self.mlp(F.relu(self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)))


@pytest.mark.parametrize("world_size", [2, 3])
def test_compiling_the_parts_without_message_passing_is_exact(world_size: int) -> None:
    data = awkward_graph(world_size)
    torch.manual_seed(0)
    plain = CompiledHead(data.num_features, int(data.y.max()) + 1).double()
    ref = reference(plain, data)
    compiled = CompiledHead(data.num_features, int(data.y.max()) + 1).double()
    compiled.load_state_dict(plain.state_dict())
    compiled.compile_head()
    check_model(compiled)  # accepted
    got = run_threaded(compiled, data, world_size)
    torch.testing.assert_close(got["out"], ref["out"], atol=1e-9, rtol=1e-7)
    for k, g in ref["grad"].items():
        torch.testing.assert_close(got["grad"][k.replace("mlp.", "mlp._orig_mod.")], g, atol=1e-9, rtol=1e-7)


def test_a_module_the_trainer_got_compiled_is_refused_at_connect() -> None:
    """Lightning unwraps ``trainer.fit(torch.compile(model))`` before the strategy sees it (and compiles it
    again after setup): the strategy refuses it naming torch.compile, not a wrong reason at the first step."""
    import lightning as L
    from lightning.pytorch.utilities.compile import _maybe_unwrap_optimized

    from lightning_halo import HaloQuantStrategy

    class GNN(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.conv = GCNConv(4, 2)

    strategy = HaloQuantStrategy(bits=32)
    plain = GNN()
    strategy.connect(plain)  # uncompiled: accepted
    model = _maybe_unwrap_optimized(torch.compile(GNN(), backend="eager"))
    with pytest.raises(UnsupportedLayerError, match=r"trainer.fit\(torch.compile\(model\)\).*" + WHAT_WORKS):
        HaloQuantStrategy(bits=32).connect(model)
