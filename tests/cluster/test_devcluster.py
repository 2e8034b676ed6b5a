"""The dev cluster is a real Slurm: multi-node jobs, fake GPUs, sacct, jobcomp, clean start and stop."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from lingjun_slurm.cli.devcluster import dev_cluster
from lingjun_slurm.devcluster import DevCluster, DevClusterConfig, DevClusterError, cgroup_problem
from tests.cluster.fixtures import (EXTRA_NODES, GPUS_PER_NODE, HEALTH_NODE, HEALTH_PARTITION, NODES, free_cluster,
                                    require_slurm, slurm, submit, wait_job)

pytestmark = pytest.mark.slurm


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_all_nodes_idle_in_cpu_and_gpu(slurm_cluster: DevCluster) -> None:
    info = slurm_cluster.status()
    assert info["up"] and info["accounting"] is True
    assert [n["name"] for n in info["nodes"]] == [f"node{i}" for i in range(1, NODES + EXTRA_NODES + 1)]
    last = f"node{NODES}"
    for node in info["nodes"]:
        assert node["state"] == "idle", info["nodes"]
        if node["name"] == HEALTH_NODE:  # kept out of cpu/gpu for the health-check test
            assert node["partitions"] == [HEALTH_PARTITION]
        else:
            assert sorted(node["partitions"]) == (["cpu", "gpu", HEALTH_PARTITION] if node["name"] == last
                                                  else ["cpu", "gpu"])
    default = slurm(slurm_cluster.env, "sinfo", "-h", "-o", "%P").stdout.split()
    assert "cpu*" in default and "gpu" in default and HEALTH_PARTITION in default
    nodes = slurm(slurm_cluster.env, "sinfo", "-h", "-p", "cpu,gpu", "-N", "-o", "%N").stdout.split()
    assert HEALTH_NODE not in nodes and len(set(nodes)) == NODES
    gres = slurm(slurm_cluster.env, "sinfo", "-h", "-p", "gpu", "-o", "%G").stdout.strip()
    assert gres == f"gpu:{GPUS_PER_NODE}"


def test_two_node_job_runs_one_task_per_node(slurm_cluster: DevCluster, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    job = submit(slurm_cluster.env, "-N2", "--ntasks-per-node=1", "-o", str(out),
                 "--wrap", 'srun bash -c \'echo "$SLURM_NODEID $SLURMD_NODENAME $SLURM_PROCID/$SLURM_NTASKS"\'')
    assert wait_job(slurm_cluster.env, job) == "COMPLETED", out.read_text() if out.exists() else ""
    lines = sorted(out.read_text().split("\n")[:-1])
    assert len(lines) == 2, lines
    ids, names, ranks = zip(*(line.split() for line in lines))
    assert ids == ("0", "1") and len(set(names)) == 2 and all(n.startswith("node") for n in names)
    assert sorted(ranks) == ["0/2", "1/2"]


def test_gpu_job_sees_its_fake_gpus(slurm_cluster: DevCluster, tmp_path: Path) -> None:
    out = tmp_path / "gpu.txt"
    job = submit(slurm_cluster.env, "-p", "gpu", f"--gres=gpu:{GPUS_PER_NODE}", "-o", str(out),
                 "--wrap", 'echo "CVD=$CUDA_VISIBLE_DEVICES GPUS=$SLURM_JOB_GPUS"')
    assert wait_job(slurm_cluster.env, job) == "COMPLETED"
    assert out.read_text().split() == ["CVD=0,1", "GPUS=0,1"]
    too_many = slurm(slurm_cluster.env, "sbatch", "-p", "gpu", f"--gres=gpu:{GPUS_PER_NODE + 1}",
                     "--wrap", "true", check=False)
    assert too_many.returncode != 0, "EnforcePartLimits=ALL rejects impossible requests at submit time"


def test_sacct_and_jobcomp_record_a_failed_job(slurm_cluster: DevCluster) -> None:
    env = slurm_cluster.env
    job = submit(env, "-J", "exit7", "-o", "/dev/null", "--wrap", "exit 7")
    assert wait_job(env, job) == "FAILED"
    # slurmdbd gets the records a moment after the job ends, and for a moment may show the job
    # already FAILED but still named "allocation": poll for the complete row.
    want, rows, end = f"{job}|exit7|FAILED|7:0", "", time.monotonic() + 20
    while rows != want and time.monotonic() < end:
        time.sleep(0.2)
        rows = slurm(env, "sacct", "-P", "-n", "-X", "-j", job, "-o", "JobID,JobName,State,ExitCode").stdout.strip()
    assert rows == want
    jobcomp = (slurm_cluster.root / "jobcomp.log").read_text()
    line = next(ln for ln in jobcomp.splitlines() if f"JobId={job} " in ln)
    assert "JobState=FAILED" in line and "ExitCode=7:0" in line


def test_up_again_is_a_no_op_and_cli_status_json(slurm_cluster: DevCluster) -> None:
    before = {n: d["pid"] for n, d in slurm_cluster.status()["daemons"].items()}
    start = time.monotonic()
    slurm_cluster.up()
    assert time.monotonic() - start < 1
    after = slurm_cluster.status()
    assert {n: d["pid"] for n, d in after["daemons"].items()} == before
    assert set(before) == {"munged", "mariadbd", "slurmdbd", "slurmctld",
                           *(f"slurmd-node{i}" for i in range(1, NODES + EXTRA_NODES + 1))}

    res = CliRunner().invoke(dev_cluster, ["status", "--root", str(slurm_cluster.root), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["up"] is True and info["slurm_conf"] == slurm_cluster.env["SLURM_CONF"]
    assert len(info["nodes"]) == NODES + EXTRA_NODES and all(d["alive"] for d in info["daemons"].values())
    assert (slurm_cluster.root / "env.sh").read_text() == f"export SLURM_CONF={slurm_cluster.slurm_conf}\n"


def test_cli_up_restart_after_a_dead_daemon_and_down() -> None:
    """Own root and ports: up via the CLI, a killed slurmd makes `up` start afresh, `down` stops all."""
    require_slurm()
    root = Path(f"/tmp/lingjun-test-cycle-{os.getpid()}")
    cgroups = cgroup_problem() is None  # the CLI's default needs them; elsewhere --no-cgroups
    cluster = free_cluster(root, 16600, nodes=2, gpus_per_node=1, cgroups=cgroups)
    runner = CliRunner()
    args = ["--root", str(root)]
    try:
        res = runner.invoke(dev_cluster, ["up", "--nodes", "2", "--gpus-per-node", "1", *([] if cgroups else
                                          ["--no-cgroups"]), "--base-port", str(cluster.config.base_port), *args])
        assert res.exit_code == 0, res.output
        assert f"source {root}/env.sh" in res.output
        first = {n: d["pid"] for n, d in cluster.status()["daemons"].items()}
        assert set(first) == {"munged", "slurmctld", "slurmd-node1", "slurmd-node2"}

        os.kill(first["slurmd-node2"], signal.SIGKILL)  # a daemon this test started
        end = time.monotonic() + 5
        while _alive(first["slurmd-node2"]) and time.monotonic() < end:
            time.sleep(0.02)
        cluster.up()  # partially up: stop the rest, start from an empty state
        second = cluster.status()
        assert second["up"] and [n["state"] for n in second["nodes"]] == ["idle", "idle"]
        assert not any(_alive(pid) for pid in first.values())

        res = runner.invoke(dev_cluster, ["down", *args])
        assert res.exit_code == 0, res.output
        pids = [d["pid"] for d in second["daemons"].values()]
        assert pids and not any(_alive(pid) for pid in pids)
        assert runner.invoke(dev_cluster, ["down", *args]).exit_code == 0  # idempotent
        res = runner.invoke(dev_cluster, ["status", "--json", *args])
        assert json.loads(res.output)["up"] is False
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)


def test_up_refuses_a_foreign_directory_and_busy_ports(tmp_path: Path) -> None:
    require_slurm()
    foreign = Path(f"/tmp/lingjun-test-foreign-{os.getpid()}")
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    try:
        with pytest.raises(DevClusterError, match="not a dev cluster directory"):
            free_cluster(foreign, 16400).up()
        assert (foreign / "precious.txt").read_text() == "keep me"
    finally:
        (foreign / "precious.txt").unlink()
        foreign.rmdir()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cluster = DevCluster(DevClusterConfig(root=tmp_path / "x", base_port=port))
        with pytest.raises(DevClusterError, match=f"ports in use on 127.0.0.1: {port}"):
            cluster.up()
