"""megatron's optimizer (Adam; the distributed optimizer when asked) and OptimizerParamScheduler,
configured the way Megatron-LM's pretrain_gpt.py configures them from the same settings.
"""

from __future__ import annotations

from typing import Any

from . import TrainError
from .runtime import Runtime
from .settings import TrainSettings


def build_optimizer(settings: TrainSettings, rt: Runtime, model: Any) -> Any:
    import torch
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    t, p = settings.training, settings.parallel
    config = OptimizerConfig(
        optimizer="adam", lr=t.lr, min_lr=t.min_lr, weight_decay=t.weight_decay,
        adam_beta1=t.adam_beta1, adam_beta2=t.adam_beta2, adam_eps=1e-8, clip_grad=t.clip_grad,
        bf16=rt.dtype_name == "bf16", fp16=rt.dtype_name == "fp16",
        params_dtype={"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[rt.dtype_name],
        use_distributed_optimizer=p.distributed_optimizer,
        overlap_param_gather=bool(p.overlap_param_gather and rt.use_cuda and p.distributed_optimizer),
    )
    try:
        from megatron.core.optimizer import get_standard_config_overrides

        overrides = get_standard_config_overrides(config)  # no weight decay on biases and norms
    except ImportError:  # older megatron-core applies the same rule itself
        overrides = None
    return get_megatron_optimizer(config, [model], config_overrides=overrides)


def scheduler_steps(settings: TrainSettings) -> dict[str, Any]:
    """The scheduler's step counts, in samples as Megatron-LM counts them (iterations x global batch)."""
    t, gbs = settings.training, settings.parallel.global_batch
    decay_iters = t.lr_decay_iters or t.iterations
    if t.lr_warmup_iters >= decay_iters:
        raise TrainError(f"lr_warmup_iters {t.lr_warmup_iters} must be below the decay iterations {decay_iters}")
    wsd = None
    if t.lr_decay_style == "WSD":
        wsd = max(1, decay_iters // 10) * gbs  # the last 10 % of the decay span (Megatron-LM has no default)
    return dict(lr_warmup_steps=t.lr_warmup_iters * gbs, lr_decay_steps=decay_iters * gbs,
                wd_incr_steps=t.iterations * gbs, wsd_decay_steps=wsd)


def build_scheduler(settings: TrainSettings, optimizer: Any) -> Any:
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    t = settings.training
    steps = scheduler_steps(settings)
    return OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=t.lr, min_lr=t.min_lr,
        lr_warmup_steps=steps["lr_warmup_steps"], lr_decay_steps=steps["lr_decay_steps"],
        lr_decay_style=t.lr_decay_style, start_wd=t.weight_decay, end_wd=t.weight_decay,
        wd_incr_steps=steps["wd_incr_steps"], wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=True, override_opt_param_scheduler=False,
        wsd_decay_steps=steps["wsd_decay_steps"],
        lr_wsd_decay_style="exponential" if t.lr_decay_style == "WSD" else None,
    )


def current_lr(optimizer: Any) -> float:
    groups = optimizer.param_groups
    for group in groups:
        if group.get("default_config", False):
            return float(group["lr"])
    return float(groups[0]["lr"]) if groups else 0.0
