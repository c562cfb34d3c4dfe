"""``lightning-halo link``: listed, explained, a config with the wrong loss scaling refused, and ``link verify``.

That examples/configs/link_gcn.yaml trains on two processes is tested with every config (tests/cli/test_fit.py).
"""

from __future__ import annotations

import pytest

from tests.support.cli import ROOT

CONFIG = str(ROOT / "examples" / "configs" / "link_gcn.yaml")


def test_link_verb_explains_itself(lightning_halo_cli) -> None:
    code, out, _ = lightning_halo_cli("link", "--help")
    assert code == 0 and "usage: lightning-halo link {fit,validate,test,predict,verify}" in out
    code, out, err = lightning_halo_cli("link")
    assert code == 2 and out == "" and "usage: lightning-halo link {fit,validate,test,predict,verify}" in err


def test_link_config_with_wrong_loss_scaling_is_refused(lightning_halo_cli) -> None:
    code, _, err = lightning_halo_cli("link", "fit", "--config", CONFIG, "--trainer.devices", "1", "--trainer.max_epochs", "1",
                                      "--trainer.strategy.init_args.scale_loss", "train_mean")  # fmt: skip
    # found while the run sets up, not while the config is read: an error of the run, with its traceback
    assert code == 4 and "scale_loss='share'" in err and "Traceback" in err, err[-3000:]


def test_verify_points_a_link_config_to_link_verify(lightning_halo_cli) -> None:
    code, out, err = lightning_halo_cli("verify", "--config", CONFIG)
    assert code == 2 and out == "" and f"lightning-halo link verify --config {CONFIG}" in err, err


@pytest.mark.multiprocess
def test_link_verify_checks_a_heterogeneous_link_config(lightning_halo_cli, tmp_path) -> None:
    """The zoo's HeteroLinkPredictor through HaloLinkDataModule(edge_type=...): one step on 2 processes equals one."""
    from lightning_halo.data import save_npy_graph
    from tests.support.hetero import generated_hetero

    graph = generated_hetero()
    for t in ("paper", "author"):
        graph[t].x = graph[t].x.float()
    data = str(save_npy_graph(graph, tmp_path / "graph"))
    code, out, err = lightning_halo_cli("link", "verify", "--config", str(ROOT / "examples" / "configs" / "hetero_link.yaml"),
                                        "--data.data", data, "--data.edge_type", "[author, writes, paper]",
                                        "--data.rev_edge_type", "[paper, rev_writes, author]")  # fmt: skip
    assert code == 0 and "exact: one training step on 2 processes vs one process" in out, out + err[-3000:]
