"""Plain PyG models used by the parity tests, built identically in every process."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv

import lightning_halo

LAYERS = ("gcn", "sage", "gat", "gin")

#: Aggregation of each main model's layers: the ``reduce`` of its sparse adjacency.
REDUCE = {"gcn": "sum", "sage": "mean", "gin": "sum"}


def edges_for(kind: str, data, sparse: bool):
    """What the net gets as ``edge_index``: the edge list, or the sparse adjacency of ``data``."""
    if not sparse:
        return data.edge_index
    from lightning_halo import sparse_adjacency

    return sparse_adjacency(data, reduce=REDUCE[kind])


def make_conv(kind: str, d_in: int, d_out: int, last: bool) -> nn.Module:
    if kind == "gcn":
        return GCNConv(d_in, d_out)  # normalize=True: needs global degrees
    if kind == "sage":
        return SAGEConv(d_in, d_out)
    if kind == "gat":
        heads = 1 if last else 2
        return GATConv(d_in, d_out // heads if not last else d_out, heads=heads)
    if kind == "gin":
        return GINConv(nn.Sequential(nn.Linear(d_in, d_out), nn.ReLU(), nn.Linear(d_out, d_out)), train_eps=True)
    raise KeyError(kind)


class Net(nn.Module):
    """``depth`` message-passing layers with ReLU in between (no dropout: parity must be exact)."""

    def __init__(self, kind: str, depth: int, d_in: int, hidden: int, n_cls: int) -> None:
        super().__init__()
        self.n_cls = n_cls
        dims = [d_in] + [hidden] * (depth - 1) + [n_cls]
        self.convs = nn.ModuleList(make_conv(kind, dims[i], dims[i + 1], i == depth - 1) for i in range(depth))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr=None, edge_type=None) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.relu(x)
        return x


class NormNet(nn.Module):
    """conv -> norm -> relu -> conv: the norm's input needs gradients, its output feeds a halo exchange."""

    def __init__(self, d_in: int, n_cls: int, norm: nn.Module, hidden: int = 8) -> None:
        super().__init__()
        self.conv1, self.norm, self.conv2 = GCNConv(d_in, hidden), norm, SAGEConv(hidden, n_cls)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.norm(self.conv1(x, edge_index))), edge_index)


def assert_norm_run_matches(got: dict, ref: dict, atol: float = 1e-9, rtol: float = 1e-7) -> None:
    """Threaded ranks (``run_threaded``) against ``reference``: logits, every gradient and every rank's buffers."""
    torch.testing.assert_close(got["out"], ref["out"], atol=atol, rtol=rtol)
    assert set(got["grad"]) == set(ref["grad"])
    for k, g in ref["grad"].items():
        torch.testing.assert_close(got["grad"][k], g, atol=atol, rtol=rtol, msg=lambda m: f"grad {k}: {m}")
    for rank in got["ranks"]:
        assert set(rank["buffers"]) == set(ref["buffers"])
        for k, b in ref["buffers"].items():
            torch.testing.assert_close(rank["buffers"][k], b, atol=atol, rtol=rtol, msg=lambda m: f"buffer {k}: {m}")


class EmbNet(nn.Module):
    """A learnable embedding per node beside the features, looked up by global id: ``emb(n_id)``.

    ``n_id`` is ``batch.n_id`` on a partition (NeighborLoader's meaning: the global ids of the
    rows of ``x``) and ``torch.arange(N)`` on the whole graph.
    """

    needs_n_id = True

    def __init__(self, depth: int, d_in: int, hidden: int, n_cls: int, num_nodes: int, dim: int = 4) -> None:
        super().__init__()
        self.n_cls = n_cls
        self.emb = nn.Embedding(num_nodes, dim)
        self.net = Net("gcn", depth, d_in + dim, hidden, n_cls)

    def forward(self, x, edge_index, edge_attr=None, edge_type=None, n_id=None):
        return self.net(torch.cat([x, self.emb(n_id)], dim=1), edge_index)


def node_ids(net: nn.Module, batch) -> dict[str, torch.Tensor]:
    """The ``n_id`` keyword of a net that takes one: ``batch.n_id`` on a partition, ``arange(N)`` on a whole graph."""
    from lightning_halo import HaloPartition

    if not getattr(net, "needs_n_id", False):
        return {}
    return {"n_id": batch.n_id if isinstance(batch, HaloPartition) else torch.arange(batch.num_nodes)}


def build_net(
    kind: str, depth: int, d_in: int, n_cls: int, hidden: int = 16, seed: int = 0, dtype: torch.dtype = torch.float64
) -> Net:
    torch.manual_seed(seed)
    return Net(kind, depth, d_in, hidden, n_cls).to(dtype)


#: Loss forms of the parity tests: what ``training_step`` returns, and the strategy's ``scale_loss``.
LOSSES = {"mean": "train_mean", "subset": "share", "sum": "share", "weighted": "share"}


def subset_of(global_id: torch.Tensor) -> torch.Tensor:
    """A fixed subset of the nodes (by global id), like UniMP's label trick supervising part of the train nodes."""
    return (global_id * 2654435761) % 5 < 3


def class_weights(n_cls: int, dtype: torch.dtype) -> torch.Tensor:
    return (1.0 + torch.arange(n_cls, dtype=dtype)) / n_cls


def loss_of(kind: str, out: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, global_id: torch.Tensor) -> torch.Tensor:
    """The loss form ``kind`` on one rank (with ``lightning_halo.global_mean``) or on the whole graph (plain PyG)."""
    from lightning_halo import global_mean

    if kind == "mean":
        return F.cross_entropy(out[mask], y[mask])
    if kind == "sum":
        return F.cross_entropy(out[mask], y[mask], reduction="sum")
    per_node = F.cross_entropy(out, y, reduction="none")
    if kind == "subset":
        return global_mean(per_node, mask & subset_of(global_id))
    if kind == "weighted":
        return global_mean(per_node, mask, weight=class_weights(out.size(1), out.dtype)[y])
    raise KeyError(kind)


def reference_loss(kind: str, out: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The same objectives written as plain single-process PyG code."""
    if kind == "subset":
        sel = mask & subset_of(torch.arange(y.numel()))
        return F.cross_entropy(out[sel], y[sel])
    if kind == "weighted":
        return F.cross_entropy(out[mask], y[mask], weight=class_weights(out.size(1), out.dtype))
    if kind == "sum":
        return F.cross_entropy(out[mask], y[mask], reduction="sum")
    return F.cross_entropy(out[mask], y[mask])


def reference_run(
    net: Net, data, steps: int = 5, lr: float = 0.01, edge_index=None, loss: str = "mean"
) -> dict[str, object]:
    """Single-process plain PyG: logits, loss and gradients at step 0, parameters after ``steps``."""
    from lightning_halo.layers.dropedge import reset_dropout_edge

    reset_dropout_edge()  # lightning_halo.dropout_edge draws as a fresh process does
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    rec: dict[str, object] = {}
    edges = data.edge_index if edge_index is None else edge_index
    for step in range(steps):
        opt.zero_grad()
        out = net(data.x, edges, data.get("edge_attr"), data.get("edge_type"), **node_ids(net, data))
        loss_value = reference_loss(loss, out, data.y, data.train_mask)
        loss_value.backward()
        if step == 0:
            rec["out0"] = out.detach().clone()
            rec["loss0"] = float(loss_value.detach())
            rec["grad0"] = {k: p.grad.detach().clone() for k, p in net.named_parameters() if p.grad is not None}
        opt.step()
    rec["params"] = {k: p.detach().clone() for k, p in net.named_parameters()}
    rec["buffers"] = {k: b.detach().clone() for k, b in net.named_buffers()}
    return rec


# ---------------------------------------------------------------------------------------------
# Every registered layer type: lin_in -> conv -> relu -> conv -> lin_out, so both convs get
# inputs that need gradients (the backward exchange runs for each).

EDGE_DIM = 3


def _mlp(d_in: int, d_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, d_out), nn.ReLU(), nn.Linear(d_out, d_out))


def _layer_factory(name: str, h: int, deg: torch.Tensor) -> tuple[nn.Module, str]:
    """(layer h->h, call style) for every layer in lightning_halo.supported_layers() and some variants.

    Call styles: ``plain`` ``conv(h, ei)``, ``attr`` ``conv(h, ei, edge_attr)``, ``x0``
    ``conv(h, x0, ei)``, ``type`` ``conv(h, ei, edge_type)``, ``weight`` ``conv(h, ei, edge_attr[:, 0])``.
    Variants are ``Class/option``.
    """
    from torch_geometric import nn as gnn

    e = EDGE_DIM
    table = {
        "GCNConv": (lambda: gnn.GCNConv(h, h), "plain"),
        "GCNConv/improved": (lambda: gnn.GCNConv(h, h, improved=True), "plain"),
        "GCNConv/t2s": (lambda: gnn.GCNConv(h, h, flow="target_to_source"), "plain"),
        "LGConv": (lambda: gnn.LGConv(), "plain"),
        "SAGEConv": (lambda: gnn.SAGEConv(h, h), "plain"),
        "SAGEConv/max": (lambda: gnn.SAGEConv(h, h, aggr="max"), "plain"),
        "SAGEConv/sum": (lambda: gnn.SAGEConv(h, h, aggr="sum", project=True), "plain"),
        "SAGEConv/t2s": (lambda: gnn.SAGEConv(h, h, flow="target_to_source"), "plain"),
        "GraphConv": (lambda: gnn.GraphConv(h, h), "plain"),
        "GraphConv/mean": (lambda: gnn.GraphConv(h, h, aggr="mean"), "plain"),
        "GraphConv/weighted": (lambda: gnn.GraphConv(h, h), "weight"),
        "GCNConv/weighted": (lambda: gnn.GCNConv(h, h), "weight"),
        "GATConv": (lambda: gnn.GATConv(h, h // 2, heads=2, edge_dim=e), "attr"),
        "GATv2Conv": (lambda: gnn.GATv2Conv(h, h // 2, heads=2, edge_dim=e), "attr"),
        "TransformerConv": (lambda: gnn.TransformerConv(h, h // 2, heads=2, edge_dim=e), "attr"),
        "GINConv": (lambda: gnn.GINConv(_mlp(h, h), train_eps=True), "plain"),
        "GINEConv": (lambda: gnn.GINEConv(_mlp(h, h), edge_dim=e), "attr"),
        "ResGatedGraphConv": (lambda: gnn.ResGatedGraphConv(h, h), "plain"),
        "LEConv": (lambda: gnn.LEConv(h, h), "plain"),
        # norm=None: GENConv's default BatchNorm needs Trainer(sync_batchnorm=True), tested separately
        "GENConv": (lambda: gnn.GENConv(h, h, edge_dim=e, norm=None), "attr"),
        "FiLMConv": (lambda: gnn.FiLMConv(h, h), "plain"),
        "FiLMConv/relations": (lambda: gnn.FiLMConv(h, h, num_relations=3), "type"),
        "GeneralConv": (lambda: gnn.GeneralConv(h, h, in_edge_channels=e, attention=True), "attr"),
        "SimpleConv": (lambda: gnn.SimpleConv(aggr="mean", combine_root="sum"), "plain"),
        "SimpleConv/self_loop": (lambda: gnn.SimpleConv(aggr="sum", combine_root="self_loop"), "plain"),
        "NNConv": (lambda: gnn.NNConv(h, h, nn.Linear(e, h * h), aggr="mean"), "attr"),
        "CGConv": (lambda: gnn.CGConv(h, dim=e), "attr"),
        "EdgeConv": (lambda: gnn.EdgeConv(_mlp(2 * h, h)), "plain"),
        "MFConv": (lambda: gnn.MFConv(h, h, max_degree=4), "plain"),
        "GMMConv": (lambda: gnn.GMMConv(h, h, dim=e, kernel_size=2), "attr"),
        # its mean divides by the weighted in-degree of each target: every in-edge of an inner node is local
        "WLConvContinuous": (lambda: gnn.WLConvContinuous(), "weight"),
        "ClusterGCNConv": (lambda: gnn.ClusterGCNConv(h, h, diag_lambda=0.3), "plain"),
        "PNAConv": (
            lambda: gnn.PNAConv(h, h, aggregators=["mean", "max", "std"], scalers=["identity", "amplification"], deg=deg),
            "plain",
        ),
        "AGNNConv": (lambda: gnn.AGNNConv(requires_grad=True), "plain"),
        "FeaStConv": (lambda: gnn.FeaStConv(h, h, heads=2), "plain"),
        "RGCNConv": (lambda: gnn.RGCNConv(h, h, num_relations=3, aggr="mean"), "type"),
        "FastRGCNConv": (lambda: gnn.FastRGCNConv(h, h, num_relations=3, num_bases=2), "type"),
        # PyG's RGATConv leaves parameters unused in every mode (and its `mod` options read l1/b1/l2/b2,
        # which it never initialises): the default mode, and DDP with find_unused_parameters
        "RGATConv": (lambda: gnn.RGATConv(h, h, num_relations=3), "type"),
        # layers that propagate several times per call: the halo is exchanged before every step
        "APPNP": (lambda: gnn.APPNP(K=3, alpha=0.1), "plain"),
        "SGConv": (lambda: gnn.SGConv(h, h, K=2), "plain"),
        "SGConv/cached": (lambda: gnn.SGConv(h, h, K=2, cached=True), "plain"),
        "SSGConv": (lambda: gnn.SSGConv(h, h, alpha=0.1, K=2), "plain"),
        "TAGConv": (lambda: gnn.TAGConv(h, h, K=3), "plain"),
        "ARMAConv": (lambda: gnn.ARMAConv(h, h, num_stacks=2, num_layers=2), "plain"),
        "GatedGraphConv": (lambda: gnn.GatedGraphConv(h, num_layers=2), "plain"),
        "MixHopConv": (lambda: gnn.MixHopConv(h, h // 2, powers=[0, 2]), "plain"),
        "ChebConv": (lambda: gnn.ChebConv(h, h, K=3), "plain"),
        "ChebConv/rw": (lambda: gnn.ChebConv(h, h, K=2, normalization="rw"), "plain"),
        "GCN2Conv": (lambda: gnn.GCN2Conv(h, alpha=0.1, theta=0.5, layer=1), "x0"),
        "FAConv": (lambda: gnn.FAConv(h, eps=0.2), "x0"),
    }
    make, style = table[name]
    return make(), style


#: Every variant the layer tests run (the supported classes plus options that change how they run).
#: Every supported layer that runs on a homogeneous graph (the "types" kind takes dicts of node and edge
#: types: tests/layers/test_hetero.py).
HOMOGENEOUS_LAYERS = tuple(name for name, kind in lightning_halo.supported_layers().items() if kind != "types")

LAYER_VARIANTS = (
    "GCNConv/improved", "GCNConv/t2s", "SAGEConv/max", "SAGEConv/sum", "SAGEConv/t2s", "GraphConv/mean",
    "FiLMConv/relations", "SimpleConv/self_loop", "SGConv/cached", "ChebConv/rw", "GraphConv/weighted",
    "GCNConv/weighted",
)  # fmt: skip


class LayerNet(nn.Module):
    """lin_in -> conv -> relu -> conv -> lin_out, so both convs get inputs that need gradients."""

    def __init__(self, name: str, d_in: int, n_cls: int, deg: torch.Tensor, hidden: int = 8) -> None:
        super().__init__()
        self.n_cls = n_cls
        self.lin_in = nn.Linear(d_in, hidden)
        self.conv1, self.style = _layer_factory(name, hidden, deg)
        self.conv2, _ = _layer_factory(name, hidden, deg)
        self.lin_out = nn.Linear(hidden, n_cls)

    def _conv(self, conv: nn.Module, h, x0, edge_index, edge_attr, edge_type):
        if self.style == "attr":
            return conv(h, edge_index, edge_attr)
        if self.style == "x0":
            return conv(h, x0, edge_index)
        if self.style == "type":
            return conv(h, edge_index, edge_type)
        if self.style == "weight":  # positive per-edge weights, the same tensor every call (a partition's column)
            return conv(h, edge_index, edge_attr[:, 0])
        return conv(h, edge_index)

    def forward(self, x, edge_index, edge_attr=None, edge_type=None):
        x0 = h = self.lin_in(x)
        h = F.relu(self._conv(self.conv1, h, x0, edge_index, edge_attr, edge_type))
        h = self._conv(self.conv2, h, x0, edge_index, edge_attr, edge_type)
        return self.lin_out(h)


def in_degree_histogram(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    deg = torch.bincount(edge_index[1], minlength=num_nodes)
    return torch.bincount(deg)


class DropEdgeGCN(nn.Module):
    """Two GCN layers (normalised over the kept edges) on the edges ``lightning_halo.dropout_edge`` keeps."""

    def __init__(self, d_in: int, n_cls: int, hidden: int = 16, p: float = 0.3) -> None:
        super().__init__()
        self.conv1, self.conv2, self.p = GCNConv(d_in, hidden), GCNConv(hidden, n_cls), p

    def forward(self, x, edge_index):
        from lightning_halo import dropout_edge

        kept, _ = dropout_edge(edge_index, p=self.p, training=self.training)
        return self.conv2(F.relu(self.conv1(x, kept)), kept)


class ReadyModel(nn.Module):
    """A model of ``torch_geometric.nn.models`` as PyG ships it, called with ``(x, edge_index)``."""

    def __init__(self, name: str, d_in: int, n_cls: int) -> None:
        super().__init__()
        from torch_geometric.nn import models as m

        self.n_cls = n_cls
        make = {
            "GCN-jk-cat": lambda: m.GCN(d_in, 16, 3, n_cls, jk="cat"),
            "GraphSAGE-jk-lstm": lambda: m.GraphSAGE(d_in, 16, 3, n_cls, jk="lstm"),
            "GIN-jk-max-layernorm": lambda: m.GIN(d_in, 16, 3, n_cls, jk="max", norm="layer_norm",
                                                 norm_kwargs={"mode": "node"}),  # fmt: skip
            "GAT-v2": lambda: m.GAT(d_in, 16, 2, n_cls, v2=True, heads=2),
            "EdgeCNN": lambda: m.EdgeCNN(d_in, 16, 2, n_cls),
            # PyG's BatchNorm (a torch BatchNorm1d inside), exact through lightning_halo.layers.batchnorm
            "GIN-batchnorm": lambda: m.GIN(d_in, 16, 3, n_cls, norm="batch_norm"),
            "GCN-dropedge": lambda: DropEdgeGCN(d_in, n_cls),  # not PyG's: DropEdge exact on partitions
            "GCN-batchnorm-cumulative": lambda: m.GCN(d_in, 16, 3, n_cls, norm="batch_norm",
                                                      norm_kwargs={"momentum": None}),  # fmt: skip
        }
        self.net = make[name]()

    def forward(self, x, edge_index, edge_attr=None, edge_type=None):
        return self.net(x, edge_index)


READY_MODELS = ("GCN-jk-cat", "GraphSAGE-jk-lstm", "GIN-jk-max-layernorm", "GAT-v2", "EdgeCNN")


def build_any(spec: str, data, seed: int = 0, hidden: int = 16) -> nn.Module:
    """``spec`` is ``kind:depth`` for the four main models, ``emb:depth`` (:class:`EmbNet`), ``layer:<ClassName>`` or
    ``model:<ready model>``;
    dtype follows ``data.x``."""
    a, b = spec.split(":", 1)
    n_cls = int(data.y.max()) + 1
    if a == "model":
        torch.manual_seed(seed)
        return ReadyModel(b, data.num_features, n_cls).to(data.x.dtype)
    if a == "emb":
        torch.manual_seed(seed)
        return EmbNet(int(b), data.num_features, hidden, n_cls, data.num_nodes).to(data.x.dtype)
    if a == "layer":
        torch.manual_seed(seed)
        deg = in_degree_histogram(data.edge_index, data.num_nodes)
        return LayerNet(b, data.num_features, n_cls, deg).to(data.x.dtype)
    return build_net(a, int(b), data.num_features, n_cls, hidden=hidden, seed=seed, dtype=data.x.dtype)


def tiny_sage_module():
    """One ``SAGEConv(8, 3)`` trained with SGD on the train nodes: the smallest LightningModule for strategy tests."""
    import lightning as L

    class TinySAGE(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.conv = SAGEConv(8, 3)

        def training_step(self, batch, _):
            out = self.conv(batch.x, batch.edge_index)
            return F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return TinySAGE()
