"""The goodput ledger of a run with a requeue on the real test Slurm cluster (issue 30 item 1): a rank
killed after the first checkpoint, the job requeued, the next attempt resumes. `status --goodput --json`
takes the allocation from Slurm's accounting (one sacct), the buckets sum to it, the iterations trained
again are lost work, the requeue's gap is a wait beside the buckets, and `report` shows the same ledger."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from lingjun_slurm.injob.host import ledger

from .faults import records, resumes
from .helpers import cli
from .shared_runs import KilledRankRun


@pytest.fixture
def slurm_env(slurm_cluster: Any, tmp_path: Path) -> dict[str, str]:
    return {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}


def own_allocation(env: dict[str, str], job_ids: list[str]) -> float:
    """CPU-seconds of the jobs, from sacct as a person would ask it (not the ledger's parser)."""
    out = subprocess.run(["sacct", "-X", "-D", "-P", "-n", "-o", "JobIDRaw,ElapsedRaw,AllocTRES",
                          "-j", ",".join(job_ids)], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True).stdout
    total = 0.0
    for line in out.splitlines():
        _job, elapsed, tres = line.split("|")
        cpus = dict(kv.split("=", 1) for kv in tres.split(",") if "=" in kv).get("cpu", "0")
        total += int(elapsed or 0) * int(cpus)
    return total


@pytest.mark.slurm
def test_a_requeued_run_has_its_lost_work_and_requeue_gap_and_buckets_summing_to_slurms_allocation(
        tmp_path: Path, killed_rank_run: KilledRankRun) -> None:
    """The run (rank 1 SIGKILLed at SAVE + 3 or later, pre-flight on) is shared with
    test_faults_slurm.py's killed rank: tests/integration/shared_runs.py."""
    run = killed_rank_run
    slurm_env, run_id, run_dir, at, stages = run.env, run.run_id, run.run_dir, run.at, run.stages
    said = [line for log in sorted((run.work / "logs").glob("*train*"))
            for line in log.read_text(errors="replace").splitlines() if line.startswith("lingjun-slurm")]
    assert stages["train"]["state"] == "COMPLETED" and stages["train"]["restarts"] == 1, (stages["train"], said)
    resumed = resumes(run_dir)[-1]["iteration"]
    assert resumed < at

    got = cli("status", "--goodput", run_id, "--json", env=slurm_env)
    doc = json.loads(got.stdout)
    assert doc["run"] == run_id and doc["source"] == "sacct" and "note" not in doc
    assert doc["goodput_of"] == "cpu" and doc["gpu"]["allocated_seconds"] == 0 and doc["cost"] is None
    cpu = doc["cpu"]
    assert set(cpu["buckets"]) == set(ledger.BUCKETS) and set(doc["waits"]) >= set(ledger.WAITS)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    jobs = [j for s in manifest["stages"] for j in s["job_ids"]]
    allocated = own_allocation(slurm_env, jobs)
    assert cpu["allocated_seconds"] == pytest.approx(allocated, rel=0.01)
    assert sum(cpu["buckets"].values()) == pytest.approx(allocated, rel=0.01)
    b = cpu["buckets"]
    # Iterations resumed+1..at ran twice: their first time is lost work (2 CPUs: one per node).
    assert b["lost_work"] > 0 and b["productive"] > b["lost_work"]
    assert b["preflight"] > 0 and b["startup"] > 0 and b["failed_tail"] > 0
    # The preprocess tasks (an array) are preprocessing whole (ElapsedRaw counts whole seconds: may be 0).
    pre = [a for a in doc["attempts"] if a["stage"] == "preprocess"]
    assert pre and all(a["buckets"]["preprocessing"] == a["allocated_seconds"] for a in pre), pre
    assert doc["waits"]["requeue_gap"] > 0
    train = [a for a in doc["attempts"] if a["stage"] == "train"]
    assert [a["restart"] for a in train] == [0, 1], train
    # The killed attempt ends in its tail (no stop record); the resumed one completes without one.
    assert train[0]["buckets"]["failed_tail"] > 0 and train[1]["buckets"]["failed_tail"] == 0, train
    # What no record explains is exactly the completed attempt's end after its trainer's stop record
    # (process exit, srun and script teardown): nothing else is a remainder.
    stop = next(r for r in records(run_dir) if r.get("type") == "stop")
    last = train[-1]
    assert last["buckets"]["unattributed"] == pytest.approx((last["end"] - stop["time"]) * last["units"], abs=0.01)
    assert b["unattributed"] == pytest.approx(last["buckets"]["unattributed"]), doc["attempts"]
    record = os.environ.get("LINGJUN_RECORD_GOODPUT_FIXTURE")
    if record:  # tests/fixtures/goodput/SOURCES.md: how the sacct fixture was recorded
        out = subprocess.run(ledger.sacct_argv(jobs), env={**os.environ, **slurm_env}, capture_output=True,
                             text=True, check=True).stdout
        Path(record).write_text(out)
        Path(record).with_suffix(".json").write_text(json.dumps(
            {"train_job": train[0]["job"], "runs": len(train)}) + "\n")

    table = cli("status", "--goodput", run_id, env=slurm_env).stdout
    assert f"goodput of run {run_id}:" in table and "lost_work" in table and "requeue_gap" in table
    out = tmp_path / "report"
    rep = cli("report", run_id, "-o", str(out), env=slurm_env, check=None)
    assert rep.returncode == 0, rep.stderr
    from lingjun_slurm.report.page import embedded_data

    data = embedded_data((out / "index.html").read_text())
    assert data["goodput"]["cpu"]["buckets"] == pytest.approx(cpu["buckets"], rel=0.02, abs=4.0)
    assert (out / "goodput.png").is_file() and "Goodput" in (out / "index.html").read_text()


def _sacct_times(env: dict[str, str], job: str) -> dict[str, str]:
    out = subprocess.run(["sacct", "-X", "-D", "-P", "-n", "-o", "Submit,Eligible,Start", "-j", job],
                         env={**os.environ, **env, "SLURM_TIME_FORMAT": "%s"}, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return dict(zip(("submit", "eligible", "start"), out[-1].split("|"))) if out else {}


def _sbatch(env: dict[str, str], *args: str) -> str:
    return subprocess.run(["sbatch", "--parsable", *args], env={**os.environ, **env}, capture_output=True,
                          text=True, check=True).stdout.strip().split(";")[0]


@pytest.mark.slurm
def test_a_hold_after_eligibility_resets_eligible_so_the_queue_wait_leaves_the_hold_out(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """docs/report.md "Goodput ledger", queue wait: what Slurm 22.05.8 does to Eligible (the ledger's
    queue wait is Start - Eligible) when a job that was already eligible is held and then released.
    _hold_job_rec sets details->begin_time to 0 when it is past and writes it to the database
    (src/slurmctld/job_mgr.c:12042-12053, slurm-22-05-8-1); on release job_independent sets it to the
    release moment (:16440-16447). So sacct's Eligible is Unknown while held and the release time after:
    the hold is in neither the queue wait nor anything else of the ledger."""
    env = {**slurm_env}
    blocker = _sbatch(env, "-p", "cpu", "-w", "node3", "--exclusive", "-o", str(tmp_path / "b.out"),
                      "--wrap", "sleep 120")
    job = _sbatch(env, "-p", "cpu", "-w", "node3", "-o", str(tmp_path / "j.out"), "--wrap", "true")
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not _sacct_times(env, job).get("eligible", "").isdigit():
            time.sleep(1)
        first = _sacct_times(env, job)
        assert first["eligible"].isdigit(), first  # pending on resources, eligible
        time.sleep(2)
        subprocess.run(["scontrol", "hold", job], env={**os.environ, **env}, check=True)
        time.sleep(3)
        held = _sacct_times(env, job)
        time.sleep(3)
        released_at = time.time()
        subprocess.run(["scontrol", "release", job], env={**os.environ, **env}, check=True)
        subprocess.run(["scancel", blocker], env={**os.environ, **env}, check=True)
        deadline = time.time() + 60
        while time.time() < deadline and not _sacct_times(env, job).get("start", "").isdigit():
            time.sleep(1)
        after = _sacct_times(env, job)
    finally:
        subprocess.run(["scancel", blocker, job], env={**os.environ, **env}, check=False)
    print("eligible then held then released:", first, held, after, released_at)
    assert not held["eligible"].isdigit(), held  # Unknown while held
    assert after["start"].isdigit() and int(after["eligible"]) >= int(released_at) - 1, (first, held, after)
    assert int(after["start"]) - int(after["eligible"]) < int(after["start"]) - int(first["eligible"]) - 5
    # Submitted held (sbatch -H): no Eligible until released (job_independent sets it only for a job with
    # a priority, :16440-16442), then the release moment.
    job = _sbatch(env, "-H", "-p", "cpu", "-o", str(tmp_path / "h.out"), "--wrap", "true")
    try:
        time.sleep(4)
        held = _sacct_times(env, job)
        deadline = time.time() + 60
        while time.time() < deadline and not held:  # the record reaches slurmdbd asynchronously (seen late under load)
            time.sleep(1)
            held = _sacct_times(env, job)
        released_at = time.time()
        subprocess.run(["scontrol", "release", job], env={**os.environ, **env}, check=True)
        deadline = time.time() + 60
        while time.time() < deadline and not _sacct_times(env, job).get("start", "").isdigit():
            time.sleep(1)
        after = _sacct_times(env, job)
    finally:
        subprocess.run(["scancel", job], env={**os.environ, **env}, check=False)
    print("submitted held then released:", held, after, released_at)
    assert not held["eligible"].isdigit() and int(after["eligible"]) >= int(released_at) - 1, (held, after)
