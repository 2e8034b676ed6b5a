"""A hand-edited runs.json (issue 15, item 5): one clear error naming the file and what to do, or
the bad rows skipped with a warning, never a traceback or "internal error"; and a submit whose
index cannot be read or written never leaves a run directory marked "submitted"."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.unit.clirun import run_cli
from lingjun_slurm.common.errors import SubmitError, TransportError
from lingjun_slurm.runs.index import RunIndex, entry_for
from lingjun_slurm.runs.manifest import load_manifest
from lingjun_slurm.spec import load_spec
from lingjun_slurm.submit import prepare, prepare_local
from lingjun_slurm.transport.local import LocalTransport
from tests.integration.helpers import chain_spec


def index_file() -> Path:
    path = Path(os.environ["LINGJUN_STATE_DIR"]) / "runs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


GOOD = {"run_id": "good-1", "name": "good", "created_at": 1.0, "executor": "local", "transport": "local",
        "host": "localhost", "run_dir": "/nonexistent/good-1", "spec": "/x.yaml"}

# (contents, words the one error line must contain)
BROKEN = {
    "empty-list": ("[]", "must be a JSON object"),
    "empty-object": ("{}", "no schema field"),
    "garbage": ("not json at all\n", "unreadable run index: not valid JSON (line 1"),
    "truncated": (json.dumps({"schema": 1, "runs": [GOOD]})[:40], "unreadable run index: not valid JSON"),
    "empty-file": ("", "unreadable run index: the file is empty"),
    "runs-not-a-list": (json.dumps({"schema": 1, "runs": {"a": 1}}), "field runs must be a list"),
    "other-schema": (json.dumps({"schema": 7, "runs": []}), "schema 7"),
    "a-string": ('"runs"', "found a string"),
    "not-utf8": (b"\xff\xfe{".decode("latin-1"), "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
@pytest.mark.parametrize("command", [["list"], ["status", "good-1"], ["forget", "--missing"],
                                     ["logs", "good", "a"]])
def test_broken_index_is_one_clear_error(case: str, command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    text, words = BROKEN[case]
    path = index_file()
    path.write_bytes(text.encode("latin-1"))
    code, out, err = run_cli(capsys, *command)
    assert code == 1, (out, err)
    assert "internal error" not in err and "Traceback" not in err
    assert str(path) in err and words in err, err
    if case not in ("other-schema",):
        assert f"mv {path} {path}.bad" in err  # what to do
    assert path.read_bytes() == text.encode("latin-1")  # never rewritten by a failing read


BAD_ROWS: dict[str, Any] = {
    "missing-fields": {"run_id": "half"},
    "a-number": 42,
    "null": None,
    "wrong-type": {**GOOD, "run_id": "typed", "created_at": "yesterday"},
    "empty-id": {**GOOD, "run_id": ""},
    "bool-time": {**GOOD, "run_id": "booly", "created_at": True},
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_bad_rows_are_skipped_with_a_warning_and_kept(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = index_file()
    bad = BAD_ROWS[case]
    path.write_text(json.dumps({"schema": 1, "runs": [bad, GOOD]}))
    code, out, err = run_cli(capsys, "list")
    assert code == 0, err
    assert "good-1" in out
    assert f"warning: {path}: skipping 1 entry that is not a run (runs[0]: " in err
    assert "internal error" not in err
    # Adding a run writes the bad row back as it was: nothing hand-written is lost.
    RunIndex().add(entry_for("new-1", "new", 2.0, "local", "local", "localhost", "/nonexistent/new-1", "/x.yaml"))
    rows = json.loads(path.read_text())["runs"]
    assert bad in rows
    assert [r["run_id"] for r in rows if r is not bad and r != bad] == ["good-1", "new-1"]
    assert [e.run_id for e in RunIndex().entries()] == ["good-1", "new-1"]


def test_missing_optional_cluster_field_is_fine(capsys: pytest.CaptureFixture[str]) -> None:
    path = index_file()
    path.write_text(json.dumps({"schema": 1, "runs": [GOOD]}))  # GOOD has no "cluster"
    code, out, err = run_cli(capsys, "list")
    assert code == 0 and "good-1" in out and "warning" not in err


def _spec(tmp_path: Path) -> Path:
    return chain_spec(tmp_path / "spec.yaml", tmp_path / "work", [{"name": "a", "command": "true"}], name="idx")


@pytest.mark.parametrize("case", ["empty-list", "garbage", "truncated"])
def test_submit_with_a_broken_index_writes_nothing(case: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = index_file()
    path.write_text(BROKEN[case][0])
    code, out, err = run_cli(capsys, "submit", str(_spec(tmp_path)), "--executor", "local")
    assert code == 1, (out, err)
    assert str(path) in err and "internal error" not in err
    runs = tmp_path / "work" / "runs"
    assert not runs.exists() or not any(runs.iterdir()), list(runs.iterdir())


def test_local_index_write_failure_leaves_no_submitted_record(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    prep = prepare(load_spec(_spec(tmp_path)), run_id="idx-1", executor="local")

    def fail(self: RunIndex, entry: object) -> None:
        raise TransportError(f"cannot write {self.path}: No space left on device")

    monkeypatch.setattr(RunIndex, "add", fail)
    with pytest.raises(SubmitError, match="run index could not be written.*No space left"):
        prepare_local(LocalTransport(), prep, RunIndex())
    assert not Path(prep.run_dir, "manifest.json").exists()


def test_local_run_dir_failure_takes_the_index_entry_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prep = prepare(load_spec(_spec(tmp_path)), run_id="idx-2", executor="local")
    import lingjun_slurm.submit as submit

    def fail(*args: object, **kwargs: object) -> None:
        raise TransportError("cannot write the run directory: Read-only file system")

    monkeypatch.setattr(submit, "write_run_dir", fail)
    with pytest.raises(TransportError):
        prepare_local(LocalTransport(), prep, RunIndex())
    assert [e.run_id for e in RunIndex().entries()] == []


class FakeSlurm:
    """Only what submit_slurm asks before the first sbatch; any sbatch fails the test."""

    def __init__(self, t: object) -> None:
        self.t = t

    def cluster_info(self) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(name="fake", slurm_version="25.05.0", accounting=False, jobcomp_type="", jobcomp_loc="", max_array_size=None)

    def submit(self, *a: object, **k: object) -> str:
        raise AssertionError("sbatch must not run when the index cannot be written")


def test_slurm_index_write_failure_marks_the_run_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import lingjun_slurm.submit as submit
    from lingjun_slurm.status import StatusCollector

    prep = prepare(load_spec(_spec(tmp_path)), run_id="idx-3", executor="slurm")
    monkeypatch.setattr(submit, "SlurmCLI", FakeSlurm)

    def fail(self: RunIndex, entry: object) -> None:
        raise TransportError(f"cannot write {self.path}: No space left on device")

    monkeypatch.setattr(RunIndex, "add", fail)
    with pytest.raises(SubmitError, match="(?s)before any job was queued.*marked failed; nothing was queued"):
        submit.submit_slurm(LocalTransport(), prep, RunIndex(), echo=print)
    m = load_manifest(LocalTransport(), prep.run_dir)
    assert m.state == "failed" and all(not s.job_ids for s in m.stages)
    assert m.events[-1]["event"] == "submit-failed" and m.events[-1]["stage"] == "index"
    run = StatusCollector(LocalTransport()).collect([m])[0]
    assert [(s.state, s.reason) for s in run.stages] == [("NOT_SUBMITTED", "submission failed")]
    # Nothing is queued, so the workdir is free again: another run may take it.
    from lingjun_slurm.runs.workdir_lock import WorkdirLock

    WorkdirLock(LocalTransport(), str(tmp_path / "work"), "idx-4").acquire()


def test_a_failed_local_submission_shows_not_submitted(tmp_path: Path) -> None:
    """A local run record marked failed before its runner wrote any state shows NOT_SUBMITTED
    "submission failed", as a Slurm run does, not PENDING "not started" forever."""
    from lingjun_slurm.runs.manifest import save_manifest
    from lingjun_slurm.status import StatusCollector

    prep = prepare(load_spec(_spec(tmp_path)), run_id="idx-local-failed", executor="local")
    m = prepare_local(LocalTransport(), prep, RunIndex())
    m.state = "failed"
    save_manifest(LocalTransport(), m)
    run = StatusCollector(LocalTransport()).collect([load_manifest(LocalTransport(), prep.run_dir)])[0]
    assert {(s.state, s.reason) for s in run.stages} == {("NOT_SUBMITTED", "submission failed")}
