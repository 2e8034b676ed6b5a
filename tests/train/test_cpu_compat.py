"""lingjun_slurm.train.cpu_compat: each redirect, its confinement to CPU mode, and undoing it."""

from __future__ import annotations

from typing import Iterator

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core", reason="needs megatron-core (pip install '.[megatron]')")

from lingjun_slurm.train import cpu_compat  # noqa: E402


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


def test_rng_tracker_on_cpu_generators(active: None) -> None:
    """model_parallel_cuda_manual_seed and the tracker's fork() work on CPU generator states: a
    forked stream is its own, the default stream is untouched by it, and saved states replay."""
    from megatron.core import tensor_parallel

    tensor_parallel.model_parallel_cuda_manual_seed(123, tp_rank=0, ep_rank=0, etp_rank=0)
    tracker = tensor_parallel.get_cuda_rng_tracker()
    assert set(tracker.get_states()) >= {"model-parallel-rng", "data-parallel-rng"}
    torch.manual_seed(7)
    default_first = torch.rand(3)
    torch.manual_seed(7)
    saved = {k: v.clone() for k, v in tracker.get_states().items()}
    with tracker.fork():
        forked = torch.rand(3)
    assert torch.equal(torch.rand(3), default_first)  # fork() put the default stream back
    assert not torch.equal(forked, default_first)
    tracker.set_states(saved)
    with tracker.fork():
        assert torch.equal(torch.rand(3), forked)  # restoring the states replays the stream
    with pytest.raises(Exception, match="not added"):
        with tracker.fork("no-such-state"):
            pass


def test_recompute_rng_helpers_use_the_cpu_generator(active: None) -> None:
    from megatron.core.tensor_parallel import random as mrandom

    state = mrandom._get_cuda_rng_state()
    a = torch.rand(2)
    mrandom._set_cuda_rng_state(state)
    assert torch.equal(torch.rand(2), a)


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
