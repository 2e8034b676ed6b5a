"""GPU memory of one rank of a Megatron GPT training run, from the model's shape and the layout.

Pure arithmetic (no torch): `lingjun-slurm plan` calls it before anything runs. Every term is a
tensor that megatron-core keeps, counted in bytes, so each can be checked on its own (the tests
hold the sums against Megatron-LM's megatron/training/theoretical_memory_usage.py where that
formula applies, and against tensors measured on the CPU).

Weights, gradients, optimizer (megatron-core's DDP and DistributedOptimizer, mixed precision):

  - weights: the model's parameters in the training dtype (2 bytes bf16/fp16, 4 fp32);
  - gradients: megatron-core's grad buffer, fp32 for bf16 (Megatron-LM sets
    accumulate_allreduce_grads_in_fp32 for bf16, megatron/training/arguments.py), 4 bytes;
  - optimizer: Adam's fp32 master copy, exp_avg and exp_avg_sq: 12 bytes per parameter (fp32
    training: no master copy, 8), divided over the data-parallel ranks x context-parallel ranks
    with the distributed optimizer (its shards follow the data-parallel group with context
    parallel, megatron/core/optimizer/distrib_optimizer.py).

That is Megatron-LM's 18 bytes (6 + 12/DP with the distributed optimizer) per parameter.
Parameters are counted exactly per pipeline stage and tensor-parallel rank: QKV, projection and
MLP weights split over TP; norms, biases of row-parallel layers and position embeddings
replicated; the word embedding on the first stage and the output layer on the last (both
vocab-parallel over TP; tied embeddings keep a copy on the last stage when PP > 1, as
megatron-core's shared embedding does).

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", arXiv:2205.05198, Table 2 and section 4), per layer and micro-batch, for s tokens per
context-parallel rank, b sequences, hidden h, a heads of d channels, g query groups, FFN f,
TP t, e bytes per element (2 for bf16/fp16):

  attention: the input norm's input and its output (the QKV input) e*s*b*h each (split over TP
  with sequence parallel, whole without); Q, K, V e*s*b*(a+2g)*d/t; with RoPE the rotated Q and K
  as well, e*s*b*(a+g)*d/t; with GQA the local attention's copies of K and V repeated to all a
  heads, 2*e*s*b*a*d/t (flash / TE attention takes the groups as they are); the attention output (the
  projection's input) e*s*b*a*d/t; the dropout mask after the projection s*b*h bytes when
  hidden_dropout > 0 (over TP with SP). The core attention of the "local" backend also keeps
  the softmax output e*a*s*s*b/t, and with attention_dropout > 0 its mask a*s*s*b/t bytes and
  the dropped-out scores e*a*s*s*b/t (the paper's 5as^2b); flash / TE fused attention keeps
  none of these but its output and the softmax statistics, 4*a*s*b/t bytes (fp32). Selective
  recompute (core attention, Megatron's default "selective") drops the s^2 terms too.
  MLP: the norm's input and output e*s*b*h each (over TP with SP); the activation's input,
  e*s*b*f/t (GELU) or e*s*b*2f/t (SwiGLU's gate and up); the second linear's input e*s*b*f/t;
  the dropout mask s*b*h bytes when hidden_dropout > 0.

  With f = 4h, a*d = h, g = a, dropout, GELU and e = 2 that is the paper's 34*s*b*h + 5*a*s^2*b
  (10 + 24/t without SP, everything / t with SP).

  Full recompute keeps only the input of each recomputed chunk (e*s*b*h, over TP with SP):
  "uniform" checkpoints every `num_layers` layers as one chunk, and one chunk is recomputed at a
  time in the backward pass (its layers' activations for one micro-batch on top); "block"
  recomputes the first `num_layers` layers of each pipeline stage and keeps the others whole
  (megatron/core/transformer/transformer_block.py _checkpointed_forward).

  Pipeline: with the 1F1B schedule stage i holds min(PP - i, micro-batches) micro-batches in
  flight; the interleaved schedule with V virtual stages holds (PP-1)*2 + (V-1)*PP + 1 chunks of
  L/(PP*V) layers on stage 0 (megatron/core/pipeline_parallel/schedules.py num_warmup_microbatches),
  which is Megatron-LM's 1 + (PP-1)/(PP*V) factor.

  First stage: the embedding's dropout mask (s*b*h bytes, over TP with SP) per micro-batch in
  flight. Last stage: the final norm's input and the output layer's input (e*s*b*h each, over TP
  with SP), and the fp32 logits the vocab-parallel cross entropy keeps (4*s*b*V/t), for the one
  micro-batch in its backward. Each norm also keeps its per-token statistics in fp32 (LayerNorm
  mean and rstd, 8 bytes; RMSNorm rstd, 4).

Not counted here but in the margin: CUDA context and NCCL buffers, the caching allocator's
fragmentation, temporary buffers (all-gathers, the logits before the loss), TransformerEngine
workspaces, and the token ids, position ids, labels and masks (int64 / bool inputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
ATTENTION = ("local", "flash")  # TE fused attention keeps what flash keeps


@dataclass(frozen=True)
class Shape:
    """The model: what megatron-core builds (GPTModel with a TransformerConfig)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    padded_vocab_size: int
    num_query_groups: Optional[int] = None  # None: as many as heads (no GQA)
    kv_channels: Optional[int] = None  # None: hidden_size / num_attention_heads
    swiglu: bool = False
    untie_embeddings: bool = False
    bias_linear: bool = True
    normalization: str = "LayerNorm"  # LayerNorm (weight and bias) or RMSNorm (weight)
    learned_position_embeddings: bool = True
    max_position_embeddings: Optional[int] = None  # None: seq_length
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1

    @property
    def groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def channels(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class Layout:
    """How the run is spread: parallel sizes, batch and optimizer."""

    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    data: int = 1
    virtual_pipeline: Optional[int] = None  # interleaved schedule: model chunks per pipeline stage
    sequence_parallel: bool = False
    micro_batch: int = 1
    num_microbatches: int = 1  # per data-parallel rank and iteration: global / (micro x DP)
    distributed_optimizer: bool = False


@dataclass(frozen=True)
class Recompute:
    granularity: Optional[str] = None  # None, "selective" or "full"
    method: Optional[str] = None  # full: "uniform" or "block"
    num_layers: Optional[int] = None  # full: layers per chunk (uniform) / per stage (block)


@dataclass(frozen=True)
class Breakdown:
    """Bytes on one GPU: the pinned keys of `plan --json`'s memory.per_gpu_bytes, and where."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    stage: int  # the pipeline stage (0-based) of the most loaded rank
    parameters: int  # parameters on that rank
    activation_terms: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations

    def per_gpu_bytes(self) -> dict[str, int]:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "total": self.total}


class PlanError(ValueError):
    """A shape or layout the estimate cannot be made for (it says which value and why)."""


def check(shape: Shape, layout: Layout, recompute: Recompute) -> None:
    t, p = layout.tensor, layout.pipeline
    if shape.num_attention_heads % t:
        raise PlanError(f"{shape.num_attention_heads} attention heads do not split over tensor {t}")
    if shape.groups % t:  # megatron-core splits the groups over TP (spec/checks.py refuses the rest too)
        raise PlanError(f"{shape.groups} query groups do not split over tensor {t}")
    chunks = p * (layout.virtual_pipeline or 1)
    if shape.num_layers % chunks:
        raise PlanError(f"{shape.num_layers} layers do not split into {p} pipeline stages"
                        + (f" x {layout.virtual_pipeline} virtual stages" if layout.virtual_pipeline else ""))
    if shape.seq_length % layout.context:
        raise PlanError(f"seq_length {shape.seq_length} does not split over context {layout.context}")
    if recompute.granularity == "full" and (recompute.method not in ("uniform", "block") or not recompute.num_layers):
        raise PlanError("full recompute needs a method (uniform or block) and num_layers")
    # megatron-core steps through one model chunk's layers (TransformerBlock.layers: L / (PP x V))
    block = shape.num_layers // chunks
    if recompute.granularity == "full" and recompute.method == "uniform" and recompute.num_layers and \
            block % recompute.num_layers:
        raise PlanError(f"uniform recompute of {recompute.num_layers} layers per chunk does not divide the "
                        f"{block} layers of a model chunk")


def layer_parameters(shape: Shape, tensor: int) -> int:
    """Parameters of one transformer layer on one tensor-parallel rank."""
    h, f, d = shape.hidden_size, shape.ffn_hidden_size, shape.channels
    q, kv = shape.num_attention_heads * d, 2 * shape.groups * d
    norm = 2 * h if shape.normalization == "LayerNorm" else h
    fc1 = h * f * (2 if shape.swiglu else 1)
    n = (h * (q + kv) + q * h + fc1 + f * h) // tensor + 2 * norm
    if shape.bias_linear:  # column-parallel biases split, row-parallel (projection, fc2) replicated
        n += (q + kv + f * (2 if shape.swiglu else 1)) // tensor + 2 * h
    return n


def stage_parameters(shape: Shape, layout: Layout, stage: int) -> int:
    """Parameters on one tensor-parallel rank of pipeline stage `stage` (all its model chunks)."""
    t, p = layout.tensor, layout.pipeline
    n = shape.num_layers // p * layer_parameters(shape, t)
    embedding = shape.padded_vocab_size * shape.hidden_size // t
    if stage == 0:
        n += embedding
        if shape.learned_position_embeddings:
            n += (shape.max_position_embeddings or shape.seq_length) * shape.hidden_size
    if stage == p - 1:
        n += 2 * shape.hidden_size if shape.normalization == "LayerNorm" else shape.hidden_size  # final norm
        if shape.untie_embeddings or p > 1:  # the output layer; tied: the shared copy on the last stage
            n += embedding
    return n


def weight_bytes(parameters: int, precision: str, layout: Layout) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes for `parameters` on one rank."""
    e = BYTES[precision]
    grads = 4 * parameters
    state = (8 if precision == "fp32" else 12) * parameters
    if layout.distributed_optimizer:
        state = math.ceil(state / (layout.data * layout.context))
    return e * parameters, grads, state


def norm_statistics(shape: Shape) -> int:
    """Bytes per token a norm keeps besides its input: LayerNorm's mean and rstd, RMSNorm's rstd (fp32)."""
    return 8 if shape.normalization == "LayerNorm" else 4


def norm_bytes(shape: Shape, e: int, cpu: bool) -> int:
    """Bytes per token of one norm and what follows it keeps: its input, its output (the next
    layer's input), the statistics; torch's unfused RMSNorm on the CPU also keeps the normalized
    input before the weight (TE's and Apex's fused norms do not)."""
    unfused = e * shape.hidden_size if cpu and shape.normalization == "RMSNorm" else 0
    return 2 * e * shape.hidden_size + norm_statistics(shape) + unfused


def layer_activations(shape: Shape, layout: Layout, precision: str, attention: str, selective: bool,
                      cpu: bool = False) -> int:
    """Bytes one transformer layer keeps for one micro-batch (see the module's docstring).

    cpu: the kernels megatron-core runs without CUDA (what the CPU measurements see): dropout
    keeps its mask in the activations' dtype, not as bool (torch's _dropout_impl multiplies by a
    noise tensor), SwiGLU runs unfused (megatron/core/transformer/mlp.py glu(): silu's output
    and `x_linear + glu_linear_offset` are kept as well, two more f-wide tensors), RMSNorm is
    torch's composite one, and RoPE the unfused rotation."""
    e = BYTES[precision]
    t = layout.tensor
    sp = t if layout.sequence_parallel else 1
    s, b, h = shape.seq_length // layout.context, layout.micro_batch, shape.hidden_size
    a, d, f = shape.num_attention_heads, shape.channels, shape.ffn_hidden_size
    tokens = s * b
    mask_bytes = e if cpu else 1
    mask = mask_bytes * tokens * h // sp if shape.hidden_dropout > 0 else 0
    norm = norm_bytes(shape, e, cpu) * tokens // sp  # a norm: its input, its output, statistics
    total = norm  # before attention
    g = shape.groups
    rope = not shape.learned_position_embeddings
    if attention == "local" and g < a:
        # GQA in the local attention: Q (reshaped out of the grouped QKV layout, or rotated) and K,
        # V repeated to every head (megatron/core/transformer/dot_product_attention.py); the rotated
        # K and the QKV output are not kept then
        total += 3 * e * tokens * a * d // t
    else:
        total += e * tokens * (a + 2 * g) * d // t  # Q, K, V: views of the QKV linear's output
        if rope:  # RoPE: the rotated copies of Q and K are what attention keeps, V still a view
            total += e * tokens * (a + g) * d // t
    if rope and cpu:  # the unfused rotation keeps cos and sin for Q and for K (models/common/embeddings/rope_utils.py)
        total += 4 * e * s * d
    total += e * tokens * a * d // t  # attention output = the projection's input
    total += mask
    if attention == "flash":
        total += 4 * a * tokens // t  # softmax statistics (fp32)
    elif not selective:
        scores = a * s * tokens // t
        total += e * scores  # softmax output
        if shape.attention_dropout > 0:
            total += mask_bytes * scores + e * scores  # dropout mask and its output
    total += norm  # before the MLP
    total += e * tokens * f * (2 if shape.swiglu else 1) // t  # activation input
    if shape.swiglu and cpu:
        total += 2 * e * tokens * f // t  # unfused: silu's output, x_linear + offset
    total += e * tokens * f // t  # second linear's input
    total += mask
    return total


def in_flight(layout: Layout, stage: int) -> float:
    """Micro-batches of activations that stage `stage` holds at its peak, as a number of passes
    over all of its layers (interleaved: chunks of L/(PP*V) layers, counted in whole stages)."""
    p, m = layout.pipeline, layout.num_microbatches
    if p == 1:
        return 1
    v = layout.virtual_pipeline
    if v:
        chunks = (p - stage - 1) * 2 + (v - 1) * p + 1
        return min(chunks, m * v) / v
    return min(p - stage, m)


def stage_activations(shape: Shape, layout: Layout, recompute: Recompute, precision: str, attention: str,
                      stage: int, cpu: bool = False) -> dict[str, int]:
    """Activation bytes of pipeline stage `stage`, by term."""
    e = BYTES[precision]
    sp = layout.tensor if layout.sequence_parallel else 1
    tokens = shape.seq_length // layout.context * layout.micro_batch
    layers = shape.num_layers // layout.pipeline
    flight = in_flight(layout, stage)
    whole = layer_activations(shape, layout, precision, attention, recompute.granularity == "selective", cpu)
    terms: dict[str, int] = {}
    if recompute.granularity == "full":
        n = min(recompute.num_layers or layers, layers)
        chunk_input = e * tokens * shape.hidden_size // sp
        if recompute.method == "uniform":
            chunks = math.ceil(layers / n)
            terms["layers"] = int(flight * chunks * chunk_input)
            terms["recompute"] = n * whole  # one chunk recomputed at a time in the backward pass
        else:  # block: the first n layers of the stage recomputed, the rest kept
            terms["layers"] = int(flight * (n * chunk_input + (layers - n) * whole))
            terms["recompute"] = whole if n else 0
    else:
        terms["layers"] = int(flight * layers * whole)
    if stage == 0 and shape.hidden_dropout > 0:
        terms["embedding"] = int(flight * (e if cpu else 1) * tokens * shape.hidden_size // sp)
    if stage == layout.pipeline - 1:
        norm = norm_bytes(shape, e, cpu) * tokens // sp
        terms["output"] = norm + 4 * tokens * shape.padded_vocab_size // layout.tensor
    return terms


def estimate(shape: Shape, layout: Layout, recompute: Recompute = Recompute(), precision: str = "bf16",
             attention: str = "flash", cpu: bool = False) -> Breakdown:
    """The most loaded rank's bytes (the pipeline stage with the largest total)."""
    if precision not in BYTES:
        raise PlanError(f"precision {precision!r} is not one of {', '.join(BYTES)}")
    if attention not in ATTENTION:
        raise PlanError(f"attention {attention!r} is not one of {', '.join(ATTENTION)}")
    check(shape, layout, recompute)
    best: Optional[Breakdown] = None
    for stage in range(layout.pipeline):
        params = stage_parameters(shape, layout, stage)
        w, g, o = weight_bytes(params, precision, layout)
        terms = stage_activations(shape, layout, recompute, precision, attention, stage, cpu)
        got = Breakdown(w, g, o, sum(terms.values()), stage, params, terms)
        if best is None or got.total > best.total:
            best = got
    assert best is not None
    return best
