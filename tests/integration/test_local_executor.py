"""The local executor: the same rendered chain on this machine, no Slurm (the embedded default)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from .helpers import PY, all_ended, chain_spec, cli, status, submitted_run_id, wait_for


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    # No SLURM_CONF and a PATH without sbatch is not needed: --executor local is explicit.
    return {"LINGJUN_STATE_DIR": str(tmp_path / "state")}


def stamp(tag: str, out: Path) -> str:
    return f'echo "{tag} start $(date +%s.%N)" >> {out}; sleep 0.2; echo "{tag} end $(date +%s.%N)" >> {out}'


def times(out: Path) -> dict[str, dict[str, float]]:
    result: dict[str, dict[str, float]] = {}
    for line in out.read_text().splitlines():
        tag, what, when = line.split()
        result.setdefault(tag, {})[what] = float(when)
    return result


def test_chain_runs_in_dependency_order(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "order.txt"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work",
                      [{"name": n, "command": stamp(n, out)} for n in ("a", "b", "c", "d")])
    proc = cli("submit", str(spec), "--executor", "local", env=env)
    run_id = submitted_run_id(proc.stdout)
    t = times(out)
    for up, down in (("a", "b"), ("b", "c"), ("c", "d")):
        assert t[down]["start"] >= t[up]["end"], (up, down, t)
    stages = status(run_id, env)
    assert [s["state"] for s in stages.values()] == ["COMPLETED"] * 4
    assert all(s["exit_code"] == 0 and s["job_ids"] for s in stages.values())
    # The same run record and log layout as Slurm runs: %x-%j.out in <workdir>/logs.
    manifest = json.loads((tmp_path / "work" / "runs" / run_id / "manifest.json").read_text())
    assert manifest["schema"] == 1 and manifest["executor"] == "local"
    job_a = manifest["stages"][0]["job_ids"][0]
    assert (tmp_path / "work" / "logs" / f"{run_id}-a-{job_a}.out").is_file()
    assert "a start" not in cli("logs", run_id, "a", env=env).stdout  # the log has the script's own lines
    assert "stage a of run" in cli("logs", run_id, "a", env=env).stdout
    listed = cli("list", "--json", env=env).stdout
    assert run_id in listed


def test_failing_stage_stops_its_dependents(tmp_path: Path, env: dict[str, str]) -> None:
    marker = tmp_path / "c-ran"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "a", "command": "true"},
        {"name": "b", "command": "echo failing; exit 7"},
        {"name": "c", "command": f"touch {marker}"},
    ])
    proc = cli("submit", str(spec), "--executor", "local", env=env, check=1)
    assert "did not complete" in proc.stderr
    run_id = submitted_run_id(proc.stdout)
    stages = status(run_id, env)
    assert stages["a"]["state"] == "COMPLETED"
    assert stages["b"]["state"] == "FAILED" and stages["b"]["exit_code"] == 7
    assert stages["c"]["state"] == "CANCELLED"
    assert stages["c"]["reason"].startswith("DependencyNeverSatisfied") and "b FAILED" in stages["c"]["reason"]
    assert not marker.exists()
    assert "failing" in cli("logs", run_id, env=env).stdout  # default stage: the failed one


def test_array_tasks_and_multi_task_stage_get_slurm_variables(tmp_path: Path, env: dict[str, str]) -> None:
    """Each task sees SLURM_PROCID/SLURM_NTASKS like under srun; RANK comes from the task wrapper."""
    out = tmp_path / "tasks.txt"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "multi", "command": f'echo "$SLURM_PROCID/$SLURM_NTASKS rank=$RANK job=$SLURM_JOB_ID" >> {out}',
         "resources": {"nodes": 1, "tasks_per_node": 3}},
    ])
    cli("submit", str(spec), "--executor", "local", env=env)
    lines = sorted(out.read_text().splitlines())
    assert [line.split()[0] for line in lines] == ["0/3", "1/3", "2/3"]
    assert [line.split()[1] for line in lines] == ["rank=0", "rank=1", "rank=2"]


def test_detach_then_cancel_stops_processes(tmp_path: Path, env: dict[str, str]) -> None:
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "slow", "command": "sleep 300"},
        {"name": "after", "command": "true"},
    ])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", "--detach", env=env).stdout)
    stages = wait_for(run_id, env, lambda s: s["slow"]["state"] == "RUNNING", timeout=30)
    assert stages["after"]["state"] == "PENDING"
    state = json.loads((tmp_path / "work" / "runs" / run_id / "local-state.json").read_text())
    pid = next(t["pid"] for t in state["tasks"] if t["stage"] == "slow")
    cli("cancel", run_id, env=env)
    stages = wait_for(run_id, env, all_ended, timeout=30)
    assert stages["slow"]["state"] == "CANCELLED" and stages["after"]["state"] == "CANCELLED"
    time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists(), "the stage's process group was not stopped"


def test_cancel_reaches_tasks_that_ignore_sigterm(tmp_path: Path, env: dict[str, str]) -> None:
    """Two tasks that trap SIGTERM: cancel escalates to SIGKILL on the job's process group."""
    env = {**env, "LINGJUN_LOCAL_KILL_GRACE_S": "1"}
    pids = tmp_path / "pids"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "stubborn", "command": f"trap '' TERM; echo $$ >> {pids}; while true; do sleep 0.1; done",
         "resources": {"nodes": 1, "tasks_per_node": 2}}])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", "--detach", env=env).stdout)
    deadline = time.monotonic() + 20
    while (not pids.exists() or len(pids.read_text().split()) < 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    task_pids = [int(p) for p in pids.read_text().split()]
    cli("cancel", run_id, env=env)
    stages = status(run_id, env)
    assert stages["stubborn"]["state"] == "CANCELLED"
    from lingjun_slurm.executors.local import proc_start
    deadline = time.monotonic() + 5
    while any(proc_start(p) is not None and "Z" not in Path(f"/proc/{p}/stat").read_text().split(")")[-1][:3]
              for p in task_pids if Path(f"/proc/{p}").exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [p for p in task_pids if Path(f"/proc/{p}").exists()
             and Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0] != "Z"]
    assert alive == [], "tasks survived the cancel"


def test_resubmit_from_a_stage_keeps_earlier_results(tmp_path: Path, env: dict[str, str]) -> None:
    flag = tmp_path / "go"
    out = tmp_path / "ran.txt"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "a", "command": f"echo a >> {out}"},
        {"name": "b", "command": f"echo b >> {out}; test -e {flag}"},
        {"name": "c", "command": f"echo c >> {out}"},
    ])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", env=env, check=1).stdout)
    assert out.read_text().split() == ["a", "b"]
    flag.touch()
    cli("resubmit", run_id, "--from", "b", env=env)
    assert out.read_text().split() == ["a", "b", "b", "c"]
    stages = status(run_id, env)
    assert [s["state"] for s in stages.values()] == ["COMPLETED"] * 3
    manifest = json.loads((tmp_path / "work" / "runs" / run_id / "manifest.json").read_text())
    b = manifest["stages"][1]
    assert b["previous"][0]["job_ids"] != b["job_ids"]


def test_dry_run_writes_nothing(tmp_path: Path, env: dict[str, str]) -> None:
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "a", "command": "true"},
                                                               {"name": "b", "command": "true"}])
    proc = cli("submit", str(spec), "--executor", "slurm", "--dry-run", env=env)
    assert "sbatch --parsable --dependency=afterok:<a> b.sbatch" in proc.stdout  # behind a held job: no --hold
    assert not (tmp_path / "work").exists()
    assert not (tmp_path / "state").exists()


def test_status_watch_returns_once_every_stage_has_ended(tmp_path: Path, env: dict[str, str]) -> None:
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "a", "command": "sleep 2"}])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", "--detach", env=env).stdout)
    started = time.monotonic()
    out = cli("status", run_id, "--watch", "--interval", "1", env=env, timeout=60).stdout
    assert time.monotonic() - started < 30
    assert out.count(f"run {run_id}") >= 2  # redrawn while the stage ran
    assert out.rstrip().splitlines()[-1].split()[2] == "COMPLETED"


def test_readme_main_job_runs_end_to_end(tmp_path: Path, env: dict[str, str]) -> None:
    """The README's main command: examples/tiny-gpt.yaml with the local executor (moved to a temporary
    workdir so earlier runs' checkpoints do not make it resume): every stage completes, the loss
    falls clearly, the checkpoint verifies."""
    repo = Path(__file__).resolve().parents[2]
    readme = (repo / "README.md").read_text()
    assert "lingjun-slurm submit examples/tiny-gpt.yaml --executor local" in readme
    text = (repo / "examples" / "tiny-gpt.yaml").read_text().replace("/tmp/lingjun-slurm/tiny-gpt", str(tmp_path / "w"))
    spec = tmp_path / "tiny-gpt.yaml"
    spec.write_text(text)
    proc = subprocess.run([PY, "-m", "lingjun_slurm.cli", "submit", str(spec), "--executor", "local"],
                          env={**os.environ, "PATH": f"{os.path.dirname(PY)}:{os.environ['PATH']}", **env},
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_id = submitted_run_id(proc.stdout)
    stages = status(run_id, env)
    assert [s["state"] for s in stages.values()] == ["COMPLETED"] * 5
    records = [json.loads(line) for line in (tmp_path / "w" / "runs" / run_id / "metrics.jsonl").read_text()
               .splitlines()]
    train = {r["iteration"]: r["loss"] for r in records if r["type"] == "train"}
    first, last = train[min(train)], train[max(train)]
    assert max(train) == 300 and last < first - 3.0, (first, last)
    assert "hashes match the manifest" in cli("logs", run_id, "checkpoint", env=env).stdout
    # issue 16 item 4: the report of this run, its data checked against the run's own records
    from lingjun_slurm.report.page import embedded_data

    out = tmp_path / "report"
    got = cli("report", run_id, "-o", str(out), env=env)
    assert got.returncode == 0 and str(out / "index.html") in got.stdout, got.stderr
    assert sorted(p.name for p in out.glob("*.png")) == ["goodput.png", "loss.png", "lr.png", "throughput.png",
                                                         "timeline.png"]
    page = (out / "index.html").read_text()
    data = embedded_data(page)
    assert data == json.loads((out / "report-data.json").read_text())
    assert {r["iteration"]: r["loss"] for r in data["metrics"]["train"]} == train
    evals = [(r["iteration"], r["loss"]) for r in records if r["type"] == "eval"]
    assert [(r["iteration"], r["loss"]) for r in data["metrics"]["eval"]] == evals
    assert [(s["name"], s["state"]) for s in data["stages"]] == [(name, "COMPLETED") for name in stages]
    manifest = json.loads((tmp_path / "w" / "runs" / run_id / "manifest.json").read_text())
    for s, rec in zip(data["stages"], manifest["stages"]):
        assert s["job_ids"] == rec["job_ids"] and s["submitted_at"] == rec["submitted_at"]
        assert s["attempts"] and s["queue_wait_s"] >= 0 and s["run_s"] >= 0 and s["requeues"] == 0
    ckpts = data["checkpoints"]
    assert ckpts["readable"] and ckpts["tracker"] == 300
    assert [c["iteration"] for c in ckpts["iterations"]] == [200, 300] and ckpts["iterations"][-1]["manifest"]
    assert page.count('src="data:image/png;base64,') == 5 and "Traceback" not in got.stderr
    _readme_main_job_goodput(tmp_path / "w" / "runs" / run_id, run_id, env, data)


def _readme_main_job_goodput(run_dir: Path, run_id: str, env: dict[str, str], data: dict) -> None:
    """The goodput ledger of the README's main job (issue 30 item 1): the allocation is the local
    runner's own record of each task's start and end (local-state.json) times the stage's CPUs, the
    run has no GPUs so goodput is judged on CPU-seconds, the buckets sum to the allocation, and the
    report carries the same ledger (goodput.png, the Goodput section)."""
    import pytest

    from lingjun_slurm.injob.host import ledger

    doc = json.loads(cli("status", "--goodput", run_id, "--json", env=env).stdout)
    assert doc["run"] == run_id and doc["source"] == "local" and doc["goodput_of"] == "cpu"
    assert doc["gpu"]["allocated_seconds"] == 0 and doc["cost"] is None
    # The allocation, from the runner's record and the plan alone (not from the ledger's code).
    state = json.loads((run_dir / "local-state.json").read_text())
    plan = {s["name"]: s["resources"] for s in json.loads((run_dir / "plan.json").read_text())["stages"]}
    own = sum((t["end"] - t["start"]) * plan[t["stage"]]["nodes"] * plan[t["stage"]]["tasks_per_node"]
              * (plan[t["stage"]]["cpus_per_task"] or 1) for t in state["tasks"])
    cpu = doc["cpu"]
    assert cpu["allocated_seconds"] == pytest.approx(own, rel=0.01)
    assert sum(cpu["buckets"].values()) == pytest.approx(own, rel=0.01)
    b = cpu["buckets"]
    assert set(b) == set(ledger.BUCKETS)
    assert b["productive"] > 0.3 * own and b["startup"] > 0, b
    assert b and b["evaluation"] > 0 and b["checkpoint_save"] > 0
    assert b["container_start"] > 0, b  # the trainer's launched_at: its process start after the batch script's
    assert b["preprocessing"] > 0 and b["other_stages"] > 0  # make-corpus, merge, checkpoint
    assert b["lost_work"] == b["hang_wait"] == b["failed_tail"] == 0
    assert doc["goodput"] == pytest.approx(b["productive"] / own, rel=0.01)
    assert doc["waits"] == {"queue": 0.0, "requeue_gap": 0.0}
    table = cli("status", "--goodput", run_id, env=env).stdout
    assert f"goodput of run {run_id}: {100 * doc['goodput']:.1f}%" in table and "productive" in table
    assert data["goodput"]["cpu"]["buckets"] == pytest.approx(b, rel=0.01)
