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
    # dm.gather_predictions: every rank's rows in global node order, equal to the single-process forward
    for rank, rec in enumerate(recs):
        ids, logits = rec["gathered"]
        assert torch.equal(ids, torch.arange(data.num_nodes)), "each node's own id lands in its own row"
        torch.testing.assert_close(logits, out, **TOL)
        torch.testing.assert_close(rec["gathered_tensor"], out, **TOL)
        if rank == 0:
            torch.testing.assert_close(rec["gathered_dict"], {"logits": out, "more": [out[:, :1]]}, **TOL)
        else:
            assert rec["gathered_dict"] is None, "dst=0: only rank 0 receives the predictions"
        assert "PredictionError: rank 1: prediction has shape (3," in rec["gather_error"], rec.get("gather_error")
        assert "but this rank owns" in rec["gather_error"]
    assert abs(sum(per_rank) / len(per_rank) - val) > 1e-6, "test graph should make the naive average wrong"
