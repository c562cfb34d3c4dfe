"""Adaptive bit widths, the pure part: the codec's variance bound per group, the greedy choice under a byte budget."""

from __future__ import annotations

import itertools

import pytest
import torch

from lightning_halo.quant import dequantize, quantize, row_nbytes
from lightning_halo.quant.allocate import (
    GroupSignal,
    check_bit_budget,
    check_bit_choices,
    check_bit_target,
    choose_widths,
    group_bytes,
    halo_reach,
    output_variance,
    relative_variance,
    signal_of,
)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_the_bound_is_the_codecs_variance_within_its_rounding(bits: int) -> None:
    """Over many draws the codec's squared error averages to at most R/(2^b-1)^2 (its scale is rounded up by at
    most 2^-8) and to more than 1/2 of it (a fraction f spread evenly gives 2/3 of the f(1-f) <= 1/4 bound)."""
    g = torch.Generator().manual_seed(bits)
    x = torch.randn(64, 24, generator=g) * torch.rand(64, 1, generator=g) * 3
    r, e = signal_of(x)
    bound = r / (2**bits - 1) ** 2
    draws = 200
    err = sum(float((dequantize(quantize(x, bits, g)) - x).double().square().sum()) for _ in range(draws)) / draws
    assert 0.5 * bound < err <= bound * (1 + 2**-8) ** 2 * 1.05, (err, bound)
    assert relative_variance(GroupSignal(r, e, 64, 24), bits) == pytest.approx(bound / e)


def test_signal_of_counts_every_row() -> None:
    x = torch.tensor([[0.0, 2.0, 1.0], [3.0, 3.0, 3.0], [-1.0, 1.0, 0.0]])
    r, e = signal_of(x)
    assert r == pytest.approx(3 * (2.0**2 + 0 + 2.0**2) / 4) and e == pytest.approx(float(x.square().sum()))
    assert signal_of(torch.zeros(0, 5)) == (0.0, 0.0)


def _groups(seed: int, n: int = 5) -> list[GroupSignal]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        e = float(torch.rand((), generator=g)) * 10 + 0.1
        r = e * float(torch.rand((), generator=g)) * 4
        n, d = int(torch.randint(1, 50, (), generator=g)), int(torch.randint(1, 64, (), generator=g))
        out.append(GroupSignal(r=r, e=e, n=n, d=d))
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [1.0, 1.3, 2.0, 4.0])
def test_the_choice_keeps_the_budget_and_no_further_upgrade_fits(seed: int, budget: float) -> None:
    groups, choices = _groups(seed), (1, 2, 4, 8)
    widths = choose_widths(groups, choices, budget)
    base = sum(group_bytes(g, 1) for g in groups)
    spent = sum(group_bytes(g, b) for g, b in zip(groups, widths))
    assert spent <= budget * base
    assert widths == choose_widths(groups, choices, budget), "deterministic"
    for i, g in enumerate(groups):  # greedy to the end: every upgrade left would break the budget
        for b in choices:
            if b > widths[i] and relative_variance(g, b) < relative_variance(g, widths[i]):
                assert spent - group_bytes(g, widths[i]) + group_bytes(g, b) > budget * base, (i, b, widths)
    if budget == 1.0:  # only upgrades that cost nothing (codes that fit the padding of a byte)
        assert all(b == 1 or group_bytes(g, b) == group_bytes(g, 1) for g, b in zip(groups, widths))


def test_the_noisiest_group_per_byte_is_widened_first_whatever_its_scale() -> None:
    quiet, noisy = GroupSignal(r=1.0, e=100.0, n=10, d=16), GroupSignal(r=300.0, e=100.0, n=10, d=16)
    assert choose_widths([quiet, noisy], (1, 2, 4, 8), 1.15) == [1, 2]
    # gradients are orders of magnitude smaller than rows: only the relative variance counts
    tiny = GroupSignal(r=300.0e-12, e=100.0e-12, n=10, d=16)
    assert choose_widths([quiet, tiny], (1, 2, 4, 8), 1.15) == [1, 2]
    silent = GroupSignal(r=0.0, e=0.0, n=10, d=16)  # all-zero rows: nothing to gain
    assert choose_widths([silent, noisy], (1, 2, 4, 8), 3.0)[0] == 1


def test_raw_and_bfloat16_choices_have_their_own_bytes_and_noise() -> None:
    g = GroupSignal(r=50.0, e=100.0, n=4, d=8, itemsize=8)
    assert group_bytes(g, 32) == 4 * row_nbytes(8, 32, torch.float64) and relative_variance(g, 32) == 0.0
    assert relative_variance(g, 16) == 2.0**-16
    assert choose_widths([g], (1, 32), 100.0) == [32] and choose_widths([g], (1, 32), 2.0) == [1]


def test_the_greedy_is_optimal_on_small_cases_up_to_one_upgrade() -> None:
    """Against every assignment: the greedy's total relative variance is at most that of the best assignment
    within the budget less one upgrade step's worth (a knapsack greedy's guarantee is not exactness)."""
    groups, choices, budget = _groups(11, 3), (1, 2, 4), 1.8
    base = sum(group_bytes(g, 1) for g in groups)

    def cost(ws):
        pairs = list(zip(groups, ws))
        return sum(group_bytes(g, b) for g, b in pairs), sum(relative_variance(g, b) for g, b in pairs)

    got = cost(choose_widths(groups, choices, budget))[1]
    feasible = [cost(ws)[1] for ws in itertools.product(choices, repeat=3) if cost(ws)[0] <= budget * base]
    assert min(feasible) <= got <= sorted(feasible)[len(feasible) // 2], "better than the median feasible choice"


@pytest.mark.parametrize(
    ("choices", "match"),
    [([3], "holds 3, which is not a bit width"), ([], "bit_choices is empty"), ([2, 2], "repeats a width"),
     ("1248", "must be a list of bit widths"), ([True], "holds True")],
)  # fmt: skip
def test_bad_choices_say_what_to_give(choices, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_bit_choices(choices)


@pytest.mark.parametrize("budget", [0.9, float("nan"), float("inf"), "2", True])
def test_bad_budgets_say_what_it_is(budget) -> None:
    with pytest.raises(ValueError, match="bit_budget"):
        check_bit_budget(budget)


# ------------------------------------------------------------------ the variance target and the aggregation's reach
@pytest.mark.parametrize("target", [0.002, 0.03, 0.3, 3.0])
def test_with_a_target_each_group_takes_the_narrowest_width_that_meets_it(target: float) -> None:
    """With bytes to spare, a group above the target is widened to the narrowest width whose output noise is at
    most the target (or the widest choice), a group at or below it stays at the narrowest: nothing more is bought."""
    groups = [GroupSignal(r=e * k, e=e, n=n, d=d, weight=w) for e, k, n, d, w in
              [(10.0, 0.5, 40, 16, 1.0), (0.01, 3.0, 10, 64, 0.2), (5.0, 40.0, 25, 8, 0.05), (1.0, 0.0, 5, 4, 1.0)]]  # fmt: skip
    widths = choose_widths(groups, (1, 2, 4, 8), budget=100.0, target=target)
    for g, b in zip(groups, widths):
        meets = [c for c in (1, 2, 4, 8) if output_variance(g, c) <= target]
        assert b == (meets[0] if meets else 8), (g, b, target)


def test_a_target_never_buys_past_the_budget_and_zero_fills_it() -> None:
    groups = _groups(3)
    for budget in (1.0, 1.5, 2.0):
        base = sum(group_bytes(g, 1) for g in groups)
        for target in (0.0, 1e-3, 1e-1):
            widths = choose_widths(groups, (1, 2, 4, 8), budget, target)
            assert sum(group_bytes(g, b) for g, b in zip(groups, widths)) <= budget * base
        assert choose_widths(groups, (1, 2, 4, 8), budget, 0.0) == choose_widths(groups, (1, 2, 4, 8), budget)
    # the lower the target, the wider (never narrower) every group
    loose, tight = choose_widths(groups, (1, 2, 4, 8), 4.0, 0.5), choose_widths(groups, (1, 2, 4, 8), 4.0, 0.001)
    assert all(t >= lo for t, lo in zip(tight, loose)) and tight != loose


def test_the_weight_is_what_reaches_the_outputs() -> None:
    """The same rows, read by a wide mean aggregation (small weight) or landing unscaled (weight 1): only the
    latter's noise is above the target."""
    spread, averaged = GroupSignal(r=20.0, e=10.0, n=10, d=16), GroupSignal(r=20.0, e=10.0, n=10, d=16, weight=0.004)
    assert output_variance(averaged, 1) == pytest.approx(0.004 * relative_variance(spread, 1))
    assert choose_widths([spread, averaged], (1, 2, 4, 8), 4.0, target=0.01) == [4, 1]  # 2/225 <= 0.01 < 2/9


def _brute_reach(edge_index: torch.Tensor, n_inner: int) -> float:
    deg = [0] * n_inner
    for _, d in edge_index.t().tolist():
        if d < n_inner:
            deg[d] += 1
    return sum(1.0 / deg[d] ** 2 for s, d in edge_index.t().tolist() if d < n_inner and s >= n_inner)


@pytest.mark.parametrize("seed", range(4))
def test_halo_reach_sums_the_squared_mean_coefficients_of_halo_edges(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n_inner, n_halo = 30, 12
    src = torch.randint(0, n_inner + n_halo, (150,), generator=g)
    dst = torch.randint(0, n_inner, (150,), generator=g)
    ei = torch.stack([src, dst])
    assert halo_reach(ei, n_inner) == pytest.approx(_brute_reach(ei, n_inner))
    assert halo_reach(ei[:, src < n_inner], n_inner) == 0.0, "no halo edge, no reach"
    assert halo_reach(torch.empty(2, 0, dtype=torch.long), n_inner) == 0.0


@pytest.mark.parametrize("target", [-0.1, float("nan"), float("inf"), "0.01", True])
def test_bad_targets_say_what_it_is(target) -> None:
    with pytest.raises(ValueError, match="bit_target"):
        check_bit_target(target)
