"""The train stage's checkpoint-fallback note in `status` (issue 15 item 5): shown for the job that
wrote it only, read once for a stage that has ended."""

from __future__ import annotations

from pathlib import Path

import pytest

from lingjun_slurm.injob.host import stagenotes
from lingjun_slurm import status
from lingjun_slurm.injob.train import resume
from lingjun_slurm.transport.local import LocalTransport

LINE = "checkpoint iter_0000004 is damaged (file __0_0.distcp truncated); resuming from iter_0000002"


class CountingTransport(LocalTransport):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def read_text(self, path: str, *args: object, **kwargs: object) -> str:  # type: ignore[override]
        self.reads += 1
        return super().read_text(path, *args, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    status._ENDED_NOTES.clear()


def _stage(job: str, state: str = "COMPLETED", reason: str | None = None) -> status.StageStatus:
    return status.StageStatus("train", [job], state, reason, 0, 12, "host", 0)


def test_the_note_shows_for_its_own_job_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    resume.write_note(str(tmp_path), LINE)
    mine, later = _stage("123", "FAILED", "NonZeroExitCode"), _stage("124")
    status._add_note(mine, None, str(tmp_path))
    status._add_note(later, None, str(tmp_path))
    assert mine.reason == LINE  # the known cause replaces Slurm's generic word
    assert later.reason is None  # a resubmitted train job: the old fallback is not its story


def test_a_clean_start_removes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    stagenotes.write_note(str(tmp_path), "train", LINE)  # an earlier job's trainer
    resume.clear_note(str(tmp_path))
    resume.clear_note(str(tmp_path))  # nothing there: no error
    st = _stage("123", "RUNNING")
    status._add_note(st, None, str(tmp_path))
    assert st.reason is None and not (tmp_path / "stage-notes" / "train.txt").exists()


def test_an_old_plain_text_note_and_garbage_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "stage-notes").mkdir()
    note = tmp_path / "stage-notes" / "train.txt"
    for text in (f"2026-12-02T03:57:36Z {LINE}\n", "\x00\x1b[31m\n", '["job", "123"]\n', '{"job": "123"}\n'):
        note.write_text(text)
        st = _stage("123")
        status._add_note(st, None, str(tmp_path))
        assert st.reason is None, text


def test_an_ended_stage_is_read_once_a_running_one_every_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    resume.write_note(str(tmp_path), LINE)
    t = CountingTransport()
    for _ in range(3):  # three refreshes of `status --watch`
        st = _stage("9", "RUNNING")
        status._add_note(st, t, str(tmp_path))
        assert st.reason == LINE
    assert t.reads == 6  # the note and nodes/excluded.json, each refresh
    for _ in range(3):
        st = _stage("9", "COMPLETED")
        status._add_note(st, t, str(tmp_path))
        assert st.reason == LINE
    assert t.reads == 8
    st = _stage("9", "PENDING")
    status._add_note(st, t, str(tmp_path))
    assert t.reads == 9 and st.reason is None  # a pending job: its exclusions only (a requeue away from a node)


def test_a_requeued_job_is_read_again_when_it_ends_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A requeue keeps the job id: the cache of ended notes is per restart too."""
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    stagenotes.write_note(str(tmp_path), "train", LINE)  # the first attempt's trainer (another process)
    t = CountingTransport()
    st = _stage("9", "FAILED")
    status._add_note(st, t, str(tmp_path))
    assert st.reason == LINE
    resume.clear_note(str(tmp_path))  # the requeued attempt resumed cleanly
    again = status.StageStatus("train", ["9"], "COMPLETED", None, 0, 12, "host", 1)
    status._add_note(again, t, str(tmp_path))
    assert again.reason is None and t.reads == 4  # two files per ended attempt
