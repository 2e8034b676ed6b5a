"""`lingjun-slurm plan`: the train stage's memory per GPU, time and size, from the rendered plan.

Pure: the plan (lingjun_slurm.plan.build_plan) and the spec's `planning` section in, numbers out;
no torch. The model as the trainer will build it comes from the same resolution the train stage
runs (lingjun_slurm.injob.train.settings.from_plan), so presets, defaults and derived sizes are the
trainer's own. Memory: planner/memory.py. FLOPs: Megatron-LM's num_floating_point_operations
(train/metrics.py flops_per_sample, what the trainer's MFU uses).

Every input the estimate depends on is in `inputs` with where it came from; one that could not
be known here is in `unknown`, and then `fits` is only as certain as it says (memory.fits is null
when the GPU is unknown). docs/planning.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ..common.bytesfmt import human_bytes
from ..gpus import GPU, GPUS, PROFILE_GPUS
from .memory import Breakdown, Layout, PlanError, Recompute, Shape, estimate

GB = 10 ** 9


@dataclass(frozen=True)
class Inputs:
    shape: Shape
    layout: Layout
    recompute: Recompute
    precision: str
    attention: str
    gpu: Optional[GPU]
    world_size: int
    gpus_per_node: int
    iterations: int
    global_batch: int
    margin: float
    mfu: float
    storage_gbps: float
    said: dict[str, Any] = field(default_factory=dict)  # input -> {"value", "source"}
    unknown: tuple[str, ...] = ()
    cpu: bool = False  # no GPUs: the CPU's kernels (memory.py cpu=True), host memory
    vocab_size: int = 0  # the tokenizer's, before padding (the recommendation pads it for another TP)
    model: Any = None  # the trainer's ModelSettings (train/settings.py), for the FLOPs


@dataclass(frozen=True)
class Estimate:
    inputs: Inputs
    memory: Breakdown
    recommendation: Optional[dict[str, Any]]
    flops_per_iteration: float
    tokens_per_iteration: int
    checkpoint_bytes: int

    @property
    def usable_bytes(self) -> Optional[int]:
        gpu = self.inputs.gpu
        return None if gpu is None else int(gpu.memory_bytes * (1 - self.inputs.margin))

    @property
    def fits(self) -> Optional[bool]:
        usable = self.usable_bytes
        return None if usable is None else self.memory.total <= usable

    @property
    def certain(self) -> bool:
        """Every input known: what `submit` may refuse on."""
        return not self.inputs.unknown and self.inputs.gpu is not None

    def seconds_per_iteration(self) -> Optional[float]:
        gpu = self.inputs.gpu
        if gpu is None or self.inputs.precision == "fp32":  # the table's peak is BF16/FP16's
            return None
        return self.flops_per_iteration / (self.inputs.world_size * gpu.peak_bf16_tflops * 1e12 * self.inputs.mfu)

    def to_json(self) -> dict[str, Any]:
        i, m = self.inputs, self.memory
        step = self.seconds_per_iteration()
        hours = None if step is None else step * i.iterations / 3600
        return {
            "schema": 1,
            "inputs": i.said,
            "unknown": list(i.unknown),
            "memory": {
                "per_gpu_bytes": m.per_gpu_bytes(),
                "gpu_bytes": i.gpu.memory_bytes if i.gpu else None,
                "usable_bytes": self.usable_bytes,
                "margin": i.margin,
                "fits": self.fits,
                "stage": m.stage,
                "parameters_on_gpu": m.parameters,
                "activation_terms": dict(m.activation_terms),
            },
            "recommendation": self.recommendation,
            "throughput": {
                "flops_per_iteration": self.flops_per_iteration,
                "tokens_per_iteration": self.tokens_per_iteration,
                "mfu": i.mfu,
                "seconds_per_iteration": step,
                "tokens_per_second": None if step is None else self.tokens_per_iteration / step,
                "hours_to_iterations": hours,
                "gpu_hours": None if hours is None else hours * i.world_size,
            },
            "checkpoint": {
                "bytes": self.checkpoint_bytes,
                "storage_gbps": i.storage_gbps,
                "seconds_per_save": self.checkpoint_bytes / (i.storage_gbps * GB),
            },
        }


def _vocab(settings: Any, planning: Any, read_tokenizer: bool) -> tuple[Optional[int], str]:
    """The tokenizer's vocabulary, as the trainer will find it (train/data.py dataset_tokenizer).

    read_tokenizer: load tokenizer files from this machine's disk (`plan`). validate and submit
    do not: loading a tokenizer costs time on every validate, its packages (tokenizers,
    sentencepiece) are optional for the CLI, and with --host the files that count are the
    cluster's. Then only the null tokenizer's vocab_size (in the spec) or planning.vocab_size is known."""
    if planning.vocab_size:
        return planning.vocab_size, "planning.vocab_size"
    tok_settings = settings.data.tokenizer or {}
    if tok_settings.get("type") == "null" and tok_settings.get("vocab_size"):
        # The null tokenizer's vocabulary is vocab_size + 1: its eod is the id after the last
        # (Megatron-LM _NullTokenizer.vocab_size, megatron/training/tokenizer/tokenizer.py:813-836 at
        # core_v0.16.1; data/tokenizer.py build() gives the trainer the same), and the trainer pads
        # that (train/entry.py: padded_vocab_size(max(tokenizer.vocab_size, model.vocab_size), tp)).
        return (int(tok_settings["vocab_size"]) + 1,
                "data.tokenizer.vocab_size + 1 (the null tokenizer's eod, as Megatron-LM's _NullTokenizer)")
    if not read_tokenizer:
        return None, "the tokenizer's files are not read by validate and submit"
    from ..injob.data.tokenizer import TokenizerSpec, build

    try:
        tok = build(TokenizerSpec.from_settings(tok_settings), need_eod=False)
    except Exception as exc:  # DataError, OSError, a missing optional package, a damaged file
        return None, f"the tokenizer cannot be read here ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
    return int(tok.vocab_size), f"the {tok.spec.type} tokenizer"


def inputs(plan: Any, planning: Any, read_tokenizer: bool = True) -> Inputs:
    """The estimate's inputs from a Plan (build_plan) and the spec's PlanningSpec."""
    from ..injob.train.model import padded_vocab_size
    from ..injob.train.settings import from_plan

    train = next((st for st in plan.stages if st.kind == "train"), None)
    if train is None:
        raise PlanError("the spec has no train stage: nothing to plan")
    settings = from_plan(plan.to_json())
    res = train.resources
    world = res.nodes * res.tasks_per_node
    m, p, t = settings.model, settings.parallel, settings.training
    said: dict[str, Any] = {}
    unknown: list[str] = []

    def say(name: str, value: Any, source: str) -> None:
        said[name] = {"value": value, "source": source}

    vocab, vsource = _vocab(settings, planning, read_tokenizer)
    if vocab is None:
        vocab = 128256 if m.vocab_size is None else m.vocab_size
        unknown.append("vocab_size")
        vsource += f"; assumed {vocab} (set planning.vocab_size)"
    vocab = max(vocab, m.vocab_size or 0)
    padded = padded_vocab_size(vocab, p.tensor)
    say("vocab_size", vocab, vsource)
    say("padded_vocab_size", padded, "Megatron-LM's padding to a multiple of 128 x TP")
    shape = Shape(num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
                  ffn_hidden_size=m.ffn_hidden_size, seq_length=m.seq_length, padded_vocab_size=padded,
                  num_query_groups=m.num_query_groups, swiglu=m.activation == "swiglu",
                  untie_embeddings=m.untie_embeddings, bias_linear=m.bias_linear, normalization=m.normalization,
                  learned_position_embeddings=m.position_embedding == "learned_absolute",
                  max_position_embeddings=m.max_position_embeddings, hidden_dropout=m.hidden_dropout,
                  attention_dropout=m.attention_dropout)
    model_parallel = p.tensor * p.pipeline * p.context
    if world % model_parallel:
        raise PlanError(f"tensor {p.tensor} x pipeline {p.pipeline} x context {p.context} does not divide the "
                        f"train stage's {world} GPUs")
    dp = world // model_parallel
    if p.global_batch % (p.micro_batch * dp):
        raise PlanError(f"global_batch {p.global_batch} is not a multiple of micro_batch {p.micro_batch} x data "
                        f"parallel {dp}")
    layout = Layout(tensor=p.tensor, pipeline=p.pipeline, context=p.context, data=dp,
                    sequence_parallel=p.sequence_parallel, micro_batch=p.micro_batch,
                    num_microbatches=p.global_batch // (p.micro_batch * dp),
                    distributed_optimizer=p.distributed_optimizer)
    say("world_size", world, f"train stage: {res.nodes} nodes x {res.tasks_per_node} tasks")
    say("data_parallel", dp, "world / (tensor x pipeline x context)")
    say("num_microbatches", layout.num_microbatches, "global_batch / (micro_batch x data parallel)")
    recompute = Recompute(t.recompute.granularity, t.recompute.method, t.recompute.num_layers)
    say("recompute", {"granularity": recompute.granularity, "method": recompute.method,
                      "num_layers": recompute.num_layers}, "training.recompute")
    say("precision", t.precision, "training.precision")

    te = planning.transformer_engine
    cpu = not res.gpus_per_node
    if cpu:
        attention, asource = "local", "no GPUs in the train stage: megatron-core's local attention on the CPU"
        te = None
    elif te is False:  # without TE megatron-core runs its own unfused attention (train/model.py layer_spec)
        attention = "local"
        asource = "planning.transformer_engine: false" + (
            " (planning.attention: flash needs TransformerEngine here)" if planning.attention == "flash" else "")
    else:
        if planning.attention:
            attention, asource = planning.attention, "planning.attention"
        else:
            attention = "flash"
            asource = "planning.transformer_engine: true" if te else "assumed: TransformerEngine's fused attention"
        if te is None:
            unknown.append("transformer_engine")
    say("attention", attention, asource)
    say("transformer_engine", te, "planning.transformer_engine" if te is not None else "unknown")

    profile = train_profile(plan)
    gpu_name = None if cpu else planning.gpu or PROFILE_GPUS.get(profile or "")
    gpu = GPUS.get(gpu_name) if gpu_name else None
    gsource = ("planning.gpu" if planning.gpu else f"network profile {profile}") if gpu else \
        f"unknown: network profile {profile or 'none'} does not name one GPU (set planning.gpu)"
    if cpu:
        gsource = "none: the train stage asks for no GPUs (it runs on the CPU)"
    elif gpu is None:
        unknown.append("gpu")
    say("gpu", gpu.name if gpu else None, gsource)
    if gpu:
        say("gpu_memory_mib", gpu.memory_mib, gpu.memory_source)
        say("peak_bf16_tflops", gpu.peak_bf16_tflops, gpu.peak_source)
    say("margin", planning.margin, "planning.margin")
    say("mfu", planning.mfu, "planning.mfu (assumed)")
    say("storage_gbps", planning.storage_gbps, "planning.storage_gbps (assumed)")
    return Inputs(shape=shape, layout=layout, recompute=recompute, precision=t.precision, attention=attention,
                  gpu=gpu, world_size=world, gpus_per_node=res.gpus_per_node or res.tasks_per_node,
                  iterations=t.iterations, global_batch=p.global_batch, margin=planning.margin, mfu=planning.mfu,
                  storage_gbps=planning.storage_gbps, said=said, unknown=tuple(unknown), cpu=cpu,
                  vocab_size=vocab, model=m)


def train_profile(plan: Any) -> Optional[str]:
    """The network profile of the plan's train stage, if it has one."""
    train = next((st for st in plan.stages if st.kind == "train"), None)
    net = getattr(train, "network", None)
    return getattr(net, "profile", None) if net is not None else None


def _memory(i: Inputs, recompute: Recompute, layout: Optional[Layout] = None,
            shape: Optional[Shape] = None) -> Breakdown:
    return estimate(shape or i.shape, layout or i.layout, recompute, i.precision, i.attention, cpu=i.cpu)


def recommend(i: Inputs, current: Breakdown) -> Optional[dict[str, Any]]:
    """None when the plan fits (or the GPU is unknown); else the fewest fully recomputed layers per
    pipeline stage (method block: the first N layers of each stage keep only their input) that
    fit, else the smallest tensor / pipeline change (the GPU count stays, data parallel shrinks)
    that fits, with or without recompute."""
    if i.gpu is None:
        return None
    usable = int(i.gpu.memory_bytes * (1 - i.margin))
    if current.total <= usable:
        return None
    layers = i.shape.num_layers // i.layout.pipeline
    need = f"needs {human_bytes(current.total)} of {human_bytes(usable)} usable"
    found = _fewest_block_layers(i, i.shape, i.layout, usable)
    if found is not None:
        n, got = found
        return _advice(Recompute("full", "block", n), i.layout, got,
                       f"{need}; full recompute of {n} of {layers} layers per pipeline stage brings it to "
                       f"{human_bytes(got.total)}")
    for tp, pp in _layouts(i):
        moved = _relayout(i, tp, pp)
        if moved is None:
            continue
        shape, layout = moved
        try:
            got = _memory(i, i.recompute, layout, shape)
        except PlanError:  # e.g. a uniform recompute chunk that does not divide the new stage
            got = None
        if got is not None and got.total <= usable:
            return _advice(i.recompute, layout, got,
                           f"{need}; tensor {tp} x pipeline {pp} brings it to {human_bytes(got.total)}")
        found = _fewest_block_layers(i, shape, layout, usable)
        if found is not None:
            n, got = found
            return _advice(Recompute("full", "block", n), layout, got,
                           f"{need}; recompute alone is not enough: tensor {tp} x pipeline {pp} with full recompute "
                           f"of {n} of {i.shape.num_layers // pp} layers per stage brings it to {human_bytes(got.total)}")
    return {"recompute": None, "tensor": None, "pipeline": None, "sequence_parallel": None,
            "reason": f"{need}; no recompute, tensor or pipeline size on {i.world_size} GPUs fits: more GPUs, a "
                      "smaller micro_batch or seq_length"}


def _fewest_block_layers(i: Inputs, shape: Shape, layout: Layout, usable: int) -> Optional[tuple[int, Breakdown]]:
    """The fewest layers per stage that full block recompute needs to fit, by bisection (the
    memory falls as more layers keep only their input), or None when all of them do not fit."""
    layers = shape.num_layers // layout.pipeline
    best = None
    lo, hi = 1, layers
    while lo <= hi:
        n = (lo + hi) // 2
        got = _memory(i, Recompute("full", "block", n), layout, shape)
        if got.total <= usable:
            best, hi = (n, got), n - 1
        else:
            lo = n + 1
    return best


def _layouts(i: Inputs) -> list[tuple[int, int]]:
    """(tensor, pipeline) candidates in order of how much they change: the product, then TP first.
    TP stays inside a node (at most gpus_per_node) and divides the heads and query groups; PP
    divides the layers; both fit in the world."""
    tps = [tp for tp in (1, 2, 4, 8, 16) if tp <= max(i.gpus_per_node, 1)
           and not i.shape.num_attention_heads % tp and not i.shape.groups % tp]
    pps = [pp for pp in range(1, min(i.shape.num_layers, i.world_size) + 1) if not i.shape.num_layers % pp]
    out = [(tp, pp) for tp in tps for pp in pps if (tp, pp) != (i.layout.tensor, i.layout.pipeline)
           and tp * pp * i.layout.context <= i.world_size]
    return sorted(out, key=lambda c: (c[0] * c[1], c[1], c[0]))


def _relayout(i: Inputs, tp: int, pp: int) -> Optional[tuple[Shape, Layout]]:
    """The shape (the vocabulary padded for the new TP) and layout on the same GPUs, or None when
    the sizes do not divide. Sequence parallel goes with TP > 1 (it only lowers memory there)."""
    from ..injob.train.model import padded_vocab_size

    mp = tp * pp * i.layout.context
    if i.world_size % mp:
        return None
    dp = i.world_size // mp
    if i.global_batch % (i.layout.micro_batch * dp):
        return None
    shape = replace(i.shape, padded_vocab_size=padded_vocab_size(i.vocab_size, tp))
    return shape, replace(i.layout, tensor=tp, pipeline=pp, data=dp, sequence_parallel=tp > 1,
                          num_microbatches=i.global_batch // (i.layout.micro_batch * dp))


def _advice(rc: Recompute, layout: Layout, got: Breakdown, reason: str) -> dict[str, Any]:
    return {"recompute": ({"granularity": rc.granularity, "method": rc.method, "num_layers": rc.num_layers}
                          if rc.granularity else None),
            "tensor": layout.tensor, "pipeline": layout.pipeline, "sequence_parallel": layout.sequence_parallel,
            "reason": reason, "per_gpu_bytes": got.per_gpu_bytes()["total"]}


def make(plan: Any, planning: Any, read_tokenizer: bool = True) -> Estimate:
    """The estimate for a Plan and the spec's planning section (PlanError: a layout that cannot work)."""
    from ..injob.train.metrics import flops_per_sample

    i = inputs(plan, planning, read_tokenizer)
    got = _memory(i, i.recompute)
    flops = flops_per_sample(i.model, i.shape.padded_vocab_size) * i.global_batch
    params = _total_parameters(i)
    state = 12 if i.precision != "fp32" else 8
    return Estimate(inputs=i, memory=got, recommendation=recommend(i, got), flops_per_iteration=flops,
                    tokens_per_iteration=i.global_batch * i.shape.seq_length,
                    checkpoint_bytes=params * ({"bf16": 2, "fp16": 2, "fp32": 4}[i.precision] + state))


def _total_parameters(i: Inputs) -> int:
    """All parameters of the model once (what a checkpoint holds): every stage at TP = 1."""
    from .memory import stage_parameters

    one = Layout(pipeline=i.layout.pipeline)
    total = sum(stage_parameters(i.shape, one, s) for s in range(i.layout.pipeline))
    if not i.shape.untie_embeddings and i.layout.pipeline > 1:
        total -= i.shape.padded_vocab_size * i.shape.hidden_size  # the last stage's copy is the same weight
    return total


def format_text(e: Estimate) -> str:
    """The breakdown a person reads (plan without --json)."""
    i, m = e.inputs, e.memory
    lines = [f"GPU memory per rank (pipeline stage {m.stage}, the most loaded; {m.parameters:,} parameters on it):"]
    for key in ("weights", "gradients", "optimizer", "activations"):
        lines.append(f"  {key:<12} {human_bytes(getattr(m, key)):>12}")
    lines.append(f"  {'total':<12} {human_bytes(m.total):>12}")
    if i.gpu is None and "gpu" not in i.unknown:
        lines.append("  no GPU: the train stage runs on the CPU (host memory; fits: not applicable)")
    elif i.gpu is None:
        lines.append("  GPU unknown: set planning.gpu to compare (fits: unknown)")
    else:
        usable = e.usable_bytes or 0
        verdict = "fits" if e.fits else "does NOT fit"
        lines.append(f"  {i.gpu.name}: {human_bytes(i.gpu.memory_bytes)}, {human_bytes(usable)} usable with a "
                     f"{i.margin:.0%} margin: {verdict}")
    terms = ", ".join(f"{k} {human_bytes(v)}" for k, v in m.activation_terms.items())
    lines.append(f"  activations: {terms} ({i.attention} attention, recompute {i.recompute.granularity or 'none'})")
    lay = i.layout
    lines.append(f"layout: world {i.world_size} = TP {lay.tensor} x PP {lay.pipeline} x CP {lay.context} x "
                 f"DP {lay.data}; micro_batch {lay.micro_batch} x {lay.num_microbatches} micro-batches; "
                 f"{i.precision}{', distributed optimizer' if lay.distributed_optimizer else ''}"
                 f"{', sequence parallel' if lay.sequence_parallel else ''}")
    step = e.seconds_per_iteration()
    lines.append(f"per iteration: {e.flops_per_iteration:.3e} FLOPs, {e.tokens_per_iteration:,} tokens"
                 + ("" if step is None else f"; {step:.2f} s at MFU {i.mfu:.0%} ({e.tokens_per_iteration / step:,.0f} "
                                            f"tokens/s); {step * i.iterations / 3600:,.1f} h and "
                                            f"{step * i.iterations / 3600 * i.world_size:,.0f} GPU-hours to "
                                            f"{i.iterations:,} iterations"))
    save = e.checkpoint_bytes / (i.storage_gbps * GB)
    lines.append(f"checkpoint: {human_bytes(e.checkpoint_bytes)}; one save {save:,.1f} s at {i.storage_gbps:g} GB/s")
    if e.recommendation:
        r = e.recommendation
        rc = r["recompute"]
        what = []
        if rc:
            what.append(f"training.recompute: {{granularity: {rc['granularity']}, method: {rc['method']}, "
                        f"num_layers: {rc['num_layers']}}}")
        if r["tensor"] is not None and (r["tensor"], r["pipeline"]) != (lay.tensor, lay.pipeline):
            what.append(f"parallelism.tensor: {r['tensor']}, parallelism.pipeline: {r['pipeline']}, "
                        f"parallelism.sequence_parallel: {str(r['sequence_parallel']).lower()}")
        lines.append("recommendation: " + ("; ".join(what) if what else "none possible") + f" ({r['reason']})")
    if i.unknown:
        lines.append("unknown here (assumed; see inputs in --json): " + ", ".join(i.unknown))
    return "\n".join(lines)
