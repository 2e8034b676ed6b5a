"""Issue 26 item 8: `cancel` says what it did, truthfully: the jobs it cancelled and the stages that
had already ended, for a running train stage on the real test Slurm cluster and with the local
executor (the real builtin trainer on the CPU in both)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from .helpers import all_ended, cli, submitted_run_id, wait_for
from .test_training_chain import gpt_spec


@pytest.fixture
def slurm_env(slurm_cluster: Any, tmp_path: Path) -> dict[str, str]:
    return {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}


def _cancelled_jobs(said: str) -> tuple[list[str], list[str]]:
    """(job ids after "jobs", stage names after "already ended") of cancel's line."""
    line = next(ln for ln in said.splitlines() if ln.startswith("cancelled run"))
    jobs = re.search(r"jobs ([^;]*)", line)
    ended = re.search(r"already ended: ([^(]*)", line)
    return ([j.split()[0] for j in jobs.group(1).split(", ") if j != "-"] if jobs else [],
            ended.group(1).strip().split(", ") if ended else [])


def _wait_training(run_dir: Path, timeout: float = 180) -> None:
    """Until the trainer has logged an iteration (metrics.jsonl): a train that really trains."""
    deadline = time.monotonic() + timeout
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and '"type": "train"' in metrics.read_text().replace('"type":"train"', '"type": "train"'):
            return
        time.sleep(0.2)
    raise AssertionError(f"no training iteration in {metrics} after {timeout} s")


@pytest.mark.slurm
def test_cancel_of_a_running_train_names_its_job_on_slurm(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    spec = gpt_spec(tmp_path, "cancelme", iterations=100000, save_interval=50000)
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=slurm_env).stdout)
    stages = wait_for(run_id, slurm_env, lambda s: s["train"]["state"] == "RUNNING" or all_ended(s), timeout=240)
    assert stages["train"]["state"] == "RUNNING", stages
    train_job = stages["train"]["job_ids"][0]
    _wait_training(tmp_path / "cancelme" / "runs" / run_id)
    said = cli("cancel", run_id, env=slurm_env, timeout=180).stdout
    print(said)
    jobs, ended = _cancelled_jobs(said)
    assert train_job in jobs and f"{train_job} (train)" in said, said
    checkpoint_job = stages["checkpoint"]["job_ids"][0]  # pending on train: ended by this cancel too
    assert f"{checkpoint_job} (checkpoint)" in said, said
    assert "train" not in ended and {"make-corpus", "preprocess", "merge"} <= set(ended), said
    final = wait_for(run_id, slurm_env, all_ended, timeout=60)
    assert final["train"]["state"] != "COMPLETED"


def test_cancel_of_a_running_local_train_names_what_it_stopped(tmp_path: Path) -> None:
    env = {"LINGJUN_STATE_DIR": str(tmp_path / "state"), "LINGJUN_LOCAL_KILL_GRACE_S": "2"}
    spec = gpt_spec(tmp_path, "cancelme", iterations=100000, save_interval=50000)
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", "--detach", env=env).stdout)
    stages = wait_for(run_id, env, lambda s: s["train"]["state"] == "RUNNING" or all_ended(s), timeout=240)
    assert stages["train"]["state"] == "RUNNING", stages
    _wait_training(tmp_path / "cancelme" / "runs" / run_id)
    said = cli("cancel", run_id, env=env, timeout=120).stdout
    print(said)
    jobs, ended = _cancelled_jobs(said)
    assert stages["train"]["job_ids"][0] in jobs, said
    assert "(train)" in said and {"make-corpus", "preprocess", "merge"} <= set(ended), said
    assert "checkpoint" not in ended, said  # pending, cancelled with the run: listed among the jobs
    final = wait_for(run_id, env, all_ended, timeout=30)
    assert final["train"]["state"] == "CANCELLED" and final["checkpoint"]["state"] == "CANCELLED"
