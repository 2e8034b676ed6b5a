"""The whole chain for real: make-corpus -> preprocess (array) -> merge -> train (builtin megatron-core
trainer on the CPU over gloo) -> checkpoint, on the test Slurm cluster and with the local executor."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import yaml

from .helpers import PY, all_ended, cli, submitted_run_id, wait_for
from .shared_runs import start_early

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def gpt_spec(tmp_path: Path, name: str, *, nodes: int = 1, tasks: int = 1, tp: int = 1, pp: int = 1,
             iterations: int = 30, save_interval: int = 10, time_limit: str = "00:10:00",
             max_restarts: int = 3, workdir: Optional[Path] = None) -> Path:
    work = workdir or tmp_path / name
    corpus = work / "corpus"
    doc: dict[str, Any] = {
        "version": 1,
        "run": {"name": name, "workdir": str(work)},
        "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": "cpu", "time": "00:10:00"},
                    "stages": {"train": {"nodes": nodes, "tasks_per_node": tasks, "gpus_per_node": 0,
                                         "cpus_per_task": 1, "time": time_limit}}},
        "container": {"runtime": "none"},
        "data": {"inputs": [str(corpus / "*.jsonl")], "tokenizer": {"type": "null", "vocab_size": 128},
                 "shards": 2, "workers": 1},
        "model": {"num_layers": 2 * pp, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32,
                  "vocab_size": 128},
        "parallelism": {"tensor": tp, "pipeline": pp, "micro_batch": 2, "global_batch": 8},
        "training": {"entrypoint": "builtin", "iterations": iterations, "lr": 3e-3, "min_lr": 3e-4,
                     "lr_warmup_iters": 2, "precision": "fp32", "log_interval": 5, "eval_interval": 1000,
                     "eval_iters": 0, "save_grace_s": 60, "max_restarts": max_restarts},
        "checkpoint": {"save_interval": save_interval, "keep_last": 2},
        "stages": {"commands": [{"name": "make-corpus", "before": "preprocess", "container": False,
                                 "command": f"python3 -m lingjun_slurm.data.synthetic {corpus} --docs 300 "
                                            "--vocab 127"}]},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def losses(run_dir: Path) -> dict[int, float]:
    """iteration -> loss from metrics.jsonl; a later record for an iteration (after a resume) wins."""
    out: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("type") == "train":
            out[rec["iteration"]] = rec["loss"]
    return out


def verify(ckpt: Path) -> None:
    proc = subprocess.run([PY, "-m", "lingjun_slurm.cli", "checkpoint", "verify", str(ckpt)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def slurm_env(slurm_cluster: Any, tmp_path: Path) -> dict[str, str]:
    return {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}


@dataclass(frozen=True)
class Submitted:
    env: dict[str, str]
    run_id: str
    work: Path


TIME_LIMIT_TEST = "test_time_limit_signal_save_requeue_finish"


@pytest.fixture(scope="module")
def time_limit_run(slurm_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Submitted]:
    """test_time_limit_signal_save_requeue_finish's run, submitted (not waited for) by the tests before
    it, so that the time its train job spends waiting for Slurm's signal overlaps them. The
    trainer sleeps 0.2 s in each step (the LINGJUN_TRAIN_SLOW test hook, rank 0): it only has to
    keep training until the signal, and so leaves the CPUs to the other test meanwhile."""
    tmp = tmp_path_factory.mktemp("time-limit")
    slow = tmp / "slow.json"
    slow.write_text(json.dumps({"rank": 0, "sleep_s": 0.2}))
    env = {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp / "state"), "LINGJUN_TRAIN_SLOW": str(slow)}
    spec = gpt_spec(tmp, "limit", iterations=100000, save_interval=50000, time_limit="00:03:00", max_restarts=8)
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    try:
        yield Submitted(env=env, run_id=run_id, work=tmp / "limit")
    finally:
        cli("cancel", run_id, env=env, check=None)


@pytest.mark.slurm
def test_whole_chain_with_a_two_node_train_stage(tmp_path: Path, slurm_env: dict[str, str],
                                                request: pytest.FixtureRequest) -> None:
    """Two nodes x two tasks: TP=2 inside each node's pair, DP=2 across the nodes (one run covers
    both the tensor-parallel and the data-parallel groups that srun's tasks form)."""
    layout = "tp2dp2"
    spec = gpt_spec(tmp_path, layout, nodes=2, tasks=2, tp=2, iterations=20)
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=slurm_env).stdout)
    # Once this train job has its nodes (the first free ones), the time-limit test's run may start
    # beside it (see the time_limit_run fixture).
    wait_for(run_id, slurm_env, lambda s: s["train"]["state"] != "PENDING", timeout=300)
    start_early(request, "time_limit_run", (TIME_LIMIT_TEST,))
    stages = wait_for(run_id, slurm_env, all_ended, timeout=300)
    assert all(s["state"] == "COMPLETED" for s in stages.values()), stages
    assert stages["train"]["nodes"] == "node[1-2]" or "," in stages["train"]["nodes"], stages["train"]
    run_dir = tmp_path / layout / "runs" / run_id
    curve = losses(run_dir)
    assert max(curve) == 20 and curve[20] < curve[min(curve)] - 0.5, curve
    start = next(json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                 if json.loads(line)["type"] == "start")
    assert (start["world_size"], start["tp"], start["dp"]) == (4, 2, 2), start
    verify(tmp_path / layout / "checkpoints")
    assert "hashes match the manifest" in cli("logs", run_id, "checkpoint", env=slurm_env).stdout


@pytest.mark.slurm
def test_a_requeued_train_job_resumes_bit_for_bit(tmp_path: Path, slurm_env: dict[str, str],
                                                 request: pytest.FixtureRequest) -> None:
    """Run A trains 30 iterations straight; run B is requeued by Slurm (scontrol requeue: the job is
    killed and restarts in place) after its checkpoint at 10. B's losses after the resume equal A's."""
    start_early(request, "time_limit_run", (TIME_LIMIT_TEST,))  # to overlap this test (see the fixture)
    spec_a = gpt_spec(tmp_path, "straight", iterations=30)
    spec_b = gpt_spec(tmp_path, "requeued", iterations=30)
    run_a = submitted_run_id(cli("submit", str(spec_a), "--executor", "slurm", env=slurm_env).stdout)
    run_b = submitted_run_id(cli("submit", str(spec_b), "--executor", "slurm", env=slurm_env).stdout)
    tracker = tmp_path / "requeued" / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + 240
    while not (tracker.exists() and tracker.read_text().strip() not in ("", "0")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tracker.exists(), "run B never saved a checkpoint"
    train_job = json.loads((tmp_path / "requeued" / "runs" / run_b / "manifest.json").read_text())
    job_id = next(s for s in train_job["stages"] if s["name"] == "train")["job_ids"][0]
    subprocess.run(["scontrol", "requeue", job_id], env={**__import__("os").environ, **slurm_env}, check=True)
    a = wait_for(run_a, slurm_env, all_ended, timeout=300)
    b = wait_for(run_b, slurm_env, all_ended, timeout=300)
    assert all(s["state"] == "COMPLETED" for s in (*a.values(), *b.values())), (a, b)
    assert b["train"]["restarts"] >= 1 and b["train"]["job_ids"] == [job_id]
    la, lb = losses(tmp_path / "straight" / "runs" / run_a), losses(tmp_path / "requeued" / "runs" / run_b)
    assert sorted(la) == sorted(lb) and max(la) == 30
    assert [la[i] for i in sorted(la)] == [lb[i] for i in sorted(lb)]  # bit for bit, before and after the resume
    starts = [json.loads(line) for line in (tmp_path / "requeued" / "runs" / run_b / "metrics.jsonl").read_text()
              .splitlines() if json.loads(line)["type"] == "start"]
    assert len(starts) >= 2 and starts[-1]["iteration"] >= 10  # the second start resumed from a checkpoint


@pytest.mark.slurm
@pytest.mark.slow
def test_time_limit_signal_save_requeue_finish(time_limit_run: Submitted) -> None:
    """A 3-minute limit with a 60 s grace (the smallest pair the spec accepts: the grace must be under
    half the limit; sbatch --signal=B:USR1@60): Slurm's USR1 reaches the script, the trainer saves on
    SIGTERM and exits 0, the script requeues its own job.

    The run was submitted by the test before this one (the time_limit_run fixture). Once its trainer
    has logged an iteration, this test lowers the running job's limit to 2 minutes with `scontrol
    update TimeLimit=2`, as a user may (a job's owner may lower its limit: _update_job,
    src/slurmctld/job_mgr.c:13339-13381, slurm-22-05-8-1, which moves end_time by the difference).
    slurmctld sends the warning signal from its periodic time-limit check (every PERIODIC_TIMEOUT =
    30 s, src/slurmctld/controller.c:2099-2104) once warn_time + 30 + now >= end_time
    (send_job_warn_signal, job_mgr.c:19065-19071): USR1 then comes 30-60 s after the job's start
    instead of 90-120 s, the same signal by the same path. Not lowered when the job has run 25 s
    already or is past its first attempt: lowered after 30 s, the next check (up to 30 s later) could
    find less than the 60 s grace left before the new end; a limit lowered past now would time the job
    out."""
    env, run_id, work = time_limit_run.env, time_limit_run.run_id, time_limit_run.work
    run_dir = work / "runs" / run_id
    metrics_file = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (metrics_file.exists() and any(
            line.endswith("}") and json.loads(line).get("type") == "train"
            for line in metrics_file.read_text().splitlines())):
        time.sleep(0.2)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    job_id = next(s for s in manifest["stages"] if s["name"] == "train")["job_ids"][0]
    senv = {**os.environ, **env}

    def show() -> dict[str, str]:  # JobState, Restarts, RunTime, TimeLimit: src/api/job_info.c:457,499-505
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=senv, capture_output=True, text=True,
                             check=True).stdout
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    job = show()
    assert job["TimeLimit"] == "00:03:00", job
    h, m, sec = (int(x) for x in job["RunTime"].split("-")[-1].split(":"))
    if job["JobState"] == "RUNNING" and job.get("Restarts") == "0" and h * 3600 + m * 60 + sec < 25:
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=2"], env=senv, check=True)
        assert show()["TimeLimit"] == "00:02:00"
    stages = wait_for(run_id, env, lambda s: s["train"]["restarts"] >= 1 or s["train"]["state"] in ENDED,
                      timeout=420)
    log = cli("logs", run_id, "train", env=env).stdout
    assert "time limit in 60 s" in log and "requeueing" in log, log[-3000:]
    assert stages["train"]["restarts"] >= 1
    cli("cancel", run_id, env=env)
    metrics = metrics_file.read_text().splitlines()
    stops = [json.loads(line) for line in metrics if json.loads(line)["type"] == "stop"]
    assert any(s["reason"] == "signal" for s in stops)
    verify(work / "checkpoints")
