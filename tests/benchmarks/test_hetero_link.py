"""benchmarks.hetero_link's summary and the docs section it writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import hetero_link
from benchmarks.pages import write_section


def _row(bits: int, seed: int, auroc: float, sent: float) -> dict:
    return {"bits": bits, "seed": seed, "epochs": 100, "best_val_auroc": auroc, "test_auroc": auroc,
            "test_hits@50": auroc / 2, "bytes_per_epoch": {"convs.1.convs[author]/fwd": sent, "gather_rows/fwd": sent}}  # fmt: skip


def test_the_summary_averages_seeds_per_width_and_the_page_shows_it(tmp_path: Path) -> None:
    rows = [_row(32, 0, 0.90, 1e6), _row(32, 1, 0.80, 3e6), _row(1, 0, 0.84, 1e5), _row(1, 1, 0.86, 1e5)]
    summary = hetero_link.summarise(rows)
    assert [s["bits"] for s in summary] == [32, 1]
    assert summary[0]["test_auroc"] == pytest.approx(0.85) and summary[0]["bytes_per_epoch"] == pytest.approx(4e6)
    assert summary[1]["seeds"] == 2 and summary[1]["test_hits@50"] == pytest.approx(0.425)
    page = tmp_path / "page.md"
    name = hetero_link.SECTION
    page.write_text(f"before\n<!-- BEGIN GENERATED: {name} -->\nold\n<!-- END GENERATED: {name} -->\nafter\n")
    write_section(page, name, hetero_link.page_section({"summary": summary}))
    text = page.read_text()
    assert "old" not in text and "| 32 | 2 | 0.8500 | 0.4250 | 4.00 MB |" in text and text.endswith("after\n")
    assert "hetero-link" in (Path(__file__).parents[2] / "docs" / "link-prediction.md").read_text(), "the page has the section"
