"""The session-wide real Slurm clusters for tests: `slurm_cluster` and `bound_cluster` (import them
in tests/conftest.py).

slurm_cluster: 4 nodes (node1..node4), partitions cpu (default) and gpu, 2 fake GPUs per node,
accounting on (sacct works), from an empty root /tmp/lingjun-test-cluster-<pid>, on ports from
16900 up (so a user's `dev-cluster up`, on 6817.., is left alone). Configured like production
(cgroups, CR_Core_Memory, PrologFlags=alloc: docs/dev-cluster.md) where cgroup v1 is writable.
Skipped where Slurm, MariaDB or root is missing, except under CI (CI set), where that is a failure.

bound_cluster: 2 nodes of 2 real CPUs, partition cpu, no GPUs, no accounting, tasks bound to
cores by default (TaskPluginParam=autobind=cores) as on sites that pin tasks; ports from 18300.

Plus node5 (HEALTH_NODE), kept for the health-check test that drains it: it is only in
partition `health` (HEALTH_PARTITION = node4 + node5), never in cpu or gpu, so no other test's
job can land on it while it is drained.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator, Mapping, NoReturn

import pytest

from lingjun_slurm.devcluster import DevCluster, DevClusterConfig, DevClusterError, cgroup_problem, usable_cpus

TEST_BASE_PORT = 16900
BOUND_BASE_PORT = 18300
BOUND_CPUS = 2
NODES = 4
GPUS_PER_NODE = 2
EXTRA_NODES = 1
HEALTH_NODE = "node5"
HEALTH_PARTITION = "health"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED"}


def unavailable(reason: str) -> NoReturn:
    """Skip locally, fail in CI: there the cluster must run."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (required in CI)")
    pytest.skip(reason)


def _have(prog: str) -> bool:
    return bool(shutil.which(prog) or shutil.which(prog, path="/usr/sbin:/sbin:/usr/bin:/bin"))


def require_slurm(accounting: bool = False) -> None:
    """Skip (fail in CI) unless a dev cluster can start here."""
    missing = [p for p in ("slurmctld", "slurmd", "munged", "sbatch") if not _have(p)]
    if missing:
        unavailable(f"Slurm is not installed (missing {', '.join(missing)}; "
                    "apt-get install slurmctld slurmd slurm-client munge)")
    if accounting:
        missing = [p for p in ("slurmdbd", "mariadbd", "mariadb-install-db") if not _have(p)]
        if missing:
            unavailable(f"accounting needs {', '.join(missing)} (apt-get install slurmdbd mariadb-server)")
    if os.geteuid() != 0:
        unavailable("the dev cluster needs root (SlurmUser=root)")


def require_cgroups() -> None:
    """Skip (fail in CI) unless cgroup v1 is writable here, which the production-like settings need."""
    problem = cgroup_problem()
    if problem:
        unavailable(f"{problem}: this test needs Slurm's cgroup plugins (docs/dev-cluster.md)")


def free_cluster(root: Path, first_port: int, **kw: object) -> DevCluster:
    """A DevCluster on the first base port from first_port (steps of 20) whose ports are all free."""
    for base in range(first_port, first_port + 20 * 10, 20):
        cluster = DevCluster(DevClusterConfig(root=root, base_port=base, **kw))  # type: ignore[arg-type]
        if not cluster.ports_in_use():
            return cluster
    pytest.fail(f"no free ports for a test cluster in {first_port}..{first_port + 200}")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[DevCluster]:
    """A running 4-node cluster (+ node5 in partition health) with accounting; use `.env` for
    sbatch/squeue/sacct/scontrol."""
    require_slurm(accounting=True)
    root = Path(f"/tmp/lingjun-test-cluster-{os.getpid()}")
    # Production-like (cgroups) wherever cgroup v1 is writable; tests that need the cgroups call
    # require_cgroups(). fast_timers: the suite's requeue tests would wait cred_expire (120 s) for
    # each requeued job, and tests/integration/test_submit_slurm.py, tests/health/test_slurm.py time
    # their waits by sched_interval=2; the timers are not what the tests are about.
    cluster = free_cluster(root, TEST_BASE_PORT, nodes=NODES, cpus_per_node=2, gpus_per_node=GPUS_PER_NODE,
                           accounting=True, cluster_name="lingjun-test", extra_nodes=EXTRA_NODES,
                           extra_partition=HEALTH_PARTITION, cgroups=cgroup_problem() is None, fast_timers=True)
    yield from _running(cluster, root, "test Slurm cluster")


@pytest.fixture(scope="session")
def bound_cluster() -> Iterator[DevCluster]:
    """A running 2-node cluster, 2 real CPUs per node, partition cpu, no GPUs, no accounting,
    TaskPluginParam=autobind=cores, otherwise like slurm_cluster; use `.env`."""
    require_slurm()
    if usable_cpus() < BOUND_CPUS:
        unavailable(f"bound_cluster needs {BOUND_CPUS} real CPUs (binding to CPUs that do not exist means "
                    f"nothing), this host has {usable_cpus()}")
    root = Path(f"/tmp/lingjun-test-bound-{os.getpid()}")
    # fast_timers: as slurm_cluster, for the tests' speed; binding does not depend on them.
    cluster = free_cluster(root, BOUND_BASE_PORT, nodes=2, cpus_per_node=BOUND_CPUS, gpus_per_node=0,
                           cluster_name="lingjun-bound", task_binding="cores", cgroups=cgroup_problem() is None,
                           fast_timers=True)
    yield from _running(cluster, root, "bound test Slurm cluster")


def _running(cluster: DevCluster, root: Path, what: str) -> Iterator[DevCluster]:
    try:
        cluster.up(timeout=90)
    except DevClusterError as exc:
        pytest.fail(f"{what} did not start:\n{exc}")
    try:
        yield cluster
    finally:
        cluster.down()
        if not os.environ.get("LINGJUN_KEEP_TEST_CLUSTER"):
            shutil.rmtree(root, ignore_errors=True)


def slurm(env: Mapping[str, str], *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command against the cluster whose env is given."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=dict(os.environ, **env), timeout=30)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} -> rc {proc.returncode}: {proc.stderr.strip()}")
    return proc


def submit(env: Mapping[str, str], *args: str) -> str:
    """sbatch --parsable ARGS; the job id."""
    return slurm(env, "sbatch", "--parsable", *args).stdout.strip().split(";")[0]


def wait_job(env: Mapping[str, str], job_id: str, timeout: float = 30) -> str:
    """Poll until the job reaches a terminal state; return it (COMPLETED, FAILED, ...)."""
    end = time.monotonic() + timeout
    state = ""
    while time.monotonic() < end:
        out = slurm(env, "scontrol", "show", "job", "-o", job_id, check=False).stdout
        state = next((f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")), "")
        if state in TERMINAL:
            return state
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} still {state or 'unknown'} after {timeout} s")
