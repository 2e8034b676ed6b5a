"""`status` after `scontrol requeue` (issue 26, item 10), on the real test cluster: the stage's
ELAPSED is the time its job has used as squeue counts it (src/squeue/print.c job_time_used,
slurm-22-05-8-1:925: 0 while PENDING, end - start once it runs again), never the time limit that
slurmctld's records carry as end_time."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import chain_spec, cli, submitted_run_id, wait_for

pytestmark = pytest.mark.slurm


def test_requeued_job_shows_the_time_it_used_not_its_limit(slurm_cluster: Any, tmp_path: Path) -> None:
    env = {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "a", "command": "trap '' TERM; sleep 600"}],
                      extra={"cluster": {"network": {"profile": "tcp"},
                                         "defaults": {"partition": "cpu", "time": "02:00:00"}}})
    run = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    senv = {**os.environ, **env}
    job = ""
    try:
        job = json.loads((tmp_path / "work" / "runs" / run / "manifest.json").read_text())["stages"][0]["job_ids"][0]
        wait_for(run, env, lambda s: s["a"]["state"] == "RUNNING")
        time.sleep(2)
        # Command stages are submitted --no-requeue; a train job is requeued the same way.
        subprocess.run(["scontrol", "update", f"JobId={job}", "Requeue=1"], env=senv, check=True)
        subprocess.run(["scontrol", "requeue", job], env=senv, check=True)
        # The job ignores SIGTERM, so it stays COMPLETING until KillWait (5 s on the test cluster)
        # has passed and SIGKILL ended it: the moment squeue shows the old start and, as end_time,
        # start + time limit. Then PENDING (BeginTime), then RUNNING again.
        seen = []
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            doc = json.loads(cli("status", run, "--json", env=env).stdout)
            st = doc["runs"][0]["stages"][0]
            seen.append((st["state"], st["elapsed_s"], st["restarts"]))
            if len(seen) > 2 and seen[-1][0] == "RUNNING" and seen[-1][2] >= 1:
                break
            time.sleep(0.5)
        assert any(s == "COMPLETING" for s, _e, _r in seen), seen
        # The limit is 2 h: an ELAPSED anywhere near it is the limit, not time used.
        assert all(e is None or e < 600 for _s, e, _r in seen), seen
        assert any(r >= 1 for _s, _e, r in seen), seen
        # Running again: the time since its new start, as squeue's TIME column counts it.
        assert seen[-1][0] == "RUNNING" and seen[-1][1] is not None and seen[-1][1] < 60, seen
    finally:
        # A plain scancel (SIGKILL after KillWait): the job ignores SIGTERM, so `cancel` would wait
        # its STEP_STOP_WAIT_S (30 s, lingjun_slurm/cli/runs.py) for the step to stop, in vain.
        if job:
            subprocess.run(["scancel", job], env=senv, check=False)
        else:
            cli("cancel", run, env=env, check=None)
