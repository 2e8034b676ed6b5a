"""The report page's layout without a browser (issue 30 item 3): nothing cut off at a chart's
edge, no table row without text. tests/report/test_browser.py checks the same in Chromium."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from lingjun_slurm.report import charts, page

from .layout import border_ink, doc, stage

pytest.importorskip("matplotlib")


def stages_of_every_kind() -> list[dict]:
    """One stage, and many: completed, failed, signalled, requeued and running attempts, the
    longest stage name the spec allows (NAME_RE, 63 characters) in wide letters."""
    return [stage("make-corpus", 1000, [(1000, 1003, 0)]),
            stage("W" * 63, 1001, [(1010, 1040, 1)]),
            stage("train", 1002, [(1040, 1100, 143), (1110, 1200, 0)]),
            stage("checkpoint", 1003, [(1200, None, None)])]


@pytest.mark.parametrize("how_many", [1, 4])
def test_no_chart_is_cut_off_at_its_edge(tmp_path: Path, how_many: int) -> None:
    """The timeline's axis label ran past the figure's right edge (its text was wider than the
    8-inch figure, which tight_layout cannot shrink)."""
    names = charts.draw(doc(stages_of_every_kind()[:how_many]), tmp_path, now=1300.0)
    assert {"loss.png", "lr.png", "throughput.png", "memory.png", "timeline.png"} <= set(names), names
    cut = {n: len(border_ink(tmp_path / n)) for n in names}
    assert cut == {n: 0 for n in names}, f"ink on the charts' outermost pixels (something cut off): {cut}"


class Rows(HTMLParser):
    """Each table row's cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def test_no_table_row_is_empty(tmp_path: Path) -> None:
    """The summary table at the top had a header row of two empty cells (a grey bar)."""
    text = page.render(doc(stages_of_every_kind()), [], tmp_path, "lingjun-slurm report r-1")
    parser = Rows()
    parser.feed(text)
    assert len(parser.rows) > 10
    empty = [i for i, row in enumerate(parser.rows) if not any(row)]
    assert empty == [], f"rows without any text: {empty} of {len(parser.rows)}"
    assert parser.rows[0] == ["run id", "r-1"]  # the page's first row: the summary's first
