"""Cross-field rules: everything pydantic's per-field validation cannot see.

Each rule returns Issues with the dotted field path the user must change. Rules are
pure functions of the Spec so they can be unit-tested one by one.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .. import container as container_mod
from .. import network
from ..common.errors import Issue, UsageError
from ..megatron import versions
from ..presets import model_presets
from .models import BUILTIN_STAGES, NAME_BYTES_MAX, PATH_BYTES_MAX, Spec, path_fits
from .resolve import builtin_resources, output_prefix, resolve_model

RESERVED_ENV = {"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}
RESERVED_ENV_PREFIXES = ("SLURM_", "LINGJUN_", "PYXIS_", "ENROOT_")
# Variables the stages need as the cluster or the image sets them. A spec's env, a network
# override and container.env_passthrough all *replace* them: the batch script exports the spec's
# value, and the job's variables are listed in --container-env, which pyxis sets over the image's
# own (pyxis_slurmstepd.c spank_import_container_env; tests/env.bats "--container-env overriding
# container variable", NVIDIA/pyxis 0.24.0).
STAGE_NEEDS = {
    "PATH": "the batch script runs srun, scontrol, squeue and python3 by name, and inside a container the "
            "image's PATH finds its python3",
    "LD_LIBRARY_PATH": "the image's value finds CUDA, NCCL and the RDMA libraries (nvidia/cuda images: "
                       "/usr/local/nvidia/lib:/usr/local/nvidia/lib64)",
    "PYTHONPATH": "the task wrapper puts the shipped lingjun_slurm in front of the image's own PYTHONPATH "
                  "(e.g. a Megatron-LM checkout); ship more code with run.ship_wheels",
    "PYTHONHOME": "python3 would look for its standard library there",
    "HOME": "pyxis mounts and resolves the user's home from it, and the image stage reads the enroot "
            "credentials under $HOME/.config/enroot",
    "BASH_ENV": "every `bash -c` of the stages (the task wrapper, command stages) would source that file first",
    "SHELLOPTS": "a read-only bash variable: exporting it ends the batch script (set -e)",
    "BASHOPTS": "a read-only bash variable: exporting it ends the batch script (set -e)",
    "CUDA_VISIBLE_DEVICES": "Slurm sets it for the GPUs it allocated; training runs one task per GPU on "
                            "cuda:LOCAL_RANK and needs all of them",
    "NVIDIA_VISIBLE_DEVICES": "enroot's nvidia hook decides from it which GPUs the container gets "
                              "(conf/hooks/98-nvidia.sh); training needs every allocated GPU",
    "MELLANOX_VISIBLE_DEVICES": "enroot's mellanox hook decides from it which InfiniBand devices the container "
                                "gets (conf/hooks/99-mellanox.sh); NCCL needs them",
}
# srun reads SRUN_* as its own options (src/srun/opt.c env_vars: SRUN_EXPORT_ENV overrides
# --export, SRUN_OUTPUT/SRUN_ERROR redirect the tasks' output, SRUN_CONTAINER...): the tool sets
# srun's options itself.
STAGE_NEEDS_PREFIXES = ("SRUN_",)
# (A NAME=VALUE string stays under MAX_ARG_STRLEN: values are at most TEXT_BYTES_MAX bytes and
# keys at most yamlpos.MAX_KEY_CHARS characters.)
INT64_MAX = 2**63 - 1


def stage_need(name: str) -> str | None:
    """Why a stage needs this variable as the cluster or image sets it (None: a spec may set it)."""
    if name in STAGE_NEEDS:
        return STAGE_NEEDS[name]
    if name.startswith(STAGE_NEEDS_PREFIXES):
        return "srun reads SRUN_* variables as its options (src/srun/opt.c), which the tool sets itself"
    return None

# sbatch options a spec may add. Everything the tool itself controls (job name, output,
# dependency, array, resources, requeue, signal, export...) is deliberately absent.
SBATCH_EXTRA_ALLOWED = frozenset({
    "mail-type", "mail-user", "comment", "exclude", "nodelist", "wckey", "licenses", "nice", "switches", "hint",
    "distribution", "gres-flags", "threads-per-core", "spread-job", "begin", "deadline", "acctg-freq", "profile",
    "mcs-label", "network", "core-spec", "cpu-freq", "gpus-per-task", "gpu-bind", "mem-bind", "sockets-per-node",
    "cores-per-socket", "ntasks-per-socket", "tmp", "priority", "tres-per-task", "gpu-freq", "container",
    "oversubscribe", "mem-per-gpu", "cpus-per-gpu",
})
# Stages the plan adds by itself (not in spec.stages), whose resources cluster.stages may set.
PLAN_ONLY_STAGES = ("image",)
SBATCH_VALUE_RE = re.compile(r"^[A-Za-z0-9._,:=@+/\[\]*-]+$")
URL_RE = re.compile(r"^[a-z][a-z0-9+.-]*://\S+$")

Rule = Callable[[Spec], list[Issue]]


def check_network(spec: Spec) -> list[Issue]:
    net = spec.cluster.network
    loc = ("cluster", "network")
    if not net.profile and not net.instance_type:
        names = ", ".join(sorted(network.profiles()))
        return [Issue(loc, f"choose a network profile ({names}) or an instance_type; "
                           "a wrong NCCL setup is slow or hangs, so there is no silent default")]
    issues: list[Issue] = []
    chosen = by_type = None
    if net.profile:
        try:
            chosen = network.get_profile(net.profile)
        except UsageError as exc:
            issues.append(Issue(loc + ("profile",), str(exc)))
    if net.instance_type:
        try:
            by_type = network.profile_for_instance(net.instance_type)
        except UsageError as exc:
            issues.append(Issue(loc + ("instance_type",), str(exc)))
        else:
            if chosen and chosen.name != by_type.name:
                issues.append(Issue(loc + ("instance_type",),
                                    f"instance type {net.instance_type} belongs to profile {by_type.name!r}, "
                                    f"not {chosen.name!r}; give one of the two"))
    for name, value in net.overrides.items():
        if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
            issues.append(Issue(loc + ("overrides", name), f"{name} is set by the tool, not by the network profile"))
        elif stage_need(name):
            issues.append(Issue(loc + ("overrides", name), f"an override would replace {name}, which the stages "
                                                           f"need as it is: {stage_need(name)}"))
        elif value is None and (chosen or by_type):
            refusal = network.unset_refusal(chosen or by_type, name)
            if refusal:
                issues.append(Issue(loc + ("overrides", name), f"null cannot unset {name}: {refusal}"))
    return issues


def check_sbatch(spec: Spec) -> list[Issue]:
    issues: list[Issue] = []
    for key, value in spec.cluster.sbatch_extra.items():
        loc = ("cluster", "sbatch_extra", key)
        if key not in SBATCH_EXTRA_ALLOWED:
            issues.append(Issue(loc, f"sbatch option {key!r} is not allowed here: the tool sets it itself or it is "
                                     f"unknown; allowed: {', '.join(sorted(SBATCH_EXTRA_ALLOWED))}"))
        elif not isinstance(value, bool) and not SBATCH_VALUE_RE.fullmatch(str(value)):
            issues.append(Issue(loc, "value goes on an #SBATCH line, which cannot be quoted: use letters, digits "
                                     "and . _ , : = @ + / [ ] * - only"))
    for stage, res in spec.cluster.stages.items():
        if stage in PLAN_ONLY_STAGES:
            for field in ("nodes", "tasks_per_node", "gpus_per_node"):
                if getattr(res, field):
                    issues.append(Issue(("cluster", "stages", stage, field),
                                        f"the {stage} stage is one CPU task on one node"))
            continue
        if stage in BUILTIN_STAGES and stage != "train":
            for field in ("nodes", "tasks_per_node"):
                if (getattr(res, field) or 1) > 1:
                    issues.append(Issue(("cluster", "stages", stage, field),
                                        f"the {stage} stage is one task on one node (preprocess scales out with "
                                        "data.shards)"))
        if stage not in BUILTIN_STAGES:
            issues.append(Issue(("cluster", "stages", stage),
                                f"unknown stage {stage!r}; resources here are for {', '.join(BUILTIN_STAGES)} "
                                "(command stages carry their own resources)"))
    return issues


def check_train_layout(spec: Spec) -> list[Issue]:
    """World size, tasks per GPU, and the TP x PP x CP x DP factorisation."""
    if spec.stages.train.skip:
        return []
    issues: list[Issue] = []
    res_loc = ("cluster", "stages", "train")
    res = builtin_resources(spec, "train")
    if res.gpus_per_node and res.tasks_per_node != res.gpus_per_node:
        issues.append(Issue(res_loc + ("tasks_per_node",),
                            f"training runs one task per GPU: tasks_per_node ({res.tasks_per_node}) must equal "
                            f"gpus_per_node ({res.gpus_per_node})"))
    if res.time_s is None:
        issues.append(Issue(res_loc + ("time",), "the train stage needs a time limit (here or in cluster.defaults): "
                                                 "it decides when to save before Slurm stops the job"))
    elif res.time_s <= 2 * spec.training.save_grace_s:
        issues.append(Issue(("training", "save_grace_s"),
                            f"save_grace_s ({spec.training.save_grace_s}) leaves no time to train within the train "
                            f"time limit ({res.time_s} s); it must be under half of it"))
    par = spec.parallelism
    world = res.nodes * res.tasks_per_node
    model_parallel = par.tensor * par.pipeline * par.context
    ploc = ("parallelism",)
    if world % model_parallel:
        issues.append(Issue(ploc + ("tensor",),
                            f"tensor x pipeline x context = {par.tensor} x {par.pipeline} x {par.context} = "
                            f"{model_parallel} must divide the world size {world} "
                            f"({res.nodes} nodes x {res.tasks_per_node} tasks)"))
        return issues
    dp = world // model_parallel
    if par.global_batch % (par.micro_batch * dp):
        issues.append(Issue(ploc + ("global_batch",),
                            f"global_batch ({par.global_batch}) must be divisible by micro_batch x data parallel "
                            f"= {par.micro_batch} x {dp} = {par.micro_batch * dp}"))
    if par.sequence_parallel and par.tensor == 1:
        issues.append(Issue(ploc + ("sequence_parallel",), "sequence parallelism needs tensor > 1"))
    if par.overlap_param_gather and not (par.distributed_optimizer and par.overlap_grad_reduce):
        issues.append(Issue(ploc + ("overlap_param_gather",),
                            "overlap_param_gather needs distributed_optimizer: true and overlap_grad_reduce: true"))
    if spec.training.entrypoint == "megatron-lm" and not res.gpus_per_node:
        issues.append(Issue(res_loc + ("gpus_per_node",), "Megatron-LM's pretrain_gpt.py needs GPUs; use "
                                                          "entrypoint: builtin for CPU runs"))
    return issues


def check_cpu_bind(spec: Spec) -> list[Issue]:
    if spec.training.cpu_bind != "profile" or spec.stages.train.skip:
        return []
    loc = ("training", "cpu_bind")
    try:
        prof = (network.get_profile(spec.cluster.network.profile) if spec.cluster.network.profile
                else network.profile_for_instance(spec.cluster.network.instance_type or ""))
    except UsageError:
        return []  # check_network reports it
    if prof.cpu_bind is None:
        return [Issue(loc, f"network profile {prof.name!r} publishes no CPU/GPU topology; give a --cpu-bind "
                           "value (cores, ldoms, map_ldom:..., mask_cpu:...) or leave it unset")]
    res = builtin_resources(spec, "train")
    if not res.exclusive:
        return [Issue(loc, "a binding for the whole node's CPUs needs whole nodes: set exclusive: true for the "
                           "train stage (or cluster.exclusive)")]
    tasks = res.tasks_per_node
    if tasks != prof.cpu_bind[0]:
        return [Issue(loc, f"profile {prof.name!r}'s binding is for {prof.cpu_bind[0]} tasks per node, the train "
                           f"stage runs {tasks}")]
    return []


def check_model(spec: Spec) -> list[Issue]:
    loc = ("model",)
    presets = model_presets()
    if spec.model.preset and spec.model.preset not in presets:
        return [Issue(loc + ("preset",), f"unknown preset {spec.model.preset!r}; known: {', '.join(sorted(presets))}")]
    arch = resolve_model(spec)
    issues = [Issue(loc + (name,), "required (or choose model.preset)") for name in
              ("num_layers", "hidden_size", "num_attention_heads", "seq_length") if arch.get(name) is None]
    if issues:
        return [] if spec.stages.train.skip else issues  # no training: no architecture needed
    par = spec.parallelism
    heads, groups = arch["num_attention_heads"], arch["num_query_groups"]
    if arch["hidden_size"] % heads:
        issues.append(Issue(loc + ("hidden_size",),
                            f"hidden_size ({arch['hidden_size']}) must be divisible by num_attention_heads ({heads})"))
    if heads % groups:
        issues.append(Issue(loc + ("num_query_groups",),
                            f"num_attention_heads ({heads}) must be divisible by num_query_groups ({groups})"))
    if not spec.stages.train.skip:
        if heads % par.tensor:
            issues.append(Issue(("parallelism", "tensor"),
                                f"num_attention_heads ({heads}) must be divisible by tensor ({par.tensor})"))
        if groups % par.tensor:
            issues.append(Issue(("parallelism", "tensor"),
                                f"num_query_groups ({groups}) must be divisible by tensor ({par.tensor})"))
        if arch["num_layers"] % par.pipeline:
            issues.append(Issue(("parallelism", "pipeline"),
                                f"num_layers ({arch['num_layers']}) must be divisible by pipeline ({par.pipeline})"))
        rc = spec.training.recompute
        layers = arch["num_layers"] // par.pipeline
        if rc.granularity == "full" and rc.method == "uniform" and rc.num_layers and layers % rc.num_layers:
            # megatron-core's _checkpointed_forward steps through the stage's layers num_layers at a
            # time and asks for layers past the end (transformer_block.py: custom(l, l + N), _get_layer)
            issues.append(Issue(("training", "recompute", "num_layers"),
                                f"uniform recompute of {rc.num_layers} layers per chunk must divide the {layers} "
                                "layers of each pipeline stage"))
        if arch["seq_length"] % (2 * par.context) and par.context > 1:
            issues.append(Issue(("parallelism", "context"),
                                f"seq_length ({arch['seq_length']}) must be divisible by 2 x context ({2 * par.context})"))
        if arch["max_position_embeddings"] < arch["seq_length"] and arch["position_embedding"] == "learned_absolute":
            issues.append(Issue(loc + ("max_position_embeddings",),
                                "max_position_embeddings must be at least seq_length with learned positions"))
    return issues


def check_training(spec: Spec) -> list[Issue]:
    tr, loc = spec.training, ("training",)
    issues: list[Issue] = []
    if tr.entrypoint == "megatron-lm" and tr.seed == 0 and not spec.stages.train.skip:
        issues.append(Issue(loc + ("seed",), "Megatron-LM refuses seed 0 (\"Seed (0) should be a positive "
                                             "integer\", _set_random_seed in megatron/training/initialize.py)"))
    # Megatron-LM asks its dataset builder for these sample counts (training.py core_v0.16.1:3295-3309;
    # train/data.py sample_counts the same), which numpy indexes as int64.
    gbs = spec.parallelism.global_batch
    evals = (tr.iterations // tr.eval_interval + 1) * tr.eval_iters
    if not spec.stages.train.skip and max(tr.iterations, evals) * gbs > INT64_MAX:
        field = "eval_iters" if evals > tr.iterations else "iterations"
        issues.append(Issue(loc + (field,), f"{field} asks for more samples than a 64-bit integer holds: "
                                            f"(iterations // eval_interval + 1) x eval_iters x global_batch = "
                                            f"{evals * gbs}, the dataset index Megatron builds counts them in int64"))
    if tr.min_lr > tr.lr:
        issues.append(Issue(loc + ("min_lr",), f"min_lr ({tr.min_lr}) must not exceed lr ({tr.lr})"))
    if tr.lr_warmup_iters >= tr.iterations:
        issues.append(Issue(loc + ("lr_warmup_iters",),
                            f"lr_warmup_iters ({tr.lr_warmup_iters}) must be below iterations ({tr.iterations})"))
    decay = tr.lr_decay_iters or tr.iterations
    if tr.lr_decay_iters is not None and tr.lr_warmup_iters >= decay:
        issues.append(Issue(loc + ("lr_decay_iters",),
                            f"lr_decay_iters ({decay}) must exceed lr_warmup_iters ({tr.lr_warmup_iters})"))
    if tr.lr_decay_style == "WSD" and tr.entrypoint == "megatron-lm":
        issues.append(Issue(loc + ("lr_decay_style",), "WSD needs Megatron-LM's --lr-wsd-decay-* settings, which "
                                                       "this version does not generate; use cosine or linear"))
    rc = tr.recompute
    if rc.method and rc.granularity != "full":
        issues.append(Issue(loc + ("recompute", "method"), "recompute.method applies to granularity: full only"))
    if rc.granularity == "full" and (not rc.method or not rc.num_layers):
        issues.append(Issue(loc + ("recompute",), "full recompute needs method (uniform|block) and num_layers"))
    if 0 < tr.hang_timeout < 10:
        issues.append(Issue(loc + ("hang_timeout",), f"hang_timeout {tr.hang_timeout} s is below the watchdog's "
                                                     "10 s resolution: give at least 10, or 0 for no watchdog"))
    if tr.preflight and tr.entrypoint == "megatron-lm" and not spec.run.ship_code:
        issues.append(Issue(loc + ("preflight",), "pre-flight runs lingjun_slurm inside the training image, which "
                                                  "needs run.ship_code: true with entrypoint: megatron-lm"))
    if tr.extra_args and tr.entrypoint != "megatron-lm":
        issues.append(Issue(loc + ("extra_args",), "extra_args are pretrain_gpt.py arguments: "
                                                   "they need entrypoint: megatron-lm"))
    return issues


def _needs_megatron_lm(spec: Spec) -> list[tuple[str, ...]]:
    users: list[tuple[str, ...]] = []
    if not spec.stages.train.skip and spec.training.entrypoint == "megatron-lm":
        users.append(("training", "entrypoint"))
    if not spec.stages.preprocess.skip and spec.data.tool == "megatron-lm":
        users.append(("data", "tool"))
    return users


def check_megatron_lm(spec: Spec) -> list[Issue]:
    users = _needs_megatron_lm(spec)
    if spec.megatron_lm is None:
        return [Issue(loc, "uses the image's Megatron-LM: add megatron_lm: {version: ..., path: ...} "
                           f"(supported floor {versions.FLOOR_TEXT})") for loc in users[:1]]
    raw = spec.megatron_lm.version
    if isinstance(raw, float):
        return [Issue(("megatron_lm", "version"), f"write the version in quotes, e.g. \"0.16.1\": YAML reads an "
                                                  f"unquoted version as the number {raw}")]
    try:
        version = versions.parse_version(raw)
    except ValueError as exc:
        return [Issue(("megatron_lm", "version"), str(exc))]
    tok = spec.data.tokenizer
    problem = versions.tokenizer_problem(tok.type, version) if tok is not None and users else None
    return [Issue(("data", "tokenizer", "type"), problem)] if problem else []


def check_data(spec: Spec) -> list[Issue]:
    data, st, loc = spec.data, spec.stages, ("data",)
    issues: list[Issue] = []
    if st.merge.skip != st.preprocess.skip:
        which = "merge" if not st.merge.skip else "preprocess"
        issues.append(Issue(("stages", which), "preprocess and merge go together: skip both (data ready, set "
                                               "data.prefix) or neither"))
    if data.train_key is not None and data.train_key not in data.json_keys:
        issues.append(Issue(loc + ("train_key",), f"train_key {data.train_key!r} is not one of json_keys "
                                                  f"{data.json_keys}"))
    if len(set(data.json_keys)) != len(data.json_keys):
        issues.append(Issue(loc + ("json_keys",), "json_keys must be unique"))
    if not st.preprocess.skip:
        if not data.inputs:
            issues.append(Issue(loc + ("inputs",), "preprocess needs at least one input (jsonl file or glob)"))
        if data.tool == "megatron-lm":
            for i, path in enumerate(data.inputs):
                if any(ch in path for ch in "*?["):
                    issues.append(Issue(loc + ("inputs", i), "tool: megatron-lm runs one array task per input "
                                                             "file: list files, not globs"))
            if data.inputs and data.shards not in (1, len(data.inputs)):
                issues.append(Issue(loc + ("shards",), f"tool: megatron-lm shards by input file: shards must be "
                                                       f"{len(data.inputs)} (the number of inputs) or left out"))
    elif not st.train.skip and data.prefix is None:
        issues.append(Issue(loc + ("prefix",), "preprocess is skipped: give the existing dataset prefix "
                                               "(e.g. /data/corpus_text_document) that training reads"))
    if not st.train.skip and float(data.split.split(",")[0]) == 0:
        issues.append(Issue(loc + ("split",), f"split {data.split!r} gives training no documents: the first "
                                              "weight is the train split"))
    if not st.preprocess.skip:
        base = output_prefix(spec)
        for key in data.json_keys:
            out = f"{base}_{key}_document.bin"  # and .idx: what merge writes (stages/merge.py)
            leaf = out.rsplit("/", 1)[-1]
            field = "output_prefix" if data.output_prefix else "json_keys"
            if len(leaf.encode()) > NAME_BYTES_MAX or len(out.encode()) > PATH_BYTES_MAX:
                issues.append(Issue(loc + (field,), f"the output file {leaf[:40]!r}... would be longer than Linux "
                                                    f"allows ({NAME_BYTES_MAX} bytes a name, {PATH_BYTES_MAX} a "
                                                    "path: ENAMETOOLONG)"))
                break
    tok = data.tokenizer
    if tok is not None:
        tloc = loc + ("tokenizer",)
        needs = {"huggingface": ["path"], "sentencepiece": ["path"], "gpt2-bpe": ["vocab_file", "merge_file"],
                 "null": ["vocab_size"]}[tok.type]
        for field in needs:
            if getattr(tok, field) is None:
                issues.append(Issue(tloc + (field,), f"tokenizer type {tok.type!r} needs {field}"))
        megatron_reads_it = (not st.preprocess.skip and data.tool == "megatron-lm") or \
            (not st.train.skip and spec.training.entrypoint == "megatron-lm")
        if tok.type == "huggingface" and tok.path and tok.path.endswith(".json") and megatron_reads_it:
            issues.append(Issue(tloc + ("path",), "Megatron-LM loads a HuggingFace tokenizer with from_pretrained: "
                                                  "give the directory that holds tokenizer.json"))
        if tok.add_special_tokens is not None and tok.type != "huggingface":
            issues.append(Issue(tloc + ("add_special_tokens",), "only huggingface tokenizers add special tokens"))
        for field in ("path", "vocab_file", "merge_file", "vocab_size"):
            if field not in needs and getattr(tok, field) is not None:
                issues.append(Issue(tloc + (field,), f"tokenizer type {tok.type!r} does not use {field}"))
    elif not (st.train.skip and st.preprocess.skip):
        issues.append(Issue(loc + ("tokenizer",), "preprocessing and training need a tokenizer"))
    return issues


def array_tasks(spec: Spec) -> int:
    """The preprocess array's task count (plan.py _array: one task per input file for megatron-lm,
    else one per shard); 0 when preprocess is skipped (no array is submitted)."""
    if spec.stages.preprocess.skip:
        return 0
    return len(spec.data.inputs) if spec.data.tool == "megatron-lm" else spec.data.shards


def check_array_size(spec: Spec, max_array_size: int | None) -> list[Issue]:
    """The preprocess array against the cluster's MaxArraySize (`scontrol show config`), when known.
    Slurm refuses an array whose largest index is >= MaxArraySize ("Invalid job array
    specification": src/slurmctld/job_mgr.c _parse_array_tok, slurm-22-05-8-1 lines 7815-7816),
    and MaxArraySize=0 disables arrays (_valid_array_inx, lines 7838-7841). Unknown (None): Slurm's
    default, 1001 (presets/slurm_limits.yaml), is only a hint: the cluster may set another."""
    from ..presets import load

    n = array_tasks(spec)
    if n == 0 or max_array_size is None:
        return []
    field = ("data", "inputs") if spec.data.tool == "megatron-lm" else ("data", "shards")
    if max_array_size == 0:
        return [Issue(field, "this cluster has job arrays disabled (MaxArraySize=0 in slurm.conf); the preprocess "
                             "stage is an array job")]
    if n - 1 >= max_array_size:
        default = load("slurm_limits.yaml")["max_array_size"]["default"]
        return [Issue(field, f"{n} preprocess array tasks need indices 0-{n - 1}, and this cluster's MaxArraySize="
                             f"{max_array_size} allows 0-{max_array_size - 1} (slurm.conf(5): the largest index "
                             f"is MaxArraySize-1; Slurm's default is {default}): use at most {max_array_size} "
                             f"shards, or ask the admin to raise MaxArraySize to at least {n}")]
    return []


def array_size_hint(spec: Spec) -> list[Issue]:
    """A warning where the cluster's MaxArraySize is unknown and the array needs more than Slurm's
    default allows (presets/slurm_limits.yaml): many clusters keep the default."""
    from ..presets import load

    n = array_tasks(spec)
    default = load("slurm_limits.yaml")["max_array_size"]["default"]
    if n - 1 < default:
        return []
    field = ("data", "inputs") if spec.data.tool == "megatron-lm" else ("data", "shards")
    return [Issue(field, f"{n} preprocess array tasks need MaxArraySize >= {n} in the cluster's slurm.conf; "
                         f"Slurm's default is {default} (the largest index is MaxArraySize-1)")]


def check_container(spec: Spec) -> list[Issue]:
    # SRC:DST strings get the path limits of {src, dst} (models.path_fits), with that message
    # instead of the Mount validation error container.parse_mount would pass on.
    too_long: list[Issue] = []
    for i, raw in enumerate(spec.container.mounts):
        if isinstance(raw, str):
            for path in raw.split(":")[:2]:
                try:
                    path_fits(path)
                except ValueError as exc:
                    too_long.append(Issue(("container", "mounts", i), str(exc)))
                    break
    taken = {issue.loc for issue in too_long}
    issues = too_long + [issue for issue in container_mod.lint(spec.container) if issue.loc not in taken]
    if spec.container.runtime == "pyxis" and not issues:
        problem = container_mod.workdir_mount_problem(spec.container, spec.run.workdir)
        if problem:
            issues.append(Issue(("container", "mounts", problem[0]), problem[1]))
    if spec.container.runtime == "none":
        for field in ("image", "workdir", "name"):
            if getattr(spec.container, field):
                issues.append(Issue(("container", field), "runtime is 'none': container options would be ignored"))
        if spec.container.mounts:
            issues.append(Issue(("container", "mounts"), "runtime is 'none': container options would be ignored"))
    return issues


def check_image_stage(spec: Spec) -> list[Issue]:
    """The image stage runs lingjun_slurm on the host's python3: it needs the shipped code."""
    c = spec.container
    if c.runtime == "pyxis" and c.stage == "auto" and c.image and not container_mod.is_squashfs_path(c.image) \
            and not spec.run.ship_code:
        return [Issue(("container", "stage"), "staging the image runs lingjun_slurm on a cluster host, which "
                                              "run.ship_code: false leaves without it: set stage: never, or "
                                              "ship_code: true")]
    return []


def check_env(spec: Spec) -> list[Issue]:
    issues: list[Issue] = []
    train_sets: dict[str, str] = {}
    if not spec.stages.train.skip:
        from ..plan import training_env  # plan imports this package: import at call time

        train_sets = {v.name: v.reason for v in training_env(spec, builtin_resources(spec, "train"))}
    for name in spec.env:
        if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
            issues.append(Issue(("env", name), f"{name} is set by Slurm or by the tool for each task"))
        elif name.startswith("NCCL_"):
            issues.append(Issue(("env", name), "NCCL variables belong in cluster.network.overrides, "
                                               "so that one block sets them"))
        elif stage_need(name):
            issues.append(Issue(("env", name), f"env would replace {name}, which the stages need as it is: "
                                               f"{stage_need(name)}"))
        elif name in train_sets:
            issues.append(Issue(("env", name), f"the train stage sets {name} itself after env ({train_sets[name]}), "
                                               "so this value would be lost there"))
    for i, name in enumerate(spec.container.env_passthrough):
        if stage_need(name):
            issues.append(Issue(("container", "env_passthrough", i),
                                f"passing {name} through would put the host's value over the image's, which the "
                                f"stages need: {stage_need(name)}"))
    return issues


def check_checkpoint(spec: Spec) -> list[Issue]:
    target = spec.checkpoint.copy_to
    if target and not (target.startswith("/") or URL_RE.fullmatch(target)):
        return [Issue(("checkpoint", "copy_to"), "expected an absolute path or a URL such as az://container/path")]
    return []


def _family_problem(spec: Spec) -> str | None:
    """Why the run's model has no Hugging Face counterpart here, or None (hf/families.py family_of:
    Llama or GPT-2 style, each setting reproduced exactly). families imports no torch."""
    from ..injob.checkpoint.hf import HFUnsupported
    from ..injob.checkpoint.hf.families import family_of

    try:
        family_of(resolve_model(spec))
    except HFUnsupported as exc:
        return str(exc)
    except KeyError:  # an unknown preset: check_model names it
        return None
    return None


def check_hf(spec: Spec) -> list[Issue]:
    """training.init_from and checkpoint.export_hf (docs/checkpoints.md, "Hugging Face export and import").

    init_from is converted by the train stage before its first iteration and loaded with finetune
    semantics. With the builtin trainer the train stage itself converts; with Megatron-LM a wrapper
    (python3 -m lingjun_slurm.injob.stages.hfinit, so lingjun_slurm must be in the tasks: run.ship_code)
    converts and then runs pretrain_gpt.py with --pretrained-checkpoint, which Megatron-LM reads only while
    --load holds no checkpoint (megatron/training/checkpointing.py load_checkpoint, core_v0.16.1:1494-1502:
    `if pretrained_dir is not None and not checkpoint_exists(load_dir): ... args.finetune = True`), so a
    requeue resumes from the run's own checkpoints. --finetune itself would be wrong here: it would reset
    every requeue to iteration 0 (checkpointing.py core_v0.16.1:1731, `if args.finetune or release:
    iteration = 0`)."""
    issues: list[Issue] = []
    tr = spec.training
    if tr.init_from:
        loc = ("training", "init_from")
        if spec.stages.train.skip:
            issues.append(Issue(loc, "init_from is converted and loaded by the train stage, which stages.train.skip "
                                     "leaves out"))
        if tr.entrypoint == "megatron-lm" and not spec.run.ship_code:
            issues.append(Issue(loc, "with entrypoint: megatron-lm the conversion runs lingjun_slurm inside the "
                                     "training image before pretrain_gpt.py: it needs run.ship_code: true"))
        if any(str(a).split("=", 1)[0] in ("--finetune", "--pretrained-checkpoint", "--load", "--no-load-optim",
                                           "--no-load-rng") for a in tr.extra_args):
            issues.append(Issue(("training", "extra_args"), "with init_from the tool sets how checkpoints load "
                                                            "(--load, --pretrained-checkpoint); --finetune, "
                                                            "--no-load-optim and --no-load-rng in extra_args would "
                                                            "also apply to every requeue's resume"))
        problem = _family_problem(spec)
        if problem:
            issues.append(Issue(loc, f"cannot start from a Hugging Face model: {problem}"))
    exp = spec.checkpoint.export_hf
    if exp is not None:
        loc = ("checkpoint", "export_hf")
        if spec.stages.checkpoint.skip:
            issues.append(Issue(loc, "the export runs in the checkpoint stage, which stages.checkpoint.skip leaves "
                                     "out (or export by hand: lingjun-slurm checkpoint export DIR --to huggingface OUT)"))
        problem = _family_problem(spec)
        if problem:
            issues.append(Issue(loc, f"cannot export to Hugging Face: {problem}"))
    return issues


def check_init_from_config(spec: Spec, runs_here: bool) -> tuple[list[Issue], list[Issue]]:
    """(errors, warnings): training.init_from's config.json against the spec's model, where this
    machine can read it (families.shape_mismatches). Each mismatch is placed at the spec's model field
    when the spec sets it, else at training.init_from. Not readable here: a warning (an error when the
    chain runs on this machine); the train stage checks it again on the nodes before converting."""
    import json
    import os

    from .models import init_from_path

    path = init_from_path(spec)
    if path is None or spec.stages.train.skip:
        return [], []
    loc = ("training", "init_from")
    cfg_path = os.path.join(path, "config.json")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        issue = Issue(loc, f"{cfg_path} does not exist on this machine" + (
            "" if runs_here else " (it must exist on the cluster's nodes)"))
        return ([issue], []) if runs_here else ([], [issue])
    except (OSError, ValueError) as exc:
        return [Issue(loc, f"cannot read {cfg_path}: {getattr(exc, 'strerror', None) or exc}")], []
    if not isinstance(cfg, dict):
        return [Issue(loc, f"{cfg_path} is not a JSON object")], []
    from ..injob.checkpoint.hf import HFUnsupported
    from ..injob.checkpoint.hf.families import shape_mismatches

    try:
        # vocab_size is the tokenizer's (the null tokenizer's count differs from the vocabulary by the eod
        # across Megatron versions): the train stage compares the padded sizes before converting.
        model = {k: v for k, v in resolve_model(spec).items() if k != "vocab_size"}
        mismatches = shape_mismatches(model, cfg)
    except HFUnsupported as exc:
        return [Issue(loc, f"{cfg_path}: {exc}")], []
    except KeyError:
        return [], []
    set_here = {k for k, v in spec.model.model_dump(exclude={"preset"}).items() if v is not None}
    errors = [Issue(("model", field) if field in set_here else loc,
                    f"{field} is {mine!r} here but {theirs!r} in {cfg_path}: the model must have the Hugging Face "
                    "model's shape (or leave it out and take the shape from the preset that matches)")
              for field, mine, theirs in mismatches]
    return errors, []


# Pseudo-filesystems of the kernel, where no run directory can be created (proc(5), sysfs(5)).
# (/dev is left alone: /dev/shm is a real tmpfs.)
PSEUDO_FS = ("/proc", "/sys")


def _path_problem(path: str, what: str) -> str | None:
    """Why `path` cannot be (or hold) a directory of this run on this machine, or None. Only what
    the local filesystem shows is judged: a path that does not exist yet is fine (submit makes it).
    The first existing component that is not a directory is named; so is a dangling symlink."""
    import os

    norm = os.path.normpath(path)
    if norm == "/":
        return f"{what} is the root directory /: the run would write runs/, logs/ and checkpoints/ into /"
    resolved = os.path.realpath(norm)
    for base in PSEUDO_FS:
        for p in {norm, resolved}:
            if p == base or p.startswith(base + "/"):
                shown = f"{norm} (-> {resolved})" if p == resolved != norm else norm
                return f"{what} {shown} is under {base}, a kernel pseudo-filesystem: give a directory on real storage"
    parts = norm.split("/")
    for n in range(2, len(parts) + 1):
        here = "/".join(parts[:n])
        if os.path.islink(here) and not os.path.exists(here):
            return f"{here} is a symlink to {os.readlink(here)!r}, which does not exist (dangling): fix or remove it"
        if os.path.lexists(here) and not os.path.isdir(here):
            kind = "a file" if os.path.isfile(here) else "not a directory"
            return (f"{here} is {kind}, not a directory" if here == norm
                    else f"{here} is {kind}, so {what} {norm} cannot be a directory")
        if not os.path.lexists(here):
            return None
    return None


def check_workdir(spec: Spec) -> list[Issue]:
    """run.workdir and the directories the run makes in it (runs/, logs/ or run.log_dir): refused at
    validation when this machine shows they cannot be directories (a file, a dangling symlink, /,
    /proc). On a cluster reached with --host the same path is checked there when submit writes it."""
    from .resolve import log_dir

    issues: list[Issue] = []
    workdir = spec.run.workdir
    problem = _path_problem(workdir, "the workdir")
    if problem:
        return [Issue(("run", "workdir"), problem)]
    for sub in ("runs",):
        problem = _path_problem(f"{workdir.rstrip('/')}/{sub}", f"{sub}/ in run.workdir")
        if problem:
            issues.append(Issue(("run", "workdir"), problem))
    logs = log_dir(spec)
    problem = _path_problem(logs, "run.log_dir" if spec.run.log_dir else "logs/ in run.workdir")
    if problem:
        issues.append(Issue(("run", "log_dir") if spec.run.log_dir else ("run", "workdir"), problem))
    return issues


def check_stages(spec: Spec) -> list[Issue]:
    issues: list[Issue] = []
    seen: set[str] = set()
    for i, cmd in enumerate(spec.stages.commands):
        loc = ("stages", "commands", i)
        if cmd.name in BUILTIN_STAGES:
            issues.append(Issue(loc + ("name",), f"{cmd.name!r} is a built-in stage name"))
        if cmd.name in seen:
            issues.append(Issue(loc + ("name",), f"duplicate stage name {cmd.name!r}"))
        seen.add(cmd.name)
        if (cmd.before is None) == (cmd.after is None):
            issues.append(Issue(loc, "give exactly one of before: or after: (a built-in stage name)"))
        elif cmd.after is not None and cmd.after not in BUILTIN_STAGES and cmd.after not in seen - {cmd.name}:
            issues.append(Issue(loc + ("after",), f"{cmd.after!r} is neither a built-in stage (preprocess, merge, "
                                                  "train, checkpoint) nor an earlier command stage"))
    all_skipped = all(getattr(spec.stages, n).skip for n in BUILTIN_STAGES)
    if all_skipped and not spec.stages.commands:
        issues.append(Issue(("stages",), "every stage is skipped: nothing to run"))
    return issues


RULES: tuple[Rule, ...] = (check_network, check_sbatch, check_container, check_image_stage, check_env,
                           check_megatron_lm, check_data, check_model, check_cpu_bind, check_train_layout,
                           check_training, check_checkpoint, check_hf, check_stages, check_workdir)


def check(spec: Spec) -> list[Issue]:
    issues: list[Issue] = []
    for rule in RULES:
        issues += rule(spec)
    return issues


def check_local_paths(spec: Spec, runs_here: bool) -> tuple[list[Issue], list[Issue]]:
    """(errors, warnings) for the files the built-in stages read, looked up on this machine
    (issue 26 item 6; docs/status-reasons.md): data.inputs (a glob must match a file, a path must
    be a file), the tokenizer's files (data.tokenizer.path / vocab_file / merge_file, as
    data/tokenizer.py opens them) and, with preprocess skipped, data.prefix's .bin/.idx.

    Not a RULE: what exists depends on the machine, not on the spec alone. runs_here: the chain
    runs on this machine (the local executor): a missing file is an error. Otherwise (Slurm, --host,
    --cluster) the files live on the cluster, which may not mount them here: a warning. A file a
    command stage may write first (one that runs before preprocess, like the tiny example's
    make-corpus) is a warning in both cases."""
    import glob
    import os

    data, st = spec.data, spec.stages
    errors: list[Issue] = []
    warnings: list[Issue] = []
    early = {c.name for c in st.commands if c.before == "preprocess"}
    grew = True
    while grew:  # commands chained after those run before preprocess too
        more = {c.name for c in st.commands if c.after in early and c.name not in early}
        early |= more
        grew = bool(more)

    def missing(loc: tuple[str | int, ...], message: str, made_by: set[str]) -> None:
        if made_by:
            warnings.append(Issue(loc, f"{message} on this machine yet; stage {', '.join(sorted(made_by))} runs "
                                       "before and may write it"))
        elif runs_here:
            errors.append(Issue(loc, f"{message} on this machine"))
        else:
            warnings.append(Issue(loc, f"{message} on this machine (it must exist on the cluster's nodes)"))

    if not st.preprocess.skip:
        for i, pattern in enumerate(data.inputs):
            if glob.has_magic(pattern):
                if not any(os.path.isfile(p) for p in glob.iglob(pattern)):
                    missing(("data", "inputs", i), f"input {pattern!r} matches no file", early)
            elif not os.path.exists(pattern):
                missing(("data", "inputs", i), f"input {pattern!r} does not exist", early)
            elif not os.path.isfile(pattern):
                errors.append(Issue(("data", "inputs", i), f"input {pattern!r} is not a file"))
    tok = data.tokenizer
    if tok is not None and not (st.preprocess.skip and st.train.skip):
        files: list[tuple[str, str | None]] = []
        if tok.type in ("huggingface", "sentencepiece"):
            path = tok.path
            if tok.type == "huggingface" and path and os.path.isdir(path):
                path = os.path.join(path, "tokenizer.json")  # data/tokenizer.py hf_tokenizer_json
            files.append(("path", path))
        elif tok.type == "gpt2-bpe":
            files += [("vocab_file", tok.vocab_file), ("merge_file", tok.merge_file)]
        for field, path in files:
            if path and not os.path.isfile(path):
                what = "is not a file" if os.path.exists(path) else "does not exist"
                missing(("data", "tokenizer", field), f"tokenizer file {path!r} {what}", set())
    if st.preprocess.skip and not st.train.skip and data.prefix:
        for ext in (".bin", ".idx"):
            if not os.path.isfile(data.prefix + ext):
                missing(("data", "prefix"), f"dataset file {data.prefix + ext!r} does not exist",
                        {c.name for c in st.commands if c.before in ("train",)})
                break
    if not runs_here:  # the chain goes to a Slurm cluster whose MaxArraySize is not known here
        warnings += array_size_hint(spec)
    hf_errors, hf_warnings = check_init_from_config(spec, runs_here)
    return errors + hf_errors, warnings + hf_warnings
