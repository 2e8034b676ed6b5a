"""CPUs reach every step where the cluster binds tasks to cores (TaskPlugin=task/affinity,task/cgroup,
TaskPluginParam=autobind=cores: the `bound_cluster` fixture, 2 real cores per node).

`#SBATCH --cpus-per-task=2` sizes the job; Slurm 22.05/23.02's srun does not read
SLURM_CPUS_PER_TASK, so a bare `srun` in the batch script asks for 1 CPU per task and autobind
pins the task to one core. The rendered srun passes `--cpus-per-task` itself
(lingjun_slurm/plan.py step_cpus): each task's Cpus_allowed_list holds both CPUs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from .helpers import all_ended, chain_spec, cli, submitted_run_id, wait_for


def cpus(listing: str) -> set[int]:
    out: set[int] = set()
    for part in listing.strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


@pytest.mark.slurm
def test_every_stage_task_gets_its_cpus_where_tasks_are_bound(tmp_path: Path, bound_cluster: Any) -> None:
    env = {**bound_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}
    real = len(os.sched_getaffinity(0))
    if real < 2:
        pytest.skip(f"needs 2 real CPUs for a 2-CPU task (this machine has {real})")
    out = tmp_path / "affinity"
    out.mkdir()
    mlm = tmp_path / "megatron"
    (mlm / "tools").mkdir(parents=True)
    # Megatron-LM's preprocess_data.py stand-in: record the array task's CPUs.
    (mlm / "tools" / "preprocess_data.py").write_text(
        "import os\n"
        f"open(os.path.join({str(out)!r}, 'preprocess-' + os.environ['SLURM_ARRAY_TASK_ID']), 'w').write(\n"
        "    [l.split(':', 1)[1] for l in open('/proc/self/status') if l.startswith('Cpus_allowed_list')][0])\n")
    (mlm / "tools" / "merge_datasets.py").write_text("")
    command = f"grep Cpus_allowed_list /proc/self/status | cut -f2 > {out}/command"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work",
                      [{"name": "probe", "command": command, "resources": {"cpus_per_task": 2}}])
    doc = yaml.safe_load(spec.read_text())
    doc["stages"]["preprocess"] = {"skip": False}
    doc["stages"]["merge"] = {"skip": False}
    doc["megatron_lm"] = {"version": "0.16.1", "path": str(mlm)}
    doc["data"] = {"tool": "megatron-lm", "inputs": [str(tmp_path / "part0.jsonl")],
                   "tokenizer": {"type": "null", "vocab_size": 512}, "workers": 1}
    doc["cluster"]["stages"] = {"preprocess": {"cpus_per_task": 2}}
    spec.write_text(yaml.safe_dump(doc))
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    stages = wait_for(run_id, env, lambda s: s["preprocess"]["state"] in ("COMPLETED", "FAILED", "CANCELLED"),
                      timeout=120)
    assert stages["probe"]["state"] == "COMPLETED" and stages["preprocess"]["state"] == "COMPLETED", stages
    got = {name: cpus((out / name).read_text()) for name in ("command", "preprocess-0")}
    assert all(len(c) == 2 for c in got.values()), got
    cli("cancel", run_id, env=env, check=None)
    wait_for(run_id, env, all_ended, timeout=60)


@pytest.mark.slurm
def test_a_one_cpu_step_keeps_the_jobs_memory_on_two_thread_cores(tmp_path: Path) -> None:
    """ThreadsPerCore=2 (CycleCloud's node lines) with CR_Core_Memory: a 1-CPU task's job holds a
    whole core, 2 CPUs x DefMemPerCPU. `--cpus-per-task` implies --exact, whose step gets tasks x c x
    MemPerCPU, half of that; the rendered srun's --mem=0 gives the step the job's memory."""
    from lingjun_slurm.devcluster import DevClusterError

    from tests.cluster.fixtures import free_cluster, require_cgroups, require_slurm

    require_slurm()
    require_cgroups()
    root = Path(f"/tmp/lingjun-test-smt-{os.getpid()}")
    cluster = free_cluster(root, 18700, nodes=2, cpus_per_node=2, gpus_per_node=0, threads_per_core=2,
                           cluster_name="lingjun-smt", fast_timers=True)
    try:
        try:
            cluster.up(timeout=90)
        except DevClusterError as exc:
            pytest.fail(f"the ThreadsPerCore=2 cluster did not start:\n{exc}")
        env = {**cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}
        out = tmp_path / "mem.txt"
        probe = ("cg=$(awk -F: '$2==\"memory\"{print $3}' /proc/self/cgroup); step=${cg%/task_*}; "
                 "echo \"$(cat /sys/fs/cgroup/memory$step/memory.limit_in_bytes) "
                 f"$(cat /sys/fs/cgroup/memory${{step%/step_*}}/memory.limit_in_bytes)\" > {out}")
        spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work",
                          [{"name": "probe", "command": probe, "resources": {"cpus_per_task": 1}}])
        run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
        stages = wait_for(run_id, env, all_ended, timeout=120)
        assert stages["probe"]["state"] == "COMPLETED", stages
        step, job = (int(x) for x in out.read_text().split())
        assert step == job == 2 * 8000 * 1024 * 1024, (step, job)  # 2 CPUs x DefMemPerCPU=16000//2
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)
