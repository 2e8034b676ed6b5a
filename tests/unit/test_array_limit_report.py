"""The report on a 1,024-task array (issue 31 item 1b): its stage timeline reads the run's markers
in ONE Transport.read_dir_files, whatever the number of tasks, not one read per task. Counted
through a transport that records every file read, at two sizes: the count must not grow."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lingjun_slurm.report import data
from lingjun_slurm.transport.local import LocalTransport


class Counting(LocalTransport):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def read_bytes(self, path: str) -> bytes:
        self.reads.append(f"read_bytes {path}")
        return super().read_bytes(path)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        self.reads.append(f"read_range {path}")
        return super().read_range(path, offset, length)

    def listdir(self, path: str) -> list[str]:
        self.reads.append(f"listdir {path}")
        return super().listdir(path)

    def read_dir_files(self, path: str, prefix: str = "", max_bytes: int = 1 << 16) -> dict[str, bytes]:
        self.reads.append(f"read_dir_files {path}")
        return super().read_dir_files(path, prefix, max_bytes)


def _run(tmp: Path, tasks: int) -> tuple[Any, Any]:
    run_dir = tmp / f"run{tasks}"
    (run_dir / "jobs").mkdir(parents=True)
    for i in range(tasks):
        (run_dir / "jobs" / f"41_{i}").write_text(f"start {1000 + i // 16} 0 node{i % 64}\nend {1001 + i // 16} 0\n")
    (run_dir / "jobs" / "42").write_text("start 2000 0 node1\nend 2010 0\n")
    stages = [SimpleNamespace(name="preprocess", kind="preprocess", job_ids=["41"], submitted_at=999.0, previous=[]),
              SimpleNamespace(name="merge", kind="merge", job_ids=["42"], submitted_at=999.0, previous=[])]
    manifest = SimpleNamespace(run_dir=str(run_dir), stages=stages, run_id="r", name="n", executor="slurm",
                               transport=SimpleNamespace(host="localhost"), created_at=999.0)
    status = SimpleNamespace(stages=[], slurm_error=None)
    return manifest, status


@pytest.mark.parametrize("tasks", [16, 1024])
def test_the_report_reads_an_arrays_markers_in_one_call(tmp_path: Path, tasks: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "goodput", lambda t, m: {})  # the ledger's own reads: status.goodput
    manifest, status = _run(tmp_path, tasks)
    t = Counting()
    doc = data.collect(t, manifest, status)
    pre = next(s for s in doc["stages"] if s["name"] == "preprocess")
    assert len(pre["attempts"]) == tasks
    assert pre["started_at"] == 1000 and pre["ended_at"] == 1001 + (tasks - 1) // 16
    # tasks in numeric order: 41_2 before 41_10
    assert [a["job"] for a in pre["attempts"][:3]] == ["41_0", "41_1", "41_2"]
    marker_reads = [r for r in t.reads if "/jobs" in r]
    assert marker_reads == [f"read_dir_files {manifest.run_dir}/jobs"], marker_reads[:5]
    assert len(t.reads) <= 6, t.reads  # metrics.jsonl, the jobs dir, nccl-tests, plan.json...: not per task


def test_a_list_of_names_still_reads_each_marker() -> None:
    """stage_timeline keeps its old form (names only: read one by one) for callers that have no contents."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "jobs").mkdir()
        (Path(tmp) / "jobs" / "7_1").write_text("start 100 0 n1\nend 110 0\n")
        rec = SimpleNamespace(job_ids=["7"], submitted_at=90.0)
        t = Counting()
        got = data.stage_timeline(t, tmp, rec, ["7_1"])
        assert got["run_s"] == 10.0 and len(t.reads) == 1
        t2 = Counting()
        got2 = data.stage_timeline(t2, tmp, rec, {"7_1": b"start 100 0 n1\nend 110 0\n"})
        assert got2 == got and t2.reads == []


@pytest.mark.parametrize("tasks", [16, 1024])
def test_the_goodput_ledger_reads_an_arrays_markers_in_one_call(tmp_path: Path, tasks: int) -> None:
    """status.goodput (the report's Goodput section, `status --goodput`): the markers of every task come
    from one read_dir_files, and the ledger still sees each task's attempt."""
    from lingjun_slurm import status as status_mod
    from lingjun_slurm.runs.manifest import ClusterRecord

    manifest, _ = _run(tmp_path, tasks)
    manifest.cluster = ClusterRecord(accounting=False)
    run_dir = Path(manifest.run_dir)
    (run_dir / "manifest.json").write_text(json.dumps({
        "run_id": "r", "executor": "slurm",
        "stages": [{"name": s.name, "kind": s.kind, "job_ids": s.job_ids, "previous": [], "submitted_at": 999.0}
                   for s in manifest.stages]}))
    (run_dir / "plan.json").write_text(json.dumps({"stages": [
        {"name": "preprocess", "kind": "preprocess", "resources": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 2}},
        {"name": "merge", "kind": "merge", "resources": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 2}}]}))
    t = Counting()
    doc = status_mod.goodput(t, manifest, now=5000.0)
    marker_reads = [r for r in t.reads if "/jobs" in r]
    assert marker_reads == [f"read_dir_files {manifest.run_dir}/jobs"], marker_reads[:5]
    assert len(t.reads) <= 8, t.reads
    attempts = [a for a in doc["attempts"] if str(a.get("job", "")).startswith("41_")]
    assert len(attempts) == tasks, doc["attempts"][:3]
