"""megatron-core's CUDA-only spots, redirected to the CPU. Active only when CUDA is unavailable.

megatron-core 0.16 hard-codes CUDA in places a CPU run goes through; without this layer each
fails with "AssertionError: Torch not compiled with CUDA enabled". What is redirected, and where
megatron-core needs it (module paths below megatron.core):

- RNG tracker -> CpuRNGStatesTracker, whose named states are CPU generator states and whose
  fork() swaps the CPU generator: tensor_parallel.random (model_parallel_cuda_manual_seed and
  CudaRNGStatesTracker.add/fork call torch.cuda.get_rng_state/manual_seed; used around dropout
  in tensor-parallel regions and by full recompute). random._get/_set_cuda_rng_state (used by
  CheckpointFunction, i.e. recompute) read and set the CPU generator.
- torch.cuda.current_device() -> "cpu": utils.GlobalMemoryBuffer (local attention),
  distributed.param_and_grad_buffer (DDP buffers), pipeline_parallel.p2p_communication,
  the distributed optimizer's shard buffers.
- torch.cuda.synchronize() -> no-op: pipeline p2p, the async checkpoint writer.
- DeviceMode (a torch.overrides.TorchFunctionMode): device="cuda" (or a bare ordinal) -> "cpu"
  in every torch call (pipeline_parallel.schedules' total_num_tokens, the optimizer's found_inf
  and loss-scale tensors, clip_grads' buffers, utils.local_multi_tensor_l2_norm,
  transformer.utils.get_default_causal_mask); Tensor.cuda() / .to("cuda") stay on the CPU;
  pin_memory=True is dropped; and Tensor.type() of a CPU tensor reads "torch.cuda.*"
  (optimizer.clip_grads and optimizer.distrib_optimizer assert
  param.type() == "torch.cuda.FloatTensor").

DeviceMode sees every torch call made while it is active (about 1 us each) and changes only
the arguments above. Like every torch function mode it is not active inside a call it
handles: a backward started with torch.autograd.backward() runs without it. megatron's
schedules enter autograd's engine directly (custom_backward) when deallocate_pipeline_outputs
is set, as Megatron-LM always sets it and the trainer does, so backward and recompute code see it.
`activate()` installs all of it and `deactivate()` restores torch and megatron-core exactly as
they were; a process that has CUDA never sees any of this.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode

log = logging.getLogger(__name__)

_TYPE_PREFIX = "torch."
_CUDA_TYPE_PREFIX = "torch.cuda."


def _is_cuda_device(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # a bare ordinal is a CUDA device
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


class DeviceMode(TorchFunctionMode):
    """Keeps tensors on the CPU and reports CPU tensor types the way CUDA ones read."""

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if _is_cuda_device(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            if name.startswith(_TYPE_PREFIX) and not name.startswith(_CUDA_TYPE_PREFIX):
                return _CUDA_TYPE_PREFIX + name[len(_TYPE_PREFIX):]
            return name
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def _cpu_get_rng_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state: torch.Tensor, device: int = -1, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


def _tracker_class() -> type:
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """megatron's RNG tracker with CPU generator states (dropout in TP regions, recompute)."""

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            orig = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(orig)

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
            # Same as CudaRNGStatesTracker.fork minus its "CPU RNG state changed" warning: here the
            # tracked generator *is* the CPU generator, so it always changes.
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            orig_state = torch.get_rng_state()
            orig_name = self._current_state_name
            if orig_name != "default-rng":
                self.states_[orig_name] = orig_state
            torch.set_rng_state(self.states_[name])
            self._current_state_name = name
            try:
                yield
            finally:
                if self._current_state_name != name:
                    raise Exception(f"current state name {self._current_state_name} is not {name}")
                self.states_[name] = torch.get_rng_state()
                if orig_name != "default-rng":
                    orig_state = self.states_[orig_name]
                torch.set_rng_state(orig_state)
                self._current_state_name = orig_name

    return CpuRNGStatesTracker


class _State:
    active = False
    mode: DeviceMode | None = None
    saved: list[tuple[Any, str, Any]] = []


def is_active() -> bool:
    return _State.active


def _patch(obj: Any, name: str, value: Any) -> None:
    _State.saved.append((obj, name, getattr(obj, name)))
    setattr(obj, name, value)


def activate(force: bool = False) -> bool:
    """Install the layer when CUDA is unavailable (or force); True when it is active afterwards."""
    if _State.active:
        return True
    if torch.cuda.is_available() and not force:
        return False
    from megatron.core.tensor_parallel import random as mrandom

    _patch(torch.cuda, "current_device", lambda: "cpu")
    _patch(torch.cuda, "synchronize", lambda *a, **k: None)
    _patch(mrandom, "_get_cuda_rng_state", _cpu_get_rng_state)
    _patch(mrandom, "_set_cuda_rng_state", _cpu_set_rng_state)
    _patch(mrandom, "_CUDA_RNG_STATE_TRACKER", _tracker_class()())
    _patch(mrandom, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", True)
    _State.mode = DeviceMode()
    _State.mode.__enter__()
    _State.active = True
    log.info("cpu_compat: CUDA unavailable; megatron-core's CUDA-only calls redirected to the CPU")
    return True


def deactivate() -> None:
    """Undo activate(): torch and megatron-core as they were."""
    if not _State.active:
        return
    assert _State.mode is not None
    _State.mode.__exit__(None, None, None)
    _State.mode = None
    while _State.saved:
        obj, name, value = _State.saved.pop()
        setattr(obj, name, value)
    _State.active = False


@contextlib.contextmanager
def enabled(force: bool = False) -> Iterator[bool]:
    """with enabled() as active: ... (deactivates on exit only if this call activated it)."""
    was = _State.active
    active = activate(force)
    try:
        yield active
    finally:
        if active and not was:
            deactivate()
