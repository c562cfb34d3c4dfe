"""compare_step on hand-made records: rows placed by n_id, per-edge tensors skipped, nested calls judged first."""

from __future__ import annotations

import torch

from lightning_halo.verification import compare_step

X = torch.arange(12.0, dtype=torch.float64).view(6, 2)
N_ID = [torch.tensor([0, 2, 5]), torch.tensor([1, 3, 4])]  # rank 0 owns nodes 0, 2, 5; rank 1 the others


def call(name: str, start: int, end: int, inputs: list, outputs: list) -> dict:
    return {"name": name, "cls": name.title(), "start": start, "end": end, "inputs": inputs, "outputs": outputs}


def record(n_id: torch.Tensor, calls: list, loss: float = 1.0, grad: float = 1.0) -> dict:
    return {"n_id": n_id, "n_inner": n_id.numel(), "calls": calls, "scaled_loss": loss, "grads": {"w": torch.tensor([grad])},
            "dtype": torch.float64}  # fmt: skip


def test_rows_are_compared_in_global_node_order_and_edges_are_skipped() -> None:
    ref = record(torch.arange(6), [call("lin", 1, 2, [X, torch.zeros(2, 10)], [X * 2])])
    ranks = [record(ids, [call("lin", 1, 2, [X[ids], torch.zeros(2, 4 + r)], [X[ids] * 2])]) for r, ids in enumerate(N_ID)]
    report = compare_step(ref, ranks)
    assert report.ok and report.compared == 1 and report.logits_diff == 0.0, str(report)
    ranks[1]["calls"][0]["outputs"] = [X[N_ID[0]] * 2]  # rank 1's rows put at rank 0's nodes: wrong
    report = compare_step(ref, ranks)
    assert not report.ok and report.first_difference.name == "lin" and not report.first_difference.inputs_differ


def test_a_nested_call_is_named_before_the_call_around_it() -> None:
    """Calls are in the order they end: the inner module is judged first, and 'previous' skips calls still open."""
    def calls(n_id, shift):
        x = X[n_id]
        return [call("a", 1, 2, [x], [x]), call("inner", 4, 5, [x + shift], [x + shift]), call("outer", 3, 6, [x], [x + shift])]

    ref = record(torch.arange(6), calls(torch.arange(6), 0.0))
    ranks = [record(ids, calls(ids, 1.0)) for ids in N_ID]
    first = compare_step(ref, ranks).first_difference
    assert (first.name, first.inputs_differ, first.previous) == ("inner", True, "a")


def test_loss_gradients_and_call_counts() -> None:
    ref = record(torch.arange(6), [call("a", 1, 2, [X], [X])], loss=2.0)
    ranks = [record(ids, [call("a", 1, 2, [X[ids]], [X[ids]])], loss=1.0 + r * 2.0) for r, ids in enumerate(N_ID)]
    assert compare_step(ref, ranks).ok  # the whole graph's loss is the mean of what the ranks back-propagate
    ranks[0]["grads"]["w"] += 1e-6
    assert compare_step(ref, ranks).grads_differ == ["w"]
    assert compare_step(ref, ranks, atol=1e-5).ok
    ranks[0]["grads"]["w"] -= 1e-6
    ranks[1]["calls"] = []  # one rank did not call it
    report = compare_step(ref, ranks)
    assert not report.ok and report.first_difference.name == "a"


def test_a_step_without_a_loss_is_not_compared_and_not_ok() -> None:
    """training_step returned None (or a dict without 'loss') on one side: the loss cannot be compared, so the
    report cannot say exact, even where every module output and gradient matched."""
    calls = lambda ids: [call("a", 1, 2, [X[ids]], [X[ids]])]  # noqa: E731
    ref = record(torch.arange(6), calls(torch.arange(6)), loss=2.0)
    ranks = [record(ids, calls(ids), loss=1.0 + r * 2.0) for r, ids in enumerate(N_ID)]
    assert compare_step(ref, ranks).ok
    for missing in (ref, ranks[1]):
        del missing["scaled_loss"]
        report = compare_step(ref, ranks)
        assert not report.ok and report.loss is None and report.first_difference is None and not report.grads_differ
        text = str(report)
        assert text.startswith("lightning-halo verify: NOT verified: one training step on 2 processes")
        where = "one process" if missing is ref else "rank 1"
        assert f"not compared: the loss: training_step returned no loss on {where}" in text, text
        assert "every module's output matched" not in text, "no difference was found: none is explained"
        missing["scaled_loss"] = 2.0 if missing is ref else 3.0
    assert compare_step(ref, ranks).ok


def test_a_zero_gradient_where_one_process_has_none_is_the_same_step_with_a_note() -> None:
    """A layer whose output reaches the loss only through the exchange gets a zero gradient on partitions."""
    ref = record(torch.arange(6), [call("a", 1, 2, [X], [X])])
    ranks = [record(ids, [call("a", 1, 2, [X[ids]], [X[ids]])]) for ids in N_ID]
    for rank in ranks:
        rank["grads"]["tied"] = torch.zeros(3)
    report = compare_step(ref, ranks)
    assert report.ok and report.grads_differ == [] and "1 parameter(s) get a zero gradient on partitions" in str(report)
    ranks[1]["grads"]["tied"] = torch.ones(3)  # not zero: a real difference
    assert compare_step(ref, ranks).grads_differ == ["tied"]


def test_parameters_without_gradient_name_ddps_unreduced_buckets_and_the_fix() -> None:
    ref = record(torch.arange(6), [call("a", 1, 2, [X], [X])])
    ref["no_grad"] = ["head_b.weight", "head_b.bias"]
    ranks = [record(ids, [call("a", 1, 2, [X[ids]], [X[ids]])], grad=0.5 + r) for r, ids in enumerate(N_ID)]  # unreduced
    report = compare_step(ref, ranks)
    assert not report.ok and report.unused == ["head_b.weight", "head_b.bias"]
    assert "find_unused_parameters=True" in str(report) and "after the last module" not in str(report)
    ref["strategy"] = {"find_unused_parameters": True}  # then the difference is something else
    report = compare_step(ref, ranks)
    assert report.unused == [] and "after the last module" in str(report)
