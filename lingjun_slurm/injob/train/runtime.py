"""Where this process stands: rank and world from the environment, process groups, device, seeds.

One process per GPU (or per CPU task). Rank variables, in order of preference:
RANK / WORLD_SIZE / LOCAL_RANK (the task wrapper of the rendered scripts, torchrun), then
srun's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, then a single process. MASTER_ADDR and
MASTER_PORT come from the batch script (or torchrun); a single process without them gets a
private in-memory store.
"""

from __future__ import annotations

import datetime
import logging
import os
import random
from dataclasses import dataclass
from typing import Any

from . import TrainError
from .settings import TrainSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str | None
    master_port: int | None


def _int_env(env: dict[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            try:
                return int(value)  # type: ignore[arg-type]
            except ValueError:
                raise TrainError(f"{name}={value!r} is not an integer") from None
    return None


def dist_env(env: dict[str, str] | None = None) -> DistEnv:
    """Rank/world/local rank and the rendezvous address from the environment."""
    env = dict(os.environ if env is None else env)
    rank = _int_env(env, "RANK", "SLURM_PROCID")
    world = _int_env(env, "WORLD_SIZE", "SLURM_NTASKS")
    local = _int_env(env, "LOCAL_RANK", "SLURM_LOCALID")
    rank, world = (0 if rank is None else rank), (1 if world is None else world)
    local = rank if local is None else local
    if not 0 <= rank < world:
        raise TrainError(f"rank {rank} is outside the world size {world} (RANK/WORLD_SIZE or SLURM_PROCID/NTASKS)")
    port = _int_env(env, "MASTER_PORT")
    addr = env.get("MASTER_ADDR") or None
    if world > 1 and (addr is None or port is None):
        raise TrainError(f"world size {world} needs MASTER_ADDR and MASTER_PORT in the environment "
                         "(the batch script exports them; torchrun sets them)")
    return DistEnv(rank, world, local, addr, port)


@dataclass
class Runtime:
    """The process's place in the job, set up by `start`."""

    env: DistEnv
    device: Any  # torch.device
    backend: str
    use_cuda: bool
    cpu_compat: bool
    dtype_name: str  # the precision actually used: bf16, fp16 or fp32
    tp: int
    pp: int
    cp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int  # data parallel rank (context parallel ranks share data)

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size


def start(settings: TrainSettings, env: DistEnv | None = None) -> Runtime:
    """Process group, device, megatron parallel state, seeds; CPU: gloo + fp32 + cpu_compat."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    from . import cpu_compat

    env = env or dist_env()
    par = settings.parallel
    mp = par.tensor * par.pipeline * par.context
    if env.world_size % mp:
        raise TrainError(f"tensor {par.tensor} x pipeline {par.pipeline} x context {par.context} = {mp} "
                         f"does not divide the world size {env.world_size}")
    dp = env.world_size // mp
    if par.global_batch % (par.micro_batch * dp):
        raise TrainError(f"global_batch {par.global_batch} is not divisible by micro_batch {par.micro_batch} "
                         f"x data parallel {dp}")
    use_cuda = torch.cuda.is_available()
    if settings.gpus_per_node and not use_cuda:
        # A GPU job that cannot see its GPUs (a CPU-only torch in the image, no driver in the
        # container, CUDA_VISIBLE_DEVICES emptied) must not quietly train on the CPU for days.
        raise TrainError(f"the train stage asks for {settings.gpus_per_node} GPUs per node, but torch {torch.__version__} "
                         "sees no CUDA device (torch.cuda.is_available() is False): check the image's torch build "
                         "(torch.version.cuda), the driver in the container and CUDA_VISIBLE_DEVICES")
    precision = settings.training.precision
    if use_cuda:
        if env.local_rank >= torch.cuda.device_count():
            raise TrainError(f"LOCAL_RANK {env.local_rank} but only {torch.cuda.device_count()} GPUs are visible: "
                             "run one task per GPU")
        torch.cuda.set_device(env.local_rank)
        device, backend = torch.device("cuda", env.local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        if precision != "fp32":
            log.warning("no CUDA: training in fp32 on the CPU (the plan asks for %s)", precision)
            precision = "fp32"
    compat = cpu_compat.activate() if not use_cuda else False

    timeout = dist_timeout()
    if not dist.is_initialized():
        if env.world_size == 1 and (env.master_addr is None or env.master_port is None):
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            os.environ.setdefault("MASTER_ADDR", str(env.master_addr))
            os.environ.setdefault("MASTER_PORT", str(env.master_port))
            kwargs: dict[str, Any] = {}
            if use_cuda:
                kwargs["device_id"] = device
            dist.init_process_group(backend, init_method=f"tcp://{env.master_addr}:{env.master_port}",
                                    rank=env.rank, world_size=env.world_size, timeout=timeout, **kwargs)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=par.tensor, pipeline_model_parallel_size=par.pipeline,
        context_parallel_size=par.context, distributed_timeout_minutes=int(timeout.total_seconds() // 60))
    rt = Runtime(env=env, device=device, backend=backend, use_cuda=use_cuda, cpu_compat=compat,
                 dtype_name=precision, tp=par.tensor, pp=par.pipeline, cp=par.context, dp=dp,
                 tp_rank=parallel_state.get_tensor_model_parallel_rank(),
                 pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
                 dp_rank=parallel_state.get_data_parallel_rank())
    set_seeds(settings.training.seed, rt)
    return rt


def set_seeds(seed: int, rt: Runtime) -> None:
    """Megatron-LM's _set_random_seed: one seed per pipeline stage, the tracker's TP/EP states."""
    import numpy as np
    import torch
    from megatron.core import tensor_parallel

    seed = seed + 100 * rt.pp_rank
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def dist_timeout() -> datetime.timedelta:
    """The process group's timeout: LINGJUN_DIST_TIMEOUT_MIN minutes (30)."""
    return datetime.timedelta(minutes=int(os.environ.get("LINGJUN_DIST_TIMEOUT_MIN", "30")))


def stop() -> None:
    """Tear down the parallel state and process group, and the CPU layer."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from . import cpu_compat

    try:
        parallel_state.destroy_model_parallel()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        cpu_compat.deactivate()
