"""plan["settings"] -> TrainSettings: everything the trainer reads from the plan, checked once.

Pure (no torch, no megatron): the plan was validated when it was rendered; this re-checks
only what the trainer relies on and fills the defaults the spec leaves open.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from . import TrainError

DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")


@dataclass(frozen=True)
class ModelSettings:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    seq_length: int
    max_position_embeddings: int
    vocab_size: int | None = None  # the tokenizer decides (train/data.py); set only for the null tokenizer
    normalization: str = "LayerNorm"
    activation: str = "gelu"
    position_embedding: str = "learned_absolute"
    rotary_base: int | None = None
    untie_embeddings: bool = False
    bias_linear: bool = True
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0


@dataclass(frozen=True)
class ParallelSettings:
    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    sequence_parallel: bool = False
    micro_batch: int = 1
    global_batch: int = 8
    distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False


@dataclass(frozen=True)
class Recompute:
    granularity: str | None = None
    method: str | None = None
    num_layers: int | None = None


@dataclass(frozen=True)
class TrainingSettings:
    iterations: int
    lr: float
    min_lr: float = 0.0
    lr_decay_style: str = "cosine"
    lr_warmup_iters: int = 0
    lr_decay_iters: int | None = None
    weight_decay: float = 0.1
    clip_grad: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    precision: str = "bf16"
    seed: int = 1234
    recompute: Recompute = field(default_factory=Recompute)
    log_interval: int = 10
    eval_interval: int = 1000
    eval_iters: int = 10
    straggler_action: str = "log"  # "off": no per-rank step times (steptimes.py)


@dataclass(frozen=True)
class CheckpointSettings:
    dir: str
    save_interval: int
    format: str = "torch_dist"


@dataclass(frozen=True)
class DataSettings:
    prefix: str
    split: str
    tokenizer: dict[str, Any]


@dataclass(frozen=True)
class TrainSettings:
    run_id: str
    run_dir: str
    model: ModelSettings
    parallel: ParallelSettings
    training: TrainingSettings
    checkpoint: CheckpointSettings
    data: DataSettings
    megatron_version: str | None = None  # plan settings.megatron_lm.version: the checkpoint conventions to follow
    gpus_per_node: int = 0  # what the train stage asked for: GPUs there and no CUDA here is an error, not the CPU

    @property
    def metrics_path(self) -> str:
        return os.path.join(self.run_dir, "metrics.jsonl")

    @property
    def dataset_cache(self) -> str:
        return os.path.join(self.run_dir, "dataset-cache")


def _pick(cls: type, raw: dict[str, Any], what: str) -> Any:
    names = set(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    values = {k: v for k, v in raw.items() if k in names and v is not None}
    try:
        return cls(**values)
    except TypeError as exc:
        raise TrainError(f"plan settings.{what} is incomplete: {exc}") from None


def _check(settings: TrainSettings) -> None:
    m, p, t = settings.model, settings.parallel, settings.training
    mp = p.tensor * p.pipeline * p.context
    if min(p.tensor, p.pipeline, p.context, p.micro_batch, p.global_batch) < 1:
        raise TrainError("parallelism sizes and batch sizes must be >= 1")
    if m.num_attention_heads % p.tensor or m.num_query_groups % p.tensor:
        raise TrainError(f"attention heads {m.num_attention_heads} and query groups {m.num_query_groups} "
                         f"must be divisible by tensor parallel {p.tensor}")
    if m.num_layers % p.pipeline:
        raise TrainError(f"num_layers {m.num_layers} must be divisible by pipeline parallel {p.pipeline}")
    if p.sequence_parallel and p.tensor == 1:
        raise TrainError("sequence_parallel needs tensor parallel > 1")
    if m.seq_length % (2 * p.context) and p.context > 1:
        raise TrainError(f"seq_length {m.seq_length} must be divisible by 2 x context parallel {p.context}")
    if m.position_embedding == "learned_absolute" and m.max_position_embeddings < m.seq_length:
        raise TrainError(f"max_position_embeddings {m.max_position_embeddings} < seq_length {m.seq_length}")
    if t.lr_decay_style not in DECAY_STYLES:
        raise TrainError(f"lr_decay_style {t.lr_decay_style!r} is not one of {', '.join(DECAY_STYLES)}")
    if t.precision not in ("bf16", "fp16", "fp32"):
        raise TrainError(f"precision {t.precision!r} is not bf16, fp16 or fp32")
    if mp < 1:
        raise TrainError("tensor x pipeline x context must be >= 1")


def _megatron_version(raw: Any) -> str | None:
    if isinstance(raw, dict) and raw.get("version") not in (None, ""):
        return str(raw["version"])
    return None


def _train_gpus(plan: dict[str, Any]) -> int:
    """GPUs per node the plan's train stage asks Slurm for (0: a CPU run, as the local executor's)."""
    for st in plan.get("stages") or []:
        if isinstance(st, dict) and st.get("kind") == "train":
            value = (st.get("resources") or {}).get("gpus_per_node")
            return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0
    return 0


def from_plan(plan: dict[str, Any]) -> TrainSettings:
    """The trainer's view of a plan; TrainError names the missing or inconsistent field."""
    try:
        s = plan["settings"]
        run_id, workdir = plan["run_id"], plan["workdir"]
    except (KeyError, TypeError):
        raise TrainError("the plan has no settings/run_id/workdir: re-render the run") from None
    for key in ("model", "parallelism", "training", "checkpoint", "data"):
        if not isinstance(s.get(key), dict):
            raise TrainError(f"plan settings.{key} is missing: re-render the run")
    tr = dict(s["training"])
    tr["recompute"] = _pick(Recompute, tr.get("recompute") or {}, "training.recompute")
    model = _pick(ModelSettings, s["model"], "model")
    if model.num_query_groups is None:
        model = ModelSettings(**{**model.__dict__, "num_query_groups": model.num_attention_heads})
    ckpt = s["checkpoint"]
    ckpt_dir = ckpt.get("dir") or plan.get("checkpoint_dir") or os.path.join(workdir, "checkpoints")
    data = s["data"]
    prefix = data.get("train_prefix") or data.get("prefix")
    if not prefix:
        raise TrainError("plan settings.data has no train_prefix (the preprocessed .bin/.idx prefix)")
    settings = TrainSettings(
        run_id=str(run_id),
        run_dir=os.path.join(workdir, "runs", str(run_id)),
        model=model,
        parallel=_pick(ParallelSettings, s["parallelism"], "parallelism"),
        training=_pick(TrainingSettings, tr, "training"),
        checkpoint=CheckpointSettings(dir=str(ckpt_dir), save_interval=int(ckpt.get("save_interval") or 1000),
                                      format=str(ckpt.get("format") or "torch_dist")),
        data=DataSettings(prefix=str(prefix), split=str(data.get("split") or "969,30,1"),
                          tokenizer=dict(data.get("tokenizer") or {})),
        megatron_version=_megatron_version(s.get("megatron_lm")),
        gpus_per_node=_train_gpus(plan),
    )
    if settings.checkpoint.format != "torch_dist":
        raise TrainError(f"checkpoint.format {settings.checkpoint.format!r}: the builtin trainer writes torch_dist")
    _check(settings)
    return settings
