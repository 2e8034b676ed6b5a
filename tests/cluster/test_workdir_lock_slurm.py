"""One run per workdir with Slurm runs (issue 15, item 2), on the real test cluster: the chain's
job ids hold <workdir>/run.lock, judged by one real squeue; see tests/unit/test_workdir_lock.py
for the local executor and the lock itself."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lingjun_slurm.common.errors import WorkdirBusy
from lingjun_slurm.common.holderlock import Holder, read_holder, slurm_jobs_alive
from lingjun_slurm.runs.workdir_lock import WorkdirLock, squeue_on
from lingjun_slurm.transport.local import LocalTransport
from tests.cluster.test_slurm_down import dead_conf
from tests.integration.helpers import PY, all_ended, chain_spec, cli, submitted_run_id, wait_for

pytestmark = pytest.mark.slurm


@pytest.fixture
def env(slurm_cluster: Any, tmp_path: Path) -> dict[str, str]:
    return {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}


def job_ids(work: Path, run_id: str) -> list[str]:
    m = json.loads((work / "runs" / run_id / "manifest.json").read_text())
    return [j for st in m["stages"] for j in st["job_ids"]]


def test_chain_holds_the_workdir_until_its_jobs_end(tmp_path: Path, env: dict[str, str]) -> None:
    go = tmp_path / "go"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "wait", "command": f"for i in $(seq 600); do test -e {go} && exit 0; sleep 0.2; done; exit 9"},
        {"name": "after", "command": "true"},
    ])
    first = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    work = tmp_path / "work"
    held = read_holder(work / "run.lock")
    assert held.run_id == first and list(held.jobs) == job_ids(work, first)
    proc = cli("submit", str(spec), "--executor", "slurm", env=env, check=1)
    ids = ", ".join(job_ids(work, first))
    assert f"is in use by run {first}: Slurm jobs {ids} (Slurm chain)" in proc.stderr, proc.stderr
    assert "Slurm says job(s)" in proc.stderr and "still pending or running" in proc.stderr
    assert len(list((work / "runs").iterdir())) == 1
    # A resubmit of the run that holds the lock is that run going on: its new jobs join the holder.
    wait_for(first, env, lambda s: s["wait"]["state"] == "RUNNING")
    cli("resubmit", first, "--from", "after", env=env)
    assert set(read_holder(work / "run.lock").jobs) >= set(job_ids(work, first))
    go.touch()
    wait_for(first, env, all_ended)
    # Ended: one squeue says so and the next submit takes the workdir, no --force.
    second = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    assert read_holder(work / "run.lock").run_id == second
    wait_for(second, env, all_ended)


def test_concurrent_slurm_submits_queue_one_chain(tmp_path: Path, env: dict[str, str]) -> None:
    """The lock is taken before the first sbatch: of five submits at once, one queues its chain."""
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "a", "command": "sleep 5"}])
    path = f"{os.path.dirname(PY)}{os.pathsep}{os.environ.get('PATH', '')}"
    procs = [subprocess.Popen([PY, "-m", "lingjun_slurm.cli", "submit", str(spec), "--executor", "slurm"],
                              env={**os.environ, "PATH": path, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(5)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    ok = [out for rc, out, _err in results if rc == 0]
    assert len(ok) == 1, results
    assert all("is in use by run" in err for rc, _out, err in results if rc != 0), results
    runs = list((tmp_path / "work" / "runs").iterdir())
    assert len(runs) == 1
    wait_for(submitted_run_id(ok[0]), env, all_ended)


def test_cancel_frees_the_workdir(tmp_path: Path, env: dict[str, str]) -> None:
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "a", "command": "sleep 120"},
                                                               {"name": "b", "command": "true"}])
    run = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    assert read_holder(tmp_path / "work" / "run.lock").run_id == run
    cli("cancel", run, env=env)
    wait_for(run, env, all_ended)
    if (tmp_path / "work" / "run.lock").exists():  # a job was still COMPLETING at the cancel: now it ended
        assert read_holder(tmp_path / "work" / "run.lock").run_id == run
    again = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    cli("cancel", again, env=env)
    wait_for(again, env, all_ended)


def test_unreachable_slurm_keeps_the_lock_and_force_breaks_it(slurm_cluster: Any, tmp_path: Path, env: dict[str, str],
                                                               monkeypatch) -> None:
    """A chain holder Slurm cannot be asked about is "cannot tell": kept, with Slurm's words; only
    --force breaks it. And the real squeue's answers about ended and unknown jobs."""
    t = LocalTransport()
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    assert slurm_jobs_alive(["999999"], squeue_on(t)) is False          # "Invalid job id specified"
    assert slurm_jobs_alive(["999998", "999999"], squeue_on(t)) is False  # several: no line
    work = tmp_path / "work"
    work.mkdir()
    (work / "run.lock").write_text(Holder(host="login-x", pid=1, start="", job_id="", since=0.0, purpose="Slurm chain",
                                          jobs=("999998", "999999"), run_id="old-run").to_json())
    lock = WorkdirLock(t, str(work), "new-run")
    monkeypatch.setenv("SLURM_CONF", str(dead_conf(slurm_cluster, tmp_path)))
    with pytest.raises(WorkdirBusy) as info:
        lock.acquire()
    assert "Slurm could not be asked about jobs 999998, 999999" in str(info.value)
    assert "Unable to contact slurm controller" in str(info.value) and "--force" in str(info.value)
    assert "broke the lock" in WorkdirLock(t, str(work), "new-run").acquire(force=True)
    assert read_holder(work / "run.lock").run_id == "new-run"
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    (work / "run.lock").write_text(Holder(host="login-x", pid=1, start="", job_id="", since=0.0, purpose="Slurm chain",
                                          jobs=("999998", "999999"), run_id="old-run").to_json())
    assert WorkdirLock(t, str(work), "newer").acquire() == ""  # Slurm says they are gone: stale, no --force
