"""Failures that go through the real srun of the test cluster (Slurm 22.05, `--kill-on-bad-exit=1`),
and whether the train job is requeued: decided from what the tasks did (lingjun_slurm/injob/host/retry.py),
not from srun's exit code, which a signalled task wins (137/143 for one rank's `exit 1`).

Megatron-LM cannot be installed here: `pretrain_gpt.py` is a stand-in that each rank runs through
the rendered train script and the real srun; what it does per rank and per attempt
(SLURM_PROCID, SLURM_RESTART_COUNT) is the fault. A finished run writes Megatron's tracker
(<save>/latest_checkpointed_iteration.txt), as Megatron-LM's rank 0 does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .faults import megatron_standin_spec
from .helpers import all_ended, cli, submitted_run_id, wait_for


@pytest.fixture
def slurm_env(slurm_cluster: Any, tmp_path: Path) -> dict[str, str]:
    return {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}


def train_job(run_dir: Path) -> str:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return next(s for s in manifest["stages"] if s["name"] == "train")["job_ids"][0]


def scontrol_job(env: dict[str, str], job: str) -> str:
    return subprocess.run(["scontrol", "show", "job", "-o", job], env={**os.environ, **env}, capture_output=True,
                          text=True, check=True).stdout


def started(pids: Path, attempt: int, rank: int) -> tuple[str, int]:
    """(node, pid) of a rank of an attempt, once it has started."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for f in pids.glob(f"{attempt}-{rank}-*") if pids.is_dir() else []:
            text = f.read_text()
            if text:
                return f.name.split("-", 2)[2], int(text)
        time.sleep(0.2)
    raise TimeoutError(f"rank {rank} of attempt {attempt} did not start")


@pytest.mark.slurm
def test_one_rank_exit_1_at_start_fails_at_once_and_is_not_requeued(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """Rank 1 exits 1 before any checkpoint; rank 0 is busy. srun kills rank 0 (--kill-on-bad-exit)
    and exits 143 (a signalled task wins its exit code), which the old rule (rc >= 128) requeued
    max_restarts times. Now: FAILED after one attempt, and `status` says which task failed how."""
    spec, _ = megatron_standin_spec(tmp_path, "if rank == 1:\n    sys.exit(1)\ntime.sleep(300)\n")
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=slurm_env).stdout)
    stages = wait_for(run_id, slurm_env, all_ended, timeout=180)
    train = stages["train"]
    assert train["state"] == "FAILED" and train["restarts"] == 0, stages
    reason = train["reason"] or ""
    assert "task 1 on node" in reason and "exited with code 1 first" in reason, train
    log = cli("logs", run_id, "train", env=slurm_env).stdout
    # The real srun's own lines: rank 1 exited 1, rank 0 was killed, srun's exit code was a signal's.
    assert ": task 1: Exited with exit code 1" in log, log[-3000:]
    assert ": task 0: Terminated" in log or ": task 0: Killed" in log, log[-3000:]
    assert "requeueing" not in log.replace("not requeueing", ""), log[-3000:]
    assert "not requeueing" in log, log[-3000:]


@pytest.mark.slurm
def test_a_rank_killed_from_outside_before_any_checkpoint_is_requeued(tmp_path: Path,
                                                                      slurm_env: dict[str, str]) -> None:
    """SIGKILL from outside (the OOM killer, an operator) on rank 1 of the first attempt, before any
    progress: not the program's failure, so the job is requeued, and the next attempt finishes."""
    spec, pids = megatron_standin_spec(tmp_path, "if attempt >= 1:\n    finish()\ntime.sleep(300)\n")
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=slurm_env).stdout)
    _, pid = started(pids, 0, 1)
    started(pids, 0, 0)
    os.kill(pid, signal.SIGKILL)
    stages = wait_for(run_id, slurm_env, all_ended, timeout=180)
    train = stages["train"]
    assert train["state"] == "COMPLETED" and train["restarts"] == 1, stages
    log = cli("logs", run_id, "train", env=slurm_env).stdout
    assert ": task 1: Killed" in log and "was stopped from outside first: Killed" in log, log[-3000:]
    assert "requeueing (restart 1 of 3)" in log, log[-3000:]


@pytest.mark.slurm
def test_a_crash_blamed_on_a_node_is_requeued_without_that_node(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """Rank 1 reports an uncorrectable ECC error and exits 1; rank 0 then exits 1 too (as a rank does
    whose peer vanished), so srun exits 1, not a signal: the old rule failed the job on the spot
    although the crash log blamed rank 1's node. Now the job is requeued away from that node, and
    the next attempt (on other nodes) finishes."""
    body = (
        "if attempt >= 1:\n    finish()\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))\n"
        "if rank == 1:\n"
        "    time.sleep(1)\n"
        "    print('[rank1]: RuntimeError: CUDA error: uncorrectable ECC error encountered', flush=True)\n"
        "    sys.exit(1)\n"
        "time.sleep(300)\n")
    spec, pids = megatron_standin_spec(tmp_path, body)
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=slurm_env).stdout)
    bad, _ = started(pids, 0, 1)
    stages = wait_for(run_id, slurm_env, all_ended, timeout=180)
    train = stages["train"]
    assert train["state"] == "COMPLETED" and train["restarts"] == 1, stages
    run_dir = tmp_path / "work" / "runs" / run_id
    assert f"ExcNodeList={bad}" in scontrol_job(slurm_env, train_job(run_dir))
    assert all(not f.name.endswith(f"-{bad}") for f in pids.glob("1-*")), sorted(p.name for p in pids.iterdir())
    log = cli("logs", run_id, "train", env=slurm_env).stdout
    assert f"requeueing without node(s) {bad}" in log, log[-3000:]
    assert "away from the node(s) this attempt blamed" in log, log[-3000:]
