"""lingjun_slurm.injob.train.cpu_compat: each redirect, its confinement to CPU mode, and undoing it."""

from __future__ import annotations

from typing import Iterator

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core", reason="needs megatron-core (pip install '.[megatron]')")

from lingjun_slurm.injob.train import cpu_compat  # noqa: E402


@pytest.fixture
def active() -> Iterator[None]:
    if torch.cuda.is_available():
        pytest.skip("the layer is for machines without CUDA")
    assert cpu_compat.activate()
    try:
        yield
    finally:
        cpu_compat.deactivate()


def test_device_cuda_stays_on_cpu(active: None) -> None:
    assert torch.zeros(2, device="cuda").device.type == "cpu"
    assert torch.tensor([1.0], device=torch.device("cuda", 0)).device.type == "cpu"
    assert torch.empty(3, dtype=torch.int, device=0).device.type == "cpu"  # a bare ordinal means cuda:N
    x = torch.ones(2)
    assert x.cuda() is x
    assert x.to("cuda").device.type == "cpu" and x.to(device="cuda").device.type == "cpu"
    assert torch.ones(2, pin_memory=True).device.type == "cpu"
    assert torch.cuda.current_device() == "cpu"
    torch.cuda.synchronize()  # a no-op instead of "Torch not compiled with CUDA enabled"


def test_type_names_read_as_cuda(active: None) -> None:
    assert torch.ones(2).type() == "torch.cuda.FloatTensor"
    assert torch.ones(2, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
    assert torch.ones(2).type(torch.float64).dtype == torch.float64  # conversions untouched


def test_deactivate_restores_torch() -> None:
    if torch.cuda.is_available():
        pytest.skip("the layer is for machines without CUDA")
    before = torch.cuda.current_device
    with cpu_compat.enabled() as on:
        assert on and cpu_compat.is_active()
    assert not cpu_compat.is_active()
    assert torch.cuda.current_device is before
    assert torch.ones(2).type() == "torch.FloatTensor"
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")


def test_inactive_when_cuda_is_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cpu_compat.activate() is False
    assert not cpu_compat.is_active()


def test_megatron_cuda_spots_run(active: None) -> None:
    """The calls that fail on a CPU without the layer: clip_grads' type assert and its cuda
    buffers, GlobalMemoryBuffer, the local l2 norm."""
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32
    from megatron.core.utils import GlobalMemoryBuffer, local_multi_tensor_l2_norm

    p = torch.nn.Parameter(torch.ones(4))
    p.grad = torch.full((4,), 2.0)
    clip_grad_by_total_norm_fp32([p], max_norm=1.0, total_norm=4.0)
    assert torch.allclose(p.grad, torch.full((4,), 0.5), atol=1e-5)
    buf = GlobalMemoryBuffer().get_tensor((2, 3), torch.float32, "x")
    assert buf.shape == (2, 3) and buf.device.type == "cpu"
    norm, _ = local_multi_tensor_l2_norm(1, None, [[torch.ones(4)]], False)
    assert norm.device.type == "cpu" and float(norm) == pytest.approx(2.0)


def _mask(n: int = 64) -> torch.Tensor:
    return torch.nn.functional.dropout(torch.ones(n), p=0.5, training=True) != 0


def test_dropout_draws_from_the_device_generator(active: None) -> None:
    """As on a GPU, dropout draws from torch.cuda's generator (here an emulated one), and draws
    from the CPU generator (a DataLoader's seed, CPU initialization) do not move its masks: what
    keeps the tensor-parallel ranks' masks equal outside tensor-parallel regions when only rank 0
    builds DataLoaders (Megatron-LM's pretrain_gpt.py is_dataset_built_on_rank)."""
    torch.manual_seed(7)  # seeds the device generator too (torch.manual_seed -> torch.cuda.manual_seed_all)
    first = _mask()
    torch.manual_seed(7)
    cpu_before = torch.get_rng_state()
    torch.empty((), dtype=torch.int64).random_()  # a DataLoader iterator's base seed: the CPU generator
    assert torch.equal(_mask(), first)
    cpu = torch.get_rng_state()
    _mask()
    assert torch.equal(torch.get_rng_state(), cpu) and not torch.equal(cpu, cpu_before)
    torch.cuda.manual_seed(7)
    assert torch.equal(torch.nn.Dropout(0.5)(torch.ones(64)) != 0, first)  # the module form, too
    assert torch.cuda.initial_seed() == 7


def test_device_generator_state_replays_and_refuses_a_gpu_state(active: None) -> None:
    torch.cuda.manual_seed(3)
    state = torch.cuda.get_rng_state()
    a = _mask()
    torch.cuda.set_rng_state(state)
    assert torch.equal(_mask(), a)
    cuda_rand = torch.rand(4, device="cuda")  # a random factory asked for a CUDA tensor: the device generator
    torch.cuda.set_rng_state(state)
    _mask()
    assert torch.equal(torch.rand(4, device="cuda"), cuda_rand)
    assert [s.shape for s in torch.cuda.get_rng_state_all()] == [state.shape]
    with pytest.raises(RuntimeError):
        torch.cuda.set_rng_state(torch.zeros(16, dtype=torch.uint8))  # a GPU's Philox state (seed, offset)


def test_rng_tracker_forks_the_device_generator(active: None) -> None:
    """megatron's own CudaRNGStatesTracker on the emulated generator: model_parallel_cuda_manual_seed
    seeds it, fork() gives dropout its own stream and puts the default one back, saved states replay,
    and the CPU generator is not touched (no "CPU RNG state changed" warning)."""
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel import random as mrandom

    tensor_parallel.model_parallel_cuda_manual_seed(123, tp_rank=0, ep_rank=0, etp_rank=0)
    tracker = tensor_parallel.get_cuda_rng_tracker()
    assert type(tracker) is mrandom.CudaRNGStatesTracker
    assert set(tracker.get_states()) >= {"model-parallel-rng", "data-parallel-rng"}
    state = torch.cuda.get_rng_state()
    default_first = _mask()
    torch.cuda.set_rng_state(state)
    saved = {k: v.clone() for k, v in tracker.get_states().items()}
    g = torch.Generator()
    g.manual_seed(123 + 2718 + 0)  # tensor_model_parallel_seed = seed + 2718 + tp_rank (random.py:411-413)
    assert torch.equal(saved["model-parallel-rng"], g.get_state())
    cpu = torch.get_rng_state()
    with tracker.fork():
        forked = _mask()
    assert torch.equal(torch.get_rng_state(), cpu)
    assert torch.equal(_mask(), default_first)  # fork() put the default stream back
    assert not torch.equal(forked, default_first)
    tracker.set_states(saved)
    with tracker.fork():
        assert torch.equal(_mask(), forked)  # restoring the states replays the stream
    with pytest.raises(Exception, match="not added"):
        with tracker.fork("no-such-state"):
            pass


def test_recompute_rng_helpers_use_the_device_generator(active: None) -> None:
    """CheckpointFunction (full recompute) saves and restores the state through these two."""
    from megatron.core.tensor_parallel import random as mrandom

    state = mrandom._get_cuda_rng_state()
    a = _mask()
    mrandom._set_cuda_rng_state(state)
    assert torch.equal(_mask(), a)


def test_deactivate_restores_torch_cuda_rng() -> None:
    if torch.cuda.is_available():
        pytest.skip("the layer is for machines without CUDA")
    from megatron.core.tensor_parallel import random as mrandom

    before = (torch.cuda.get_rng_state, torch.cuda.random.manual_seed, torch.cuda.manual_seed_all,
              mrandom._get_cuda_rng_state, mrandom._CUDA_RNG_STATE_TRACKER)
    with cpu_compat.enabled():
        assert torch.cuda.get_rng_state is not before[0]
    assert (torch.cuda.get_rng_state, torch.cuda.random.manual_seed, torch.cuda.manual_seed_all,
            mrandom._get_cuda_rng_state, mrandom._CUDA_RNG_STATE_TRACKER) == before
    cpu = torch.get_rng_state()
    torch.nn.functional.dropout(torch.ones(8), 0.5)  # without the layer: the CPU generator again
    assert not torch.equal(torch.get_rng_state(), cpu)


def test_active_in_backward_through_megatrons_custom_backward(active: None) -> None:
    """Backward code (custom autograd functions, full recompute) sees the layer when the engine is
    entered directly, as megatron's schedules do with deallocate_pipeline_outputs=True (the
    trainer sets it); torch.autograd.backward() itself would run the backward outside the mode."""
    from megatron.core.pipeline_parallel.schedules import custom_backward

    class NeedsCuda(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[override]
            return x * 2

        @staticmethod
        def backward(ctx, grad):  # type: ignore[override]
            return grad * 2 + torch.zeros(grad.shape, device="cuda")  # a CUDA-only spot, in backward

    x = torch.ones(3, requires_grad=True)
    custom_backward(NeedsCuda.apply(x).sum(), None)
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def _saved_rng(cuda: "torch.Tensor | None", tracked: dict) -> dict:
    import random

    import numpy as np

    return {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": cuda, "rng_tracker_states": tracked}


def test_checkpoint_without_a_device_state_continues_on_the_torch_state(active: None) -> None:
    """The builtin's checkpoints from before the emulated generator hold cuda_rng_state None (their
    dropout drew from the torch generator): the device generator continues from the torch state."""
    from types import SimpleNamespace

    from megatron.core import tensor_parallel

    from lingjun_slurm.injob.train.ckpt import _set_rng_state

    torch.manual_seed(11)
    torch.rand(5)
    state = _saved_rng(None, {"model-parallel-rng": torch.get_rng_state()})
    with torch._C.DisableTorchFunction():  # outside the layer: dropout on the torch generator, as that build drew
        expected = _mask()
    torch.manual_seed(99)
    _set_rng_state(state, SimpleNamespace(use_cuda=False, cpu_compat=True))
    assert torch.equal(torch.get_rng_state(), state["torch_rng_state"])
    assert torch.equal(_mask(), expected)
    assert torch.equal(tensor_parallel.get_cuda_rng_tracker().get_states()["model-parallel-rng"],
                       state["torch_rng_state"])


def test_checkpoint_with_gpu_rng_states_warns_and_keeps_the_seeded_streams(
        active: None, caplog: pytest.LogCaptureFixture) -> None:
    """A GPU's Philox states (16 bytes) cannot be set on the emulated generator: one warning, the
    seeded device streams stay, no traceback from deep inside a later fork()."""
    from types import SimpleNamespace

    from megatron.core import tensor_parallel

    from lingjun_slurm.injob.train.ckpt import _set_rng_state

    tensor_parallel.model_parallel_cuda_manual_seed(5, tp_rank=0, ep_rank=0, etp_rank=0)
    seeded = {k: v.clone() for k, v in tensor_parallel.get_cuda_rng_tracker().get_states().items()}
    device = torch.cuda.get_rng_state()
    philox = torch.zeros(16, dtype=torch.uint8)
    state = _saved_rng(philox, {"model-parallel-rng": philox.clone(), "data-parallel-rng": philox.clone()})
    with caplog.at_level("WARNING", logger="lingjun_slurm.injob.train.ckpt"):
        _set_rng_state(state, SimpleNamespace(use_cuda=False, cpu_compat=True))
    assert "(cuda_rng_state, model-parallel-rng, data-parallel-rng) were saved on GPUs" in caplog.text
    assert torch.equal(torch.cuda.get_rng_state(), device)
    kept = tensor_parallel.get_cuda_rng_tracker().get_states()
    assert all(torch.equal(kept[k], seeded[k]) for k in seeded)
    with tensor_parallel.get_cuda_rng_tracker().fork():
        _mask()
