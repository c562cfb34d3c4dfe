"""The partial-sum exchange over the in-process transport: blocks, gradients and bytes, exactly."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.exchange import HaloExchanger
from lightning_halo.partition import build_halo_partitions, partition_graph
from lightning_halo.quant import row_nbytes
from lightning_halo.testing import ThreadGroup
from tests.support.graphs import awkward_graph
from tests.support.threaded import on_threads

D = 5


def _bound(group: ThreadGroup, r: int, part, bits: int) -> tuple[HaloExchanger, object]:
    """Rank ``r``'s exchanger bound to its part in a training step, and its cover plan (built collectively)."""
    ex = HaloExchanger(group.transport(r), bits=bits)
    ex.bind(part)
    ex.begin_step(True, epoch=0)
    return ex, ex.cover_plan()


def _expected_block(part, cover, coefficients: torch.Tensor, x_global: torch.Tensor) -> torch.Tensor:
    """The block a rank must receive, from the whole graph's rows: fetched rows, then partial sums."""
    gid = part.global_id
    n_inner = int(part.n_inner)
    block = torch.zeros(cover.block, D, dtype=x_global.dtype)
    block[cover.kept_pos] = x_global[gid[n_inner + cover.kept_cols]]
    rows = x_global[gid[n_inner + cover.folded_col]] * coefficients.view(-1, 1)
    block.index_add_(0, cover.partial_pos[cover.folded_partial], rows)
    return block


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_blocks_and_gradients_equal_the_whole_graph_computation(world_size: int) -> None:
    data = awkward_graph(world_size)
    parts = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, world_size), world_size)
    x_global = torch.randn(data.num_nodes, D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    group = ThreadGroup(world_size)

    def rank(r: int) -> dict:
        part = parts[r]
        ex, cover = _bound(group, r, part, 32)
        coefficients = torch.rand(cover.folded_col.numel(), dtype=torch.float64, generator=torch.Generator().manual_seed(r))
        route = ex.cover_route(coefficients, torch.device("cpu"))
        x = x_global[part.inner_global_id].clone().requires_grad_(True)
        block = ex.fetch(x, "conv", route=route)
        # a loss whose block gradient is known: sum over the block of block * G_block
        g_block = torch.randn(cover.block, D, dtype=torch.float64, generator=torch.Generator().manual_seed(10 + r))
        (block * g_block).sum().backward()
        return {"block": block.detach(), "want": _expected_block(part, cover, coefficients, x_global), "grad": x.grad,
                "g_block": g_block, "cover": cover, "coefficients": coefficients, "meter": dict(ex.meter.total)}  # fmt: skip

    res = on_threads(world_size, rank)
    grad_global = torch.zeros(data.num_nodes, D, dtype=torch.float64)
    for r, out in enumerate(res):
        torch.testing.assert_close(out["block"], out["want"], rtol=1e-12, atol=1e-12)
        part, cover = parts[r], out["cover"]
        n_inner, gid = int(part.n_inner), parts[r].global_id
        # the block's gradient flows back to the rows it came from, weighted by the coefficients
        grad_global.index_add_(0, gid[n_inner + cover.kept_cols], out["g_block"][cover.kept_pos])
        g_partial = out["g_block"][cover.partial_pos[cover.folded_partial]] * out["coefficients"].view(-1, 1)
        grad_global.index_add_(0, gid[n_inner + cover.folded_col], g_partial)
        assert out["meter"][("conv", "fwd")] == cover.num_send * row_nbytes(D, 32, torch.float64)
        assert out["meter"][("conv", "bwd")] == cover.block * row_nbytes(D, 32, torch.float64)
    for r, out in enumerate(res):
        torch.testing.assert_close(out["grad"], grad_global[parts[r].inner_global_id], rtol=1e-12, atol=1e-12)
    assert sum(o["cover"].block for o in res) < sum(int(p.n_halo) for p in parts)


def test_stored_input_features_form_the_block_locally_without_traffic() -> None:
    data = awkward_graph(2)
    parts = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 2), 2)
    group = ThreadGroup(2)

    def rank(r: int) -> tuple:
        part = parts[r]
        ex, cover = _bound(group, r, part, 1)
        c = torch.rand(cover.folded_col.numel(), dtype=part.x.dtype)
        block = ex.fetch(part.x, "conv0", route=ex.cover_route(c, torch.device("cpu")))
        return block, cover, c, dict(ex.meter.total), part

    for block, cover, c, meter, part in on_threads(2, rank):
        assert not any(layer == "conv0" for layer, _ in meter)  # the stored halo_x: nothing travelled
        gid, n = part.global_id, int(part.n_inner)
        want = torch.zeros(cover.block, data.x.size(1), dtype=data.x.dtype)
        want[cover.kept_pos] = data.x[gid[n + cover.kept_cols]]
        want.index_add_(0, cover.partial_pos[cover.folded_partial], data.x[gid[n + cover.folded_col]] * c.view(-1, 1))
        torch.testing.assert_close(block, want)


def test_a_slot_refuses_to_switch_between_rows_and_partial_sums() -> None:
    from lightning_halo.exchange.meter import TrafficMeter
    from lightning_halo.exchange.slots import SlotTable
    from lightning_halo.exchange.wire import HaloExchangeError, SoloTransport, Wire

    table = SlotTable(Wire(SoloTransport(), TrafficMeter()))
    rows = torch.ones(2, 3)
    table.slot(0, "conv1", "in", rows, partial=True)
    with pytest.raises(HaloExchangeError, match="partial sums"):
        table.slot(0, "conv1", "in", rows, partial=False)
    state = table.state_dict()
    assert state[0]["partial"] is True
    table.load_state_dict(state, torch.device("cpu"))
    assert table.slots[0].partial


# --------------------------------------------------------- the float32 fallback off the CPU
class _FakeSparseMM:
    """``torch.sparse.mm`` off the CPU that fails with ``error`` for every dtype but float32 (recorded)."""

    def __init__(self, error: BaseException) -> None:
        self.error, self.dtypes = error, []

    def __call__(self, a, b, *reduce):
        self.dtypes.append(b.dtype)
        if b.dtype != torch.float32:
            raise self.error
        return torch.empty(a.size(0), b.size(1), dtype=b.dtype, device=b.device)


def _op_and_rows(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    op = torch.eye(3).to_sparse_csr()
    return op, torch.empty(3, 2, dtype=dtype, device="meta")  # not the CPU: the branch for CUDA


def test_out_of_memory_off_the_cpu_is_raised_not_retried_in_float32(monkeypatch) -> None:
    from lightning_halo.exchange.cover import _apply

    fake = _FakeSparseMM(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"))
    monkeypatch.setattr(torch.sparse, "mm", fake)
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):
        _apply(*_op_and_rows(torch.bfloat16))
    assert fake.dtypes == [torch.bfloat16], "no second try in float32 (it needs more memory still)"


def test_a_dtype_without_a_kernel_off_the_cpu_runs_in_float32(monkeypatch) -> None:
    from lightning_halo.exchange.cover import _apply

    fake = _FakeSparseMM(RuntimeError("\"spmm_cuda\" not implemented for 'BFloat16'"))
    monkeypatch.setattr(torch.sparse, "mm", fake)
    out = _apply(*_op_and_rows(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and fake.dtypes == [torch.bfloat16, torch.float32]


def test_other_errors_off_the_cpu_are_raised_for_full_precision(monkeypatch) -> None:
    from lightning_halo.exchange.cover import _apply

    fake = _FakeSparseMM(RuntimeError("CUDA error: an illegal memory access was encountered"))
    monkeypatch.setattr(torch.sparse, "mm", fake)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        _apply(*_op_and_rows(torch.float64))
    assert fake.dtypes == [torch.float64]


def test_a_relation_view_holds_its_own_partial_sums_and_folded_edges() -> None:
    """A joint layout of two relations (targets 0-1 and 2-4): each view renumbers its targets from 0, keeps the
    block positions, and the masks of their folded edges split the joint list."""
    from lightning_halo.exchange.cover import CoverPlan

    empty = torch.empty(0, dtype=torch.long)
    plan = CoverPlan(
        n_inner=3, n_halo=4, recv_counts=(0, 5), send_counts=(0, 0), kept_cols=torch.tensor([1]),
        kept_pos=torch.tensor([0]), partial_pos=torch.tensor([1, 2, 3, 4]), partial_target=torch.tensor([0, 1, 2, 4]),
        folded_col=torch.tensor([0, 2, 0, 3, 2]), folded_partial=torch.tensor([0, 0, 1, 2, 3]), folded_counts=(0, 5),
        send_rows=empty, send_rows_pos=empty, send_partial_pos=empty, send_folded_partial=empty, send_folded_col=empty,
    )  # fmt: skip
    first, mask_a = plan.relation_view(0, 2)
    second, mask_b = plan.relation_view(2, 5)
    assert first.partial_target.tolist() == [0, 1] and first.partial_pos.tolist() == [1, 2]
    assert second.partial_target.tolist() == [0, 2] and second.partial_pos.tolist() == [3, 4]
    assert first.folded_col.tolist() == [0, 2, 0] and first.folded_partial.tolist() == [0, 0, 1]
    assert second.folded_col.tolist() == [3, 2] and second.folded_partial.tolist() == [0, 1]
    assert torch.equal(mask_a, ~mask_b) and mask_a.tolist() == [True, True, True, False, False]
    assert torch.equal(first.kept_pos, plan.kept_pos) and first.block == plan.block


def test_a_rank_owning_no_row_of_a_type_sends_an_empty_buffer() -> None:
    """A heterogeneous rank may own no node of a source type: its send operator has no column, its buffer no row."""
    from lightning_halo.exchange.cover import _apply

    op = torch.zeros(0, 0).to_sparse_csr()
    out = _apply(op, torch.empty(0, 8, dtype=torch.float64))
    assert out.shape == (0, 8) and out.dtype == torch.float64
    op = torch.zeros(2, 0).to_sparse_csr()  # rows to send (partial sums of nothing) from no own row
    assert torch.equal(_apply(op, torch.empty(0, 3)), torch.zeros(2, 3))
