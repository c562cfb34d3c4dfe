"""gather_rows: values and gradients of inner and remote rows, duplicates, empty requests, quantized, errors.

Ranks run as threads over lightning_halo.testing.ThreadGroup, each with its own HaloExchanger
bound to its part of Cora; the reference is plain indexing of the whole graph's rows.
"""

from __future__ import annotations

import pytest
import torch

from lightning_halo.data.datasets import load_bundled
from lightning_halo.exchange import HaloExchanger
from lightning_halo.link.gather import LAYER, gather_rows
from lightning_halo.partition import build_halo_partitions, partition_graph
from lightning_halo.testing import ThreadGroup
from tests.support.threaded import on_threads


@pytest.fixture(scope="module")
def cora_parts():
    data = load_bundled("cora")
    parts = {p: build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, p), p) for p in (1, 3)}
    return data.num_nodes, parts


def _requests(n: int, world: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(world)
    reqs = [torch.randint(0, n, (2, 300), generator=g) for _ in range(world)]
    reqs[0] = torch.cat([reqs[0], reqs[0][:, :40]], 1)  # repeated ids
    if world > 1:
        reqs[-1] = torch.empty(2, 0, dtype=torch.long)  # a rank with no pairs still takes part
    return reqs


def _run(parts, reqs, z_full, weights, bits=32, training=True):
    world = len(parts)
    group = ThreadGroup(world, timeout=20)

    def rank(r):
        ex = HaloExchanger(group.transport(r), bits=bits, eval_bits=bits)
        part = parts[r]
        ex.bind(part)
        ex.begin_step(training=training)
        z = z_full.detach()[part.n_id].clone().requires_grad_(True)
        out = gather_rows(z, reqs[r], exchanger=ex)
        (out * weights[r]).sum().backward()
        return out.detach(), z.grad, part.n_id, ex.meter

    return on_threads(world, rank)


@pytest.mark.parametrize("world", [1, 3])
def test_values_and_gradients_equal_indexing(cora_parts, world) -> None:
    n, all_parts = cora_parts
    parts, reqs = all_parts[world], _requests(n, world)
    z_full = torch.randn(n, 4, dtype=torch.float64, requires_grad=True)
    weights = [torch.randn(*r.shape, 4, dtype=torch.float64) for r in reqs]
    results = _run(parts, reqs, z_full, weights)
    sum(((z_full[r] * w).sum() for r, w in zip(reqs, weights))).backward()
    grad = torch.zeros_like(z_full)
    for r, (out, g, n_id, _) in enumerate(results):
        assert torch.equal(out, z_full.detach()[reqs[r]]), f"rank {r}: rows differ from z[ids]"
        grad[n_id] += g
    torch.testing.assert_close(grad, z_full.grad, rtol=1e-12, atol=1e-12)
    if world > 1:
        remote = sum(int((~torch.isin(reqs[r], parts[r].n_id)).sum()) for r in range(world))
        assert remote > 0, "the requests must reach rows of other ranks"


def test_each_remote_row_travels_once_and_is_counted(cora_parts) -> None:
    n, all_parts = cora_parts
    parts, reqs = all_parts[3], _requests(n, 3)
    z_full = torch.randn(n, 4, dtype=torch.float64)
    results = _run(parts, reqs, z_full, [torch.ones(*r.shape, 4, dtype=torch.float64) for r in reqs])
    for r, (*_, meter) in enumerate(results):
        uniq = torch.unique(reqs[r])
        remote = int((~torch.isin(uniq, parts[r].n_id)).sum())
        received = meter.total[(LAYER, "bwd")] // (4 * 8)  # gradients go back for each row received
        assert received == remote, f"rank {r}: {received} rows sent back, {remote} distinct remote rows"
        assert meter.total[(LAYER, "aux")] > 0


def test_quantized_rows_are_close_and_eval_uses_eval_traffic(cora_parts) -> None:
    n, all_parts = cora_parts
    parts, reqs = all_parts[3], _requests(n, 3)
    z_full = torch.randn(n, 8)
    ones = [torch.ones(*r.shape, 8) for r in reqs]
    results = _run(parts, reqs, z_full, ones, bits=8)
    for r, (out, *_, meter) in enumerate(results):
        if reqs[r].numel():
            assert (out - z_full[reqs[r]]).abs().max() < 0.05
        assert meter.total[(LAYER, "fwd")] < meter.total_fp32[(LAYER, "fwd")] / 2, "8-bit rows on the wire"
    evals = _run(parts, reqs, z_full, ones, training=False)  # evaluation: eval_bits, counted as eval traffic
    assert sum(m.total[(LAYER, "eval")] for *_, m in evals) > 0
    assert all((LAYER, "fwd") not in m.total for *_, m in evals)


def test_errors_name_the_problem(cora_parts) -> None:
    n, all_parts = cora_parts
    part = all_parts[1][0]
    ex = HaloExchanger(None, bits=32)
    ex.bind(part)
    ex.begin_step(training=True)
    z = torch.randn(part.n_inner, 2)
    with pytest.raises(TypeError, match="integer global node ids"):
        gather_rows(z, torch.zeros(3), exchanger=ex)
    with pytest.raises(IndexError, match=r"global ids in \[0, 2708\)"):
        gather_rows(z, torch.tensor([n]), exchanger=ex)
    with pytest.raises(ValueError, match="inner rows"):
        gather_rows(z[:10], torch.tensor([1]), exchanger=ex)
    assert gather_rows(z, torch.empty(0, dtype=torch.long), exchanger=ex).shape == (0, 2)



def _twice_per_step(parts_by_step, reqs, z_full, timeout=20):
    """Each rank binds its part of every partitioning in turn and calls gather_rows twice in each step."""
    world = len(parts_by_step[0])
    group = ThreadGroup(world, timeout=timeout)

    def rank(r):
        ex = HaloExchanger(group.transport(r), bits=32)
        out = []
        for parts in parts_by_step:
            part = parts[r]
            ex.bind(part)
            ex.begin_step(training=True)
            z = z_full.detach()[part.n_id].clone().requires_grad_(True)
            first = gather_rows(z, reqs[r], exchanger=ex)
            second = gather_rows(z * 2, reqs[r].flip(0), exchanger=ex)
            (first.sum() + second.sum()).backward()
            out.append((first.detach(), second.detach(), z.grad, part.n_id))
        return out

    return on_threads(world, rank, timeout=timeout + 10)


def test_two_calls_per_step_on_threaded_ranks_and_a_new_partitioning(cora_parts) -> None:
    """Every rank's row directory is its own exchanger's: two calls per step, threads for ranks, and a second
    partitioning bound later all give z[ids] (a directory shared across ranks or kept from the first
    partitioning fetches the wrong rows, or runs its collective on some ranks only and times out)."""
    n, all_parts = cora_parts
    data = load_bundled("cora")
    other = build_halo_partitions(data, partition_graph(data.edge_index, n, 3, partitioner="random", seed=1), 3)
    reqs = _requests(n, 3)
    z_full = torch.randn(n, 4, dtype=torch.float64)
    results = _twice_per_step([all_parts[3], other, all_parts[3]], reqs, z_full)
    want_grad = sum(torch.bincount(r.reshape(-1), minlength=n).double() for r in reqs) * 3  # d(first + second)/dz
    for step in range(3):
        grad = torch.zeros(n, dtype=torch.float64)
        for r, steps in enumerate(results):
            first, second, g, n_id = steps[step]
            assert torch.equal(first, z_full[reqs[r]]), f"rank {r}, step {step}: first call"
            assert torch.equal(second, 2 * z_full[reqs[r].flip(0)]), f"rank {r}, step {step}: second call"
            grad[n_id] += g[:, 0]
        assert torch.equal(grad, want_grad), f"step {step}: gradients reach the owners"


@pytest.mark.parametrize("world", [1, 3])
def test_second_derivatives_through_the_gather_equal_indexing(cora_parts, world) -> None:
    """A gradient penalty over the gathered rows (``create_graph=True``): the gather's backward is its transpose and
    differentiates again, so the penalty's gradient reaches every rank's rows as plain indexing's does."""
    n, all_parts = cora_parts
    parts, reqs = all_parts[world], _requests(n, world)
    z_full = torch.randn(n, 4, dtype=torch.float64, requires_grad=True)
    weights = [torch.randn(*r.shape, 4, dtype=torch.float64) for r in reqs]
    v_full = torch.rand(n, 4, dtype=torch.float64)
    group = ThreadGroup(world, timeout=20)

    def rank(r):
        ex = HaloExchanger(group.transport(r), bits=32)
        part = parts[r]
        ex.bind(part)
        ex.begin_step(training=True)
        z = z_full.detach()[part.n_id].clone().requires_grad_(True)
        out = gather_rows(z, reqs[r], exchanger=ex)
        (g,) = torch.autograd.grad((out.square() * weights[r]).sum(), z, create_graph=True)
        (g.square() * v_full[part.n_id]).sum().backward()
        return z.grad, part.n_id

    f = sum((z_full[r].square() * w).sum() for r, w in zip(reqs, weights))
    (g_full,) = torch.autograd.grad(f, z_full, create_graph=True)
    (g_full.square() * v_full).sum().backward()
    grad = torch.zeros_like(z_full)
    for g, n_id in on_threads(world, rank):
        grad[n_id] += g
    torch.testing.assert_close(grad, z_full.grad, rtol=1e-10, atol=1e-12)
