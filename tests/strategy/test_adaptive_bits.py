"""``HaloQuantStrategy(bits="adaptive")``: widths agreed by every rank, each exchange exactly the codec at its width,
bytes exactly those widths', logged per layer and direction; bad options refused."""

from __future__ import annotations

import pytest
import torch

from lightning_halo import HaloQuantStrategy
from lightning_halo.exchange.state import _seed
from lightning_halo.partition import build_halo_partitions, partition_graph
from lightning_halo.quant import dequantize, quantize, row_nbytes
from tests.support.graphs import graph_by_name
from tests.support.parity import TOL, load_records, run_parity

CONFIG, EPOCHS = "sage:3:awkward", 6


def _replayed(recs: list[dict], widths: list[dict]) -> dict[tuple, torch.Tensor]:
    """Every rank's exchanges re-encoded in one process: its recorded rows, at the agreed width of their epoch,
    layer and direction, with a generator seeded as that rank's exchange seeds it, drawn in the same order."""
    out = {}
    for r, rec in enumerate(recs):
        gen = torch.Generator().manual_seed(_seed(0 * 1_000_003 + r))  # HaloQuantStrategy(seed=0), rank r
        for direction, epoch, slot, sent, _ in rec["trace"]:
            layer = list(widths[epoch])[slot]
            bits = widths[epoch][layer][direction]
            out[(r, direction, epoch, slot)] = dequantize(quantize(sent, bits, gen), sent.dtype)
    return out


@pytest.mark.multiprocess
def test_each_exchange_is_the_codec_at_the_agreed_width_and_bytes_are_exact(tmp_path) -> None:
    """The run equals its single-process replay: the halo rows each rank received in every epoch are, bit for bit,
    the owners' rows encoded at the width all ranks agreed for that layer and direction; the gradients likewise."""
    run_parity([CONFIG], 2, tmp_path, extra=["--steps", str(EPOCHS), "--bits", "adaptive", "--trace",
                                             "--halo-reduction", "none", "--bit-budget", "1.5",
                                             "--bit-target", "0"])  # fmt: skip
    recs = load_records(CONFIG, 2, tmp_path)
    widths = recs[0]["widths"]
    assert all(rec["widths"] == widths for rec in recs), "ranks disagree on the widths"
    chosen = {b for w in widths for per in w.values() for b in per.values()}
    assert widths[0] == {layer: {"fwd": 1, "bwd": 1} for layer in widths[0]}, "nothing measured before epoch 1"
    assert len(chosen) > 1, f"the test must see more than one width: {widths}"
    data = graph_by_name("awkward", 2)
    parts = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, 2), 2)
    replay = _replayed(recs, widths)
    checked = 0
    for q, rec in enumerate(recs):
        for direction, epoch, slot, sent, received in rec["trace"]:
            if direction == "fwd":  # q's halo: every owner's rows for q, as the owner encoded them
                pieces = []
                for o, count in enumerate(parts[q].recv_counts.tolist()):
                    start = int(parts[o].send_counts[:q].sum())
                    pieces.append(replay[(o, "fwd", epoch, slot)][start : start + count])
                torch.testing.assert_close(received, torch.cat(pieces), rtol=0, atol=0)
            else:  # q's rows' gradients: every peer's halo gradients for them, as the peer encoded them
                expect = torch.zeros_like(received)
                for p in range(2):
                    offset = 0
                    for owner, count in enumerate(parts[p].recv_counts.tolist()):
                        if owner == q:
                            start = int(parts[q].send_counts[:p].sum())
                            rows = parts[q].send_index[start : start + count]
                            expect.index_add_(0, rows, replay[(p, "bwd", epoch, slot)][offset : offset + count])
                        offset += count
                torch.testing.assert_close(received, expect, **TOL)
            checked += 1
        for epoch, counts in enumerate(rec["epoch_bytes"]):  # bytes: exactly the chosen widths' records
            for direction, e, slot, sent, _ in rec["trace"]:
                if e == epoch:
                    layer = list(widths[epoch])[slot]
                    want = sent.size(0) * row_nbytes(sent.size(1), widths[epoch][layer][direction], sent.dtype)
                    assert counts[(layer, direction)] == want, (q, epoch, layer, direction)
            # the agreement: one all-reduce of [slots, directions, 3] signals, [slots, 2] reaches and the monitored
            # metric's [sum, count], float64, per epoch after the first
            assert counts.get(("bits", "aux"), 0) == (0 if epoch == 0 else (len(widths[0]) * (2 * 3 + 2) + 2) * 8)
    assert checked == 2 * EPOCHS * 2 * 2
    logged = recs[0]["logged"]
    for layer, per in widths[-1].items():
        for direction, b in per.items():
            assert logged[f"halo/bits/{layer}/{direction}"] == b
            assert logged[f"halo/noise/{layer}/{direction}"] >= 0


@pytest.mark.multiprocess
def test_adaptive_bits_with_partial_sums_and_adaptive_staleness_on_three_ranks(tmp_path) -> None:
    """Partial sums travel at the agreed widths too, stale epochs included; the run trains (finite, moved)."""
    run_parity([CONFIG], 3, tmp_path, extra=["--steps", str(EPOCHS), "--bits", "adaptive", "--schedule", "adaptive:0.5",
                                             "--halo-reduction", "cover", "--bit-target", "0"])  # fmt: skip
    recs = load_records(CONFIG, 3, tmp_path)
    assert all(rec["widths"] == recs[0]["widths"] for rec in recs)
    assert all(rec["decisions"] == recs[0]["decisions"] for rec in recs)
    assert "cover" in recs[0], "the layers took partial sums"
    assert {d for ds in recs[0]["decisions"] if not isinstance(ds, str) for d in ds} >= {"pipelined"}
    assert len({b for w in recs[0]["widths"] for per in w.values() for b in per.values()}) > 1
    for rec in recs:
        assert all(torch.isfinite(p).all() for p in rec["params"].values())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(bits="adaptiv"), r"bits='adaptiv' is not supported; choose one of .* or 'adaptive'"),
        (dict(bits="adaptive", grad_bits=3), r"grad_bits=3 is not supported"),
        (dict(bits="adaptive", bit_choices=(1, 3)), r"bit_choices=\[1, 3\] holds 3"),
        (dict(bits="adaptive", bit_budget=0.5), r"bit_budget=0.5 is below 1"),
        (dict(bits="adaptive", bit_target=-0.1), r"bit_target=-0.1 is below 0"),
        (dict(bits=2, bit_target=0.05), r"bit_target=0.05 applies to bits='adaptive'"),
        (dict(bits=1, bit_budget=3.0), r"bit_budget=3.0 applies to bits='adaptive' \(or grad_bits='adaptive'\) only"),
        (dict(bits=4, bit_choices=(1, 2)), r"bit_choices=\(1, 2\) applies to bits='adaptive'"),
        (dict(bits=1, bit_monitor="val_acc"), r"bit_monitor='val_acc' applies to bits='adaptive'"),
        (dict(bits="adaptive", bit_monitor=""), r"bit_monitor='' must be the name of a metric the module logs"),
        (dict(bits="adaptive", bit_monitor="val_acc", bit_mode="up"), r"bit_mode='up' must be 'min' .* or 'max'"),
        (dict(bits="adaptive", bit_monitor="val_acc", bit_patience=0), r"bit_patience=0 must be an int >= 1"),
    ],
)  # fmt: skip
def test_bad_adaptive_options_are_refused_with_the_fix(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HaloQuantStrategy(**kwargs)


def test_adaptive_directions_follow_the_options() -> None:
    both, fwd_only = HaloQuantStrategy(bits="adaptive"), HaloQuantStrategy(bits="adaptive", grad_bits=8)
    assert both.bits == both.grad_bits == "adaptive" and both.exchanger.bit_choices == (1, 2, 4, 8)
    assert fwd_only.grad_bits == 8 and fwd_only.exchanger.fixed_width("bwd") == 8
    assert fwd_only.exchanger.fixed_width("fwd") == 8, "exchanges outside the slots (link pairs): the widest choice"
    assert HaloQuantStrategy(bits=2).halo_widths() == {}
