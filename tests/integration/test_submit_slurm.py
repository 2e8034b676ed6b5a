"""submit / status / logs / cancel / resubmit against the real test Slurm cluster (tests/cluster)."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from .helpers import all_ended, chain_spec, cli, status, submitted_run_id, wait_for

pytestmark = pytest.mark.slurm


@pytest.fixture
def env(slurm_cluster: Any, tmp_path: Path) -> dict[str, str]:
    return {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}


def stamp(tag: str, out: Path) -> str:
    return (f'echo "{tag} start $(date +%s.%N) $SLURM_JOB_NAME" >> {out}; sleep 0.3; '
            f'echo "{tag} end $(date +%s.%N) $SLURM_JOB_NAME" >> {out}')


def squeue_states(env: dict[str, str], ids: list[str]) -> dict[str, str]:
    proc = subprocess.run(["squeue", "--json"], env={**__import__("os").environ, **env}, capture_output=True,
                          text=True, check=True)
    jobs = json.loads(proc.stdout)["jobs"]
    return {str(j["job_id"]): j["job_state"] for j in jobs if str(j["job_id"]) in ids}


def test_four_stage_chain_completes_in_order(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "order.txt"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work",
                      [{"name": n, "command": stamp(n, out)} for n in ("a", "b", "c", "d")])
    proc = cli("submit", str(spec), "--executor", "slurm", env=env)
    run_id = submitted_run_id(proc.stdout)
    stages = wait_for(run_id, env, all_ended)
    assert [s["state"] for s in stages.values()] == ["COMPLETED"] * 4, stages
    seen: dict[str, dict[str, Any]] = {}
    for line in out.read_text().splitlines():
        tag, what, when, job_name = line.split()
        seen.setdefault(tag, {})[what] = float(when)
        assert job_name == f"{run_id}-{tag}"  # job names are <run-id>-<stage>
    for up, down in (("a", "b"), ("b", "c"), ("c", "d")):
        assert seen[down]["start"] >= seen[up]["end"], (up, down, seen)
    for s in stages.values():
        assert s["exit_code"] == 0 and s["nodes"] and s["elapsed_s"] is not None and s["restarts"] == 0
    manifest = json.loads((tmp_path / "work" / "runs" / run_id / "manifest.json").read_text())
    assert manifest["schema"] == 1 and manifest["executor"] == "slurm" and manifest["cluster"]["name"]
    assert manifest["stages"][1]["depends_on"] == [{"stage": "a", "type": "afterok",
                                                    "job_ids": manifest["stages"][0]["job_ids"]}]
    assert (tmp_path / "work" / "runs" / run_id / "spec.yaml").read_text() == spec.read_text()
    log = cli("logs", run_id, "b", env=env).stdout
    assert f"stage b of run {run_id}" in log


def test_failing_stage_means_downstream_never_starts(tmp_path: Path, env: dict[str, str]) -> None:
    ran = tmp_path / "downstream-ran"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "prep", "command": "echo bad input >&2; exit 3"},
        {"name": "fit", "command": f"touch {ran}"},
        {"name": "ckpt", "command": f"touch {ran}"},
    ])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    stages = wait_for(run_id, env, lambda s: all_ended(s) and s["prep"]["state"] == "FAILED", timeout=60)
    assert stages["prep"]["exit_code"] == 3  # decoded, not the raw wait status 768
    for name in ("fit", "ckpt"):
        assert stages[name]["state"] == "CANCELLED", stages
        assert stages[name]["reason"].startswith("DependencyNeverSatisfied"), stages[name]
    assert "prep FAILED" in stages["fit"]["reason"]
    assert not ran.exists()
    table = cli("status", run_id, env=env).stdout
    assert "DependencyNeverSatisfied (prep FAILED)" in table


def test_failing_sbatch_at_stage_three_cancels_the_first_two(tmp_path: Path, env: dict[str, str]) -> None:
    ran = tmp_path / "ran"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "one", "command": f"touch {ran}"},
        {"name": "two", "command": f"touch {ran}"},
        {"name": "three", "command": "true", "resources": {"partition": "nosuchpartition"}},
        {"name": "four", "command": "true"},
    ])
    proc = cli("submit", str(spec), "--executor", "slurm", env=env, check=1)
    assert "failed at stage three" in proc.stderr
    assert "invalid partition" in proc.stderr.lower()  # Slurm's own words reach the user
    assert "cancelled the 2 held job(s)" in proc.stderr
    run_dir = next((tmp_path / "work" / "runs").iterdir())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["state"] == "failed"
    ids = [j for st in manifest["stages"] for j in st["job_ids"]]
    assert len(ids) == 2
    time.sleep(3)  # a released job would have been scheduled by now (sched_interval=2)
    assert set(squeue_states(env, ids).values()) <= {"CANCELLED"}
    assert not ran.exists() and not (run_dir / "jobs").exists()


def test_cancel_then_resubmit_from_a_stage(tmp_path: Path, env: dict[str, str]) -> None:
    go = tmp_path / "go"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "first", "command": "true"},
        {"name": "slow", "command": f"for i in $(seq 600); do test -e {go} && exit 0; sleep 0.2; done; exit 9"},
        {"name": "last", "command": "true"},
    ])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    wait_for(run_id, env, lambda s: s["slow"]["state"] == "RUNNING")
    cli("cancel", run_id[:-2], env=env)  # a unique prefix of the run id works
    stages = wait_for(run_id, env, all_ended)
    assert stages["first"]["state"] == "COMPLETED"
    assert stages["slow"]["state"] == "CANCELLED" and stages["last"]["state"] == "CANCELLED"
    old_slow = stages["slow"]["job_ids"]
    go.touch()
    proc = cli("resubmit", run_id, "--from", "slow", env=env)
    assert "resubmitted run" in proc.stdout
    stages = wait_for(run_id, env, all_ended)
    assert [s["state"] for s in stages.values()] == ["COMPLETED"] * 3, stages
    assert stages["slow"]["job_ids"] != old_slow
    manifest = json.loads((tmp_path / "work" / "runs" / run_id / "manifest.json").read_text())
    slow = manifest["stages"][1]
    assert slow["previous"][0]["job_ids"] == old_slow
    assert slow["depends_on"] == [{"stage": "first", "type": "afterok", "job_ids": []}]  # first had completed
    assert [e["event"] for e in manifest["events"]] == ["submit", "cancel", "resubmit"]


def test_two_node_stage_runs_one_task_per_node(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "tasks.txt"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "multi", "command": f'echo "$RANK/$WORLD_SIZE $SLURMD_NODENAME" >> {out}',
         "resources": {"nodes": 2, "tasks_per_node": 1}},
    ])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    stages = wait_for(run_id, env, all_ended)
    assert stages["multi"]["state"] == "COMPLETED", stages
    lines = sorted(out.read_text().splitlines())
    assert [line.split()[0] for line in lines] == ["0/2", "1/2"]
    assert len({line.split()[1] for line in lines}) == 2  # two different nodes


def test_array_stage_runs_every_shard(tmp_path: Path, env: dict[str, str]) -> None:
    """The preprocess array through the `tool: megatron-lm` path. Megatron-LM cannot be installed
    here, so tools/preprocess_data.py is a stand-in that records its --input and --output-prefix
    (the argument names of Megatron-LM's tools/preprocess_data.py)."""
    mlm = tmp_path / "megatron"
    (mlm / "tools").mkdir(parents=True)
    record = tmp_path / "shards.txt"
    stand_in = (
        "import sys\n"
        "a = sys.argv\n"
        f"open({str(record)!r}, 'a').write(a[a.index('--input') + 1] + ' ' + a[a.index('--output-prefix') + 1] + '\\n')\n"
    )
    (mlm / "tools" / "preprocess_data.py").write_text(stand_in)
    (mlm / "tools" / "merge_datasets.py").write_text("")
    inputs = [str(tmp_path / f"part{i}.jsonl") for i in range(3)]
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [], extra={})
    import yaml
    doc = yaml.safe_load(spec.read_text())
    doc["stages"] = {"merge": {"skip": True}, "train": {"skip": True}, "checkpoint": {"skip": True},
                     "preprocess": {"skip": True}}
    doc["stages"]["preprocess"] = {"skip": False}
    doc["stages"]["merge"] = {"skip": False}
    doc["megatron_lm"] = {"version": "0.16.1", "path": str(mlm)}
    doc["data"] = {"tool": "megatron-lm", "inputs": inputs, "tokenizer": {"type": "null", "vocab_size": 512},
                   "workers": 1}
    spec.write_text(yaml.safe_dump(doc))
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    stages = wait_for(run_id, env, lambda s: s["preprocess"]["state"] in ("COMPLETED", "FAILED"))
    assert stages["preprocess"]["state"] == "COMPLETED", stages
    got = sorted(line.split()[0] for line in record.read_text().splitlines())
    assert got == inputs
    assert sorted(line.split()[1].rsplit("/", 1)[1] for line in record.read_text().splitlines()) == [
        "shard_00000", "shard_00001", "shard_00002"]
    logs = cli("logs", run_id, "preprocess", "--task", "2", env=env).stdout
    assert "part2.jsonl" in logs
    cli("cancel", run_id, env=env)


def test_status_makes_a_bounded_number_of_slurm_calls(tmp_path: Path, env: dict[str, str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from lingjun_slurm.runs.manifest import load_manifest
    from lingjun_slurm.status import StatusCollector
    from lingjun_slurm.transport import LocalTransport

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    run_dirs = []
    for k in range(6):
        # one workdir per run: a workdir holds one live run at a time
        spec = chain_spec(tmp_path / f"s{k}.yaml", tmp_path / f"work{k}", [
            {"name": "x", "command": "true"}, {"name": "y", "command": "true"}, {"name": "z", "command": "true"}])
        run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
        run_dirs.append(str(tmp_path / f"work{k}" / "runs" / run_id))
    t = LocalTransport()
    calls = []
    for n in (1, 6):
        manifests = [load_manifest(t, d) for d in run_dirs[:n]]
        t.history.clear()
        runs = StatusCollector(t).collect(manifests)
        assert len(runs) == n and all(len(r.stages) == 3 for r in runs)
        calls.append([argv[0] for argv in t.history])
    assert calls[0] == calls[1]  # the same commands for 3 jobs as for 18
    assert calls[1].count("squeue") == 1 and calls[1].count("sacct") <= 1 and len(calls[1]) <= 2


def test_twenty_concurrent_submits_lose_nothing(tmp_path: Path, env: dict[str, str]) -> None:
    specs = [chain_spec(tmp_path / f"s{i}.yaml", tmp_path / f"work{i}", [{"name": "only", "command": "true"}])
             for i in range(20)]  # one workdir each: a workdir holds one live run at a time

    def one(i: int) -> str:
        return submitted_run_id(cli("submit", str(specs[i]), "--executor", "slurm", "--run-id", f"conc-{i:02d}",
                                    env=env).stdout)

    with ThreadPoolExecutor(max_workers=20) as pool:
        ids = list(pool.map(one, range(20)))
    listed = json.loads(cli("list", "--json", "--limit", "0", env=env).stdout)["runs"]
    assert sorted(e["run_id"] for e in listed) == sorted(ids) == [f"conc-{i:02d}" for i in range(20)]


def test_logs_follow_streams_until_the_job_ends(tmp_path: Path, env: dict[str, str]) -> None:
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "talk", "command": "for i in 1 2 3 4 5; do echo tick-$i; sleep 0.4; done"}])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    wait_for(run_id, env, lambda s: s["talk"]["state"] != "PENDING")
    out = cli("logs", run_id, "talk", "--follow", env=env, timeout=60).stdout
    assert [line for line in out.splitlines() if line.startswith("tick-")] == [f"tick-{i}" for i in range(1, 6)]
    assert status(run_id, env)["talk"]["state"] == "COMPLETED"


class AgedOut:
    """Wraps the real transport and drops chosen job ids from squeue's answer, as slurmctld does
    MinJobAge (300 s here) after a job ends; waiting that long in a test is not an option.
    Everything else (sacct, files) goes to the real cluster and disk."""

    def __init__(self, real: Any, gone: set[str]) -> None:
        self.real, self.gone = real, gone

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def run(self, argv: Any, **kw: Any) -> Any:
        result = self.real.run(argv, **kw)
        if list(argv[:2]) == ["squeue", "--me"]:  # the text reader: ArrayJobID is the first "|" field
            kept = [ln for ln in result.stdout.splitlines(keepends=True) if ln.split("|", 1)[0] not in self.gone]
            result = type(result)(result.argv, result.returncode, "".join(kept), result.stderr, result.duration_s)
        if list(argv[:2]) == ["squeue", "--json"]:
            doc = json.loads(result.stdout)
            doc["jobs"] = [j for j in doc["jobs"] if str(j.get("array_job_id") or j["job_id"]) not in self.gone
                           and str(j["job_id"]) not in self.gone]
            result = type(result)(result.argv, result.returncode, json.dumps(doc), result.stderr, result.duration_s)
        return result


def test_jobs_that_left_squeue_resolve_from_sacct_jobcomp_or_markers(tmp_path: Path, env: dict[str, str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from lingjun_slurm.runs.manifest import load_manifest
    from lingjun_slurm.status import StatusCollector
    from lingjun_slurm.transport import LocalTransport

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "ok", "command": "true"}, {"name": "bad", "command": "exit 5", "dependency": "afterany"}])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    wait_for(run_id, env, all_ended)
    time.sleep(1)  # let slurmctld's jobcomp line and slurmdbd's record land
    m = load_manifest(LocalTransport(), str(tmp_path / "work" / "runs" / run_id))
    ids = {j for st in m.stages for j in st.job_ids}
    t = AgedOut(LocalTransport(), ids)

    def states() -> dict[str, tuple[str, Any]]:
        run = StatusCollector(t).collect([m])[0]  # type: ignore[arg-type]
        return {s.name: (s.state, s.exit_code) for s in run.stages}

    expected = {"ok": ("COMPLETED", 0), "bad": ("FAILED", 5)}
    assert states() == expected  # from sacct
    m.cluster.accounting = False
    assert states() == expected  # from the jobcomp/filetxt log
    m.cluster.jobcomp_loc = str(tmp_path / "no-such-log")
    assert states() == expected  # from the start/end markers the scripts wrote
    (tmp_path / "work" / "runs" / run_id / "jobs" / m.stages[1].job_ids[0]).unlink()
    run = StatusCollector(t).collect([m])[0]  # type: ignore[arg-type]
    assert run.stages[1].state == "UNKNOWN" and "no record" in (run.stages[1].reason or "")


def test_resubmit_of_a_running_stage_waits_for_the_old_job_then_replaces_it(tmp_path: Path,
                                                                           env: dict[str, str]) -> None:
    go = tmp_path / "go"
    out = tmp_path / "runs.txt"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "long", "command": (f'echo "$SLURM_JOB_ID start $(date +%s.%N)" >> {out}; '
                                     f"trap 'echo \"$SLURM_JOB_ID end $(date +%s.%N)\" >> {out}' EXIT; "
                                     f"for i in $(seq 600); do test -e {go} && exit 0; sleep 0.2; done")},
        {"name": "after", "command": "true"}])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    old = wait_for(run_id, env, lambda s: s["long"]["state"] == "RUNNING")["long"]["job_ids"][0]
    cli("resubmit", run_id, "--from", "long", env=env)
    go.touch()
    stages = wait_for(run_id, env, all_ended)
    assert [s["state"] for s in stages.values()] == ["COMPLETED", "COMPLETED"], stages
    new = stages["long"]["job_ids"][0]
    assert new != old
    events = {}
    for line in out.read_text().splitlines():
        job, what, when = line.split()
        events[(job, what)] = float(when)
    assert events[(new, "start")] >= events[(old, "end")]  # never both at once


def test_status_ignores_a_job_id_that_belongs_to_another_job(tmp_path: Path, env: dict[str, str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A manifest whose job id now names someone else's job (id reuse, another cluster)."""
    from lingjun_slurm.runs.manifest import load_manifest
    from lingjun_slurm.status import StatusCollector
    from lingjun_slurm.transport import LocalTransport

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "mine", "command": "sleep 1"}])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    m = load_manifest(LocalTransport(), str(tmp_path / "work" / "runs" / run_id))
    m.stages[0].job_name = "someone-elses-job"
    run = StatusCollector(LocalTransport()).collect([m])[0]
    assert run.stages[0].state != "PENDING" and run.stages[0].state != "RUNNING"
    cli("cancel", run_id, env=env)


def test_status_skips_runs_whose_directory_is_gone_and_forget_drops_them(tmp_path: Path,
                                                                        env: dict[str, str]) -> None:
    import shutil

    # two workdirs: a second run in the first one's workdir is refused while the first is queued
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "one", "command": "true"}])
    other = chain_spec(tmp_path / "t.yaml", tmp_path / "work2", [{"name": "one", "command": "true"}])
    keep = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    gone = submitted_run_id(cli("submit", str(other), "--executor", "slurm", env=env).stdout)
    # Its job writes markers and logs into the run directory while it runs: removing the
    # directory under it raced that ("Directory not empty" in CI). Remove it once the job ended.
    wait_for(gone, env, all_ended)
    shutil.rmtree(tmp_path / "work2" / "runs" / gone)
    proc = cli("status", env=env)
    assert keep in proc.stdout and f"skipping run {gone}" in proc.stderr
    cli("status", gone, env=env, check=1)  # asked for by name: an error
    cli("forget", gone, env=env)
    assert gone not in cli("list", env=env).stdout


def test_train_restarts_in_place_and_the_chain_after_it_still_runs(tmp_path: Path, env: dict[str, str]) -> None:
    """The train script requeues its own job id while iterations remain, so the afterok edge of the
    stage after it stays valid. Megatron-LM cannot be installed here: pretrain_gpt.py is a stand-in
    that 'trains' one iteration per start and records it the way Megatron-LM does, in
    <save>/latest_checkpointed_iteration.txt (rank 0 only)."""
    import yaml

    mlm = tmp_path / "megatron"
    mlm.mkdir()
    ckpt = tmp_path / "work" / "checkpoints"
    (mlm / "pretrain_gpt.py").write_text(
        "import os, pathlib\n"
        f"tracker = pathlib.Path({str(ckpt)!r}) / 'latest_checkpointed_iteration.txt'\n"
        "if os.environ['RANK'] == '0':\n"
        "    tracker.parent.mkdir(parents=True, exist_ok=True)\n"
        "    last = int(tracker.read_text()) if tracker.exists() else 0\n"
        "    tracker.write_text(str(last + 1))\n")
    after = tmp_path / "after-ran"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "eval", "after": "train",
                                                                 "command": f"touch {after}"}])
    doc = yaml.safe_load(spec.read_text())
    doc["stages"]["train"] = {"skip": False}
    doc["stages"]["commands"][0].pop("before", None)
    doc["cluster"]["stages"] = {"train": {"partition": "gpu", "nodes": 1, "tasks_per_node": 2, "gpus_per_node": 2}}
    doc["megatron_lm"] = {"version": "0.16.1", "path": str(mlm)}
    doc["data"] = {"prefix": str(tmp_path / "data" / "corpus_text_document"),
                   "tokenizer": {"type": "null", "vocab_size": 512}}
    doc["model"] = {"preset": "tiny", "vocab_size": 512}
    doc["parallelism"] = {"micro_batch": 1, "global_batch": 2}
    # preflight: false: the test cluster's GPUs are gres device files, no driver; pre-flight would
    # rightly fail every node (no nvidia-smi, tests/integration/test_faults_slurm.py tests it).
    doc["training"] = {"entrypoint": "megatron-lm", "iterations": 2, "max_restarts": 3, "save_grace_s": 60,
                       "preflight": False}
    doc["checkpoint"] = {"dir": str(ckpt)}
    spec.write_text(yaml.safe_dump(doc))
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    first = json.loads((tmp_path / "work" / "runs" / run_id / "manifest.json").read_text())
    stages = wait_for(run_id, env, lambda s: s["eval"]["state"] in ("COMPLETED", "FAILED", "CANCELLED"),
                      timeout=120)
    assert stages["train"]["state"] == "COMPLETED" and stages["eval"]["state"] == "COMPLETED", stages
    assert stages["train"]["restarts"] == 1
    assert stages["train"]["job_ids"] == first["stages"][0]["job_ids"]  # the same job id throughout
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "2" and after.exists()
    log = cli("logs", run_id, "train", env=env).stdout
    assert "requeueing (restart 1 of 3)" in log
