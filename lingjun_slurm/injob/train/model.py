"""TransformerConfig + GPTModel (TransformerEngine layer spec on GPUs when TE imports, the local
spec otherwise), wrapped in megatron's DistributedDataParallel.
"""

from __future__ import annotations

import logging
from typing import Any

from . import TrainError
from .runtime import Runtime
from .settings import TrainSettings

log = logging.getLogger(__name__)

MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128  # Megatron-LM's --make-vocab-size-divisible-by default


def padded_vocab_size(orig: int, tensor_parallel: int, divisible_by: int = MAKE_VOCAB_SIZE_DIVISIBLE_BY) -> int:
    """Megatron-LM's _vocab_size_with_padding: up to a multiple of divisible_by x TP."""
    multiple = divisible_by * tensor_parallel
    return ((orig + multiple - 1) // multiple) * multiple


def have_transformer_engine() -> bool:
    try:
        import transformer_engine  # noqa: F401
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # ImportError, or a TE build that does not match the CUDA/torch here
        return False
    return True


def transformer_config(settings: TrainSettings, rt: Runtime) -> Any:
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    m, p, t = settings.model, settings.parallel, settings.training
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[rt.dtype_name]
    swiglu = m.activation == "swiglu"
    rc = t.recompute
    kwargs: dict[str, Any] = dict(
        num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups, ffn_hidden_size=m.ffn_hidden_size,
        normalization=m.normalization, layernorm_epsilon=1e-5,
        activation_func=F.silu if swiglu else F.gelu, gated_linear_unit=swiglu,
        add_bias_linear=m.bias_linear, hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout,
        tensor_model_parallel_size=p.tensor, pipeline_model_parallel_size=p.pipeline,
        context_parallel_size=p.context, sequence_parallel=p.sequence_parallel,
        params_dtype=dtype, pipeline_dtype=dtype, bf16=rt.dtype_name == "bf16", fp16=rt.dtype_name == "fp16",
        use_cpu_initialization=not rt.use_cuda, init_method_std=0.02,
        recompute_granularity=rc.granularity, recompute_method=rc.method, recompute_num_layers=rc.num_layers,
        # Megatron-LM always sets this. It also makes the schedules call autograd's engine directly
        # (custom_backward), so on the CPU cpu_compat's mode stays active during backward/recompute.
        deallocate_pipeline_outputs=True,
    )
    if rt.use_cuda:
        # Megatron-LM's defaults on GPUs (fused kernels come with TE / megatron's JIT fusions).
        kwargs.update(bias_dropout_fusion=True, masked_softmax_fusion=True,
                      bias_activation_fusion=swiglu or m.bias_linear)
    try:
        return TransformerConfig(**kwargs)
    except (AssertionError, ValueError) as exc:
        raise TrainError(f"megatron-core refuses the model settings: {exc}") from None


def layer_spec(settings: TrainSettings, rt: Runtime) -> tuple[Any, str]:
    """(spec, name): TE on GPUs when transformer_engine imports, megatron's local modules otherwise."""
    from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_layer_local_spec,
                                                          get_gpt_layer_with_transformer_engine_spec)

    if rt.use_cuda and have_transformer_engine():
        return get_gpt_layer_with_transformer_engine_spec(), "transformer_engine"
    if settings.parallel.context > 1:
        raise TrainError("context parallel needs TransformerEngine's attention (GPUs with transformer_engine); "
                         "megatron-core's local attention has no context parallelism")
    if settings.parallel.sequence_parallel and not _have_apex():
        raise TrainError("sequence_parallel needs TransformerEngine's (GPUs) or Apex's layer norms: megatron-core's "
                         "torch LayerNorm fallback refuses it; turn sequence_parallel off here")
    return get_gpt_layer_local_spec(normalization=settings.model.normalization), "local"


def _have_apex() -> bool:
    try:
        import apex  # noqa: F401
    except Exception:
        return False
    return True


def build(settings: TrainSettings, rt: Runtime, vocab_size: int) -> tuple[Any, Any, str]:
    """(ddp_model, transformer_config, spec name) for this pipeline stage."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel

    m, p = settings.model, settings.parallel
    config = transformer_config(settings, rt)
    spec, spec_name = layer_spec(settings, rt)
    model = GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=vocab_size,
        max_sequence_length=m.max_position_embeddings,
        pre_process=rt.is_first_stage, post_process=rt.is_last_stage,
        share_embeddings_and_output_weights=not m.untie_embeddings,
        position_embedding_type=m.position_embedding,
        rotary_base=int(m.rotary_base or 10000),
    )
    if rt.use_cuda:
        model.cuda(torch.cuda.current_device())
    if rt.dtype_name in ("bf16", "fp16"):
        from megatron.core.transformer.module import Float16Module

        model = Float16Module(config, model)  # as Megatron-LM's get_model: 16-bit module, fp32 loss out
    overlap_grad = p.overlap_grad_reduce and rt.use_cuda
    overlap_param = p.overlap_param_gather and rt.use_cuda and p.distributed_optimizer
    if (p.overlap_grad_reduce or p.overlap_param_gather) and not rt.use_cuda:
        log.warning("overlap_grad_reduce/overlap_param_gather need CUDA streams: off on the CPU")
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=rt.dtype_name != "fp32", overlap_grad_reduce=overlap_grad,
        overlap_param_gather=overlap_param, use_distributed_optimizer=p.distributed_optimizer,
        check_for_nan_in_grad=False, bucket_size=(max(40_000_000, 1_000_000 * rt.dp) if overlap_grad else None),
        average_in_collective=False)
    ddp = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    return ddp, config, spec_name


def count_parameters(model: Any) -> int:
    """Parameters of this rank's shard of the model."""
    return sum(p.numel() for p in model.parameters())
