"""The dev/test cluster is configured like production (issue 25): cgroups confine cores, memory and
GPUs; fake GPUs do not take /dev/null with them; clusters side by side keep their cgroups apart and
`down` removes them; a cluster with TaskPluginParam=autobind=cores binds tasks as such sites do.

Checked against the real Slurm 22.05.8 (Debian) with cgroup v1; the settings' sources are in
docs/dev-cluster.md (cyclecloud-slurm templates @049346f6, Slurm 22.05 src/plugins/cgroup/v1).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from lingjun_slurm.devcluster import (CGROUP_CONTROLLERS, CGROUP_ROOT, DevCluster, DevClusterConfig, _live_slurmd_node_names,
                                      cgroup_problem)
from tests.cluster.fixtures import free_cluster, require_cgroups, require_slurm, slurm, submit, wait_job

pytestmark = pytest.mark.slurm

# Every cyclecloud-slurm setting the dev cluster takes over (azure-slurm-install/templates/
# slurm.conf.template and cgroup.conf.template @049346f6b1cee4db11fd6a6166a58e32f5d006f5).
CYCLECLOUD_SLURM_CONF = ["MpiDefault=none", "ProctrackType=proctrack/cgroup", "ReturnToService=2",
                         "PropagateResourceLimits=ALL", "SwitchType=switch/none",
                         "TaskPlugin=task/affinity,task/cgroup", "SchedulerType=sched/backfill",
                         "SelectType=select/cons_tres", "GresTypes=gpu", "SelectTypeParameters=CR_Core_Memory",
                         "JobAcctGatherType=jobacct_gather/none", "SlurmctldParameters=idle_on_node_suspend",
                         "DisableRootJobs=NO", "LaunchParameters=use_interactive_step", "PrivateData=cloud",
                         "PrologFlags=alloc", "TreeWidth=16", "SlurmctldTimeout=30"]
CYCLECLOUD_CGROUP_CONF = ["ConstrainCores=yes", "ConstrainRAMSpace=yes", "ConstrainDevices=yes"]


def _lines(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines()}


def test_configuration_is_cyclecloud_s(tmp_path: Path) -> None:
    cluster = DevCluster(DevClusterConfig(root=tmp_path / "c", memory_mb_per_node=16000, cpus_per_node=2))
    conf = _lines(cluster._slurm_conf())
    assert set(CYCLECLOUD_SLURM_CONF) <= conf, set(CYCLECLOUD_SLURM_CONF) - conf
    assert set(CYCLECLOUD_CGROUP_CONF) <= _lines(cluster._cgroup_conf())
    parts = [line for line in conf if line.startswith("PartitionName=")]
    assert parts and all(" DefMemPerCPU=8000 " in p for p in parts)  # RealMemory // CPUs, as slurmcc does
    assert not any(line.startswith(("KillWait", "TaskPluginParam")) for line in conf)  # Slurm's defaults
    assert "FirstJobId=6817000" in conf
    bare = _lines(DevCluster(DevClusterConfig(root=tmp_path / "b", cgroups=False, task_binding="cores",
                                              fast_timers=True))._slurm_conf())
    assert {"ProctrackType=proctrack/linuxproc", "TaskPlugin=task/affinity", "TaskPluginParam=autobind=cores",
            "KillWait=5"} <= bare


def test_cgroup_problem_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    assert "cgroup v2" in (cgroup_problem(tmp_path) or "")
    (tmp_path / "cgroup.controllers").unlink()
    for name in ("freezer", "cpuset", "memory"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tasks").write_text("")
    assert cgroup_problem(tmp_path) == f"cgroup v1 controller devices is not mounted at {tmp_path}/devices"
    (tmp_path / "devices").mkdir()
    (tmp_path / "devices" / "tasks").write_text("")
    assert cgroup_problem(tmp_path) is None  # root may write here


def _job_cgroup(line_prefix: str, text: str) -> str:
    """The cgroup path of one controller from a copy of /proc/self/cgroup."""
    return next(line.split(":", 2)[2] for line in text.splitlines() if line.split(":")[1] == line_prefix)


def test_a_job_is_confined_to_its_cores_and_memory(slurm_cluster: DevCluster, tmp_path: Path) -> None:
    require_cgroups()
    out = tmp_path / "one.txt"
    job = submit(slurm_cluster.env, "-c1", "-o", str(out), "--wrap",
                 "grep Cpus_allowed_list /proc/self/status; p=$(grep :memory: /proc/self/cgroup | cut -d: -f3); "
                 'cat "/sys/fs/cgroup/memory${p%%/step_*}/memory.limit_in_bytes"; cat /proc/self/cgroup')
    assert wait_job(slurm_cluster.env, job) == "COMPLETED", out.read_text()
    lines = out.read_text().splitlines()
    assert lines[0].split()[1] in ("0", "1"), lines  # one of the 2 cores (ConstrainCores)
    assert int(lines[1]) == 8000 << 20, lines  # DefMemPerCPU = 16000 MB // 2 CPUs, for its one CPU
    memory = _job_cgroup("memory", "\n".join(lines[2:]))
    assert memory.startswith("/slurm_node") and f"/job_{job}/step_batch" in memory, memory
    assert not list((CGROUP_ROOT / "memory").glob(f"slurm_node*/uid_*/job_{job}"))  # Slurm removed it at the end

    # ConstrainRAMSpace: over its --mem, a job is killed by the kernel's OOM killer in its cgroup.
    hog = tmp_path / "hog.txt"
    job = submit(slurm_cluster.env, "--mem=64M", "-o", str(hog), "--wrap",
                 f"{sys.executable} -c 'b = bytearray(256 << 20); print(len(b))'")
    assert wait_job(slurm_cluster.env, job) == "OUT_OF_MEMORY", hog.read_text()


def test_a_gpu_job_may_open_only_its_own_fake_gpu_and_dev_null(slurm_cluster: DevCluster, tmp_path: Path) -> None:
    """ConstrainDevices denies the GPUs a job was not given, by major:minor. The fake GPUs have
    NVIDIA's major and minors of their own: the job's GPU opens as far as the driver (ENXIO: no
    driver behind 195:N here), the other is denied (EPERM), /dev/null still works."""
    require_cgroups()
    dev = slurm_cluster.root / "dev"
    probe = tmp_path / "probe.py"
    probe.write_text("import errno, os, sys\n"
                     "for f in sys.argv[1:]:\n"
                     "    try:\n"
                     "        os.close(os.open(f, os.O_RDWR)); print(f, 'OPEN')\n"
                     "    except OSError as e:\n"
                     "        print(f, errno.errorcode[e.errno])\n")
    out = tmp_path / "gpu.txt"
    job = submit(slurm_cluster.env, "-p", "gpu", "--gres=gpu:1", "-o", str(out), "--wrap",
                 f'echo "GPUS=$SLURM_JOB_GPUS"; {sys.executable} {probe} {dev}/gpu0 {dev}/gpu1 /dev/null; '
                 'echo written > /dev/null && echo DEVNULL=ok')
    assert wait_job(slurm_cluster.env, job) == "COMPLETED", out.read_text()
    lines = out.read_text().splitlines()
    mine = lines[0].split("=")[1]
    assert mine in ("0", "1"), lines
    other = "1" if mine == "0" else "0"
    assert f"{dev}/gpu{mine} ENXIO" in lines and f"{dev}/gpu{other} EPERM" in lines, lines
    assert "/dev/null OPEN" in lines and lines[-1] == "DEVNULL=ok", lines


def _ours(node: str, job: str) -> list[Path]:
    return [p for ctl in CGROUP_CONTROLLERS for p in (CGROUP_ROOT / ctl / f"slurm_{node}").glob(f"uid_*/job_{job}")]


def test_two_clusters_with_the_same_node_names_keep_their_cgroups_apart(tmp_path: Path) -> None:
    """Slurm 22.05 names a job's cgroup slurm_<node>/uid_<uid>/job_<id>: both clusters have node1,
    and each one's first job would be job 2 without their own FirstJobId (base port x 1000)."""
    require_slurm()
    require_cgroups()
    pid = os.getpid()
    one = free_cluster(Path(f"/tmp/lingjun-test-cg1-{pid}"), 15800, nodes=2, gpus_per_node=0, fast_timers=True)
    one.up(timeout=90)
    two = None
    try:
        two = free_cluster(Path(f"/tmp/lingjun-test-cg2-{pid}"), one.config.base_port + 20, nodes=2,
                           gpus_per_node=0, fast_timers=True)
        two.up(timeout=90)
        go = tmp_path / "go"
        jobs, outs = [], []
        for i, cluster in enumerate((one, two)):
            outs.append(tmp_path / f"job{i}.txt")
            jobs.append(submit(cluster.env, "-w", "node1", "-o", str(outs[-1]), "--wrap",
                               f"cat /proc/self/cgroup; while [ ! -e {go} ]; do sleep 0.1; done"))
        end = time.monotonic() + 30
        while not all(o.exists() and "freezer" in o.read_text() for o in outs) and time.monotonic() < end:
            time.sleep(0.1)
        paths = [_job_cgroup("freezer", o.read_text()) for o in outs]
        assert paths[0] != paths[1], paths
        assert all(p.startswith("/slurm_node1/uid_") for p in paths), paths
        assert _ours("node1", jobs[0]) and _ours("node1", jobs[1])

        one.down()  # kills its jobs, removes their cgroups, leaves two's
        assert not _ours("node1", jobs[0])
        assert slurm(two.env, "squeue", "-h", "-j", jobs[1], "-o", "%T").stdout.strip() == "RUNNING"
        assert len(_ours("node1", jobs[1])) == 4  # freezer, cpuset, memory, devices
        go.touch()
        assert wait_job(two.env, jobs[1]) == "COMPLETED", outs[1].read_text()
    finally:
        one.down()
        if two is not None:
            two.down()
        for cluster in (one, two):
            if cluster is not None:
                shutil.rmtree(cluster.root, ignore_errors=True)
    assert not _ours("node1", jobs[1])
    # slurm_node1/2 go with the last cluster that has those nodes (another test cluster may run here)
    others = _live_slurmd_node_names()
    for node in ("node1", "node2"):
        if node not in others:
            assert not any((CGROUP_ROOT / ctl / f"slurm_{node}").exists() for ctl in CGROUP_CONTROLLERS), node


def test_bound_cluster_binds_a_bare_srun_to_one_core(bound_cluster: DevCluster, tmp_path: Path) -> None:
    """Slurm 22.05 with TaskPluginParam=autobind=cores: in `sbatch -n1 -c2`, a bare srun asks for
    1 CPU per task (srun no longer reads SLURM_CPUS_PER_TASK, 22.05 RELEASE_NOTES) and its task is
    bound to one core; `srun -c 2` gets both. The bug lingjun-slurm's scripts must avoid."""
    out = tmp_path / "bind.txt"
    job = submit(bound_cluster.env, "-n1", "-c2", "-o", str(out), "--wrap",
                 "grep Cpus_allowed_list /proc/self/status; srun grep Cpus_allowed_list /proc/self/status; "
                 "srun -c 2 grep Cpus_allowed_list /proc/self/status")
    assert wait_job(bound_cluster.env, job) == "COMPLETED", out.read_text()
    batch, bare, with_c = (line.split()[1] for line in out.read_text().splitlines())
    assert batch == "0-1" and with_c == "0-1", out.read_text()
    assert bare in ("0", "1"), out.read_text()


def test_down_removes_the_cgroups_and_processes_slurm_left_behind(tmp_path: Path) -> None:
    """A job whose slurmstepd died (here: SIGKILLed) keeps its cgroups and its processes, which
    Slurm never cleans; `down` kills what is in this cluster's job cgroups and removes them."""
    require_slurm()
    require_cgroups()
    cluster = free_cluster(Path(f"/tmp/lingjun-test-cg3-{os.getpid()}"), 15700, nodes=2, gpus_per_node=0,
                           fast_timers=True)
    cluster.up(timeout=90)
    try:
        pid_file = tmp_path / "pid"
        job = submit(cluster.env, "-w", "node1", "-o", "/dev/null", "--wrap", f"sleep 300 & echo $! > {pid_file}; wait")
        end = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < end:
            time.sleep(0.1)
        sleeper = int(pid_file.read_text())
        steps = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/cmdline")
                 if _read(p).startswith(f"slurmstepd: [{job}.")]
        assert steps, f"no slurmstepd for job {job}"
        for step in steps:  # this test's cluster's own step daemons
            os.kill(step, 9)
        time.sleep(0.5)
        assert _ours("node1", job) and Path(f"/proc/{sleeper}").exists()
        cluster.down()
        assert not _ours("node1", job)
        end = time.monotonic() + 5
        while _alive(sleeper) and time.monotonic() < end:
            time.sleep(0.05)
        assert not _alive(sleeper)
    finally:
        cluster.down()
        shutil.rmtree(cluster.root, ignore_errors=True)


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    stat = _read(Path(f"/proc/{pid}/stat"))
    return bool(stat) and stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
