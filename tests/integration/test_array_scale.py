"""data.max_running on a real Slurm (the suite's 4-node cluster, 8 CPUs): a preprocess array of 4
shards with `%2` never runs more than 2 tasks at once, the waiting tasks show Slurm's reason
JobArrayTaskLimit, and status and report count the tasks. The 1,024-task array at 64 nodes is
bench/scale_array.py (docs/preprocessing.md "Many shards")."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from .helpers import all_ended, cli, submitted_run_id, wait_for

SHARDS = 4  # two waves of %2: enough for the limit to hold a task back


def _spec(tmp: Path, shards: int, max_running: int) -> Path:
    (tmp / "in").mkdir()
    with open(tmp / "in" / "c.jsonl", "w") as f:
        for i in range(shards * 8):
            f.write(json.dumps({"text": " ".join(str((i + j) % 500) for j in range(8))}) + "\n")
    doc: dict[str, Any] = {
        "version": 1, "run": {"name": "arr", "workdir": str(tmp / "work")},
        "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": "cpu", "time": "00:05:00"},
                    "stages": {"preprocess": {"cpus_per_task": 1}}},
        "container": {"runtime": "none"},
        "data": {"inputs": [str(tmp / "in" / "c.jsonl")], "shards": shards, "max_running": max_running,
                 "workers": 1, "tokenizer": {"type": "null", "vocab_size": 512}},
        "stages": {"train": {"skip": True}, "checkpoint": {"skip": True}},
    }
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _peak(intervals: list[tuple[float, float]]) -> int:
    """Most tasks running at once; whole-second markers: an end and a start in the same second
    count as end first."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.slurm
def test_the_percent_limit_holds_on_slurm(tmp_path: Path, slurm_cluster: Any) -> None:
    env = {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}
    run_id = submitted_run_id(cli("submit", str(_spec(tmp_path, SHARDS, 2)), "--executor", "slurm", env=env).stdout)
    run_dir = tmp_path / "work" / "runs" / run_id
    job = json.loads((run_dir / "manifest.json").read_text())["stages"][0]["job_ids"][0]
    reasons: set[str] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the pending tasks' reason, from squeue itself
        out = subprocess.run(["squeue", "-h", "-r", "-j", job, "-t", "PD", "-o", "%r"], capture_output=True,
                             text=True, env={**os.environ, **slurm_cluster.env}).stdout
        reasons |= set(out.split())
        if "JobArrayTaskLimit" in reasons or not out.strip():
            break
        time.sleep(0.3)
    stages = wait_for(run_id, env, all_ended, timeout=180)
    assert stages["preprocess"]["state"] == "COMPLETED" and stages["merge"]["state"] == "COMPLETED", stages
    assert "JobArrayTaskLimit" in reasons, reasons
    spans = []
    for i in range(SHARDS):
        lines = (run_dir / "jobs" / f"{job}_{i}").read_text().split("\n")
        start = float(next(ln for ln in lines if ln.startswith("start")).split()[1])
        end = float(next(ln for ln in lines if ln.startswith("end")).split()[1])
        spans.append((start, end))
    assert _peak(spans) <= 2, spans
    script = (run_dir / "preprocess.sbatch").read_text()
    assert f"#SBATCH --array=0-{SHARDS - 1}%2\n" in script
    out = tmp_path / "report"
    cli("report", run_id, "-o", str(out), env=env, timeout=180)
    doc = json.loads((out / "report-data.json").read_text())
    pre = next(s for s in doc["stages"] if s["name"] == "preprocess")
    assert len(pre["attempts"]) == SHARDS and pre["state"] == "COMPLETED"
