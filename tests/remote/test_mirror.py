"""The local copy of a remote run (runs/mirror.py) as `status` shows it when the host is unreachable: the
last status seen here must not contradict the copy of the manifest that commands here changed since."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lingjun_slurm.cli.runs import _stale
from lingjun_slurm.runs import mirror
from lingjun_slurm.runs.index import entry_for
from lingjun_slurm.runs.manifest import Attempt, ClusterRecord, Manifest, SpecRecord, StageRecord, TransportRecord
from lingjun_slurm.status import RunStatus, StageStatus

RUN = "mir-20261130-010101-abcdef"


def manifest(ids: dict[str, str], events: list[dict]) -> Manifest:  # type: ignore[type-arg]
    now = time.time()
    return Manifest(run_id=RUN, name="mir", created_at=now, updated_at=now, tool_version="0", user="u",
                    executor="slurm", transport=TransportRecord(kind="ssh", host="login"),
                    cluster=ClusterRecord(name="c"), spec=SpecRecord(source="s.yaml", sha256="0"),
                    run_dir=f"/shared/runs/{RUN}", log_dir="/shared/logs", state="submitted", events=events,
                    stages=[StageRecord(name=n, kind="command", script=f"{n}.sbatch", job_name=f"{RUN}-{n}",
                                        job_ids=[j]) for n, j in ids.items()])


def seen_status(states: dict[str, tuple[str, str]]) -> dict:  # type: ignore[type-arg]
    run = RunStatus(RUN, "mir", "slurm", "login", [StageStatus(n, [j], st, None, None, 5, "node1", 0)
                                                   for n, (j, st) in states.items()], f"/shared/runs/{RUN}")
    return run.to_json()


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LINGJUN_STATE_DIR", str(tmp_path))
    return tmp_path


def stale_stages() -> dict[str, StageStatus]:
    entry = entry_for(RUN, "mir", time.time(), "slurm", "ssh", "login", f"/shared/runs/{RUN}", "s.yaml")
    (run,) = _stale([entry], "login")
    assert run.stale_as_of is not None
    return {s.name: s for s in run.stages}


def test_after_a_resubmit_the_stale_view_has_the_new_job_ids_not_the_old_state() -> None:
    mirror.save_status(RUN, seen_status({"a": ("101", "COMPLETED"), "b": ("102", "FAILED")}))
    time.sleep(0.01)
    m = manifest({"a": "101", "b": "205"}, [{"event": "submit", "at": 1.0},
                                            {"event": "resubmit", "at": time.time(), "stages": ["b"]}])
    m.stages[1].previous.append(Attempt(job_ids=["102"], submitted_at=1.0))
    mirror.save_manifest(m)
    got = stale_stages()
    assert got["a"].state == "COMPLETED" and got["a"].job_ids == ["101"]  # untouched since: kept
    assert got["b"].job_ids == ["205"] and got["b"].state == "UNKNOWN", got["b"]
    assert "resubmit" in (got["b"].reason or "")


def test_after_a_cancel_running_stages_are_unknown_and_ended_ones_kept() -> None:
    mirror.save_status(RUN, seen_status({"a": ("101", "COMPLETED"), "b": ("102", "RUNNING")}))
    time.sleep(0.01)
    mirror.save_manifest(manifest({"a": "101", "b": "102"},
                                  [{"event": "cancel", "at": time.time(), "stages": ["a", "b"]}]))
    got = stale_stages()
    assert got["a"].state == "COMPLETED"
    assert got["b"].state == "UNKNOWN" and "cancel" in (got["b"].reason or "")


def test_events_before_the_last_status_change_nothing() -> None:
    mirror.save_manifest(manifest({"a": "101"}, [{"event": "cancel", "at": time.time() - 60, "stages": ["a"]}]))
    mirror.save_status(RUN, seen_status({"a": ("101", "CANCELLED")}))
    assert stale_stages()["a"].state == "CANCELLED"
