"""Validation/test metrics are global (each node counted once) and predict covers every node."""

from __future__ import annotations

import pytest
import torch

from tests.support.graphs import graph_by_name
from tests.support.models import build_any, reference_run
from tests.support.parity import TOL, load_records, run_parity

CONFIG = "gcn:2:awkward"


@pytest.mark.multiprocess
def test_metrics_and_predictions_equal_single_process(tmp_path) -> None:
    world_size = 3
    run_parity([CONFIG], world_size, tmp_path, extra=["--eval", "--steps", "2"])
    data = graph_by_name("awkward", world_size)
    net = build_any("gcn:2", data)
    reference_run(net, data, steps=2)  # trains net in place
    with torch.no_grad():
        out = net(data.x, data.edge_index)
    pred = out.argmax(-1)
    val = float((pred[data.val_mask] == data.y[data.val_mask]).float().mean())
    test = float((pred[data.test_mask] == data.y[data.test_mask]).float().mean())
    recs = load_records(CONFIG, world_size, tmp_path)
    # an average of per-rank accuracies would differ: the ranks hold unequal numbers of val nodes
    per_rank = []
    for rec in recs:
        assert rec["val_acc"] == pytest.approx(val, abs=1e-12)
        assert rec["test_acc"] == pytest.approx(test, abs=1e-12)
        gid, logits = rec["predict"]
        torch.testing.assert_close(logits, out[gid], **TOL)
        m = data.val_mask[gid]
        per_rank.append(float((logits.argmax(-1)[m] == data.y[gid][m]).float().mean()))
    assert sorted(torch.cat([r["predict"][0] for r in recs]).tolist()) == list(range(data.num_nodes))
    assert abs(sum(per_rank) / len(per_rank) - val) > 1e-6, "test graph should make the naive average wrong"
