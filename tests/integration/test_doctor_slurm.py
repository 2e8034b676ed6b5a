"""`lingjun-slurm doctor` on the real test Slurm cluster: the train job's pre-flight as a job of its
own, on a 2-node CPU spec (tests/integration/faults.py), each node's NCCL_SOCKET_IFNAME=eth0
judged against its own modelled sysfs tree (LINGJUN_PREFLIGHT_ROOT with {node}, exported in the
submitting environment, which sbatch passes on)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from .faults import train_spec
from .helpers import all_ended, cli, status, wait_for

NODES = "node1,node2"


def doctor_spec(tmp: Path) -> Path:
    """Two nodes pinned (so the bad one is always in the job), no container, NCCL over eth0."""
    spec = train_spec(tmp, "doc", data_prefix=str(tmp / "unused" / "corpus"), preflight=False)
    doc = yaml.safe_load(spec.read_text())
    doc["cluster"]["network"]["overrides"] = {"NCCL_SOCKET_IFNAME": "eth0"}
    doc["cluster"]["sbatch_extra"] = {"nodelist": NODES}
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    return spec


def sysfs_roots(tmp: Path, bad: str) -> str:
    """A sysfs tree per test-cluster node: eth0 up, except on `bad` (none: all up)."""
    root = tmp / f"roots-{bad or 'none'}"
    for i in range(1, 5):
        net = root / f"node{i}" / "sys" / "class" / "net" / "eth0"
        net.mkdir(parents=True)
        (net / "operstate").write_text("down\n" if f"node{i}" == bad else "up\n")
        (net / "carrier").write_text("0\n" if f"node{i}" == bad else "1\n")
    return str(root / "{node}")


def doctor(spec: Path, env: dict[str, str], *args: str, check: int) -> Any:
    return cli("doctor", str(spec), "--poll-interval", "0.5", *args, env=env, check=check, timeout=90)


@pytest.mark.slurm
def test_doctor_names_the_node_whose_socket_interface_is_down_then_passes_when_all_are_up(
        tmp_path: Path, slurm_cluster: Any) -> None:
    env = {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state"),
           "LINGJUN_PREFLIGHT_SHARE_TIMEOUT": "20"}
    spec = doctor_spec(tmp_path)

    bad = doctor(spec, {**env, "LINGJUN_PREFLIGHT_ROOT": sysfs_roots(tmp_path, "node1")}, check=1)
    assert "lingjun-slurm: preflight: node node1: eth0 down (NCCL_SOCKET_IFNAME=eth0)" in bad.stdout, bad.stdout
    assert "node2" not in bad.stdout.split("doctor:")[0], bad.stdout  # only node1 is blamed
    assert "doctor: 1 of 2 nodes failed: node1" in bad.stdout, bad.stdout
    # No staged image is looked for: the spec runs without a container, as the run would.
    assert "no staged image" not in bad.stderr

    good = doctor(spec, {**env, "LINGJUN_PREFLIGHT_ROOT": sysfs_roots(tmp_path, "")}, "--json", check=0)
    verdict = json.loads(good.stdout)
    assert verdict["ok"] and verdict["exit"] == 0 and verdict["nodes"] == ["node1", "node2"], verdict

    # Each doctor job is a run of its own in the workdir: status and logs work on it.
    runs = sorted((tmp_path / "doc" / "runs").iterdir())
    assert len(runs) == 2 and all((r / "plan.json").is_file() and (r / "site" / "lingjun_slurm").is_dir()
                                  for r in runs)
    entry = json.loads(cli("list", "--json", env=env).stdout)["runs"][-1]
    run_id = entry["run_id"]
    assert run_id.startswith("doc-doctor-") and entry["name"] == "doc-doctor", entry
    assert status(run_id, env)["doctor"]["state"] == "COMPLETED"
    assert "lingjun-slurm: preflight: 2 nodes passed" in cli("logs", "doc-doctor", env=env).stdout
    refused = cli("resubmit", run_id, "--from", "doctor", env=env, check=2)
    assert "doctor" in refused.stderr

    # --no-wait: the job id, at once; the verdict appears where it says.
    queued = json.loads(doctor(spec, {**env, "LINGJUN_PREFLIGHT_ROOT": sysfs_roots(tmp_path, "node2")}, "--no-wait",
                               "--json", check=0).stdout)
    assert wait_for(queued["run_id"], env, all_ended, timeout=60)["doctor"]["job_ids"] == [queued["job_id"]]
    verdict = json.loads(Path(queued["verdict"]).read_text())
    assert verdict["exit"] == 1 and list(verdict["bad_nodes"]) == ["node2"], verdict
