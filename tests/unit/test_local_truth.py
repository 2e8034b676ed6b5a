"""The local executor tells the truth (issue 15, item 3).

A closed terminal (SIGHUP) cancels like Ctrl-C; a runner killed by SIGKILL takes its jobs with it
(their supervisor sees it die: PR_SET_PDEATHSIG); status checks the recorded pids with their start
times and boot id and says RUNNING (orphaned) or FAILED, never CANCELLED for a job nobody
cancelled; a full disk ends the run FAILED "no space left on <mount>". The full-disk tests that
need a full filesystem mount a 1-2 MiB tmpfs (root; skipped where mount is refused), the others
inject ENOSPC where a program would meet it.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from lingjun_slurm.executors import local
from lingjun_slurm.common.diskspace import no_space_in_log, no_space_reason
from lingjun_slurm.executors.local import LocalRunner
from lingjun_slurm.runs.index import RunIndex
from lingjun_slurm.spec import load_spec
from lingjun_slurm.submit import prepare, prepare_local
from lingjun_slurm.transport.local import LocalTransport
from tests.integration.helpers import PY, chain_spec, cli, status, submitted_run_id

PATH = f"{os.path.dirname(PY)}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"LINGJUN_STATE_DIR": str(tmp_path / "state"), "LINGJUN_LOCAL_KILL_GRACE_S": "3"}


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_until(pred, timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or pred}")
        time.sleep(0.05)


def read_pid(path: Path) -> int:
    wait_until(lambda: path.exists() and path.read_text().strip(), what=f"{path}")
    return int(path.read_text().split()[0])


def state_of(work: Path, run_id: str) -> dict:
    return json.loads((work / "runs" / run_id / "local-state.json").read_text())


def sleeper(tmp_path: Path, pidfile: Path, seconds: int = 120) -> Path:
    # exec: the recorded pid is the sleep itself, the job's last process.
    return chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "slow", "command": f"echo $$ > {pidfile}; exec sleep {seconds}"},
        {"name": "after", "command": "true"},
    ])


def test_sighup_cancels_like_ctrl_c(tmp_path: Path, env: dict[str, str]) -> None:
    """The terminal of a foreground run closes: the run is cancelled and its job stopped."""
    pidfile = tmp_path / "pid"
    spec = sleeper(tmp_path, pidfile)
    proc = subprocess.Popen([PY, "-m", "lingjun_slurm.cli", "submit", str(spec), "--executor", "local"],
                            env={**os.environ, "PATH": PATH, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    job = read_pid(pidfile)
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)
    assert "SIGHUP: cancelling run" in out and "Traceback" not in err
    wait_until(lambda: not alive(job), 10, "the job to be stopped")
    run_id = submitted_run_id(out)
    stages = status(run_id, env)
    assert stages["slow"]["state"] == "CANCELLED" and stages["slow"]["reason"] == "cancelled"
    assert stages["after"]["state"] == "CANCELLED"
    assert not (tmp_path / "work" / "run.lock").exists()


def test_sigkill_of_the_runner_stops_its_jobs_and_status_says_failed(tmp_path: Path, env: dict[str, str]) -> None:
    pidfile = tmp_path / "pid"
    spec = sleeper(tmp_path, pidfile)
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", "--detach", env=env).stdout)
    job = read_pid(pidfile)
    runner = state_of(tmp_path / "work", run_id)["runner_pid"]
    os.kill(runner, signal.SIGKILL)
    wait_until(lambda: not alive(job), 15, "the job to die with its runner")
    wait_until(lambda: (tmp_path / "work" / "runs" / run_id / "jobs" / "1").read_text().count("end ") == 1, 15)
    stages = status(run_id, env)
    assert stages["slow"]["state"] == "FAILED", stages
    assert stages["slow"]["reason"].startswith("the local runner died (killed?); the job was stopped by signal 15")
    assert stages["after"]["state"] == "CANCELLED"
    assert stages["after"]["reason"].startswith("DependencyNeverSatisfied (slow FAILED)")
    # The runner is gone and so are its jobs: the workdir is free again, without --force.
    again = submitted_run_id(cli("submit", str(spec), "--executor", "local", "--detach", env=env).stdout)
    cli("cancel", again, env=env)


def test_orphaned_job_is_running_blocks_the_workdir_and_cancel_stops_it(tmp_path: Path, env: dict[str, str]) -> None:
    """Runner and supervisor both killed (nothing is left to stop the job): status says what is
    true, RUNNING (orphaned); a new submit is refused; cancel stops the job by its process group."""
    pidfile = tmp_path / "pid"
    spec = sleeper(tmp_path, pidfile)
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", "--detach", env=env).stdout)
    job = read_pid(pidfile)
    st = state_of(tmp_path / "work", run_id)
    supervisor = next(t["pid"] for t in st["tasks"] if t["stage"] == "slow")
    os.kill(st["runner_pid"], signal.SIGSTOP)  # so it cannot reap the supervisor and stop the group itself
    os.kill(supervisor, signal.SIGKILL)
    os.kill(st["runner_pid"], signal.SIGKILL)
    wait_until(lambda: not alive(st["runner_pid"]), 10)
    try:
        time.sleep(0.5)
        assert alive(job)
        stages = status(run_id, env)
        assert stages["slow"]["state"] == "RUNNING" and stages["slow"]["reason"].startswith("orphaned:"), stages
        assert stages["after"]["state"] == "CANCELLED"
        proc = cli("submit", str(spec), "--executor", "local", "--detach", env=env, check=1)
        assert f"is in use by run {run_id}" in proc.stderr and "stage slow" in proc.stderr, proc.stderr
        out = cli("cancel", run_id, env=env).stdout
        assert f"slow pid {supervisor}" in out
        wait_until(lambda: not alive(job), 10, "cancel to stop the orphan")
        assert status(run_id, env)["slow"]["state"] == "CANCELLED"
    finally:
        if alive(job):
            os.kill(job, signal.SIGKILL)


def test_status_checks_pids_with_start_time_and_boot_id(tmp_path: Path, env: dict[str, str]) -> None:
    """A recorded pid that is alive but another process (other start time, or a pid from before
    a reboot) is not the runner and not the job: FAILED, not RUNNING, not CANCELLED."""
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "a", "command": "true"}])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", env=env).stdout)
    run_dir = tmp_path / "work" / "runs" / run_id
    for marker in (run_dir / "jobs").iterdir():
        marker.unlink()  # the job's own record would say COMPLETED
    me = os.getpid()
    start = local.proc_start(me)

    def pretend(**kw) -> None:
        st = json.loads((run_dir / "local-state.json").read_text())
        st.update(finished=False, runner_pid=me, runner_start=start, boot_id=local.boot_id())
        st["tasks"][0].update(state="RUNNING", pid=me, pid_start=start, end=None, exit_code=None)
        for key, value in kw.items():
            if key.startswith("task_"):
                st["tasks"][0][key[5:]] = value
            else:
                st[key] = value
        (run_dir / "local-state.json").write_text(json.dumps(st))

    pretend()
    assert status(run_id, env)["a"]["state"] == "RUNNING"  # the record and the processes agree
    pretend(runner_start=start + 1, task_pid_start=start + 1)  # recycled pids
    got = status(run_id, env)["a"]
    assert got["state"] == "FAILED" and "recorded no end" in got["reason"], got
    pretend(boot_id="another-boot")  # same pid and ticks, but a boot ago
    assert status(run_id, env)["a"]["state"] == "FAILED"


# ------------------------------------------------------------------ a full disk


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs under tmp_path (root only; skipped where mount is refused)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_disk_under_the_runner_is_failed_no_space_left(tmp_path: Path, env: dict[str, str], tiny_fs: Path) -> None:
    """The workdir's filesystem fills up while a job runs: the runner cannot write its state any
    more, stops the jobs and records FAILED "no space left on <mount>" (was CANCELLED)."""
    work = tiny_fs / "work"
    spec = chain_spec(tmp_path / "s.yaml", work, [
        {"name": "fill", "command": f"head -c 8M /dev/zero > {work}/fill || true; sleep 120", "before": "preprocess"},
        {"name": "tick", "command": "sleep 2", "before": "preprocess"},
    ])
    proc = cli("submit", str(spec), "--executor", "local", env=env, check=1)
    assert f"no space left on {tiny_fs}" in proc.stdout, proc.stdout
    run_id = submitted_run_id(proc.stdout)
    state = json.loads((work / "runs" / run_id / "local-state.json").read_text())
    assert state["finished"] and state["error"].startswith(f"no space left on {tiny_fs}")
    stages = status(run_id, env)
    assert stages["fill"]["state"] == "FAILED", stages
    assert stages["fill"]["reason"].startswith(f"no space left on {tiny_fs}")
    assert "could not write local-state.json" in stages["fill"]["reason"]
    assert all(s["state"] != "CANCELLED" or s["reason"] != "cancelled" for s in stages.values()), stages


@pytest.mark.parametrize("command,named", [
    ("dd if=/dev/zero of={fs}/shard-0.bin bs=64k count=100", True),   # dd: error writing '<path>': No space ...
    ("head -c 8M /dev/zero > {fs}/shard-0.bin", False),               # head: error writing 'standard output': ...
])
def test_job_that_meets_a_full_disk_is_failed_no_space_left(tmp_path: Path, env: dict[str, str], tiny_fs: Path,
                                                            command: str, named: bool) -> None:
    """A job's own write fails (the real tools' messages, in a log on another filesystem). Where the
    message names no file, the filesystem the job writes to is found full."""
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "shard", "command": command.format(fs=tiny_fs)}])
    proc = cli("submit", str(spec), "--executor", "local", env=env, check=1)
    run_id = submitted_run_id(proc.stdout)
    got = status(run_id, env)["shard"]
    assert got["state"] == "FAILED" and got["exit_code"] == 1
    want = f"no space left on {tiny_fs}" + (f" (writing {tiny_fs}/shard-0.bin)" if named else "")
    assert got["reason"] == want, got


def test_enospc_raised_in_a_stage_is_named(tmp_path: Path, env: dict[str, str]) -> None:
    """No mount needed: a stage whose Python write fails with errno 28, as a shard writer's would."""
    target = tmp_path / "data" / "shard-3.bin"
    code = f"import errno, os; raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), {str(target)!r})"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "prep", "command": f'python3 -c "{code}"'}])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", env=env, check=1).stdout)
    got = status(run_id, env)["prep"]
    assert got["state"] == "FAILED"
    assert got["reason"].startswith("no space left on /") and f"(writing {target})" in got["reason"], got


def test_runner_that_cannot_write_its_state_records_failed(tmp_path: Path, env: dict[str, str], monkeypatch) -> None:
    """No mount needed: ENOSPC injected where the runner writes local-state.json, for as long as
    its reserve file takes room; the last record goes into the room the reserve kept."""
    monkeypatch.setenv("LINGJUN_STATE_DIR", env["LINGJUN_STATE_DIR"])
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "long", "command": "sleep 120", "before": "preprocess"},
        {"name": "short", "command": "true", "before": "preprocess"},
    ])
    prep = prepare(load_spec(spec), run_id="full-1", executor="local")
    m = prepare_local(LocalTransport(), prep, RunIndex())
    real = local.write_state
    calls = {"n": 0}

    def write_state(run_dir: str, text: str) -> None:
        calls["n"] += 1
        if calls["n"] > 1 and Path(run_dir, local.RESERVE_FILE).exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(run_dir, "local-state.json.tmp")))
        real(run_dir, text)

    monkeypatch.setattr(local, "write_state", write_state)
    monkeypatch.setattr(local, "KILL_GRACE_S", 2.0)
    lines: list[str] = []
    assert LocalRunner(m.run_dir, echo=lines.append).run() == 1
    state = local.read_state(m.run_dir)
    assert state.finished and state.error.startswith("no space left on /")
    by_stage = {t.stage: t for t in state.tasks}
    assert by_stage["long"].state == "FAILED" and by_stage["long"].reason.startswith("no space left on /")
    assert not Path(m.run_dir, local.RESERVE_FILE).exists()
    assert any("no space left on" in line for line in lines)


@pytest.mark.parametrize("text,found", [
    ("Traceback ...\nOSError: [Errno 28] No space left on device: '/data/x/shard-0.bin'\n",
     (errno.ENOSPC, "/data/x/shard-0.bin")),
    ("OSError: [Errno 28] No space left on device\n", (errno.ENOSPC, None)),           # from write(): no path
    ("dd: error writing '/data/x/fill': No space left on device\n", (errno.ENOSPC, "/data/x/fill")),
    ("head: error writing 'standard output': No space left on device\n", (errno.ENOSPC, None)),
    ("cp: cannot create regular file '/data/y': No space left on device\n", (errno.ENOSPC, "/data/y")),
    ("bash: line 1: /data/z.log: No space left on device\n", (errno.ENOSPC, "/data/z.log")),
    ("bash: echo: write error: No space left on device\n", (errno.ENOSPC, None)),
    ("OSError: [Errno 122] Disk quota exceeded: '/home/a/ckpt'\n", (errno.EDQUOT, "/home/a/ckpt")),
    ("training failed: loss is nan\n", None),
])
def test_no_space_messages_in_a_log(tmp_path: Path, text: str, found) -> None:
    """The forms printed here by Python 3.11, GNU coreutils 9.1 (dd, head, cp) and bash 5.2 when a
    1 MiB tmpfs filled up, plus EDQUOT's."""
    log = tmp_path / "job.out"
    log.write_text("lingjun-slurm: stage a\n" + text)
    assert no_space_in_log(str(log)) == found


def test_no_space_reason_names_the_mount(tiny_fs: Path) -> None:
    assert no_space_reason(str(tiny_fs / "a" / "b"), errno.ENOSPC) == f"no space left on {tiny_fs} (writing {tiny_fs}/a/b)"
    assert no_space_reason(str(tiny_fs), errno.ENOSPC) == f"no space left on {tiny_fs}"
    assert no_space_reason(str(tiny_fs), errno.EIO) is None
