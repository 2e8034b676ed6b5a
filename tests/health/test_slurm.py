"""lingjun-health against the real test Slurm cluster (tests/cluster): drain, avoid, resume.

node5 is kept for this test: it is only in partition `health` (with node4), so draining it
never delays another test's job. The checks read an Azure ND H200 v5 tree with the stand-in
nvidia-smi (tests/health/machines.py); scontrol is the real one, talking to the real
slurmctld.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lingjun_slurm.devcluster import DevCluster
from tests.cluster.fixtures import HEALTH_NODE, HEALTH_PARTITION, NODES, slurm, submit, wait_job
from tests.health.machines import Node, azure_nd_h200_v5

pytestmark = pytest.mark.slurm
OTHER = f"node{NODES}"  # the other node of partition health
REASON = "lingjun-health: mlx5_ib2 port 1 DOWN"


def node_state(env: dict[str, str], name: str) -> tuple[str, str]:
    """State and Reason (without Slurm's ' [user@time]') from `scontrol show node -o`."""
    line = slurm(env, "scontrol", "show", "node", "-o", name).stdout
    state = next(f.split("=", 1)[1] for f in line.split() if f.startswith("State="))
    reason = line.split(" Reason=", 1)[1].rsplit(" [", 1)[0] if " Reason=" in line else ""
    return state, reason


def job_state(env: dict[str, str], job: str) -> tuple[str, str]:
    out = slurm(env, "squeue", "-h", "-j", job, "-o", "%T|%r").stdout.strip()
    state, _, reason = out.partition("|")
    return state, reason


HealthNode = tuple[Node, dict[str, str], list[str]]  # the tree, the cluster's env, jobs to cancel


@pytest.fixture
def health_node(slurm_cluster: DevCluster, tmp_path: Path) -> Iterator[HealthNode]:
    """node5's tree, with the real scontrol; node5 resumed (and our jobs cancelled) afterwards."""
    node = Node(tmp_path, azure_nd_h200_v5(), name=HEALTH_NODE,
                standins=("nvidia-smi", "enroot", "systemctl", "nvidia-container-cli"))
    node.env.update(slurm_cluster.env)  # the real scontrol, pointed at the test cluster
    assert not (node.bin / "scontrol").exists()
    jobs: list[str] = []
    try:
        yield node, slurm_cluster.env, jobs
    finally:
        if jobs:
            slurm(slurm_cluster.env, "scancel", *jobs, check=False)
        if "DRAIN" in node_state(slurm_cluster.env, HEALTH_NODE)[0]:
            slurm(slurm_cluster.env, "scontrol", "update", f"NodeName={HEALTH_NODE}", "State=RESUME")
        wait_idle(slurm_cluster.env)


def wait_idle(env: dict[str, str], timeout: float = 20) -> None:
    """Until node5 is plain IDLE: after RESUME, slurmctld marks it NOT_RESPONDING until its next
    ping answers (about half a second here); later tests should find it as they expect."""
    end, state = time.monotonic() + timeout, ""
    while time.monotonic() < end:
        state = node_state(env, HEALTH_NODE)[0]
        if state == "IDLE":
            return
        time.sleep(0.1)
    raise AssertionError(f"{HEALTH_NODE} still {state} after {timeout} s")


def test_failing_check_drains_the_next_job_avoids_it_and_a_passing_check_resumes_it(health_node: HealthNode) -> None:
    node, env, jobs = health_node
    wait_idle(env)
    node.set_port("mlx5_ib2", state="1: DOWN", phys_state="2: Polling")
    proc = node.run()
    assert proc.returncode == 1 and f"DRAIN {HEALTH_NODE} {REASON}" in proc.stdout, proc.stdout + proc.stderr
    state, reason = node_state(env, HEALTH_NODE)
    assert "DRAIN" in state and reason == REASON
    assert slurm(env, "sinfo", "-R", "-h", "-n", HEALTH_NODE).stdout.startswith(REASON[:20] + " ")  # 20 columns
    full = slurm(env, "sinfo", "-R", "-h", "-n", HEALTH_NODE, "-o", "%N %E").stdout.strip()
    assert full == f"{HEALTH_NODE} {REASON}"

    # The next job in the partition runs on the other node; one that may only use node5 waits.
    out_any, out_five = node.tmp / "any.out", node.tmp / "five.out"
    jobs.append(submit(env, "-p", HEALTH_PARTITION, "-N1", "-o", str(out_any), "--wrap", "echo $SLURMD_NODENAME"))
    jobs.append(submit(env, "-p", HEALTH_PARTITION, "-N1", "-x", OTHER, "-o", str(out_five),
                       "--wrap", "echo $SLURMD_NODENAME"))
    assert wait_job(env, jobs[0]) == "COMPLETED" and out_any.read_text().strip() == OTHER
    end = time.monotonic() + 3  # sched_interval=2 s: it had its chances
    while time.monotonic() < end:
        state, why = job_state(env, jobs[1])
        assert state == "PENDING", (state, why)
        time.sleep(0.2)
    assert HEALTH_NODE in why  # "ReqNodeNotAvail, UnavailableNodes:node5"

    # Healthy again: the program resumes its own drain, and the waiting job runs on node5.
    node.set_port("mlx5_ib2", state="4: ACTIVE", phys_state="5: LinkUp")
    proc = node.run()
    assert proc.returncode == 0 and f"RESUME {HEALTH_NODE} (was drained: {REASON})" in proc.stdout, proc.stdout
    assert "DRAIN" not in node_state(env, HEALTH_NODE)[0]
    assert wait_job(env, jobs[1]) == "COMPLETED" and out_five.read_text().strip() == HEALTH_NODE


def test_a_drain_by_someone_else_is_never_resumed_or_rewritten(health_node: HealthNode) -> None:
    node, env, _ = health_node
    wait_idle(env)
    foreign = "maintenance: swap DIMM B3"
    slurm(env, "scontrol", "update", f"NodeName={HEALTH_NODE}", "State=DRAIN", f"Reason={foreign}")
    proc = node.run()  # passing
    assert proc.returncode == 0 and f"KEEP {HEALTH_NODE} drained by someone else: {foreign}" in proc.stdout
    assert node_state(env, HEALTH_NODE)[1] == foreign
    node.change(kernel_log="kern/xid79.log")
    proc = node.run()  # failing
    assert proc.returncode == 1 and "FAIL gpu-xid GPU 3 XID 79" in proc.stdout
    state, reason = node_state(env, HEALTH_NODE)
    assert "DRAIN" in state and reason == foreign


def test_a_node_someone_else_set_down_is_neither_drained_nor_resumed(health_node: HealthNode) -> None:
    node, env, _ = health_node
    wait_idle(env)
    foreign = "maintenance: replace PSU"
    slurm(env, "scontrol", "update", f"NodeName={HEALTH_NODE}", "State=DOWN", f"Reason={foreign}")
    try:
        node.set_port("mlx5_ib2", state="1: DOWN", phys_state="2: Polling")
        proc = node.run()  # failing: the admin's reason must stay
        assert proc.returncode == 1 and f"KEEP {HEALTH_NODE} DOWN by someone else: {foreign}" in proc.stdout, proc.stdout
        assert node_state(env, HEALTH_NODE) == ("DOWN", foreign)
        node.set_port("mlx5_ib2", state="4: ACTIVE", phys_state="5: LinkUp")
        proc = node.run()  # passing: still the admin's node to bring back
        assert proc.returncode == 0 and node_state(env, HEALTH_NODE) == ("DOWN", foreign)
    finally:
        slurm(env, "scontrol", "update", f"NodeName={HEALTH_NODE}", "State=RESUME")
