"""The status table on narrow terminals (issue 26, item 10): at 60 and 80 columns every column is
as wide as its header and its longest cell (no one-letter-per-line column, nothing cut with "…"),
and REASON, with NODES and RESTARTS, folds on lines of its own under the table; where there is
room REASON is a folded column as before."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from lingjun_slurm.cli import ui
from lingjun_slurm.status import RunStatus, StageStatus

HANG = "NonZeroExitCode; hang: no iteration for 1800 s at iteration 1200"


def runs() -> list[RunStatus]:
    return [RunStatus("tiny-gpt-20261205-001020-abcdef", "tiny-gpt", "slurm", "login-node-01", [
        StageStatus("preprocess", ["16900123"], "COMPLETED", None, 0, 125, "node[1-4]", 0),
        StageStatus("train", ["16900124"], "FAILED", HANG, 1, 2 * 86400 + 5, "node[1-4]", 2),
        StageStatus("checkpoint", ["16900125"], "CANCELLED", "DependencyNeverSatisfied (train FAILED)",
                    None, None, None, 0)], "/w/runs/x")]


def render(monkeypatch: pytest.MonkeyPatch, columns: int) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))  # as a terminal of that width tells rich
    buf = io.StringIO()
    ui.print_status(runs(), out=Console(file=buf, force_terminal=False, color_system=None))
    return buf.getvalue()


@pytest.mark.parametrize("columns", [60, 80])
def test_narrow_terminal_keeps_every_column_whole_and_folds_reason(monkeypatch: pytest.MonkeyPatch,
                                                                   columns: int) -> None:
    out = render(monkeypatch, columns)
    lines = out.splitlines()
    assert all(len(line.rstrip()) <= columns for line in lines), out
    assert "…" not in out, out
    header = next(line for line in lines if "STAGE" in line)
    for word in ("STAGE", "JOB", "STATE", "ELAPSED", "EXIT"):
        assert f" {word}" in f" {header}", out  # whole: no column narrower than its header
    rows = {line.split()[0]: line.split() for line in lines if line.strip().startswith(("preprocess ", "train ",
                                                                                         "checkpoint "))}
    assert rows["train"][:5] == ["train", "16900124", "FAILED", "2-00:00:05", "1"], out
    assert rows["preprocess"][:4] == ["preprocess", "16900123", "COMPLETED", "00:02:05"], out
    # No one-letter-per-line column: every non-blank line holds more than a couple of characters.
    assert all(len(line.strip()) > 3 for line in lines if line.strip()), out
    # REASON folds under the table, whole.
    assert HANG in " ".join(line.strip() for line in lines), out
    assert "train: nodes node[1-4], 2 restarts, NonZeroExitCode;" in out, out


def test_wide_terminal_keeps_reason_as_a_column(monkeypatch: pytest.MonkeyPatch) -> None:
    out = render(monkeypatch, 140)
    header = next(line for line in out.splitlines() if "STAGE" in line)
    assert header.split() == ["STAGE", "JOB", "STATE", "ELAPSED", "EXIT", "RESTARTS", "NODES", "REASON"]
    assert any(HANG in line for line in out.splitlines()), out
