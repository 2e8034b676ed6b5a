"""The local executor's srun stand-in: N tasks, srun's task variables, kill-on-bad-exit."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lingjun_slurm.executors.launch", *args], capture_output=True,
                          text=True, timeout=60)


def test_tasks_get_their_rank_and_size() -> None:
    proc = launch("--ntasks", "3", "--", "sh", "-c", 'echo "$SLURM_PROCID $SLURM_LOCALID $SLURM_NTASKS"')
    assert proc.returncode == 0
    assert sorted(proc.stdout.splitlines()) == ["0 0 3", "1 1 3", "2 2 3"]


def test_first_failure_is_the_exit_status() -> None:
    proc = launch("--ntasks", "2", "--", "sh", "-c", 'exit $((SLURM_PROCID + 4))')
    assert proc.returncode in (4, 5)
    assert "exited with" in proc.stderr


def test_kill_on_bad_exit_stops_the_other_tasks(tmp_path: Path) -> None:
    started = time.monotonic()
    # exec: the task is the sleep itself (a shell's orphaned child is the runner's to clean up).
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.executors.launch", "--ntasks", "2",
                           "--kill-on-bad-exit", "--", "sh", "-c",
                           'if [ "$SLURM_PROCID" = 0 ]; then exit 3; fi; exec sleep 30'],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    assert proc.returncode == 3
    assert time.monotonic() - started < 15
