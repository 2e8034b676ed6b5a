"""megatron-core's CUDA-only spots, redirected to the CPU. Active only when CUDA is unavailable.

megatron-core 0.16 hard-codes CUDA in places a CPU run goes through; without this layer each
fails with "AssertionError: Torch not compiled with CUDA enabled". What is redirected, and where
megatron-core needs it (module paths below megatron.core):

- The CUDA default generator -> an emulated one (DeviceGenerator): a CPU generator state of its
  own that torch.cuda.get_rng_state / set_rng_state / manual_seed / manual_seed_all / initial_seed
  (and their torch.cuda.random twins) read and set, and that megatron's
  random._get/_set_cuda_rng_state (the RNG tracker's fork(), CheckpointFunction's recompute) use.
  Ops that on a GPU draw from the device generator draw from it: the dropout functions
  (megatron-core's dropouts are all torch.nn.functional.dropout on activations, which live on the
  GPU there: fusions/fused_bias_dropout.py, transformer/dot_product_attention.py, the embedding's
  torch.nn.Dropout) and the random factories called with device="cuda". Everything else (CPU
  parameter initialization, the DataLoaders' base seed) draws from the CPU generator, as on a GPU
  machine with --use-cpu-initialization. In-place random ops on existing tensors (normal_,
  uniform_, bernoulli_) cannot tell where the tensor would live and stay on the CPU generator; a
  GPT training step of megatron-core has none. Megatron's own CudaRNGStatesTracker then runs
  unchanged (a fresh one per activation).
  Why two generators and not one: Megatron-LM draws from the CPU generator on some ranks only (its
  DataLoaders, built on tensor-parallel rank 0: pretrain_gpt.py is_dataset_built_on_rank,
  core_v0.16.1 :205-211). With one shared generator the tensor-parallel ranks' dropout masks
  outside tensor-parallel regions then differ, the replicated parameters (layer norms,
  row-parallel biases, position embeddings) drift apart, and a checkpoint, which keeps
  tensor-parallel rank 0's copy of them only, no longer resumes the run it came from. On a GPU the
  "default state" is the same on every tensor-parallel rank (tensor_parallel/random.py
  model_parallel_cuda_manual_seed's docstring, core_v0.16.1 :394-397); so it is here.
- torch.cuda.current_device() -> "cpu": utils.GlobalMemoryBuffer (local attention),
  distributed.param_and_grad_buffer (DDP buffers), pipeline_parallel.p2p_communication,
  the distributed optimizer's shard buffers.
- torch.cuda.synchronize() -> no-op: pipeline p2p, the async checkpoint writer.
- torch.cuda.current_stream() -> a null stream (wait_event / wait_stream / synchronize do nothing):
  from megatron-core 0.19 the DDP's start_grad_sync asks for it on every step
  (distributed/param_and_grad_buffer.py, core_v0.19.0 :632, main d98e8a6 :638); 0.16 .. 0.18 never
  reach it on the CPU.
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


# Ops that on a GPU draw from the device generator: dropout (always on activations, which live
# on the GPU), and the random factories when asked for a CUDA tensor.
_DROPOUTS = frozenset((
    torch.nn.functional.dropout, torch.nn.functional.dropout1d, torch.nn.functional.dropout2d,
    torch.nn.functional.dropout3d, torch.nn.functional.alpha_dropout, torch.nn.functional.feature_alpha_dropout,
    torch.dropout, torch.dropout_, torch.alpha_dropout, torch.alpha_dropout_, torch.feature_dropout,
    torch.feature_dropout_, torch.feature_alpha_dropout, torch.feature_alpha_dropout_))
_RANDOM_FACTORIES = frozenset((torch.rand, torch.randn, torch.randint, torch.randperm, torch.normal,
                               torch.rand_like, torch.randn_like, torch.randint_like))


class DeviceGenerator:
    """The CUDA default generator, emulated: a CPU generator state of its own (what a GPU's
    Philox generator is to the ops that run there). Seeded and read through torch.cuda's RNG
    functions while the layer is active; `drawing()` swaps it into the CPU generator around an
    op that would draw from the device on a GPU."""

    def __init__(self) -> None:
        fresh = torch.Generator()  # the same default seed as a fresh CUDA generator (c10 default_rng_seed_val)
        self.state = fresh.get_state()
        self.seed = fresh.initial_seed()

    def manual_seed(self, seed: int) -> None:
        gen = torch.Generator()
        gen.manual_seed(int(seed))
        self.state, self.seed = gen.get_state(), int(seed)

    def get_state(self) -> torch.Tensor:
        return self.state.clone()

    def set_state(self, new_state: torch.Tensor) -> None:
        gen = torch.Generator()
        gen.set_state(new_state)  # torch's own check: a CPU generator state (a GPU's state is refused)
        self.state = gen.get_state()

    @contextlib.contextmanager
    def drawing(self) -> Iterator[None]:
        cpu = torch.get_rng_state()
        torch.set_rng_state(self.state)
        try:
            yield
        finally:
            self.state = torch.get_rng_state()
            torch.set_rng_state(cpu)


class DeviceMode(TorchFunctionMode):
    """Keeps tensors on the CPU, reports CPU tensor types the way CUDA ones read, and lets the ops
    that would run on the GPU draw from the emulated device generator."""

    def __init__(self, generator: DeviceGenerator | None = None) -> None:
        super().__init__()
        self.generator = generator or DeviceGenerator()

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        cuda = _is_cuda_device(kwargs.get("device"))
        on_device = func in _DROPOUTS or (cuda and func in _RANDOM_FACTORIES)
        if cuda:
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        if on_device:
            with self.generator.drawing():
                return func(*args, **kwargs)
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


def device_generator() -> DeviceGenerator:
    """The emulated CUDA generator of the active layer."""
    if _State.mode is None:
        raise RuntimeError("cpu_compat is not active")
    return _State.mode.generator


def _cuda_get_rng_state(device: Any = "cuda", *_a: Any, **_k: Any) -> torch.Tensor:
    """torch.cuda.get_rng_state, and megatron's _get_cuda_rng_state(device, clone, graph_safe)."""
    return device_generator().get_state()


def _cuda_set_rng_state(new_state: torch.Tensor, *_a: Any, **_k: Any) -> None:
    """torch.cuda.set_rng_state, and megatron's _set_cuda_rng_state(new_state, device, graph_safe)."""
    device_generator().set_state(new_state)


def _cuda_get_rng_state_all() -> list[torch.Tensor]:
    return [_cuda_get_rng_state()]  # the one emulated device


def _cuda_set_rng_state_all(new_states: Any) -> None:
    for state in new_states:
        _cuda_set_rng_state(state)


def _cuda_manual_seed(seed: int) -> None:
    device_generator().manual_seed(seed)


def _cuda_initial_seed() -> int:
    return device_generator().seed


class _State:
    active = False
    mode: DeviceMode | None = None
    saved: list[tuple[Any, str, Any]] = []


def is_active() -> bool:
    return _State.active


class _NullStream:
    """torch.cuda.current_stream() on the CPU: every op is already synchronous."""

    def wait_event(self, *_a: Any, **_k: Any) -> None:
        pass

    def wait_stream(self, *_a: Any, **_k: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


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

    _State.mode = DeviceMode(DeviceGenerator())
    _patch(torch.cuda, "current_device", lambda: "cpu")
    _patch(torch.cuda, "synchronize", lambda *a, **k: None)
    _patch(torch.cuda, "current_stream", lambda *a, **k: _NullStream())
    for module in (torch.cuda, torch.cuda.random):
        _patch(module, "get_rng_state", _cuda_get_rng_state)
        _patch(module, "set_rng_state", _cuda_set_rng_state)
        _patch(module, "get_rng_state_all", _cuda_get_rng_state_all)
        _patch(module, "set_rng_state_all", _cuda_set_rng_state_all)
        _patch(module, "manual_seed", _cuda_manual_seed)
        # torch.manual_seed seeds the CUDA generators through it (torch/random.py _manual_seed_impl), as on a GPU
        _patch(module, "manual_seed_all", _cuda_manual_seed)
        _patch(module, "initial_seed", _cuda_initial_seed)
    _patch(mrandom, "_get_cuda_rng_state", _cuda_get_rng_state)
    _patch(mrandom, "_set_cuda_rng_state", _cuda_set_rng_state)
    # megatron's own tracker, fresh: its add()/fork() go through the functions above
    _patch(mrandom, "_CUDA_RNG_STATE_TRACKER", mrandom.CudaRNGStatesTracker())
    _patch(mrandom, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", True)
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
