"""status, submit and the run index at the scale users run (issue 31): counts, not times, at two sizes.

Each test does the same thing at a size and at ten times it and compares what it counts (Slurm
calls, file reads, comparisons): a refresh is a bounded number of Slurm calls whatever the job
count, and nothing grows faster than the jobs do. bench/scale_queue.py measures the seconds on a
real 64-node cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import pytest

from lingjun_slurm import status as status_mod
from lingjun_slurm.runs import index as index_mod
from lingjun_slurm.runs.index import RunIndex, entry_for
from lingjun_slurm.runs.manifest import (ClusterRecord, DependencyRecord, Manifest, SpecRecord, StageRecord,
                                         TransportRecord)
from lingjun_slurm.slurm.client import SlurmCLI
from lingjun_slurm.slurm.parse import JobInfo
from lingjun_slurm.status import StatusCollector
from lingjun_slurm.transport.local import LocalTransport

STAGES = 5


def job(job_id: str, name: str, state: str = "PENDING", array_job: Optional[str] = None,
        task: Optional[int] = None, source: str = "squeue") -> JobInfo:
    return JobInfo(job_id=job_id, array_job_id=array_job, array_task_id=task, array_tasks_pending=None, name=name,
                   state=state, flags=(), reason="BeginTime" if state == "PENDING" else None,
                   exit_code=0 if state == "COMPLETED" else None, signal=None, start=None, end=None, elapsed_s=None,
                   nodes=None, restarts=0, source=source)


def manifest(i: int, run_dir: str, first_job: int, array: Optional[str] = None, accounting: bool = False) -> Manifest:
    stages = []
    for s in range(STAGES):
        deps = [DependencyRecord(stage=f"s{s}", type="afterok", job_ids=[str(first_job + s - 1)])] if s else []
        stages.append(StageRecord(name=f"s{s + 1}", kind="command", script=f"s{s + 1}.sbatch",
                                  job_name=f"run{i}-s{s + 1}", array=array if s == 0 else None,
                                  job_ids=[str(first_job + s)], depends_on=deps))
    return Manifest(run_id=f"run{i}", name="scale", created_at=1e9 + i, updated_at=1e9 + i, tool_version="0",
                    user="u", executor="slurm", transport=TransportRecord(kind="local", host="h"),
                    cluster=ClusterRecord(name="c", slurm_version="22.05.8", accounting=accounting),
                    spec=SpecRecord(source="s.yaml", sha256="0" * 64), run_dir=run_dir, log_dir=f"{run_dir}/logs",
                    state="submitted", stages=stages)


class Reader:
    """A QueueReader that counts its calls (each would be one squeue / sacct)."""

    name = "fake"

    def __init__(self, queue: list[JobInfo], acct: Optional[list[JobInfo]] = None) -> None:
        self.records, self.acct, self.calls = queue, acct, []

    def queue(self) -> list[JobInfo]:
        self.calls.append("squeue")
        return list(self.records)

    def accounting(self, job_ids: Iterable[str]) -> Optional[list[JobInfo]]:
        self.calls.append("sacct")
        return None if self.acct is None else list(self.acct)


class CountingTransport(LocalTransport):
    """Files as LocalTransport; counts every file operation status does, and every command."""

    def __init__(self) -> None:
        super().__init__()
        self.file_ops: list[str] = []

    def read_text(self, path: str) -> str:
        self.file_ops.append(f"read_text {path}")
        return super().read_text(path)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        self.file_ops.append(f"read_range {path}")
        return super().read_range(path, offset, length)

    def listdir(self, path: str) -> list[str]:
        self.file_ops.append(f"listdir {path}")
        return super().listdir(path)

    def read_dir_files(self, path: str, prefix: str = "", max_bytes: int = 1 << 16) -> dict[str, bytes]:
        self.file_ops.append(f"read_dir_files {path}")
        # The default reads one by one through listdir/read_range: count this as the one call a backend
        # answers it in (transport/ssh.py: one remote command), not the files inside.
        mark = len(self.file_ops)
        try:
            return super().read_dir_files(path, prefix, max_bytes)
        finally:
            del self.file_ops[mark:]


def _status_of_queue(tmp_path: Path, runs: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int, int]:
    """status of `runs` five-stage chains, every job pending in squeue with other users' jobs beside
    them: (Slurm calls, record comparisons, file operations)."""
    ms = [manifest(i, str(tmp_path / f"r{runs}-{i}"), 1000 + STAGES * i) for i in range(runs)]
    queue = [job(j, rec.job_name) for m in ms for rec in m.stages for j in rec.job_ids]
    queue += [job(str(900000 + k), f"other-{k}") for k in range(runs)]  # not ours: filtered out
    reader = Reader(queue)
    compared = [0]
    real = status_mod._belongs

    def counting(info: JobInfo, job_id: str, job_name: str) -> bool:
        compared[0] += 1
        return real(info, job_id, job_name)

    monkeypatch.setattr(status_mod, "_belongs", counting)
    t = CountingTransport()
    out = StatusCollector(t, reader=reader).collect(ms)
    assert [s.state for r in out for s in r.stages] == ["PENDING"] * (STAGES * runs)
    assert [s.reason for s in out[-1].stages] == ["BeginTime"] * STAGES
    return len(reader.calls), compared[0], len(t.file_ops)


def test_status_of_ten_times_the_jobs_is_one_squeue_and_ten_times_the_work(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    small = _status_of_queue(tmp_path, 40, monkeypatch)     # 200 jobs
    large = _status_of_queue(tmp_path, 400, monkeypatch)    # 2,000 jobs
    assert small[0] == large[0] == 1  # one squeue; every job is in it: no sacct
    # Each record is looked at for its own stage only: 10x the jobs, 10x the comparisons (was
    # stages x records: 100x).
    assert small[1] == STAGES * 40 and large[1] == STAGES * 400, (small, large)
    assert small[2] == large[2] == 0  # pending command stages: no file read at all


def test_a_1024_task_array_is_aggregated_from_its_records_and_its_markers_in_one_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1,024-task array stage: up to 1,024 squeue records under one job id, aggregated by id; once
    they left the queue (no accounting), its markers jobs/<id>_<task> are read in ONE read_dir_files
    call, not a listdir plus one read per task."""
    counts = {}
    for tasks in (100, 1024):
        run_dir = tmp_path / f"a{tasks}"
        (run_dir / "jobs").mkdir(parents=True)
        m = manifest(0, str(run_dir), 5000, array=f"0-{tasks - 1}")
        for k in range(tasks):
            (run_dir / "jobs" / f"5000_{k}").write_text(f"start 1000 0 node{k % 64 + 1}\nend {1010 + k % 7} 0\n")
        (run_dir / "jobs" / "50001_0").write_text("start 1 0 x\nend 2 1\n")  # another job's: not this array
        # The four later stages still pend in squeue; the array left it.
        queue = [job(j, rec.job_name) for rec in m.stages[1:] for j in rec.job_ids]
        t = CountingTransport()
        run = StatusCollector(t, reader=Reader(queue)).collect([m])[0]
        assert run.stages[0].state == "COMPLETED", run.stages[0]
        assert run.stages[0].elapsed_s == 16 and run.stages[0].exit_code == 0
        assert [s.state for s in run.stages[1:]] == ["PENDING"] * 4
        counts[tasks] = list(t.file_ops)
    assert counts == {n: [f"read_dir_files {tmp_path}/a{n}/jobs"] for n in (100, 1024)}, counts

    # In the queue: 1,024 task records (some done, some running, the rest pending) make one stage.
    m = manifest(1, str(tmp_path / "q"), 7000, array="0-1023")
    name = m.stages[0].job_name
    recs = [job(f"7000_{k}", name, "COMPLETED" if k < 500 else "RUNNING", array_job="7000", task=k)
            for k in range(600)]
    recs.append(job("7000_[600-1023]", name, "PENDING", array_job="7000"))
    reader = Reader(recs + [job(j, r.job_name) for r in m.stages[1:] for j in r.job_ids])
    run = StatusCollector(CountingTransport(), reader=reader).collect([m])[0]
    assert run.stages[0].state == "RUNNING" and reader.calls == ["squeue"]


_REAL_ROW_PROBLEM = index_mod._row_problem


def count_row_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """[n]: how many index rows RunIndex checks (parses) from now on."""
    parsed = [0]

    def counting(row: object) -> Optional[str]:
        parsed[0] += 1
        return _REAL_ROW_PROBLEM(row)

    monkeypatch.setattr(index_mod, "_row_problem", counting)
    return parsed


def _resolve_all(tmp_path: Path, runs: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """`status RUN...` resolves every RUN against the index: how many index rows are parsed."""
    monkeypatch.setenv("LINGJUN_STATE_DIR", str(tmp_path / f"state{runs}"))
    (tmp_path / f"state{runs}").mkdir()
    index = RunIndex()
    rows = [entry_for(f"scale-{i:05d}", "scale", 1e9 + i, "slurm", "local", "h", f"/w/{i}", "s.yaml")
            for i in range(runs)]
    index._write(rows)
    # As a new `status` process finds it: nothing parsed yet.
    monkeypatch.setattr(index_mod, "_PARSED", {}, raising=False)
    parsed = count_row_parses(monkeypatch)
    for e in rows:
        assert RunIndex().resolve(e.run_id) == e  # a new RunIndex per RUN, as cli/remote.py resolve does
    assert [e.run_id for e in RunIndex().entries()] == [e.run_id for e in rows]
    return parsed[0]


def test_resolving_every_run_reads_the_index_once_not_once_per_run(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert _resolve_all(tmp_path, 200, monkeypatch) == 200
    assert _resolve_all(tmp_path, 2000, monkeypatch) == 2000  # was 2000 x 2000


def test_a_submit_does_not_parse_the_whole_index_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each submit adds one entry: after the first read, the index it wrote is the one it knows;
    parsing every row again per submit made 2,000 submits quadratic (36 ms per add at 2,000 runs)."""
    for runs in (200, 2000):
        monkeypatch.setenv("LINGJUN_STATE_DIR", str(tmp_path / f"s{runs}"))
        (tmp_path / f"s{runs}").mkdir()
        RunIndex()._write([entry_for(f"r-{i:05d}", "r", 1e9 + i, "slurm", "local", "h", f"/w/{i}", "s.yaml")
                           for i in range(runs)])
        parsed = count_row_parses(monkeypatch)
        for k in range(10):
            RunIndex().add(entry_for(f"new-{k}", "n", 2e9 + k, "slurm", "local", "h", f"/n/{k}", "s.yaml"))
        monkeypatch.setattr(index_mod, "_row_problem", _REAL_ROW_PROBLEM)
        assert parsed[0] <= runs, (runs, parsed[0])  # at most the first read; was 10 x runs
        assert len(RunIndex().entries()) == runs + 10


def test_the_index_is_read_again_once_it_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINGJUN_STATE_DIR", str(tmp_path / "state"))
    RunIndex().add(entry_for("a-1", "a", 1e9, "slurm", "local", "h", "/w/a", "s.yaml"))
    assert [e.run_id for e in RunIndex().entries()] == ["a-1"]
    RunIndex().add(entry_for("b-1", "b", 1e9 + 1, "slurm", "local", "h", "/w/b", "s.yaml"))
    assert [e.run_id for e in RunIndex().entries()] == ["a-1", "b-1"]
    assert RunIndex().resolve("b").run_id == "b-1"
    RunIndex().remove(["a-1"])
    assert [e.run_id for e in RunIndex().entries()] == ["b-1"]
    # Edited by hand (same size, other content): read again.
    path = tmp_path / "state" / "runs.json"
    path.write_text(path.read_text().replace("b-1", "c-1"))
    assert [e.run_id for e in RunIndex().entries()] == ["c-1"]


class SacctTransport(LocalTransport):
    def __init__(self) -> None:
        super().__init__()

    def _run(self, argv: tuple[str, ...], *, cwd: Optional[str], env: Optional[Mapping[str, str]],
             input: Optional[str], timeout: Optional[float]) -> tuple[int, str, str]:
        assert argv[0] == "sacct"
        ids = next(a for a in argv if a.startswith("--jobs=")).split("=", 1)[1].split(",")
        # JobID|JobIDRaw|State|ExitCode|Elapsed|Start|End|NodeList|Reason|JobName (SACCT_FIELDS)
        return 0, "".join(f"{i}|{i}|COMPLETED|0:0|00:00:05|||node1|None|job{i}\n" for i in ids), ""


def test_sacct_of_20000_ids_keeps_each_argument_under_the_kernels_limit() -> None:
    """Linux refuses one argument over MAX_ARG_STRLEN (131072 bytes with its NUL): 20,000 seven-digit
    ids are 160 kB. They go in as few calls as fit SACCT_JOBS_BYTES each, every id exactly once."""
    from lingjun_slurm.slurm.client import SACCT_JOBS_BYTES
    from lingjun_slurm.slurm.parse import SACCT_FIELDS

    assert len(SACCT_FIELDS) == 10  # the fake's line above has one column per field
    for n, calls in ((1000, 1), (20000, 3)):
        ids = [str(1000000 + k) for k in range(n)]
        t = SacctTransport()
        got = SlurmCLI(t).accounting(reversed(ids))
        assert len(t.history) == calls
        args = [next(a for a in argv if a.startswith("--jobs=")) for argv in t.history]
        assert all(len(a) <= len("--jobs=") + SACCT_JOBS_BYTES < 131072 for a in args)
        assert sorted(j for a in args for j in a[7:].split(",")) == ids
        assert got is not None and sorted(i.job_id for i in got) == ids


class SlurmStub(LocalTransport):
    """Files as LocalTransport; sbatch, scontrol, scancel answered here and counted."""

    def __init__(self, fail_at: Optional[int] = None) -> None:
        super().__init__()
        self.next_id, self.fail_at, self.sbatches = 100, fail_at, 0

    def _run(self, argv: tuple[str, ...], *, cwd: Optional[str], env: Optional[Mapping[str, str]],
             input: Optional[str], timeout: Optional[float]) -> tuple[int, str, str]:
        if argv[0] == "sbatch":
            self.sbatches += 1
            if self.sbatches == self.fail_at:
                return 1, "", "sbatch: error: Batch job submission failed: Invalid partition name specified"
            self.next_id += 1
            return 0, f"{self.next_id}\n", ""
        if argv[:3] == ("scontrol", "show", "config"):
            return 0, "ClusterName = stub\nSLURM_VERSION = 22.05.8\nAccountingStorageType = accounting_storage/none\n", ""
        if argv[0] in ("scontrol", "scancel"):
            return 0, "", ""
        return super()._run(argv, cwd=cwd, env=env, input=input, timeout=timeout)


def _chain_spec(path: Path, workdir: Path, n: int = STAGES) -> Path:
    import yaml

    stages: dict[str, Any] = {s: {"skip": True} for s in ("preprocess", "merge", "train", "checkpoint")}
    stages["commands"] = [{"name": f"s{i + 1}", "command": "true", **({"after": f"s{i}"} if i else
                                                                     {"before": "preprocess"})} for i in range(n)]
    path.write_text(yaml.safe_dump({"version": 1, "run": {"name": "scale", "workdir": str(workdir)},
                                    "cluster": {"network": {"profile": "tcp"}},
                                    "container": {"runtime": "none"}, "stages": stages}))
    return path


def _submit(tmp_path: Path, t: SlurmStub, i: int) -> Manifest:
    from lingjun_slurm.spec import load_spec
    from lingjun_slurm.submit import prepare, submit_slurm

    loaded = load_spec(_chain_spec(tmp_path / f"s{i}.yaml", tmp_path / f"w{i}"))
    prep = prepare(loaded, run_id=f"scale-{i}", executor="slurm")
    return submit_slurm(t, prep, RunIndex(tmp_path / "state"), echo=lambda line: None)


def kinds(history: list[tuple[str, ...]]) -> list[str]:
    return [" ".join(a[:2]) if a[0] == "scontrol" else a[0] for a in history
            if a[0] in ("sbatch", "scontrol", "scancel", "squeue", "sacct")]


def test_a_chain_is_its_sbatches_and_one_release_and_the_config_is_read_once(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Five stages: five sbatch (only the first --hold: the others wait behind it by afterok) and ONE
    scontrol release; `scontrol show config` once per cluster per process, not per chain."""
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))  # a cluster of this test's own
    (tmp_path / "slurm.conf").write_text("ClusterName=stub\n")
    t = SlurmStub()
    m = _submit(tmp_path, t, 0)
    assert kinds(t.history) == ["scontrol show"] + ["sbatch"] * STAGES + ["scontrol release"], kinds(t.history)
    sb = [a for a in t.history if a[0] == "sbatch"]
    assert "--hold" in sb[0] and not any("--hold" in a for a in sb[1:])
    assert all(any(x.startswith("--dependency=afterok:") for x in a) for a in sb[1:])
    roots = [j for j in m.stages[0].job_ids]
    assert t.history[-1] == ("scontrol", "release", ",".join(roots))
    t.history.clear()
    _submit(tmp_path, t, 1)
    assert kinds(t.history) == ["sbatch"] * STAGES + ["scontrol release"]  # 1.2 calls per stage


def test_a_failed_sbatch_still_cancels_what_was_queued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lingjun_slurm.common.errors import SubmitError

    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    (tmp_path / "slurm.conf").write_text("ClusterName=stub2\n")
    t = SlurmStub(fail_at=3)
    with pytest.raises(SubmitError, match="failed at stage s3"):
        _submit(tmp_path, t, 0)
    assert ("scancel", "101", "102") in t.history
    assert not any(a[:2] == ("scontrol", "release") for a in t.history)


def test_a_held_job_waiting_on_a_job_outside_the_submission_is_released_before_the_roots(
        tmp_path: Path) -> None:
    """resubmit: a stage whose only dependency is a running job outside the call is held too (it could
    start as soon as that job ends) and released in a call of its own ahead of the roots; a stage
    behind an afterany on a held job is held as well (the rollback's cancel would meet an afterany)."""
    from lingjun_slurm.plan import Dependency
    from lingjun_slurm.submit import submit_stages

    class Sched(SlurmCLI):
        pass

    t = SlurmStub()
    sched = Sched(t)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    m = manifest(0, str(run_dir), 1)

    def plan(name: str, deps: list[tuple[str, str]]) -> Any:
        st = type("S", (), {})()
        st.name, st.script, st.job_name = name, f"{name}.sbatch", f"x-{name}"
        st.depends_on = [Dependency(stage=s, type=ty) for s, ty in deps]
        return st

    stages = [plan("s3", [("s2", "afterok")]), plan("s4", [("s3", "afterok")]), plan("s5", [("s4", "afterany")]),
              plan("s1", [])]  # a root: released last, in a call of its own
    ids = submit_stages(sched, m, stages, {"s2": ["55"]}, echo=lambda line: None)
    sb = {a[-1]: a for a in t.history if a[0] == "sbatch"}
    assert "--hold" in sb["s3.sbatch"] and "--hold" not in sb["s4.sbatch"] and "--hold" in sb["s5.sbatch"]
    assert "--hold" in sb["s1.sbatch"]
    releases = [a for a in t.history if a[:2] == ("scontrol", "release")]
    assert releases == [("scontrol", "release", f"{ids[0]},{ids[2]}"), ("scontrol", "release", ids[3])]


def test_the_clusters_config_is_read_again_after_its_ttl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`scontrol show config` is slurmctld's live configuration (a reconfigure changes MaxArraySize
    without touching slurm.conf's stamp): the cached answer is kept CLUSTER_INFO_TTL_S, then read again."""
    from lingjun_slurm.slurm import client

    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))  # a cluster of this test's own
    (tmp_path / "slurm.conf").write_text("ClusterName=stub\n")
    clock = [1000.0]
    monkeypatch.setattr("time.monotonic", lambda: clock[0])
    t = SlurmStub()
    assert SlurmCLI(t).cluster_info().name == "stub"
    SlurmCLI(t).cluster_info()
    assert kinds(t.history) == ["scontrol show"]
    clock[0] += client.CLUSTER_INFO_TTL_S + 1
    SlurmCLI(t).cluster_info()
    assert kinds(t.history) == ["scontrol show"] * 2
