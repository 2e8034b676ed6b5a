"""The queue's text reader and its JSON reader give the same JobInfo for the same live jobs of the
real test cluster (issue 31): SlurmCLI.queue (squeue --Format, parse_squeue_text) against
SlurmCLI._queue_json (squeue --json, parse_squeue_json), read back to back."""

from __future__ import annotations

import time
from typing import Any

import pytest

from lingjun_slurm.slurm.client import SQUEUE_ARGV, SlurmCLI
from lingjun_slurm.transport.local import LocalTransport
from tests.cluster.fixtures import slurm, submit, wait_job

pytestmark = pytest.mark.slurm


def test_text_and_json_readers_agree_on_live_jobs(slurm_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    env = slurm_cluster.env
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    ids: list[str] = []
    try:
        ok = submit(env, "-o", "/dev/null", "-J", "q-ok", "--wrap", "true")
        bad = submit(env, "-o", "/dev/null", "-J", "q-bad", "--wrap", "exit 3")
        ids += [ok, bad]
        assert wait_job(env, ok) == "COMPLETED" and wait_job(env, bad) == "FAILED"
        ids.append(submit(env, "-o", "/dev/null", "-J", "q-held", "--hold", "--wrap", "true"))
        ids.append(submit(env, "-o", "/dev/null", "-J", "q-never", f"--dependency=afterok:{bad}", "--wrap", "true"))
        ids.append(submit(env, "-o", "/dev/null", "-J", "q a|b ünï", "--hold", "--wrap", "true"))
        arr = submit(env, "-o", "/dev/null", "-J", "q-arr", "-p", "cpu", "--array=0-5%2", "--wrap", "sleep 300")
        ids.append(arr)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # two tasks running, the rest one pending record
            out = slurm(env, "squeue", "-h", "-j", arr, "-t", "R", "-o", "%i").stdout.split()
            if len(out) == 2:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"array {arr}: not two tasks running: {out}")

        t = LocalTransport()
        cli = SlurmCLI(t)
        mine = set(ids)

        def ours(jobs: list[Any]) -> dict[str, Any]:
            return {j.job_id: j for j in jobs if (j.array_job_id or j.job_id) in mine}

        for _ in range(5):  # read back to back; again if a job changed state in between
            before = ours(cli.queue())
            from_json = ours(cli._queue_json())
            after = ours(cli.queue())
            if before == after:
                break
        assert before == after, "the queue kept changing"
        assert t.history[0] == SQUEUE_ARGV and cli.failed is None
        assert from_json == before
        assert set(before) == {ok, bad, *ids[2:5], f"{arr}_0", f"{arr}_1", f"{arr}_[2-5]"}
        assert before[f"{arr}_[2-5]"].array_tasks_pending == "2-5"
        assert (before[bad].state, before[bad].exit_code) == ("FAILED", 3)
        assert before[ids[3]].reason == "DependencyNeverSatisfied"
        assert before[ids[4]].name == "q a|b ünï"
    finally:
        if ids:
            slurm(env, "scancel", *ids, check=False)
