"""Derived values shared by the checks and the planner (pure functions of a Spec)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..presets import model_presets
from ..common.timefmt import parse_time
from .models import BUILTIN_STAGES, CommandStage, Resources, Spec

ARCH_FIELDS = [name for name in (
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "seq_length",
    "max_position_embeddings", "vocab_size", "normalization", "activation", "position_embedding", "rotary_base",
    "untie_embeddings", "bias_linear", "hidden_dropout", "attention_dropout",
)]
REQUIRED_ARCH = ("num_layers", "hidden_size", "num_attention_heads", "seq_length")
ARCH_DEFAULTS: dict[str, Any] = {
    "normalization": "LayerNorm", "activation": "gelu", "position_embedding": "learned_absolute",
    "untie_embeddings": False, "bias_linear": True, "hidden_dropout": 0.1, "attention_dropout": 0.1,
}


def resolve_model(spec: Spec) -> dict[str, Any]:
    """Preset values overlaid with the spec's fields, plus derived defaults.

    Raises KeyError(preset) for an unknown preset (the checks report it first).
    """
    arch: dict[str, Any] = dict(ARCH_DEFAULTS)
    if spec.model.preset:
        preset = model_presets()[spec.model.preset]
        arch.update({k: v for k, v in preset.items() if k != "description"})
    arch.update({k: v for k, v in spec.model.model_dump(exclude={"preset"}).items() if v is not None})
    if "seq_length" in arch:
        arch.setdefault("max_position_embeddings", arch["seq_length"])
    if "hidden_size" in arch:
        arch.setdefault("ffn_hidden_size", 4 * arch["hidden_size"])
    if "num_attention_heads" in arch:
        arch.setdefault("num_query_groups", arch["num_attention_heads"])
    return {k: arch.get(k) for k in ARCH_FIELDS}


@dataclass(frozen=True)
class StageResources:
    partition: str | None
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    cpus_per_task: int | None
    mem: str | None
    time_s: int | None
    exclusive: bool


def merge_resources(spec: Spec, own: Resources | None, *, one_task_per_gpu: bool = False) -> StageResources:
    """A stage's resources: its own values over cluster.defaults over built-in defaults."""
    base = spec.cluster.defaults
    layers = [base] + ([own] if own is not None else [])

    def pick(field: str) -> Any:
        value = None
        for layer in layers:
            v = getattr(layer, field)
            if v is not None:
                value = v
        return value

    gpus = pick("gpus_per_node") or 0
    tasks = pick("tasks_per_node") or (gpus if gpus and one_task_per_gpu else 1)
    time = pick("time")
    exclusive = pick("exclusive")
    return StageResources(
        partition=pick("partition"),
        nodes=pick("nodes") or 1,
        tasks_per_node=tasks,
        gpus_per_node=gpus,
        cpus_per_task=pick("cpus_per_task"),
        mem=pick("mem"),
        time_s=parse_time(time) if time is not None else None,
        exclusive=spec.cluster.exclusive if exclusive is None else exclusive,
    )


def builtin_resources(spec: Spec, stage: str) -> StageResources:
    res = merge_resources(spec, spec.cluster.stages.get(stage), one_task_per_gpu=stage == "train")
    if stage != "train":
        # Only training is multi-task: the other built-ins are one task on one node (preprocess
        # scales out by array tasks), whatever cluster.defaults says for nodes and tasks.
        res = StageResources(res.partition, 1, 1, res.gpus_per_node, res.cpus_per_task, res.mem,
                             res.time_s, res.exclusive)
    return res


def command_resources(spec: Spec, stage: CommandStage) -> StageResources:
    return merge_resources(spec, stage.resources)


def active_builtins(spec: Spec) -> list[str]:
    return [name for name in BUILTIN_STAGES if not getattr(spec.stages, name).skip]


def stage_order(spec: Spec) -> list[str | CommandStage]:
    """Built-in stage names and command stages in chain order.

    A command stage sits just before/after its anchor (a built-in stage, or for `after:` an
    earlier command stage); several at one spot keep their order in the spec. Anchors that
    are skipped still fix the position.
    """
    commands = spec.stages.commands
    placed: set[str] = set()

    def followers(anchor: str) -> list[str | CommandStage]:
        out: list[str | CommandStage] = []
        for cmd in commands:
            if cmd.after == anchor and cmd.name not in placed:
                placed.add(cmd.name)
                out += [cmd, *followers(cmd.name)]
        return out

    order: list[str | CommandStage] = []
    for name in BUILTIN_STAGES:
        for cmd in commands:
            if cmd.before == name and cmd.name not in placed:
                placed.add(cmd.name)
                order += [cmd, *followers(cmd.name)]
        if not getattr(spec.stages, name).skip:
            order.append(name)
        order += followers(name)
    return order


def data_prefix(spec: Spec) -> str:
    """The Megatron --data-path prefix training reads."""
    if spec.stages.preprocess.skip and spec.data.prefix:
        return spec.data.prefix
    key = spec.data.train_key or spec.data.json_keys[0]
    return f"{output_prefix(spec)}_{key}_document"


def output_prefix(spec: Spec) -> str:
    return spec.data.output_prefix or f"{spec.run.workdir}/data/corpus"


def log_dir(spec: Spec) -> str:
    return spec.run.log_dir or f"{spec.run.workdir}/logs"


def checkpoint_dir(spec: Spec) -> str:
    return spec.checkpoint.dir or f"{spec.run.workdir}/checkpoints"
