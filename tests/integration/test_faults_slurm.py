"""Faults injected into training on the real test Slurm cluster (builtin trainer, CPU, DP=2 over
two nodes; tests/integration/faults.py): a representative few; bench/faults.py runs them all and
prints what each costs. Each one must be survived: the run completes every iteration, loses at
most one save interval, and the node to blame is excluded from the requeue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .faults import last_iteration, resumes, train_spec, wait_for_rank
from .helpers import all_ended, cli, submitted_run_id, wait_for
from .shared_runs import KILLED_RANK_TESTS, KilledRankRun, start_early

SAVE = 10


@pytest.fixture
def slurm_env(slurm_cluster: Any, tmp_path: Path) -> dict[str, str]:
    return {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}


def scontrol_job(env: dict[str, str], job: str) -> str:
    return subprocess.run(["scontrol", "show", "job", "-o", job], env={**os.environ, **env}, capture_output=True,
                          text=True, check=True).stdout


def train_job(run_dir: Path) -> str:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return next(s for s in manifest["stages"] if s["name"] == "train")["job_ids"][0]


@pytest.mark.slurm
def test_a_stopped_rank_is_a_hang_its_node_is_excluded_and_training_finishes(
        tmp_path: Path, slurm_env: dict[str, str], request: pytest.FixtureRequest) -> None:
    """SIGSTOP on rank 1 after the first checkpoint: the other rank waits in its all-reduce, no new
    iteration appears, and after hang_timeout the watchdog records both ranks' states (rank 1
    stopped), collects their stacks, ends the step; the script requeues the job and sets its
    ExcNodeList to rank 1's node, and the next attempt resumes from the checkpoint elsewhere.
    (Mostly waiting: the shared killed-rank run, tests/integration/shared_runs.py, runs meanwhile.)"""
    start_early(request, "killed_rank_started", KILLED_RANK_TESTS)
    spec = train_spec(tmp_path, "hang", iterations=30, save_interval=SAVE, hang_timeout=12, preflight=False)
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=slurm_env).stdout)
    run_dir = tmp_path / "hang" / "runs" / run_id
    node, pid = wait_for_rank(run_dir, 1, SAVE + 1)
    at = last_iteration(run_dir)
    os.kill(pid, signal.SIGSTOP)
    stopped = time.time()
    stages = wait_for(run_id, slurm_env, all_ended, timeout=360)
    assert stages["train"]["state"] == "COMPLETED", stages
    assert stages["train"]["restarts"] == 1
    assert f"excluded {node} (watchdog: hang at iteration" in (stages["train"]["reason"] or ""), stages["train"]
    job = train_job(run_dir)
    assert f"ExcNodeList={node}" in scontrol_job(slurm_env, job)
    assert node not in stages["train"]["nodes"].replace("[", ",").replace("]", ",").split(","), stages["train"]
    hang = json.loads((run_dir / "hangs" / f"{job}-0.json").read_text())
    assert hang["step_ended"] and hang["last_iteration"] >= at
    states = {s["rank"]: s["state"] for s in hang["states"]}
    assert states[1] == "T" and states[0] in ("S", "R"), hang["states"]  # read before any signal
    dump = next(Path(s["path"]) for s in hang["stacks"] if s["rank"] == 0).read_text()
    assert "most recent call first" in dump and "loop.py" in dump, dump[:2000]  # rank 0 waited in the train loop
    starts = resumes(run_dir)
    assert starts[-1]["iteration"] >= at - SAVE, starts  # at most one save interval lost
    assert last_iteration(run_dir) == 30
    log = cli("logs", run_id, "train", env=slurm_env).stdout
    assert "watchdog: no new iteration for" in log and f"requeueing without node(s) {node}" in log, log[-3000:]
    assert time.time() - stopped < 300


@pytest.mark.slurm
def test_a_killed_rank_requeues_and_resumes(killed_rank_run: KilledRankRun) -> None:
    """SIGKILL on rank 1 mid-training: srun ends the step (--kill-on-bad-exit), the script requeues
    (a task killed by a signal), the next attempt resumes from the last checkpoint. No node is
    blamed: a rank that died says nothing about its node. (The run, pre-flight on, is shared with
    test_goodput_slurm.py: tests/integration/shared_runs.py.)"""
    run = killed_rank_run
    stages, run_dir = run.stages, run.run_dir
    assert stages["train"]["state"] == "COMPLETED", stages
    assert stages["train"]["restarts"] == 1
    assert resumes(run_dir)[-1]["iteration"] >= run.at - run.save_interval
    assert not (run_dir / "nodes" / "excluded.json").exists()
    assert "ExcNodeList=(null)" in scontrol_job(run.env, train_job(run_dir))


def node_roots(tmp: Path, bad: str) -> str:
    """A sysfs tree per test-cluster node (LINGJUN_PREFLIGHT_ROOT's {node}): eth0 up, except on `bad`."""
    for i in range(1, 5):
        net = tmp / "roots" / f"node{i}" / "sys" / "class" / "net" / "eth0"
        net.mkdir(parents=True)
        (net / "operstate").write_text("down\n" if f"node{i}" == bad else "up\n")
        (net / "carrier").write_text("0\n" if f"node{i}" == bad else "1\n")
    return str(tmp / "roots" / "{node}")


@pytest.mark.slurm
def test_a_node_that_fails_preflight_is_excluded_before_any_training(tmp_path: Path,
                                                                      slurm_env: dict[str, str]) -> None:
    """Pre-flight on the two allocated nodes, the job's NCCL_SOCKET_IFNAME=eth0 judged against each
    node's (modelled) sysfs: on the first node eth0 is down, so the job never trains there: it is
    requeued without that node, its next pre-flight passes, and training runs from iteration 0."""
    import yaml

    spec = train_spec(tmp_path, "pre", iterations=12, save_interval=SAVE, hang_timeout=60, preflight=True)
    doc = yaml.safe_load(spec.read_text())
    doc["cluster"]["network"]["overrides"] = {"NCCL_SOCKET_IFNAME": "eth0"}
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    # The tool's own variables are refused in the spec; sbatch exports the submitting environment.
    env = {**slurm_env, "LINGJUN_PREFLIGHT_ROOT": node_roots(tmp_path, "node1"), "LINGJUN_PREFLIGHT_SHARE_TIMEOUT": "20"}
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    run_dir = tmp_path / "pre" / "runs" / run_id
    stages = wait_for(run_id, slurm_env, all_ended, timeout=300)
    train = stages["train"]
    assert train["state"] == "COMPLETED" and train["restarts"] == 1, stages
    assert "excluded node1 (preflight: eth0 down (NCCL_SOCKET_IFNAME=eth0))" in (train["reason"] or ""), train
    assert "ExcNodeList=node1" in scontrol_job(slurm_env, train_job(run_dir))
    job = train_job(run_dir)
    first = json.loads((run_dir / "preflight" / f"{job}-0" / "verdict.json").read_text())
    assert first["exit"] == 1 and list(first["bad_nodes"]) == ["node1"], first
    second = json.loads((run_dir / "preflight" / f"{job}-1" / "verdict.json").read_text())
    assert second["ok"], second
    assert [r["iteration"] for r in resumes(run_dir)] == [0]  # the first attempt never started training
    log = cli("logs", run_id, "train", env=slurm_env).stdout
    assert "lingjun-slurm: preflight: node node1: socket-if" in log and "requeueing without node(s) node1" in log, \
        log[-3000:]


@pytest.mark.slurm
def test_gpus_missing_on_every_node_fail_the_job_in_preflight_without_excluding_anyone(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """A GPU job on the test cluster's gpu partition, whose GPUs are gres device files without a
    driver: pre-flight finds no GPU on any node. That is the image's or the cluster's problem, not
    a node's: the job fails at once, before training, and no node is excluded."""
    import yaml

    spec = train_spec(tmp_path, "nogpu", iterations=4, preflight=True)
    doc = yaml.safe_load(spec.read_text())
    doc["cluster"]["stages"]["train"].update(partition="gpu", gpus_per_node=1)
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=slurm_env).stdout)
    run_dir = tmp_path / "nogpu" / "runs" / run_id
    stages = wait_for(run_id, slurm_env, all_ended, timeout=240)
    assert stages["train"]["state"] == "FAILED" and stages["train"]["restarts"] == 0, stages
    verdict = json.loads((run_dir / "preflight" / f"{train_job(run_dir)}-0" / "verdict.json").read_text())
    assert verdict["exit"] == 2 and not verdict["bad_nodes"], verdict
    assert not (run_dir / "nodes" / "excluded.json").exists()
    assert resumes(run_dir) == []  # the trainer never started
    assert "pre-flight failed" in cli("logs", run_id, "train", env=slurm_env).stdout
    # The cause reaches status: the train stage's note, written by the batch script as it gives up.
    reason = stages["train"]["reason"] or ""
    assert reason.startswith("pre-flight failed, not training: ") and " fails on " in reason, stages["train"]
