"""lingjun_slurm/executors/childwait.py: the runner, supervisor and srun stand-in wake at a child's
exit instead of at their next poll. Bounds are loose (a 60 s timeout that must not be reached)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from lingjun_slurm.executors import childwait
from lingjun_slurm.executors.childwait import wait_any


def test_returns_when_a_child_exits_long_before_the_timeout() -> None:
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    try:
        start = time.monotonic()
        wait_any([slow.pid, quick.pid], 60)
        assert time.monotonic() - start < 30
        assert quick.poll() == 0 and slow.poll() is None
    finally:
        slow.kill()
        slow.wait()


def test_an_exited_unreaped_child_returns_at_once_and_a_live_one_waits_out_the_timeout() -> None:
    done = subprocess.Popen(["true"])
    while not os.path.exists(f"/proc/{done.pid}") or open(f"/proc/{done.pid}/stat").read().split()[2] != "Z":
        time.sleep(0.01)
    start = time.monotonic()
    wait_any([done.pid], 60)
    assert time.monotonic() - start < 30
    assert done.poll() == 0
    live = subprocess.Popen(["sleep", "60"])
    try:
        wait_any([live.pid], 0.2)
        assert live.poll() is None
    finally:
        live.kill()
        live.wait()


def test_without_pidfd_it_sleeps_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pidfd(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    slept: list[float] = []
    monkeypatch.setattr(childwait.os, "pidfd_open", no_pidfd)
    monkeypatch.setattr(childwait.time, "sleep", slept.append)
    wait_any([os.getpid()], 0.05)
    wait_any([], 0.07)
    assert slept == [0.05, 0.07]
