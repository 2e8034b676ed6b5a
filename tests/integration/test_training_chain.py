"""The whole chain for real: make-corpus -> preprocess (array) -> merge -> train (builtin megatron-core
trainer on the CPU over gloo) -> checkpoint, on the test Slurm cluster and with the local executor."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from .helpers import PY, all_ended, cli, submitted_run_id, wait_for

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


@pytest.mark.slurm
def test_whole_chain_with_a_two_node_train_stage(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """Two nodes x two tasks: TP=2 inside each node's pair, DP=2 across the nodes (one run covers
    both the tensor-parallel and the data-parallel groups that srun's tasks form)."""
    layout = "tp2dp2"
    spec = gpt_spec(tmp_path, layout, nodes=2, tasks=2, tp=2, iterations=20)
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=slurm_env).stdout)
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
def test_a_requeued_train_job_resumes_bit_for_bit(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """Run A trains 30 iterations straight; run B is requeued by Slurm (scontrol requeue: the job is
    killed and restarts in place) after its checkpoint at 10. B's losses after the resume equal A's."""
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
def test_time_limit_signal_save_requeue_finish(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """A 3-minute limit with a 60 s grace (the smallest pair the spec accepts: the grace must be under
    half the limit): Slurm's USR1 (delivered at its ~30 s check, so 60-90 s before the end) reaches
    the script, the trainer saves on SIGTERM and exits 0, the script requeues its own job. Slow:
    about three minutes."""
    spec = gpt_spec(tmp_path, "limit", iterations=100000, save_interval=50000, time_limit="00:03:00",
                    max_restarts=8)
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=slurm_env).stdout)
    stages = wait_for(run_id, slurm_env, lambda s: s["train"]["restarts"] >= 1 or s["train"]["state"] in ENDED,
                      timeout=420)
    log = cli("logs", run_id, "train", env=slurm_env).stdout
    assert "time limit in 60 s" in log and "requeueing" in log, log[-3000:]
    assert stages["train"]["restarts"] >= 1
    cli("cancel", run_id, env=slurm_env)
    metrics = (tmp_path / "limit" / "runs" / run_id / "metrics.jsonl").read_text().splitlines()
    stops = [json.loads(line) for line in metrics if json.loads(line)["type"] == "stop"]
    assert any(s["reason"] == "signal" for s in stops)
    verify(tmp_path / "limit" / "checkpoints")
