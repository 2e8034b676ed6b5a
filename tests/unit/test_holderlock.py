"""The holder-file lock (lingjun_slurm/common/holderlock.py): O_EXCL holder files, stale holders, races."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lingjun_slurm.common import holderlock
from lingjun_slurm.common.holderlock import Holder, HolderLock, LockHeld, read_holder, slurm_job_alive


def holder(**kw) -> Holder:
    base = dict(host=holderlock.this_host(), pid=os.getpid(), start=holderlock.process_start(os.getpid()) or "",
                job_id="", since=time.time(), purpose="test")
    base.update(kw)
    return Holder(**base)


def test_second_holder_is_refused_and_named(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    first = HolderLock(path, purpose="import image").acquire()
    with pytest.raises(LockHeld) as info:
        HolderLock(path).acquire(timeout=0.2, poll_s=0.05)
    assert f"pid {os.getpid()} on {holderlock.this_host()}" in str(info.value) and "import image" in str(info.value)
    first.release()
    assert not path.exists()
    HolderLock(path).acquire().release()


def test_holder_file_says_who(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    lock = HolderLock(tmp_path / "x.lock", purpose="p").acquire()
    data = json.loads((tmp_path / "x.lock").read_text())
    assert data["pid"] == os.getpid() and data["job_id"] == "4242" and data["host"] == holderlock.this_host()
    assert data["start"].endswith(":" + Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19])
    lock.release()


def test_dead_local_holder_is_stale(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(proc.stdout)
    path = tmp_path / "x.lock"
    path.write_text(holder(pid=dead, start="x:1").to_json())
    lock = HolderLock(path).acquire()
    assert read_holder(path).pid == os.getpid()
    lock.release()


def test_reused_pid_is_stale(tmp_path: Path) -> None:
    """Our own pid, but recorded with another start time: the recorded process is gone."""
    path = tmp_path / "x.lock"
    path.write_text(holder(start="other-boot:123").to_json())
    assert HolderLock(path).try_acquire()


def test_live_local_holder_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    path.write_text(holder().to_json())
    assert not HolderLock(path).try_acquire()
    assert read_holder(path) is not None


def test_remote_holder_is_judged_by_its_job(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    path.write_text(holder(host="gpu-node-7", pid=1, job_id="77").to_json())
    assert not HolderLock(path, job_alive=lambda j: True).try_acquire()
    assert not HolderLock(path, job_alive=lambda j: None).try_acquire()   # slurmctld unreachable
    assert not HolderLock(path).try_acquire()                             # no way to ask
    assert HolderLock(path, job_alive=lambda j: j != "77").try_acquire()


def test_remote_holder_outside_a_job_is_never_broken(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    path.write_text(holder(host="login2", pid=1).to_json())
    assert not HolderLock(path, job_alive=lambda j: False).try_acquire()


def test_unreadable_holder_is_kept_while_young(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    path.write_text("")
    assert not HolderLock(path).try_acquire()
    old = time.time() - holderlock.UNREADABLE_GRACE_S - 5
    os.utime(path, (old, old))
    assert HolderLock(path).try_acquire()


def _contend(path: str, out: str, n: int) -> None:
    for _ in range(n):
        lock = HolderLock(path).acquire(timeout=30, poll_s=0.001)
        with open(out, "a") as f:
            f.write(f"in {os.getpid()}\n")
            f.flush()
            time.sleep(0.002)
            f.write(f"out {os.getpid()}\n")
        lock.release()


def test_processes_never_hold_it_together(tmp_path: Path) -> None:
    path, out = str(tmp_path / "x.lock"), str(tmp_path / "log")
    procs = [multiprocessing.Process(target=_contend, args=(path, out, 15)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    lines = Path(out).read_text().splitlines()
    assert len(lines) == 4 * 15 * 2
    for i in range(0, len(lines), 2):
        assert lines[i].startswith("in ") and lines[i + 1] == "out " + lines[i].split()[1]


def test_racing_breakers_leave_one_holder(tmp_path: Path) -> None:
    """Many processes find the same stale holder at once: exactly one wins each round."""
    path = tmp_path / "x.lock"
    path.write_text(holder(pid=2 ** 22 + 12345, start="gone:1").to_json())
    out = tmp_path / "log"
    procs = [multiprocessing.Process(target=_contend, args=(str(path), str(out), 3)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    lines = out.read_text().splitlines()
    assert len(lines) == 24
    for i in range(0, len(lines), 2):
        assert lines[i + 1] == "out " + lines[i].split()[1]
    assert not list(tmp_path.glob("x.lock.stale.*"))


def test_release_leaves_someone_elses_file(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    lock = HolderLock(path).acquire()
    path.write_text(holder(host="other", pid=3).to_json())  # broken and retaken by another
    lock.release()
    assert read_holder(path).host == "other"


@pytest.mark.parametrize("rc,out,alive", [
    (0, "RUNNING\n", True), (0, "PENDING\n", True), (0, "", False), (0, "COMPLETED\n", False),
    (0, "CANCELLED\nRUNNING\n", True), (0, "TIMEOUT\n", False),
    (1, "slurm_load_jobs error: Invalid job id specified\n", False),
    (1, "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n", None),
])
def test_slurm_job_alive(rc: int, out: str, alive) -> None:
    seen = []
    assert slurm_job_alive("12", lambda argv: (seen.append(argv), (rc, out))[1]) is alive
    assert seen == [["squeue", "-h", "-t", "all", "-j", "12", "-o", "%T"]]
