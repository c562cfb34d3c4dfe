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
    choose_widths,
    group_bytes,
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
