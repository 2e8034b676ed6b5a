"""Spec -> Plan: stages, Slurm options, dependencies, environment and entry commands.

Pure and deterministic: the same spec (and run id) always gives the same plan. The
plan is written as plan.json beside the scripts; stage code inside the jobs reads it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from . import __version__, network
from .container import host_side, is_squashfs_path, mounts_with_workdir, parse_mount, pyxis_flags
from .megatron import args as megatron_args
from .network import EnvVar, NetworkEnv
from .common.shell import Shell, Word, to_json
from .spec.models import CommandStage, Resources, Spec, export_dir, init_dir, init_from_path, mem_mib
from .spec.resolve import (StageResources, active_builtins, builtin_resources, checkpoint_dir, command_resources,
                           data_prefix, log_dir, output_prefix, resolve_model, stage_order)
from .common.timefmt import format_time, parse_time

PLAN_SCHEMA = 1
# sbatch's memory options are mutually exclusive: with one of these in sbatch_extra, no --mem.
MEM_OPTIONS = frozenset({"mem-per-cpu", "mem-per-gpu"})
EXECUTORS = ("slurm", "local")
PLAN_VAR = Shell('"$PLAN"')
PYTHON = "python3"
# Each task learns its torch.distributed identity from Slurm inside the srun step, and puts the
# code shipped with the run (LINGJUN_SITE, set by built-in stages) first on the image's own
# PYTHONPATH: inside the container, so an image's PYTHONPATH (e.g. a Megatron-LM checkout) stays.
TASK_WRAPPER: tuple[Word, ...] = (
    "bash", "-c",
    'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"; '
    'if [ -n "${LINGJUN_SITE:-}" ]; then export PYTHONPATH="$LINGJUN_SITE${PYTHONPATH:+:$PYTHONPATH}"; fi; '
    'exec "$@"',
    "lingjun-task",
)


@dataclass(frozen=True)
class Dependency:
    stage: str
    type: str  # afterok | afterany | afternotok


@dataclass(frozen=True)
class StagePlan:
    name: str
    kind: str  # preprocess | merge | train | checkpoint | command
    script: str
    job_name: str
    sbatch: tuple[tuple[str, str | None], ...]
    depends_on: tuple[Dependency, ...]
    resources: StageResources
    env: tuple[EnvVar, ...]
    network: NetworkEnv | None
    launcher: tuple[Word, ...]
    commands: tuple[tuple[Word, ...], ...]
    container: bool
    array: str | None = None
    vars: dict[str, Any] = field(default_factory=dict)  # template-only extras (e.g. input lists)


def env_names(env: tuple[EnvVar, ...], net: NetworkEnv | None, train: bool) -> list[str]:
    """Every variable a stage's script sets: all of them go to --container-env."""
    names = [v.name for v in env] + (net.names() if net else [])
    return names + (["MASTER_ADDR", "MASTER_PORT"] if train else [])


@dataclass(frozen=True)
class Plan:
    run_id: str
    name: str
    spec_sha256: str
    source: str
    workdir: str
    log_dir: str
    checkpoint_dir: str
    # The same directory as the batch shell outside the container sees it (container.host_side).
    host_checkpoint_dir: str
    stages: tuple[StagePlan, ...]
    settings: dict[str, Any]
    reproduce: str
    executor: str = "slurm"
    tool_version: str = __version__

    def stage(self, name: str) -> StagePlan:
        for st in self.stages:
            if st.name == name:
                return st
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": PLAN_SCHEMA,
            "tool_version": self.tool_version,
            "run_id": self.run_id,
            "name": self.name,
            "executor": self.executor,
            "spec_sha256": self.spec_sha256,
            "workdir": self.workdir,
            "log_dir": self.log_dir,
            "checkpoint_dir": self.checkpoint_dir,
            "host_checkpoint_dir": self.host_checkpoint_dir,
            "stages": [_stage_json(st) for st in self.stages],
            "settings": self.settings,
        }


def _stage_json(st: StagePlan) -> dict[str, Any]:
    res = st.resources
    return {
        "name": st.name,
        "kind": st.kind,
        "script": st.script,
        "job_name": st.job_name,
        "array": st.array,
        "depends_on": [{"stage": d.stage, "type": d.type} for d in st.depends_on],
        "resources": {
            "partition": res.partition, "nodes": res.nodes, "tasks_per_node": res.tasks_per_node,
            "gpus_per_node": res.gpus_per_node, "cpus_per_task": res.cpus_per_task, "mem": res.mem,
            "time_s": res.time_s, "exclusive": res.exclusive,
        },
        "container": st.container,
        "env": {v.name: v.value for v in st.env},
        "network_profile": st.network.profile if st.network else None,
        "commands": [[to_json(w) for w in cmd] for cmd in st.commands],
    }


def network_env(spec: Spec) -> NetworkEnv:
    net = spec.cluster.network
    prof = network.get_profile(net.profile) if net.profile else network.profile_for_instance(net.instance_type or "")
    return network.resolve(prof, net.overrides)


def training_env(spec: Spec, res: StageResources) -> list[EnvVar]:
    par = spec.parallelism
    env = [EnvVar("PYTHONUNBUFFERED", "1", "log lines reach the Slurm log as they are printed")]
    if par.tensor > 1 or par.context > 1:
        env.append(EnvVar("CUDA_DEVICE_MAX_CONNECTIONS", "1",
                          "one CUDA work queue so TP/CP communication overlaps compute in order (Megatron)"))
    if res.gpus_per_node and spec.training.hang_timeout:
        # torch's NCCL watchdog dumps its flight recorder (the last collectives of every rank) when a
        # collective times out: ProcessGroupNCCL.hpp TORCH_NCCL_DUMP_ON_TIMEOUT (needs the trace buffer
        # TORCH_NCCL_TRACE_BUFFER_SIZE > 0, which is 0 by default); the file goes to the stacks dir.
        env.append(EnvVar("TORCH_NCCL_DUMP_ON_TIMEOUT", "1",
                          "a timed-out collective dumps torch's NCCL flight recorder beside the stack dumps"))
        env.append(EnvVar("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000",
                          "the flight recorder keeps the last 2000 collectives per rank (default 0: off)"))
    if res.cpus_per_task:
        env.append(EnvVar("OMP_NUM_THREADS", str(res.cpus_per_task),
                          "size each task's OpenMP pool to its CPUs instead of every core of the node"))
    return env


def _sbatch(spec: Spec, job_name: str, res: StageResources, logs: str, *, array: str | None,
            dependent: bool, train: bool) -> tuple[tuple[str, str | None], ...]:
    opts: dict[str, str | None] = {
        "job-name": job_name,
        "output": f"{logs}/%x-{'%A_%a' if array else '%j'}.out",
        "open-mode": "append",
        "nodes": str(res.nodes),
        "ntasks-per-node": str(res.tasks_per_node),
    }
    if res.partition:
        opts["partition"] = res.partition
    if res.gpus_per_node:
        opts["gpus-per-node"] = str(res.gpus_per_node)
    if res.cpus_per_task:
        opts["cpus-per-task"] = str(res.cpus_per_task)
    if res.mem:
        opts["mem"] = res.mem
    elif res.exclusive and not MEM_OPTIONS & {k for k, v in spec.cluster.sbatch_extra.items() if v is not False}:
        # --exclusive gives every CPU and GRES of the node "but is only allocated as much memory
        # as it requested ... To request all the memory on a node, use --mem=0" (Slurm's
        # doc/man/man1/sbatch.1, --exclusive).
        opts["mem"] = "0"
    if res.time_s:
        opts["time"] = format_time(res.time_s)
    if res.exclusive:
        opts["exclusive"] = None
    for key in ("account", "qos", "reservation", "constraint"):
        value = getattr(spec.cluster, key)
        if value:
            opts[key] = value
    if array:
        opts["array"] = array
    if dependent:
        opts["kill-on-invalid-dep"] = "yes"
    if train:
        opts["requeue"] = None
        opts["signal"] = f"B:USR1@{spec.training.save_grace_s}"
    else:
        opts["no-requeue"] = None
    for key, value in spec.cluster.sbatch_extra.items():
        if value is False:
            continue
        opts[key] = None if value is True else str(value)
    return tuple(sorted(opts.items()))


@dataclass(frozen=True)
class ContainerPlan:
    """How the chain's stages get their image and container name (docs/rendering.md#images)."""

    staged: bool                 # an image stage imports the image once; stages run its .sqsh
    name_prefix: str | None      # container names start with this (None: unnamed containers)
    image_key: str               # the image part of the name when not staged (staged: the digest's, at run time)
    cache_dir: str

    def image_word(self) -> Word | None:
        return Shell('--container-image="$LINGJUN_IMAGE"') if self.staged else None

    def name_word(self) -> Word | None:
        return Shell('--container-name="$LINGJUN_CONTAINER_NAME"') if self.name_prefix else None


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8]


def container_plan(spec: Spec, run_id: str, pyxis: bool) -> ContainerPlan:
    """Staging applies to registry images under pyxis unless container.stage is never. Named
    containers get <name>-<run key>-<image key>-<job id>: a changed image or another run never
    reuses one (pyxis reuses an existing named container whatever --container-image says,
    pyxis_slurmstepd.c), and each job removes its own."""
    image = spec.container.image or ""
    staged = pyxis and spec.container.stage == "auto" and bool(image) and not is_squashfs_path(image)
    prefix = f"{spec.container.name}-{_key(run_id)}-" if pyxis and spec.container.name else None
    return ContainerPlan(staged=staged, name_prefix=prefix, image_key=_key(image),
                         cache_dir=spec.container.cache_dir or f"{spec.run.workdir}/images")


def image_resources(spec: Spec) -> StageResources:
    """Where the image stage runs and with what (docs/images.md, "Resources"; docs/admin-guide.md).

    Partition: cluster.stages.image.partition, else the train stage's (when train is skipped,
    the first active built-in's, else the first container command's), else cluster.defaults'.
    The import must run where the train stage's image is valid: the same CPU architecture (the registry digest and the
    layers are per architecture: a CPU partition of another architecture, e.g. x86 login-class
    nodes beside arm64 GB200/GB300 GPU nodes, imports the wrong image), and enroot's registry
    credentials, which cluster-init writes on execute-spec nodes only (cluster_init/.../lib/
    roles.sh lj_role_execute -> lib/enroot.sh lj_enroot_credentials, given to each job's user by
    the prolog enroot-credentials-prolog.sh).

    Size (cluster.stages.image.cpus_per_task / mem / time override each): enroot's import
    (src/docker.sh, v4.1.2) downloads ENROOT_MAX_CONNECTIONS (10) layers at once, each through
    gunzip | zstd (:187, :110-115), extracts them with `parallel -j ENROOT_MAX_PROCESSORS`
    (:316) and squashes with `mksquashfs -processors ENROOT_MAX_PROCESSORS` (:485);
    ENROOT_MAX_PROCESSORS defaults to $(nproc) (enroot.in:89), the job's CPUs. So cpus_default
    CPUs, but never more than one train node is known to have (its tasks x cpus_per_task: the
    train job asks that much of every node of this partition). Memory: what it holds is the page cache
    of the extracted tree and the squashfs being written (the image's unpacked size, 20-40 GB
    for an NGC PyTorch image; cgroup memory counts it), so mem_per_cpu_mib per CPU, capped by the
    train stage's own --mem when it sets one. Temporary space is ENROOT_TEMP_PATH (node-local
    scratch, cluster-init), not memory. Time: time_default_s (a cold 20 GB import is minutes to
    tens of minutes; the stage's own lock wait for a concurrent run's import counts too)."""
    cpus_default = 16  # parallel extraction and mksquashfs threads; more gains little past the disk
    mem_per_cpu_mib = 2048  # 16 CPUs -> 32 GiB
    time_default_s = 3 * 3600

    own = spec.cluster.stages.get("image") or Resources()
    active = active_builtins(spec)
    boxed = [c for c in spec.stages.commands if c.container]
    if "train" in active or not (active or boxed):
        host = builtin_resources(spec, "train")
    elif active:
        host = builtin_resources(spec, active[0])
    else:  # a chain of container commands: where the first of them runs
        host = command_resources(spec, boxed[0])
    partition = own.partition or host.partition or spec.cluster.defaults.partition
    cpus = own.cpus_per_task
    if cpus is None:
        # CPUs every node of that partition is known to have: the stage asks them of each node
        cpus = max(1, min(cpus_default, host.tasks_per_node * (host.cpus_per_task or 1)))
    mem = own.mem
    if mem is None:
        mib = cpus * mem_per_cpu_mib
        cap = mem_mib(host.mem) if host.mem else None  # --mem=0 (all of the node's) is no cap
        mem = f"{min(mib, cap) if cap else mib}M"
    time_s = parse_time(own.time) if own.time is not None else time_default_s
    return StageResources(partition, 1, 1, 0, cpus, mem, time_s, False)


def step_cpus(res: StageResources) -> int | None:
    """CPUs per task that each srun of the stage must ask for itself, or None (1, as sbatch's).

    `#SBATCH --cpus-per-task` sizes the job, not its steps: Slurm 22.05 and 23.02's srun do not
    read SLURM_CPUS_PER_TASK (22.05 RELEASE_NOTES: "srun will no longer read in
    SLURM_CPUS_PER_TASK"; src/srun/libsrun/opt.c:542 in 22.05 and src/srun/opt.c:548 in 23.02
    map only SRUN_CPUS_PER_TASK to -c), 23.11 to 25.11 read SLURM_CPUS_PER_TASK again and not
    SRUN_CPUS_PER_TASK (src/srun/opt.c:547 in 23.11, :556 in 25.11). A bare srun then asks for 1
    CPU per task, and where tasks are bound (TaskPluginParam=autobind=cores, --cpu-bind=cores)
    each task runs on one core. `-c N` works in every release (doc/man/man1/srun.1: "Explicitly
    requesting this option implies --exact"; the step still gets the job's memory).
    docs/slurm-versions.md, "CPUs per task reach every step"
    (`cluster.sbatch_extra` cannot set cpus-per-task; its `cpus-per-gpu` reaches srun through
    SLURM_CPUS_PER_GPU, which srun reads in 22.05 to 25.11: opt.c:545 in 22.05.)"""
    return res.cpus_per_task or None


def _whole_node_binding(bind: str) -> bool:
    """A --cpu-bind that names CPUs of the whole node: map_cpu/mask_cpu (each listed CPU must be in
    the step, dist_tasks.c:302/358 at 22.05) and the ldom forms ("Entire node must be allocated",
    dist_tasks.c:443), unlike cores/threads/sockets/rank/none, which bind inside the step."""
    return bool(re.search(r"(?:^|,)(?:map_|mask_)|ldom", bind))


def _launcher(spec: Spec, st_kind: str, names: list[str], use_container: bool,
              cplan: ContainerPlan | None = None, cpus: int | None = None) -> tuple[Word, ...]:
    words: list[Word] = ["srun"]
    bind = spec.training.cpu_bind if st_kind == "train" else None
    if bind == "profile":
        prof = network.get_profile(network_env(spec).profile)
        assert prof.cpu_bind is not None  # spec.checks.check_cpu_bind
        bind = prof.cpu_bind[1]
    if cpus and not (bind and _whole_node_binding(bind)):
        # --mem=0: -c implies --exact, and an --exact step gets tasks x c x MemPerCPU, not the job's
        # memory, where the job's memory comes from DefMemPerCPU or --mem-per-cpu (step_mgr.c
        # 2355-2370, 2433-2436 at 22.05): half the job's on a ThreadsPerCore=2 node with an odd c
        # (CycleCloud's default node lines). 0 is "all available job memory to new job steps"
        # (srun.1), and a --mem on the command line resets SLURM_MEM_PER_CPU/GPU from the job
        # (slurm_opt.c _validate_memory_options, 22.05:5746-5766).
        # Not with a binding that names the node's CPUs (masks, maps, ldoms): an --exact step does
        # not hold them and the launch fails; the binding gives each task its CPUs there.
        words += [f"--cpus-per-task={cpus}", "--mem=0"]
    if st_kind == "train":
        words.append("--kill-on-bad-exit=1")
        if bind:
            words.append(f"--cpu-bind={bind}")
    if use_container:
        # No mount of monitoring.textfile_dir: the trainer stages its samples under the run directory and
        # the watchdog writes the job's file on the host (docs/monitoring.md, promfile.py read_staged).
        words += pyxis_flags(spec.container, spec.run.workdir, names,
                             image=cplan.image_word() if cplan else None,
                             name=cplan.name_word() if cplan else None).flags
    return tuple(words)


def local_launcher(res: StageResources, kind: str) -> tuple[Word, ...]:
    """The local executor's stand-in for srun: N tasks on this machine, SLURM_PROCID etc. set."""
    words: list[Word] = [PYTHON, "-m", "lingjun_slurm.executors.launch", "--ntasks",
                         str(res.nodes * res.tasks_per_node)]
    if kind == "train":
        words.append("--kill-on-bad-exit")
    return tuple(words + ["--"])


def _builtin_commands(spec: Spec, kind: str) -> tuple[tuple[tuple[Word, ...], ...], dict[str, Any]]:
    """The entry command(s) of a built-in stage, plus template extras."""
    own = (PYTHON, "-m", "lingjun_slurm.stages", kind, "--plan", PLAN_VAR)
    shard_dir = f"{output_prefix(spec)}.shards"
    if kind == "preprocess":
        if spec.data.tool == "megatron-lm":
            assert spec.megatron_lm is not None
            argv = megatron_args.preprocess_args(spec, Shell('"$INPUT"'), Shell('"$SHARD_PREFIX"'))
            cmd = (PYTHON, f"{spec.megatron_lm.path}/tools/preprocess_data.py", *argv)
            return (cmd,), {"inputs": list(spec.data.inputs), "shard_dir": shard_dir}
        return (own + ("--shard", Shell('"$SLURM_ARRAY_TASK_ID"')),), {}
    if kind == "merge" and spec.data.tool == "megatron-lm":
        assert spec.megatron_lm is not None
        cmds = []
        for key in spec.data.json_keys:
            argv = megatron_args.merge_args(spec, f"{shard_dir}/by-key/{key}", f"{output_prefix(spec)}_{key}_document")
            cmds.append((PYTHON, f"{spec.megatron_lm.path}/tools/merge_datasets.py", *argv))
        return tuple(cmds), {"shard_dir": shard_dir, "json_keys": list(spec.data.json_keys)}
    if kind == "train" and spec.training.entrypoint == "megatron-lm":
        assert spec.megatron_lm is not None
        script = f"{spec.megatron_lm.path}/pretrain_gpt.py"
        # With the shipped lingjun_slurm in the tasks, pyrun registers the stack dump the hang
        # watchdog asks for (faulthandler on SIGUSR2) and then runs the script as python would.
        runner: tuple[Word, ...] = (PYTHON, "-m", "lingjun_slurm.injob.pyrun") if (
            spec.run.ship_code and spec.training.hang_timeout) else (PYTHON,)
        cmd = (*runner, script, *megatron_args.pretrain_args(spec))
        if spec.training.init_from:
            # Every task runs the wrapper: rank 0 converts training.init_from once (unless the run's
            # checkpoint directory already holds a checkpoint), the others wait for it, then each execs
            # pretrain_gpt.py, which takes it through --pretrained-checkpoint (injob/stages/hfinit.py).
            cmd = (PYTHON, "-m", "lingjun_slurm.injob.stages.hfinit", "--plan", PLAN_VAR, "--", *cmd)
        return (cmd,), {}
    return (own,), {}


def fault_vars(spec: Spec, res: StageResources, executor: str, launcher: tuple[Word, ...],
               log_dir: str, job_name: str) -> dict[str, Any]:
    """The train script's fault handling (docs/fault-tolerance.md): pre-flight on every node,
    the hang watchdog, bad-node exclusion. `launcher` is the train step's srun (its container
    flags start the pre-flight tasks in the same image)."""
    tr = spec.training
    slurm = executor == "slurm"
    in_image = spec.training.entrypoint == "builtin" or spec.run.ship_code  # lingjun_slurm inside the tasks
    preflight = slurm and in_image and (tr.preflight if tr.preflight is not None else bool(res.gpus_per_node))
    watchdog = None
    if tr.hang_timeout:
        megatron = tr.entrypoint == "megatron-lm"
        watchdog = {"format": "megatron" if megatron else "builtin",
                    # Megatron-LM prints its iteration lines to the job's output (print_rank_last);
                    # the builtin trainer appends one metrics.jsonl record per iteration on rank 0.
                    "progress": f"{log_dir}/{job_name}-" if megatron else "metrics.jsonl",
                    "timeout": tr.hang_timeout, "startup_timeout": tr.hang_startup_timeout,
                    "log_interval": tr.log_interval, "stacks": in_image}
    pre_launcher: tuple[Word, ...] = ()
    if preflight:
        pre_launcher = ("srun", Shell('--ntasks="${SLURM_JOB_NUM_NODES:-1}"'), "--ntasks-per-node=1",
                        "--kill-on-bad-exit=0", "--time=10", *[w for w in launcher[1:] if not (
                            isinstance(w, str) and w.startswith(("--kill-on-bad-exit", "--cpu-bind")))])
    # The collective smoke test: the train step's own layout and container flags (its ranks are the
    # training's ranks), a rank's failure not ending the others (each writes its rank file), and
    # srun --time (whole minutes, Slurm's unit) past the runner's own deadline as the backstop.
    collective_timeout = tr.preflight_collective_timeout if preflight else 0
    coll_launcher: tuple[Word, ...] = ()
    if collective_timeout:
        coll_launcher = ("srun", "--kill-on-bad-exit=0", f"--time={-(-collective_timeout // 60) + 1}",
                         *[w for w in launcher[1:] if not (isinstance(w, str) and w.startswith("--kill-on-bad-exit"))])
    return {"preflight": preflight, "preflight_launcher": pre_launcher, "watchdog": watchdog,
            "collective": bool(collective_timeout), "collective_launcher": coll_launcher,
            "log": f"{log_dir}/{job_name}-",  # + "$SLURM_JOB_ID.out": the job's output (sbatch --output)
            "exclude_max": tr.exclude_bad_nodes if slurm else 0, "drain": tr.drain_bad_nodes and slurm,
            "need": res.nodes}


def merge_in_preprocess(spec: Spec) -> bool:
    """The built-in data stage with one shard: no merge job; the preprocess task writes the merged
    outputs itself (a merge of one shard is that shard's bytes: hard links; docs/preprocessing.md)."""
    active = active_builtins(spec)
    return (spec.data.tool == "builtin" and spec.data.shards == 1 and "preprocess" in active
            and "merge" in active)


def _array(spec: Spec) -> str:
    """sbatch --array: 0-(n-1), with `%M` when data.max_running limits how many run at once
    (Slurm's syntax: sbatch(1) --array; slurmctld takes atoi() of what follows `%` as the array's
    max_run_tasks, src/slurmctld/job_mgr.c _create_job_array, slurm-22-05-8-1 lines 5019-5024).
    A limit at or above the task count limits nothing and is left out."""
    n = len(spec.data.inputs) if spec.data.tool == "megatron-lm" else spec.data.shards
    limit = spec.data.max_running
    return f"0-{n - 1}" + (f"%{limit}" if limit is not None and limit < n else "")


def settings(spec: Spec, cplan: ContainerPlan | None = None) -> dict[str, Any]:
    """What the stage code inside the jobs needs, fully resolved."""
    dump = spec.model_dump(mode="json")
    return {
        "container": {"image": spec.container.image, "cache_dir": cplan.cache_dir, "arch": None}
        if cplan is not None and cplan.staged else None,
        "data": {**dump["data"], "output_prefix": output_prefix(spec), "shard_dir": f"{output_prefix(spec)}.shards",
                 "merge_in_preprocess": merge_in_preprocess(spec),
                 "train_prefix": data_prefix(spec) if not spec.stages.train.skip or spec.data.prefix else None},
        "model": resolve_model(spec),
        "parallelism": dump["parallelism"],
        "training": _training_settings(spec, dump["training"]),
        "checkpoint": _checkpoint_settings(spec, dump["checkpoint"]),
        "megatron_lm": dump["megatron_lm"],
        "preflight": preflight_settings(spec),
        **_monitoring_settings(dump["monitoring"]),
    }


def _monitoring_settings(monitoring: dict[str, Any]) -> dict[str, Any]:
    """{"monitoring": {...}} when the spec (or clusters.yaml) sets a field, else nothing: plans of runs
    without it stay as they were (their golden files too)."""
    return {"monitoring": monitoring} if any(v is not None for v in monitoring.values()) else {}


def _training_settings(spec: Spec, training: dict[str, Any]) -> dict[str, Any]:
    """settings.training; with training.init_from also init_dir (where the train stage converts it)
    and init_hf (the Hugging Face directory). Without it the key is left out, so plans of runs
    without it stay as they were."""
    training = dict(training)
    if training.pop("init_from", None) is not None:
        training.update({"init_from": spec.training.init_from, "init_hf": init_from_path(spec),
                         "init_dir": init_dir(spec)})
    return training


def _checkpoint_settings(spec: Spec, ckpt: dict[str, Any]) -> dict[str, Any]:
    """settings.checkpoint, with export_hf resolved (its dir, the run's Hugging Face tokenizer
    directory when it has one) and left out when unset."""
    ckpt = {**ckpt, "dir": checkpoint_dir(spec)}
    exp = ckpt.pop("export_hf", None)
    if exp is not None:
        tok = spec.data.tokenizer
        tok_dir = None
        if tok is not None and tok.type == "huggingface" and tok.path:
            tok_dir = tok.path if not tok.path.endswith(".json") else tok.path.rsplit("/", 1)[0] or "/"
        ckpt["export_hf"] = {**exp, "dir": export_dir(spec), "tokenizer_dir": tok_dir,
                             "tokenizer_type": tok.type if tok is not None else None}
    return ckpt


def preflight_settings(spec: Spec) -> dict[str, Any]:
    """settings.preflight (lingjun_slurm/injob/preflight/__init__.py knobs()): the collective smoke
    test's bound, the network's floors (the profile's published single-node figures and one port's
    line rate, each with its source) and the variables the job sets (named when all is slow)."""
    net = network_env(spec)
    prof = network.get_profile(net.profile)
    refs = [{"op": r.op, "busbw_gbps": r.busbw_gbps, "size": r.size, "nodes": r.nodes, "gpus_per_node": r.gpus_per_node,
             "gpu": r.gpu, "source": r.source} for r in prof.nccl_references if r.gpu]
    port = ({"gbps": prof.port.gbps, "ports_per_node": prof.port.ports_per_node, "source": prof.port.source}
            if prof.port else None)
    return {"collective": {"timeout_s": spec.training.preflight_collective_timeout,
                           "profile": net.profile, "floors": refs, "port": port,
                           "network_vars": {v.name: v.value for v in net.vars}}}


def build_plan(spec: Spec, *, run_id: str | None = None, spec_sha256: str = "", source: str = "spec.yaml",
               reproduce: str = "", executor: str = "slurm") -> Plan:
    """executor "local" renders for the local executor: no container flags, a local launcher."""
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}")
    run_id = run_id or spec.run.name
    logs = log_dir(spec)
    net = network_env(spec)
    user_env = [EnvVar(k, v, "set in the spec") for k, v in spec.env.items()]
    pyxis = spec.container.runtime == "pyxis" and executor == "slurm"
    if pyxis and net.mounts:
        # Profiles may need host files inside the container (e.g. Azure's NCCL topology file).
        have = {parse_mount(m).dst for m in spec.container.mounts}
        extra = [m for m in net.mounts if parse_mount(m).dst not in have]
        spec = spec.model_copy(update={"container": spec.container.model_copy(
            update={"mounts": list(spec.container.mounts) + extra})})

    # Paths the batch shell itself reads or writes are host paths: map them through the mounts.
    mounts = mounts_with_workdir(spec.container, spec.run.workdir) if pyxis else []

    def on_host(path: str) -> str:
        return host_side(path, mounts)

    cplan = container_plan(spec, run_id, pyxis)
    stages: list[StagePlan] = []
    if cplan.staged:
        res = image_resources(spec)
        stages.append(StagePlan(
            name="image", kind="image", script="image.sbatch", job_name=f"{run_id}-image",
            sbatch=_sbatch(spec, f"{run_id}-image", res, logs, array=None, dependent=False, train=False),
            depends_on=(), resources=res, env=tuple(user_env), network=None,
            launcher=_launcher(spec, "image", [], False),
            commands=((PYTHON, "-m", "lingjun_slurm.stages", "image", "--plan", PLAN_VAR),), container=False,
            vars={"ship_code": spec.run.ship_code}))
    # Stages that already wait on the image stage (directly or through an earlier stage).
    after_image: set[str] = {"image"} if cplan.staged else set()
    last_builtin: str | None = None
    pending_before: list[Dependency] = []
    command_names = {c.name for c in spec.stages.commands}
    folded = merge_in_preprocess(spec)
    for item in stage_order(spec):
        if item == "merge" and folded:
            continue  # one shard: the preprocess task writes the merged outputs (stages/preprocess.py)
        if isinstance(item, CommandStage):
            res = command_resources(spec, item)
            if item.after and item.after in command_names:
                anchor: str | None = item.after
            elif item.after == "merge" and folded:
                anchor = "preprocess"
            elif item.after and item.after in active_builtins(spec):
                anchor = item.after
            else:
                anchor = last_builtin
            deps = (Dependency(anchor, item.dependency),) if anchor else ()
            stage_net = net if res.gpus_per_node else None
            env = tuple(user_env)
            use_container = pyxis and item.container
            cmd: tuple[Word, ...] = ("bash", "-c", item.command)
            kind, name, vars_ = "command", item.name, {}
            cmds: tuple[tuple[Word, ...], ...] = (cmd,)
            if item.before or any(d.stage == item.after for d in pending_before):
                pending_before.append(Dependency(item.name, "afterok"))
        else:
            kind = name = item
            res = builtin_resources(spec, item)
            deps = tuple(([Dependency(last_builtin, "afterok")] if last_builtin else []) + pending_before)
            pending_before = []
            stage_net = net if item == "train" else None
            env = tuple(user_env + (training_env(spec, res) if item == "train" else []))
            use_container = pyxis
            cmds, vars_ = _builtin_commands(spec, item)
            if "shard_dir" in vars_:
                vars_["host_shard_dir"] = on_host(vars_["shard_dir"])
            last_builtin = item
        if use_container and cplan.staged and not any(d.stage in after_image for d in deps):
            deps = (Dependency("image", "afterok"),) + deps
        if any(d.stage in after_image for d in deps):
            after_image.add(name)
        array = _array(spec) if kind == "preprocess" else None
        job_name = f"{run_id}-{name}"
        if use_container:
            vars_ = {**vars_, "staged_image": cplan.staged, "container_prefix": cplan.name_prefix,
                     "image_key": cplan.image_key}
        names = env_names(env, stage_net, kind == "train") + (
            ["LINGJUN_SITE"] if kind != "command" and spec.run.ship_code else []) + (
            ["LINGJUN_STACKS_DIR", "LINGJUN_NODES", "LINGJUN_STEPS_FILE"] if kind == "train" else []) + (
            ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] if kind == "train" and res.gpus_per_node and
            spec.training.hang_timeout else [])
        launcher = (_launcher(spec, kind, sorted(names), use_container, cplan, step_cpus(res))
                    if executor == "slurm"
                    else local_launcher(res, kind))
        if kind == "train":
            vars_ = {**vars_, "faults": fault_vars(spec, res, executor, launcher, logs, job_name)}
        stages.append(StagePlan(
            name=name, kind=kind, script=f"{name}.sbatch", job_name=job_name,
            sbatch=_sbatch(spec, job_name, res, logs, array=array, dependent=bool(deps), train=kind == "train"),
            depends_on=deps, resources=res, env=env, network=stage_net,
            launcher=launcher,
            commands=cmds, container=use_container,
            array=array, vars={**vars_, "ship_code": kind != "command" and spec.run.ship_code and executor == "slurm"},
        ))
    return Plan(run_id=run_id, name=spec.run.name, spec_sha256=spec_sha256, source=source, workdir=spec.run.workdir,
                log_dir=logs, checkpoint_dir=checkpoint_dir(spec),
                host_checkpoint_dir=on_host(checkpoint_dir(spec)), stages=tuple(stages), settings=settings(spec, cplan),
                reproduce=reproduce, executor=executor)
