"""The training loop: resume, steps through megatron's forward_backward_func, eval, saves, and
SIGTERM -> finish the step -> save -> exit 0.

Every rank runs `run(settings)`. The ranks agree on stopping: each step ends with one
all-reduce of [loss sum, token count, "got SIGTERM"] over the world, so a signal that reaches
the ranks at slightly different moments still stops all of them after the same iteration.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from dataclasses import dataclass, field
from functools import partial
from types import FrameType
from typing import Any, Callable

from . import TrainError
from .ckpt import Progress
from .runtime import Runtime
from .settings import TrainSettings

log = logging.getLogger(__name__)


class StopFlag:
    """Set by SIGTERM (Slurm's time-limit path: scancel --signal=TERM); the loop saves and exits 0."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: Any = None

    def install(self, signum: int = signal.SIGTERM) -> None:
        self._previous = signal.signal(signum, self._handler)

    def _handler(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is None:
            log.warning("got signal %d: finishing this step, then saving a checkpoint and exiting", signum)
        self.signum = signum

    def uninstall(self, signum: int = signal.SIGTERM) -> None:
        if self._previous is not None:
            signal.signal(signum, self._previous)
            self._previous = None

    @property
    def set(self) -> bool:
        return self.signum is not None


@dataclass
class Trainer:
    settings: TrainSettings
    rt: Runtime
    model: Any
    optimizer: Any
    scheduler: Any
    train_batches: Any
    valid_batches: Any
    padded_vocab: int
    flops_per_sample: float
    peak_tflops: float | None
    progress: Progress = field(default_factory=Progress)
    steps: Any = None  # steptimes.StepTimes: this rank's compute and wait per step (straggler watchdog)
    slow: Any = None  # steptimes.SlowHook: the LINGJUN_TRAIN_SLOW test hook

    @property
    def num_micro(self) -> int:
        p = self.settings.parallel
        return p.global_batch // (p.micro_batch * self.rt.dp)

    def _forward_step(self, data_iterator: Any, model: Any) -> tuple[Any, Callable[..., Any]]:
        from .data import context_parallel_slice

        batch = context_parallel_slice(next(data_iterator), self.rt)
        output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
        return output, partial(_loss_func, batch["loss_mask"])

    def _run_schedule(self, batches: Any, consumed: int, forward_only: bool) -> list[Any]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        return get_forward_backward_func()(
            forward_step_func=self._forward_step, data_iterator=batches.step(consumed, self.num_micro),
            model=[self.model], num_microbatches=self.num_micro, seq_length=self.settings.model.seq_length,
            micro_batch_size=self.settings.parallel.micro_batch, decoder_seq_length=self.settings.model.seq_length,
            forward_only=forward_only)

    def _reduce(self, losses: list[Any], stop: bool) -> tuple[float, int, bool]:
        """Global (loss, tokens, any rank stopping) in one all-reduce over the world."""
        import torch
        import torch.distributed as dist

        total = torch.zeros(3, dtype=torch.float64, device=self.rt.device)
        if self.rt.is_last_stage and self.rt.tp_rank == 0:
            for item in losses:
                rep = item["lm loss"]
                total[0] += rep[0].double()
                total[1] += rep[1].double()
        total[2] = 1.0 if stop else 0.0
        if self.steps is not None:
            self.steps.timed(dist.all_reduce)(total)  # a wait in a collective (steptimes.py)
        else:
            dist.all_reduce(total)
        loss_sum, tokens, stops = total.tolist()
        return (loss_sum / tokens if tokens else float("nan")), int(tokens), stops > 0

    def train_step(self, stop: bool) -> tuple[float, float | None, bool]:
        """One optimizer step; (loss, grad norm, stop on every rank)."""
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        if self.slow is not None:
            self.slow()  # LINGJUN_TRAIN_SLOW: a sleep in this step's compute (test hook, steptimes.py)
        losses = self._run_schedule(self.train_batches, self.progress.consumed_train_samples, forward_only=False)
        ok, grad_norm, _zeros = self.optimizer.step()
        gbs = self.settings.parallel.global_batch
        if ok:
            self.scheduler.step(increment=gbs)
        self.progress.iteration += 1
        self.progress.consumed_train_samples += gbs
        self.progress.flops_so_far += self.flops_per_sample * gbs
        loss, _tokens, stop_all = self._reduce(losses, stop)
        return loss, (float(grad_norm) if grad_norm is not None else None), stop_all

    def evaluate(self) -> float | None:
        import torch

        iters = self.settings.training.eval_iters
        if self.valid_batches is None or iters == 0:
            return None
        self.model.eval()
        loss_sum = 0.0
        tokens = 0
        try:
            with torch.no_grad():
                for _ in range(iters):
                    losses = self._run_schedule(self.valid_batches, self.progress.consumed_valid_samples, True)
                    self.progress.consumed_valid_samples += self.settings.parallel.global_batch
                    loss, n, _ = self._reduce(losses, False)
                    loss_sum += loss * n
                    tokens += n
        finally:
            self.model.train()
        return loss_sum / tokens if tokens else float("nan")


def _loss_func(loss_mask: Any, output_tensor: Any) -> tuple[Any, Any, dict[str, Any]]:
    """Megatron-LM's pretrain_gpt loss: summed masked token losses, the token count, a report."""
    import torch

    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().clone().detach().to(torch.int)
    report = torch.cat([loss.clone().detach().view(1), num_tokens.view(1).to(loss.dtype)])
    return loss, num_tokens, {"lm loss": report}


def _configure_model_hooks(model: Any, optimizer: Any) -> None:
    """What Megatron-LM's train() sets on the model config before the first step."""
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.utils import get_model_config

    config = get_model_config(model)
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    ddp = model.ddp_config
    if ddp.overlap_grad_reduce:
        config.no_sync_func = model.no_sync
        config.grad_sync_func = model.start_grad_sync  # Megatron-LM's align_grad_reduce default
    if ddp.overlap_param_gather:
        config.param_sync_func = model.start_param_sync  # Megatron-LM's align_param_gather default


def attach_step_times(model: Any, steps: Any) -> None:
    """Count megatron-core's finalize_model_grads (the data parallel gradient all-reduce, and with
    overlap_grad_reduce the wait for the bucketed all-reduces: megatron/core/distributed/
    finalize_model_grads.py) as this step's wait in collectives."""
    from megatron.core.utils import get_model_config

    config = get_model_config(model)
    if config.finalize_model_grads_func is not None:
        config.finalize_model_grads_func = steps.timed(config.finalize_model_grads_func)


class _ParamsGathered:
    """With overlap_param_gather the updated parameters are all-gathered lazily, by forward
    pre-hooks; evaluation and checkpoint saves need them complete (Megatron-LM disables the
    hooks around both, which forces the gather, and enables them afterwards)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.active = bool(getattr(model, "use_forward_hook", False))  # distributed optimizer + overlap

    def __enter__(self) -> None:
        if self.active:
            self.model.disable_forward_pre_hook(param_sync=True)

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            self.model.enable_forward_pre_hook()


def _should_save(it: int, settings: TrainSettings) -> bool:
    return it % settings.checkpoint.save_interval == 0 or it == settings.training.iterations


def train(tr: Trainer, metrics: Any, stop_flag: StopFlag, stop_at: int | None = None) -> str:
    """Train until the last iteration, a signal, or iteration `stop_at` (LINGJUN_TRAIN_STOP_AT: behaves
    like a signal arriving during that step); returns the stop reason ("done" | "signal" | "stop_at")."""
    from . import ckpt

    s, rt = tr.settings, tr.rt
    tokens_per_step = s.parallel.global_batch * s.model.seq_length
    reason = "done"
    while tr.progress.iteration < s.training.iterations:
        lr = _lr(tr.optimizer)
        t0 = time.perf_counter()
        forced = stop_at is not None and tr.progress.iteration + 1 >= stop_at
        if tr.steps is not None:
            tr.steps.begin()
        loss, grad_norm, stop = tr.train_step(stop_flag.set or forced)
        if rt.use_cuda:
            import torch

            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        it = tr.progress.iteration
        if tr.steps is not None:
            tr.steps.end(it)  # every log interval: one gathered line from rank 0 (steptimes.py)
        if not math.isfinite(loss):
            raise TrainError(f"loss is {loss} at iteration {it}: stopping without saving "
                             f"(resume from the last checkpoint with a lower lr or a different seed)")
        fields: dict[str, Any] = dict(iteration=it, loss=loss, lr=lr, grad_norm=grad_norm, step_time_s=dt,
                                      tokens_per_s=tokens_per_step / dt,
                                      consumed_samples=tr.progress.consumed_train_samples)
        if rt.use_cuda:
            tflops = tr.flops_per_sample * s.parallel.global_batch / dt / rt.world_size / 1e12
            fields["tflops_per_gpu"] = tflops
            if tr.peak_tflops and rt.dtype_name in ("bf16", "fp16"):
                fields["mfu"] = tflops / tr.peak_tflops
            # what `lingjun-slurm plan` predicts (bench/memory_gpu.py compares the two)
            fields["max_memory_allocated"] = int(torch.cuda.max_memory_allocated())
        metrics.train(s.training.iterations, **fields)
        if s.training.eval_iters and it % s.training.eval_interval == 0:
            with _ParamsGathered(tr.model):
                val = tr.evaluate()
            if val is not None:
                metrics.eval(it, val, s.training.eval_iters)
        if stop or _should_save(it, s):
            with _ParamsGathered(tr.model):
                path, secs = ckpt.save(s.checkpoint.dir, tr.model, tr.optimizer, tr.scheduler, s, rt, tr.progress,
                                       tr.padded_vocab)
            metrics.record("save", iteration=it, seconds=round(secs, 3), path=path)
            log.info("saved checkpoint %s in %.2f s", path, secs)
        if stop:
            reason = "signal" if stop_flag.set or not forced else "stop_at"
            log.info("stopping after iteration %d (%s; checkpoint saved): exit 0", it,
                     "LINGJUN_TRAIN_STOP_AT" if reason == "stop_at" else "signal")
            break
    return reason


def _lr(optimizer: Any) -> float:
    from .optim import current_lr

    return current_lr(optimizer)
