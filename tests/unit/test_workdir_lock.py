"""One run per workdir (issue 15, item 2): the holder-file lock <workdir>/run.lock.

The chain holder (several Slurm job ids, judged by ONE squeue), the local executor's runner
holding it, the refusal naming the holder, --force only where the holder cannot be checked, and
the same lock on another host through a transport (bash noclobber = O_EXCL). Slurm runs against
the real test cluster: tests/cluster/test_workdir_lock_slurm.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lingjun_slurm.common import holderlock
from lingjun_slurm.common.errors import WorkdirBusy
from lingjun_slurm.common.holderlock import Holder, HolderLock, judge, read_holder, slurm_jobs_alive
from lingjun_slurm.runs.workdir_lock import TransportFiles, WorkdirLock, lock_path
from lingjun_slurm.transport.local import LocalTransport
from tests.integration.helpers import PY, chain_spec, cli, submitted_run_id

CONNECT_FAILURE = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def chain_holder(**kw) -> Holder:
    base = dict(host="login-9", pid=4242, start="x:1", job_id="", since=time.time(), purpose="Slurm chain",
                jobs=("11", "12", "13"), run_id="run-a")
    base.update(kw)
    return Holder(**base)


class FakeSqueue:
    """What squeue answers, and every argv it was asked."""

    def __init__(self, rc: int, out: str) -> None:
        self.rc, self.out, self.calls = rc, out, []

    def __call__(self, argv: list[str]) -> tuple[int, str]:
        self.calls.append(argv)
        return self.rc, self.out


@pytest.mark.parametrize("rc,out,state", [
    (0, "COMPLETED\nRUNNING\n", "alive"),
    (0, "COMPLETED\nPENDING\n", "alive"),
    (0, "COMPLETED\nCOMPLETING\n", "alive"),       # processes still being cleaned up
    (0, "COMPLETED\nCANCELLED\nFAILED\n", "stale"),
    (0, "", "stale"),                              # forgotten by slurmctld (MinJobAge)
    (1, CONNECT_FAILURE, "unknown"),               # cannot tell: kept
])
def test_chain_holder_is_stale_only_when_every_job_ended_by_one_squeue(rc: int, out: str, state: str) -> None:
    squeue = FakeSqueue(rc, out)
    verdict = judge(chain_holder(), jobs_alive=lambda ids: slurm_jobs_alive(ids, squeue))
    assert verdict.state == state, verdict
    assert squeue.calls == [["squeue", "-h", "-t", "all", "-j", "11,12,13", "-o", "%T"]]


def test_a_chain_outlives_the_process_that_queued_it(tmp_path: Path) -> None:
    """Written on this host by a submit that has exited: the jobs, not the pid, decide."""
    path = tmp_path / "run.lock"
    path.write_text(chain_holder(host=holderlock.this_host(), pid=dead_pid()).to_json())
    assert not HolderLock(path, jobs_alive=lambda ids: True).try_acquire()
    assert not HolderLock(path, jobs_alive=lambda ids: None).try_acquire()
    assert not HolderLock(path).try_acquire()  # no way to ask Slurm: kept
    lock = HolderLock(path, jobs_alive=lambda ids: False)
    assert lock.try_acquire() and read_holder(path).pid == os.getpid()
    lock.release()


def test_one_forgotten_job_is_gone_several_give_no_line() -> None:
    assert slurm_jobs_alive(["7"], FakeSqueue(1, "slurm_load_jobs error: Invalid job id specified")) is False
    assert slurm_jobs_alive(["7", "8"], FakeSqueue(0, "")) is False
    assert slurm_jobs_alive([], FakeSqueue(0, "RUNNING")) is False


def test_holder_file_round_trips_jobs_and_run(tmp_path: Path) -> None:
    lock = HolderLock(tmp_path / "run.lock", run_id="r1").acquire()
    lock.update(jobs=("5", "6"))
    held = read_holder(tmp_path / "run.lock")
    assert held.jobs == ("5", "6") and held.run_id == "r1" and held.pid == os.getpid()
    assert "Slurm jobs 5, 6" in held.describe()
    lock.release()
    assert not (tmp_path / "run.lock").exists()


# ------------------------------------------------------------------ the CLI, local executor


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"LINGJUN_STATE_DIR": str(tmp_path / "state")}


def slow_spec(tmp_path: Path, seconds: int = 60) -> Path:
    return chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "slow", "command": f"sleep {seconds}"}])


def test_second_submit_into_a_busy_workdir_is_refused_naming_the_holder(tmp_path: Path, env: dict[str, str]) -> None:
    spec = slow_spec(tmp_path)
    first = submitted_run_id(cli("submit", str(spec), "--executor", "local", "--detach", env=env).stdout)
    try:
        proc = cli("submit", str(spec), "--executor", "local", "--detach", env=env, check=1)
        assert f"workdir {tmp_path / 'work'} is in use by run {first}" in proc.stderr
        assert "local runner" in proc.stderr and f"lingjun-slurm cancel {first}" in proc.stderr
        assert f"lock file: {tmp_path / 'work' / 'run.lock'}" in proc.stderr
        assert [p.name for p in (tmp_path / "work" / "runs").iterdir()] == [first]  # nothing written
        state = json.loads((tmp_path / "work" / "runs" / first / "local-state.json").read_text())
        held = read_holder(tmp_path / "work" / "run.lock")
        assert held.pid == state["runner_pid"] and held.run_id == first  # the runner took it over
        # --force does not break a holder that is verifiably alive.
        proc = cli("submit", str(spec), "--executor", "local", "--detach", "--force", env=env, check=1)
        assert "never breaks a lock whose holder is alive" in proc.stderr
    finally:
        cli("cancel", first, env=env)
    assert not (tmp_path / "work" / "run.lock").exists()  # the runner released it as it ended
    again = cli("submit", str(spec), "--executor", "local", "--detach", env=env)
    cli("cancel", submitted_run_id(again.stdout), env=env)


def test_concurrent_submits_let_exactly_one_run(tmp_path: Path, env: dict[str, str]) -> None:
    spec = slow_spec(tmp_path)
    path = f"{os.path.dirname(PY)}{os.pathsep}{os.environ.get('PATH', '')}"
    procs = [subprocess.Popen([PY, "-m", "lingjun_slurm.cli", "submit", str(spec), "--executor", "local", "--detach"],
                              env={**os.environ, "PATH": path, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(5)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    ok = [out for rc, out, _err in results if rc == 0]
    said = "\n".join(f"rc={rc}\nstdout: {out}\nstderr: {err}" for rc, out, err in results)  # whole, not truncated
    try:
        assert len(ok) == 1, f"{len(ok)} submits won:\n{said}"
        assert all("is in use by run" in err for rc, _out, err in results if rc != 0), said
        assert len(list((tmp_path / "work" / "runs").iterdir())) == 1
    finally:
        for out in ok:
            cli("cancel", submitted_run_id(out), env=env)


def test_lock_of_a_killed_runner_is_broken_without_force(tmp_path: Path, env: dict[str, str]) -> None:
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "a", "command": "true"}])
    (tmp_path / "work").mkdir()
    stale = Holder(host=holderlock.this_host(), pid=dead_pid(), start="x:1", job_id="", since=time.time(),
                   purpose="local runner", run_id="chain-old")
    (tmp_path / "work" / "run.lock").write_text(stale.to_json())
    proc = cli("submit", str(spec), "--executor", "local", env=env)
    assert "--force" not in proc.stdout + proc.stderr
    assert not (tmp_path / "work" / "run.lock").exists()  # a foreground run releases it at its end


def test_force_breaks_only_a_holder_that_cannot_be_checked(tmp_path: Path, env: dict[str, str]) -> None:
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "a", "command": "true"}])
    (tmp_path / "work").mkdir()
    other = Holder(host="login-elsewhere", pid=77, start="b:1", job_id="", since=time.time(), purpose="submitting",
                   run_id="chain-far")
    (tmp_path / "work" / "run.lock").write_text(other.to_json())
    proc = cli("submit", str(spec), "--executor", "local", env=env, check=1)
    assert "run chain-far: pid 77 on login-elsewhere" in proc.stderr
    assert "cannot be checked" in proc.stderr and "--force" in proc.stderr
    assert not (tmp_path / "work" / "runs").exists()
    proc = cli("submit", str(spec), "--executor", "local", "--force", env=env)
    assert "--force: broke the lock" in proc.stdout and "login-elsewhere" in proc.stdout
    # A live holder on this host: --force is refused.
    (tmp_path / "work" / "run.lock").write_text(holderlock.me("local runner", run_id="chain-live").to_json())
    proc = cli("submit", str(spec), "--executor", "local", "--force", env=env, check=1)
    assert "run chain-live" in proc.stderr and "never breaks a lock whose holder is alive" in proc.stderr


def test_foreground_run_holds_the_lock_while_it_runs(tmp_path: Path, env: dict[str, str]) -> None:
    seen = tmp_path / "seen"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work",
                      [{"name": "a", "command": f"cat {tmp_path / 'work' / 'run.lock'} > {seen}"}])
    cli("submit", str(spec), "--executor", "local", env=env)
    held = json.loads(seen.read_text())
    assert held["purpose"] == "local runner" and held["host"] == holderlock.this_host()
    assert not (tmp_path / "work" / "run.lock").exists()


def test_interrupted_foreground_submit_frees_the_workdir(tmp_path: Path, env: dict[str, str]) -> None:
    spec = slow_spec(tmp_path)
    path = f"{os.path.dirname(PY)}{os.pathsep}{os.environ.get('PATH', '')}"
    proc = subprocess.Popen([PY, "-m", "lingjun_slurm.cli", "submit", str(spec), "--executor", "local"],
                            env={**os.environ, "PATH": path, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (tmp_path / "work" / "logs").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    assert read_holder(tmp_path / "work" / "run.lock").pid == proc.pid  # held while it runs
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130  # Ctrl-C (interrupts.py)
    assert not (tmp_path / "work" / "run.lock").exists()


# ------------------------------------------------------------------ over a transport


def test_transport_files_do_what_the_local_ones_do(tmp_path: Path) -> None:
    """The bash/coreutils commands behind the remote lock, run for real (here through the local
    transport; over SSH below)."""
    f = TransportFiles(LocalTransport())
    p = str(tmp_path / "x.lock")
    assert f.create_exclusive(p, '{"a": 1}') is True
    assert f.create_exclusive(p, '{"a": 2}') is False
    assert json.loads(f.read(p)) == {"a": 1}
    assert 0 <= f.age_s(p) < 60 and f.age_s(p + ".none") is None
    assert f.link(p, p) is False
    assert f.rename(p + ".none", p + ".moved") is False
    assert f.rename(p, p + ".moved") is True and f.read(p) is None
    assert f.link(p + ".moved", p) is True and f.read(p) == f.read(p + ".moved")
    f.replace(p, "new\n")
    assert f.read(p) == "new\n"
    f.unlink(p)
    f.unlink(p)
    assert f.read(p) is None
    with pytest.raises(Exception, match="cannot create the lock file"):
        f.create_exclusive(str(tmp_path / "no" / "such" / "dir" / "x.lock"), "{}")


def test_workdir_lock_over_ssh(ssh_server, tmp_path: Path) -> None:
    t = ssh_server.transport()
    try:
        work = str(tmp_path / "work")
        first = WorkdirLock(t, work, "run-1")
        assert first.acquire() == ""
        assert read_holder(lock_path(work)).run_id == "run-1"
        with pytest.raises(WorkdirBusy, match="is in use by run run-1: pid"):
            WorkdirLock(t, work, "run-2").acquire(force=True)  # alive here: --force refused
        first.record_jobs(["31", "32"])
        assert read_holder(lock_path(work)).jobs == ("31", "32")
        first.release()
        assert not os.path.exists(lock_path(work))
        # A holder from another host outside any job: only --force breaks it, over SSH too.
        Path(lock_path(work)).write_text(Holder(host="far", pid=1, start="", job_id="", since=time.time(),
                                                purpose="submitting", run_id="run-far").to_json())
        with pytest.raises(WorkdirBusy, match="cannot be checked"):
            WorkdirLock(t, work, "run-3").acquire()
        third = WorkdirLock(t, work, "run-3")
        assert "broke the lock" in third.acquire(force=True)
        assert read_holder(lock_path(work)).run_id == "run-3"
        third.release()
    finally:
        t.close()
