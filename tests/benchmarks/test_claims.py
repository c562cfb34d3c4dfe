"""Figures on the pages come from stored results: the summary table of docs/benchmarks.md is what
``benchmarks/results/`` give, and the changelog's headline figures are those same results."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import claims
from benchmarks.report import find, load, matrix_cells

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cells() -> dict:
    return load(claims.RESULTS)[0]


def test_the_summary_table_is_what_the_results_give() -> None:
    assert claims.main(["--check"]) == 0, "run python -m benchmarks.claims and read what changed"


def test_the_check_fails_on_a_figure_no_result_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(claims.PAGE.read_text().replace("GCN 2.40×", "GCN 2.41×"))
    monkeypatch.setattr(claims, "PAGE", page)
    assert claims.main(["--check"]) == 1
    assert claims.main([]) == 0 and claims.main(["--check"]) == 0, "rewritten from the results"
    assert "GCN 2.40×" in page.read_text()


def test_a_variant_cell_is_never_taken_for_the_matrix_cell(cells) -> None:
    """``gcn-b1-sync-cover`` sorts before ``gcn-b1-sync``: the report once took it."""
    tolokers = [c for c in cells["tolokers"] if c.get("rate") == "100mbit"]
    assert any(c["cell"] == "gcn-b1-sync-cover" for c in tolokers), "the case this test is about"
    picked = find(matrix_cells(tolokers), model="gcn", bits=1, mode="sync")
    assert picked["cell"] == "gcn-b1-sync"


def _speed(cells: dict, graph: str, model: str) -> float:
    sel = [c for c in matrix_cells(cells[graph]) if (c.get("nodes"), c.get("rate")) == (2, "100mbit")]
    s32, s1 = find(sel, model=model, bits=32, mode="sync"), find(sel, model=model, bits=1, mode="sync")
    return s32["summary"]["epoch_s"] / s1["summary"]["epoch_s"]


def test_the_changelogs_headline_figures_are_the_stored_results(cells) -> None:
    text = " ".join((ROOT / "CHANGELOG.md").read_text().split())
    tolokers = re.search(r"on Tolokers \(2 nodes, 100 Mbit/s\) 1-bit sync is now ([\d.]+)× \(GCN\) and ([\d.]+)× \(SAGE\)", text)
    cornell = re.search(r"on cornell5 ([\d.]+)× and ([\d.]+)× \(compute", text)
    assert tolokers and cornell, "the sentences this test reads were reworded: update the test with them"
    assert tolokers.groups() == (f"{_speed(cells, 'tolokers', 'gcn'):.2f}", f"{_speed(cells, 'tolokers', 'sage'):.2f}")
    assert cornell.groups() == (f"{_speed(cells, 'cornell5', 'gcn'):.2f}", f"{_speed(cells, 'cornell5', 'sage'):.2f}")
    fused = claims._fused("tolokers")["gcn_epochs"]["speedup_vs_plain_edge_index"][claims.AUTO]
    assert f"Tolokers GCN {fused:.1f}× faster than PyG's `edge_index` path" in text
    rss = find(matrix_cells(cells["cornell5"]), model="gcn", bits=32, mode="sync", rate="100mbit")
    assert f"peak RSS per rank {rss['summary']['peak_rss_mb']:,.0f} MiB at 32 bits" in text


def test_figures_known_to_be_unbacked_are_gone() -> None:
    """Each was on a page without a stored result behind it (issue 36)."""
    pages = [ROOT / "README.md", ROOT / "docs" / "benchmarks.md"]
    text = " ".join(" ".join(p.read_text().split()) for p in pages)
    for figure in ("7.3–7.4 s", "3.22 GB", "2.41×"):
        assert figure not in text, figure
