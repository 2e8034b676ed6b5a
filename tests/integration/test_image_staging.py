"""Issue 12 items 1-2 on the real test Slurm cluster, with the enroot/pyxis stand-ins
(tests/fixtures/standins): the image is imported once per run, requeue included; every stage runs
the staged .sqsh; named containers never outlive their run after success, failure or cancel."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.standins import containers, imports, log_lines, standin_env

from .helpers import all_ended, chain_spec, cli, submitted_run_id, wait_for
from .test_training_chain import gpt_spec, losses

IMAGE = "reg.example#team/img:1"


def pyxis(spec: Path, cache: Path, name: str = "tiny") -> Path:
    doc = yaml.safe_load(spec.read_text())
    doc["container"] = {"runtime": "pyxis", "image": IMAGE, "name": name, "cache_dir": str(cache)}
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    return spec


@pytest.fixture
def env(slurm_cluster: Any, tmp_path: Path) -> dict[str, str]:
    return {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state"), **standin_env(tmp_path)}


def own_containers(env: dict[str, str], prefix: str = "pyxis_tiny-") -> dict[str, list[str]]:
    return {node: [n for n in names if n.startswith(prefix)] for node, names in containers(env).items()
            if any(n.startswith(prefix) for n in names)}


@pytest.mark.slurm
def test_the_chain_imports_once_and_leaves_no_container(tmp_path: Path, env: dict[str, str]) -> None:
    """2 preprocess shards, merge, a 2-node train requeued after its first checkpoint, checkpoint:
    one `enroot import` in all, every stage on the staged .sqsh, no container left on any node."""
    spec = pyxis(gpt_spec(tmp_path, "staged", nodes=2, iterations=30), tmp_path / "cache")
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    run_dir = tmp_path / "staged" / "runs" / run_id
    tracker = tmp_path / "staged" / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + 240
    while not (tracker.exists() and tracker.read_text().strip() not in ("", "0")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tracker.exists(), "train never saved a checkpoint"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    train_job = next(s for s in manifest["stages"] if s["name"] == "train")["job_ids"][0]
    subprocess.run(["scontrol", "requeue", train_job], env={**os.environ, **env}, check=True)
    stages = wait_for(run_id, env, all_ended, timeout=300)
    assert all(s["state"] == "COMPLETED" for s in stages.values()), stages
    assert stages["train"]["restarts"] >= 1
    assert max(losses(run_dir)) == 30

    found = imports(env)
    assert len(found) == 1, found                                   # not once per shard, node or restart
    sqsh = (run_dir / "image" / "sqsh").read_text().strip()
    digest = (run_dir / "image" / "digest").read_text().strip()
    assert sqsh == str(tmp_path / "cache" / f"sha256-{digest.split(':')[1]}.sqsh") and Path(sqsh).is_file()
    assert f"@{digest}" in found[0]                                 # pinned to the digest it is named by
    created = [ln for ln in log_lines(env) if ln.startswith("create ")]
    assert created and all(f" {sqsh} " in f" {ln} " for ln in created), created
    assert own_containers(env) == {}, containers(env)
    assert not list((tmp_path / "cache").glob(".import-*"))
    train_log = cli("logs", run_id, "train", env=env).stdout
    ports = {int(w.split("=")[1]) for w in train_log.split() if w.startswith("MASTER_PORT=")}
    assert ports and max(ports) < 32768, ports

    # A second run of the same image and cache finds the image there: no import at all. (A chain of
    # one container command: what is tested is the image job, not another training run.)
    run2 = submitted_run_id(cli("submit", str(command_chain(tmp_path, "true")), "--executor", "slurm",
                                env=env).stdout)
    wait_for(run2, env, all_ended, timeout=300)
    assert len(imports(env)) == 1
    assert "reusing" in cli("logs", run2, "image", env=env).stdout


def command_chain(tmp_path: Path, command: str) -> Path:
    spec = chain_spec(tmp_path / "chain.yaml", tmp_path / "w", [
        {"name": "work", "container": True, "command": command,
         "resources": {"nodes": 2, "tasks_per_node": 1}}])
    return pyxis(spec, tmp_path / "cache")


@pytest.mark.slurm
def test_a_failed_stage_removes_its_containers(tmp_path: Path, env: dict[str, str]) -> None:
    run_id = submitted_run_id(cli("submit", str(command_chain(tmp_path, "exit 3")), "--executor", "slurm",
                                  env=env).stdout)
    stages = wait_for(run_id, env, all_ended, timeout=120)
    assert stages["work"]["state"] == "FAILED" and stages["image"]["state"] == "COMPLETED", stages
    assert any(ln.startswith("create pyxis_tiny-") for ln in log_lines(env)), log_lines(env)
    assert own_containers(env) == {}, containers(env)


@pytest.mark.slurm
def test_a_cancelled_run_removes_its_containers(tmp_path: Path, env: dict[str, str]) -> None:
    run_id = submitted_run_id(cli("submit", str(command_chain(tmp_path, "sleep 120")), "--executor", "slurm",
                                  env=env).stdout)
    wait_for(run_id, env, lambda s: s["work"]["state"] == "RUNNING", timeout=120)
    deadline = time.monotonic() + 30
    while len(own_containers(env)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(own_containers(env)) == 2, containers(env)           # one per node while it runs
    job = wait_for(run_id, env, lambda s: s["work"]["state"] == "RUNNING", timeout=10)["work"]["job_ids"][0]
    said = cli("cancel", run_id, env=env).stdout
    # The running job is the one cancelled (its steps stopped first), not "already ended" (it once was,
    # on the real pyxis: tests/fixtures/real_pyxis_enroot/product/03-named-container-cancel.txt).
    assert f"jobs {job}" in said and "work" not in said.partition("already ended")[2], said
    stages = wait_for(run_id, env, all_ended, timeout=120)
    assert stages["work"]["state"] in ("CANCELLED", "FAILED"), stages
    assert own_containers(env) == {}, containers(env)


@pytest.mark.slurm
def test_leftovers_of_an_ended_job_are_swept_by_the_next(tmp_path: Path, env: dict[str, str]) -> None:
    """A job killed outright (raw scancel: no step may start then) leaves its container; the run's next
    job removes it from its nodes (only containers of this run whose job has left the queue)."""
    spec = command_chain(tmp_path, "true")
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    wait_for(run_id, env, all_ended, timeout=120)
    work = [ln for ln in log_lines(env) if ln.startswith("create pyxis_tiny-")][0].split()[1]
    prefix = work.rsplit("-", 1)[0]
    for node in ("node1", "node2"):
        (Path(env["STANDIN_ENROOT_ROOT"]) / node / "data" / f"{prefix}-999999").mkdir(parents=True, exist_ok=True)
    cli("resubmit", run_id, "--from", "work", env=env)
    wait_for(run_id, env, lambda s: all_ended(s) and s["work"]["state"] == "COMPLETED", timeout=120)
    assert own_containers(env) == {}, containers(env)


@pytest.mark.slurm
def test_a_run_from_before_the_image_stage_still_resubmits(tmp_path: Path, env: dict[str, str]) -> None:
    """Upgrades (issue 12 item 7): a run record without an image stage re-renders its own chain; its
    stages import the image themselves, as they did when it was submitted."""
    spec = command_chain(tmp_path, "true")
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    wait_for(run_id, env, all_ended, timeout=120)
    manifest_path = tmp_path / "w" / "runs" / run_id / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["stages"] = [s for s in manifest["stages"] if s["name"] != "image"]
    for s in manifest["stages"]:
        s["depends_on"] = [d for d in s.get("depends_on", []) if d.get("stage") != "image"]
    manifest_path.write_text(json.dumps(manifest, indent=1))
    before = len(imports(env))
    cli("resubmit", run_id, "--from", "work", env=env)
    stages = wait_for(run_id, env, lambda s: all_ended(s) and s["work"]["state"] == "COMPLETED", timeout=120)
    assert "image" not in stages
    assert len(imports(env)) == before + 2                          # one per node: the old behaviour
    assert cli("status", run_id, env=env).returncode == 0


@pytest.mark.slurm
def test_cancel_during_training_saves_cleans_up_and_does_not_requeue(tmp_path: Path, env: dict[str, str]) -> None:
    """cancel stops the 2-node train's steps (SIGTERM: the trainer saves), marks the job so the script
    does not requeue itself, removes its containers, and the job ends CANCELLED with no restart."""
    spec = pyxis(gpt_spec(tmp_path, "cancelled", nodes=2, iterations=100000, save_interval=100000),
                 tmp_path / "cache")
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    run_dir = tmp_path / "cancelled" / "runs" / run_id
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (run_dir / "metrics.jsonl").exists():
        time.sleep(0.5)
    assert (run_dir / "metrics.jsonl").exists(), "train never started"
    assert len(own_containers(env)) == 2, containers(env)
    cli("cancel", run_id, env=env, timeout=180)
    stages = wait_for(run_id, env, all_ended, timeout=120)
    assert stages["train"]["state"] == "CANCELLED" and stages["train"]["restarts"] == 0, stages["train"]
    assert own_containers(env) == {}, containers(env)
    log = cli("logs", run_id, "train", env=env).stdout
    assert "not requeueing" in log and "requeueing (restart" not in log, log[-2000:]
    tracker = tmp_path / "cancelled" / "checkpoints" / "latest_checkpointed_iteration.txt"
    assert tracker.exists() and int(tracker.read_text()) > 0  # the SIGTERM save


@pytest.mark.slurm
def test_a_container_stage_starts_in_the_run_directory(tmp_path: Path, env: dict[str, str]) -> None:
    """pyxis starts a task in the image's WorkingDir (else `/`) unless --container-workdir is given
    (pyxis_slurmstepd.c:1652-1664; the stand-in follows the real pyxis 0.24 recordings): every
    containerized srun passes the run directory, so relative paths mean what they mean on the
    host (examples/command-chain.yaml's data/ survives from one stage to the next)."""
    where = tmp_path / "w" / "where.txt"
    run_id = submitted_run_id(cli("submit", str(command_chain(tmp_path, f"pwd > {where}")), "--executor", "slurm",
                                  env=env).stdout)
    stages = wait_for(run_id, env, all_ended, timeout=120)
    assert stages["work"]["state"] == "COMPLETED", stages
    assert where.read_text().strip() == str(tmp_path / "w" / "runs" / run_id)
