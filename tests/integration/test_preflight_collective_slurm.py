"""The pre-flight's collective smoke test on the real test Slurm cluster (builtin trainer on CPUs:
gloo; the cluster's GPUs are gres files without a driver, so gpus_per_node 0).

LINGJUN_PREFLIGHT_SLOW (a test hook, docs/fault-tolerance.md) makes node2's ranks sleep after each
timed collective as if its link ran at 0.05 of its rate: the smoke test must name node2 (narrowed
by pairs of nodes), the job is requeued without it, the next attempt's smoke test passes and
training completes. 0.05, not the bench's 0.2: gloo timings on a 2-core host that other work
shares are noisy enough to bring a 5x slowdown below the judge's 2x (measured once: node2's pairs
at 0.16 GB/s against 0.23 while three test processes ran beside it); a 20x one is not."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .faults import resumes, train_spec
from .helpers import all_ended, cli, submitted_run_id, wait_for


@pytest.fixture
def slurm_env(slurm_cluster: Any, tmp_path: Path) -> dict[str, str]:
    return {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}


def train_job(run_dir: Path) -> str:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return next(s for s in manifest["stages"] if s["name"] == "train")["job_ids"][0]


@pytest.mark.slurm
def test_a_slow_node_is_named_by_the_collective_smoke_test_and_excluded(tmp_path: Path,
                                                                        slurm_env: dict[str, str]) -> None:
    spec = train_spec(tmp_path, "coll", nodes=3, iterations=6, save_interval=3, hang_timeout=60, preflight=True,
                      extra_training={"preflight_collective_timeout": 40})
    env = {**slurm_env, "LINGJUN_PREFLIGHT_SLOW": "node2=0.05", "LINGJUN_PREFLIGHT_SHARE_TIMEOUT": "20"}
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    run_dir = tmp_path / "coll" / "runs" / run_id
    stages = wait_for(run_id, slurm_env, all_ended, timeout=420)
    job = train_job(run_dir)
    first_dir = run_dir / "preflight" / f"{job}-0" / "collective"
    first = json.loads((first_dir / "results.json").read_text())
    assert "node2" in first["nodes"], first  # the test cluster gives the first free nodes
    verdict = json.loads((first_dir / "collective-verdict.json").read_text())
    assert verdict["exit"] == 1 and list(verdict["bad_nodes"]) == ["node2"], verdict
    assert verdict["source"] == "preflight-collective"
    train = stages["train"]
    assert train["state"] == "COMPLETED" and train["restarts"] == 1, stages
    reason = train["reason"] or ""
    assert "excluded node2 (preflight-collective: all_reduce busbw " in reason and "median" in reason, train
    show = subprocess.run(["scontrol", "show", "job", "-o", job], env={**os.environ, **slurm_env},
                          capture_output=True, text=True, check=True).stdout
    assert "ExcNodeList=node2" in show, show
    excluded = json.loads((run_dir / "nodes" / "excluded.json").read_text())
    assert any(e["node"] == "node2" and e["source"] == "preflight-collective" for e in excluded["nodes"]), excluded
    second = json.loads((run_dir / "preflight" / f"{job}-1" / "collective" / "collective-verdict.json").read_text())
    assert second["ok"] and "node2" not in second["nodes"], second
    assert [r["iteration"] for r in resumes(run_dir)] == [0]  # the first attempt never trained
    log = cli("logs", run_id, "train", env=slurm_env).stdout
    assert "lingjun-slurm: preflight: node node2: all_reduce busbw" in log, log[-3000:]
    assert "collective smoke test failed: not training on these nodes" in log, log[-3000:]
    assert "requeueing without node(s) node2" in log, log[-3000:]
