"""torch_dist checkpoints through megatron's dist_checkpointing, in Megatron-LM's layout.

    {dir}/iter_{NNNNNNN}/                 dist_checkpointing.save (every rank writes its shards)
    {dir}/latest_checkpointed_iteration.txt   rank 0, atomically, only after every rank saved

What Megatron-LM's megatron/training/checkpointing.py puts in the sharded state dict (line
numbers at core_v0.16.1 55ac708; main d98e8a6 the same unless noted), and what this module writes:

  "args"          the argparse.Namespace (generate_state_dict, :891). `--load` reads from it
                  tensor/pipeline_model_parallel_size (RNG and reshard decisions, :1536-1569),
                  consumed_train/valid_samples, skipped_train_samples (:1746-1753), no_save_rng /
                  no_save_optim (getattr, default False), and check_checkpoint_args compares
                  num_layers, hidden_size, num_attention_heads, add_position_embedding (default
                  True) and, with a vocab file, max_position_embeddings, make_vocab_size_divisible_by,
                  tokenizer_type (:102-141). We write those names with the run's values.
  "checkpoint_version"  3.0 (:893; main :1572). Read with default 0.
  "iteration"     required: without it (or total_iters) `--load` exits (:1731-1741).
  "model"         model.sharded_state_dict(metadata) (:900-911), no "module." prefix.
  "optimizer"     optimizer.sharded_state_dict(state_dict, metadata, is_loading) (:917-934); the
                  distributed optimizer as distrib_optim_sharding_type "dp_reshardable" unless
                  --dist-ckpt-optim-fully-reshardable (_build_sharded_state_dict_metadata, :401-434,
                  which also sets singleton_local_shards False and chained_optim_avoid_prefix True;
                  the metadata, minus the process group, goes to dist_checkpointing.save as
                  content_metadata, :621-626, and comes back with load_content_metadata, :1573).
                  Optional: --no-load-optim / --finetune skip it.
  "opt_param_scheduler"  scheduler.state_dict() (:940-942); loaded with the optimizer.
  "rng_state"     get_rng_state (:336-391): [dict(random_rng_state, np_rng_state,
                  torch_rng_state, cuda_rng_state, rng_tracker_states)] (one entry per DP rank
                  only with --data-parallel-random-init), as
                  ShardedObject("rng_state", list, (pp_size, tp_size), (pp_rank, tp_rank),
                  replica_id=dp_cp_rank) (:377-384). Only with expert parallelism > 1 does 0.16.1
                  shard it by (pp, tp, dp) (:365-376); from core_v0.17.0 to main it is always
                  (pp, tp) (main :493-504). `--load` builds that object for the current run and
                  requires it unless --no-load-rng / --finetune or the (TP, PP) changed
                  (:1562-1569): a missing key is a load error, not a warning.
  "num_floating_point_operations_so_far"  (:605); read with default 0 (:1743).
  "rerun_state_machine"  only while a rerun is pending (rerun_state_machine.state_dict returns
                  None otherwise) and loaded only when present (:1694-1707): never written here.

The builtin has no expert parallelism, so for every Megatron-LM version it supports (0.16 ..
0.20) it saves the RNG state the (pp, tp) way (RNG_SHARDING). Checkpoints saved by the builtin
before that (lingjun-slurm <= the "rng (pp, tp, dp)" layout) shard it by (pp, tp, dp x cp); load()
reads either, by looking at the checkpoint's own keys.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import TrainError
from .runtime import Runtime
from .settings import TrainSettings

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 3.0  # checkpointing.py generate_state_dict (core_v0.16.1 :893, main :1572)
# _build_sharded_state_dict_metadata (core_v0.16.1 :401-434): these two always, the sharding type
# only with the distributed optimizer. The default fully_sharded_model_space of megatron-core's
# DistributedOptimizer fails in megatron-core 0.16 with "flattened_range is not supported".
BASE_METADATA = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
DISTOPT_SHARDING = "dp_reshardable"
RNG_KEY = "rng_state"


def sharded_metadata(settings: TrainSettings) -> dict[str, Any]:
    meta = dict(BASE_METADATA)
    if settings.parallel.distributed_optimizer:
        meta["distrib_optim_sharding_type"] = DISTOPT_SHARDING
    return meta


def rng_sharding(version: str | None) -> tuple[str, ...]:
    """The RNG ShardedObject's axes that Megatron-LM `version` uses for a run without expert
    parallelism: ("pp", "tp") from core_v0.16.1 (checkpointing.py:377-384) to main (:493-504).
    Versions outside 0.16 .. 0.20 were refused when the plan was rendered; an undeclared
    version means 0.16.1's conventions."""
    return ("pp", "tp")


@dataclass
class Progress:
    """Where training stands: what a checkpoint must bring back besides weights and state."""

    iteration: int = 0
    consumed_train_samples: int = 0
    consumed_valid_samples: int = 0
    flops_so_far: float = 0.0


def _layout(rt: Runtime) -> dict[str, int]:
    return {"tensor_model_parallel_size": rt.tp, "pipeline_model_parallel_size": rt.pp,
            "context_parallel_size": rt.cp, "data_parallel_size": rt.dp}


_TOKENIZER_TYPES = {"huggingface": "HuggingFaceTokenizer", "gpt2-bpe": "GPT2BPETokenizer",
                    "sentencepiece": "GPTSentencePieceTokenizer", "null": "NullTokenizer"}


def _args(settings: TrainSettings, rt: Runtime, progress: Progress, padded_vocab: int) -> argparse.Namespace:
    from .model import MAKE_VOCAB_SIZE_DIVISIBLE_BY

    m, p = settings.model, settings.parallel
    tok = settings.data.tokenizer or {}
    return argparse.Namespace(
        # what Megatron-LM's --load reads or compares (module docstring), under its names
        add_position_embedding=True, make_vocab_size_divisible_by=MAKE_VOCAB_SIZE_DIVISIBLE_BY,
        tokenizer_type=_TOKENIZER_TYPES.get(str(tok.get("type") or ""), tok.get("type")),
        vocab_size=tok.get("vocab_size"), world_size=rt.world_size, data_parallel_random_init=False,
        no_save_rng=False, no_save_optim=False, use_dist_ckpt=True, ckpt_fully_parallel_save=rt.dp > 1,
        kv_channels=m.hidden_size // m.num_attention_heads,
        group_query_attention=m.num_query_groups != m.num_attention_heads,
        megatron_lm_version=settings.megatron_version,
        num_layers=m.num_layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups,
        seq_length=m.seq_length, max_position_embeddings=m.max_position_embeddings,
        padded_vocab_size=padded_vocab, position_embedding_type=m.position_embedding,
        normalization=m.normalization, swiglu=m.activation == "swiglu",
        untie_embeddings_and_output_weights=m.untie_embeddings,
        micro_batch_size=p.micro_batch, global_batch_size=p.global_batch,
        use_distributed_optimizer=p.distributed_optimizer, ckpt_format="torch_dist",
        iteration=progress.iteration, consumed_train_samples=progress.consumed_train_samples,
        consumed_valid_samples=progress.consumed_valid_samples, skipped_train_samples=0,
        train_iters=settings.training.iterations, seed=settings.training.seed,
        trainer="lingjun_slurm.train", **_layout(rt))


def _rng_state(rt: Runtime) -> dict[str, Any]:
    import numpy as np
    import torch
    from megatron.core import tensor_parallel

    # On the CPU torch.cuda's generator is cpu_compat's emulated device generator (dropout draws from it)
    return {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(),
            "cuda_rng_state": torch.cuda.get_rng_state() if rt.use_cuda or rt.cpu_compat else None,
            "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states()}


def _set_rng_state(state: dict[str, Any], rt: Runtime) -> None:
    """Megatron-LM's load_checkpoint order (checkpointing.py:1863-1886 at core_v0.16.1): python,
    numpy, torch, then the CUDA generator and the tracker's named states.

    On the CPU the CUDA generator is cpu_compat's emulated one. A checkpoint of the builtin from
    before it had one holds no CUDA state (None): its dropout drew from the torch generator, so
    the emulated generator continues from the torch state, which continues that run exactly.
    Device states of the other kind (a GPU's Philox state on the CPU, a CPU generator state on a
    GPU) cannot be set: the device streams then stay as seeded, with a warning."""
    import numpy as np
    import torch
    from megatron.core import tensor_parallel

    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    if not (rt.use_cuda or rt.cpu_compat):
        return
    cuda = state.get("cuda_rng_state")
    if cuda is None and not rt.use_cuda:
        cuda = state["torch_rng_state"]
    tracker = tensor_parallel.get_cuda_rng_tracker()
    graph_safe = tensor_parallel.is_graph_safe_cuda_rng_tracker(tracker)  # as load_checkpoint (:1844, :1870-1873)
    tracked = {k: tensor_parallel.convert_cuda_rng_state(v, to_graphable=graph_safe)
               for k, v in (state.get("rng_tracker_states") or {}).items()}
    size = torch.cuda.get_rng_state().numel()
    foreign = [name for name, st in [("cuda_rng_state", cuda), *tracked.items()]
               if isinstance(st, torch.Tensor) and st.numel() != size]
    if foreign:
        log.warning("the checkpoint's device RNG states (%s) were saved on %s: they cannot be restored here, "
                    "dropout draws start from the seeded states (the run is no longer bit-identical to an "
                    "uninterrupted one)", ", ".join(foreign), "GPUs" if not rt.use_cuda else "the CPU")
        return
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)
    tracker.reset()
    tracker.set_states(tracked)


def _rng_object(rt: Runtime, state: dict[str, Any] | None, sharding: tuple[str, ...]) -> Any:
    """The RNG ShardedObject: ("pp", "tp") is Megatron-LM's (one object per (pp, tp), the DP x CP
    ranks replicas of it, checkpointing.py:377-384); ("pp", "tp", "dp") the builtin's earlier one."""
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    dp_cp = parallel_state.get_data_parallel_world_size(with_context_parallel=True)
    dp_cp_rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)
    if sharding == ("pp", "tp", "dp"):
        return ShardedObject(RNG_KEY, [state], (rt.pp, rt.tp, dp_cp), (rt.pp_rank, rt.tp_rank, dp_cp_rank),
                             replica_id=0)
    return ShardedObject(RNG_KEY, [state], (rt.pp, rt.tp), (rt.pp_rank, rt.tp_rank), replica_id=dp_cp_rank)


def saved_rng_sharding(path: str) -> tuple[str, ...] | None:
    """How the checkpoint at `path` shards its RNG state, from its keys ("rng_state/shard_0.0_1.1"
    is (pp, tp), "rng_state/shard_0.0.0_1.1.1" (pp, tp, dp)); None when it has no RNG state."""
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(path).read_metadata().state_dict_metadata
    for key in keys:
        m = re.fullmatch(re.escape(RNG_KEY) + r"/shard_([\d.]+)_([\d.]+)", key)
        if m:
            return ("pp", "tp", "dp") if m.group(1).count(".") == 2 else ("pp", "tp")
    return None


def _unwrap(model: Any) -> Any:
    """The GPTModel inside megatron's DDP: Megatron-LM's checkpoints have no "module." prefix."""
    while hasattr(model, "module"):
        model = model.module
    return model


def sharded_state_dict(model: Any, optimizer: Any, scheduler: Any, settings: TrainSettings, rt: Runtime,
                       progress: Progress, padded_vocab: int, is_loading: bool,
                       rng: tuple[str, ...] | None = ("pp", "tp"), metadata: dict[str, Any] | None = None) -> dict:
    """Megatron-LM's generate_state_dict for this run; rng: the RNG sharding, None for no RNG state."""
    metadata = sharded_metadata(settings) if metadata is None else metadata
    model_sd = _unwrap(model).sharded_state_dict(metadata=metadata)
    state: dict[str, Any] = {
        "model": model_sd,
        "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=is_loading, metadata=metadata),
        "opt_param_scheduler": scheduler.state_dict(),
        "iteration": progress.iteration,
        "checkpoint_version": CHECKPOINT_VERSION,
        "args": _args(settings, rt, progress, padded_vocab),
        "num_floating_point_operations_so_far": float(progress.flops_so_far),
    }
    if rng is not None:
        state[RNG_KEY] = _rng_object(rt, None if is_loading else _rng_state(rt), rng)
    return state


_MANAGER: Any = None  # keeps the Manager (and its server process) alive


def _manager_process_init() -> None:
    """Initializer of the Manager's server process: ignore SIGTERM/SIGINT (they are for the
    trainer), exit when the trainer is gone (so it never outlives a SIGKILLed trainer), and
    leave at shutdown without the ~0.5 s interpreter teardown."""
    import signal
    import threading
    from multiprocessing import managers

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="lingjun-parent-watch", daemon=True).start()

    def shutdown(self: Any, conn: Any) -> None:  # answer, then leave at once (this server process only)
        try:
            conn.send(("#RETURN", None))
        finally:
            os._exit(0)

    managers.Server.shutdown = shutdown  # type: ignore[method-assign]


def start_writer_manager() -> None:
    """Give dist_checkpointing's torch_dist writer a result-queue Manager that survives SIGTERM.

    megatron's writer collects results through a multiprocessing Manager
    (filesystem_async._get_write_results_queue), which it creates at the first save with the
    spawn context and keeps for the life of the process. Three problems with that one:
    Slurm's `scancel --signal=TERM` and the local runner signal every process of the step, and
    a Manager killed that way makes the save after the signal fail ("Connection refused";
    verified); a spawned child re-imports __main__ (EOFError when __main__ cannot be imported);
    and it imports torch to unpickle the first results (~1.5 s inside the first save).
    This one is forked (megatron forks its writer processes the same way at every save), so it
    has torch already and re-imports nothing, and it ignores SIGTERM/SIGINT. Call it once the
    model is built, before the first save.
    """
    import multiprocessing as mp
    from multiprocessing.managers import SyncManager

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    global _MANAGER
    if getattr(filesystem_async, "_results_queue", "absent") is not None:
        return  # already there, or a megatron-core without this global (it then makes its own)
    manager = SyncManager(ctx=mp.get_context("fork"))
    manager.start(initializer=_manager_process_init)
    _MANAGER = manager
    filesystem_async._results_queue = manager.Queue()


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _no_space(path: str, exc: BaseException) -> str | None:
    """"no space left on <mount>" / "disk quota exceeded on <mount>" when the failed save ran out of
    space, else None. torch's zip writer hides the errno ("[enforce fail at inline_container.cc:672]
    . unexpected pos 704 vs 598", "PytorchStreamWriter failed writing file ..."), so besides an
    OSError's errno and the strerror texts, the filesystem itself is asked: no free block left
    (statvfs), or a small write there fails now with ENOSPC/EDQUOT (the only way to see a quota)."""
    import errno

    from lingjun_slurm.common.diskspace import NO_SPACE, full_filesystem, mount_point

    def what(err: int) -> str:
        return "no space left on" if err == errno.ENOSPC else "disk quota exceeded on"

    seen: list[BaseException] = [exc]
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        seen += [w[0] if isinstance(w, tuple) else w for w in failures.values()]
    for e in list(seen):
        seen += [c for c in (e.__cause__, e.__context__) if c is not None and c not in seen]
    for e in seen:
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            return f"{what(e.errno)} {mount_point(path)}"
    text = describe_exception(exc)
    if "No space left on device" in text:
        return f"{what(errno.ENOSPC)} {mount_point(path)}"
    if "Disk quota exceeded" in text:
        return f"{what(errno.EDQUOT)} {mount_point(path)}"
    where = path if os.path.isdir(path) else os.path.dirname(path)
    if full_filesystem(where):
        return f"{what(errno.ENOSPC)} {mount_point(where)}"
    probe = os.path.join(where, f".lingjun-space-probe-{os.getpid()}")
    try:
        with open(probe, "wb") as fh:
            fh.write(b"\0" * (1 << 20))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        if err.errno in NO_SPACE:
            return f"{what(err.errno)} {mount_point(where)}"
    finally:
        try:
            os.unlink(probe)
        except OSError:
            pass
    return None


def save(ckpt_dir: str, model: Any, optimizer: Any, scheduler: Any, settings: TrainSettings, rt: Runtime,
         progress: Progress, padded_vocab: int) -> tuple[str, float]:
    """Save iteration progress.iteration; returns (path, seconds). The tracker moves only afterwards
    (as Megatron-LM's save_checkpoint: the tracker is written in the finalize step, after the
    save, megatron/training/checkpointing.py:1074-1084 at d98e8a64).

    Between the two, lingjun-manifest.json: each rank hashes the files it wrote and rank 0 writes
    the manifest of them all (train/hashcheck.py save_manifest), so a fresh checkpoint is
    hash-checked at its next load. The order is save (metadata.json last) -> every rank's hashes ->
    manifest (atomic rename) -> tracker: a manifest never describes a partial save, and a tracker
    never names a checkpoint without one. The hashing re-reads the files just written (from the page
    cache, in parallel across the ranks and on threads); its time is in the "saved checkpoint" log
    line and in the seconds returned.

    A directory of this iteration that is newer than the tracker is an unfinished save (damaged
    directories were renamed aside at the resume, resume.move_aside): it is removed. A save that runs out
    of space is one line naming the mount point; the half-written directory is left, the tracker
    still names the previous checkpoint, and the next save of that iteration replaces it."""
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

    from ..checkpoint import iter_name, read_tracker, write_tracker

    start = time.perf_counter()
    path = os.path.join(ckpt_dir, iter_name(progress.iteration))
    if rt.rank == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
        if os.path.exists(path):
            tracker = read_tracker(ckpt_dir)
            if tracker.iteration is None or tracker.iteration >= progress.iteration:
                raise TrainError(f"{path} exists and is not newer than the tracker's checkpoint "
                                 f"({tracker.name or tracker.problem}); refusing to overwrite it")
            log.warning("removing %s: an unfinished save (newer than the tracker)", path)
            stale = f"{path}.lingjun-stale-{os.getpid()}"
            os.rename(path, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.makedirs(path)
    _barrier()
    state = sharded_state_dict(model, optimizer, scheduler, settings, rt, progress, padded_vocab, is_loading=False,
                               rng=rng_sharding(settings.megatron_version))
    strategy = get_default_save_sharded_strategy("torch_dist")
    if rt.dp > 1:  # spread the replicated tensors' writes over the data-parallel ranks (Megatron-LM's default)
        strategy = FullyParallelSaveStrategyWrapper(
            strategy, parallel_state.get_data_parallel_group(with_context_parallel=True))
    try:
        dist_checkpointing.save(state, path, strategy, content_metadata=sharded_metadata(settings))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # torch's CheckpointException derives from BaseException
        full = _no_space(path, exc)
        if full:
            raise TrainError(f"{full} writing checkpoint {path} (iteration {progress.iteration})") from None
        raise TrainError(f"cannot save checkpoint {path} (iteration {progress.iteration}): "
                         f"{describe_exception(exc)}") from None
    from . import hashcheck

    try:
        _barrier()  # every rank's shards are on disk
        files, size, secs = hashcheck.save_manifest(rt, path, progress.iteration)
        log.info("hashed checkpoint %s for its manifest: %d files, %.1f MiB in %.2f s", path, files, size / 2**20, secs)
    except OSError as exc:
        full = _no_space(path, exc)
        if full:
            raise TrainError(f"{full} writing the manifest of checkpoint {path} (iteration {progress.iteration}); "
                             "the tracker still names the previous checkpoint") from None
        raise TrainError(f"cannot write the manifest of checkpoint {path} (iteration {progress.iteration}): "
                         f"{exc.strerror or exc}") from None
    try:
        _barrier()  # the manifest is written
        if rt.rank == 0:
            write_tracker(ckpt_dir, progress.iteration)
    except OSError as exc:
        full = _no_space(ckpt_dir, exc)
        if full:
            raise TrainError(f"{full} writing the tracker of checkpoint {path} (iteration {progress.iteration}); "
                             "the tracker still names the previous checkpoint") from None
        raise
    _barrier()
    return path, time.perf_counter() - start


def latest(ckpt_dir: str) -> int | None:
    """The iteration to resume from: the tracker's; without a tracker, the newest complete
    iteration directory (metadata.json, which dist_checkpointing.save writes last: a save whose
    tracker write failed, e.g. on a full disk); None for a start from scratch. TrainError when the
    tracker is unusable (not a number: Megatron-LM's read_metadata exits too, checkpointing.py
    :388-405 at d98e8a64) or unreadable.

    An iteration directory that no tracker names (no tracker, or newer than the tracker's) and that
    is incomplete (no metadata.json: the save died, e.g. ENOSPC) is moved aside to
    iter_NNNNNNN.incomplete-<UTC> (kept, never deleted), with a log line saying where training
    starts. Moved by one process only: rank 0 once the process group is up, or a 1-process run."""
    from ..checkpoint import iter_name, read_tracker
    from ..checkpoint.layout import MEGATRON_CONFIG, iterations

    if not os.path.isdir(ckpt_dir):
        return None
    tracker = read_tracker(ckpt_dir)
    if tracker.raw is None and os.path.exists(tracker.path):  # there, but unreadable (EACCES, EIO)
        raise TrainError(f"cannot resume: {tracker.problem}")
    if tracker.raw is not None and tracker.problem:
        raise TrainError(f"cannot resume: {tracker.problem}")
    if tracker.release:
        raise TrainError(f"cannot resume from {ckpt_dir}: the tracker says 'release' (a converted or final "
                         "checkpoint); the builtin trainer resumes only from iter_NNNNNNN checkpoints")
    named = -1 if tracker.iteration is None else tracker.iteration
    found = [(it, path) for it, path in iterations(Path(ckpt_dir)) if it > named]
    unfinished = [path for _it, path in found if not (path / MEGATRON_CONFIG).is_file()]
    complete = [it for it, path in found if (path / MEGATRON_CONFIG).is_file()]
    if tracker.iteration is not None:
        start: int | None = tracker.iteration
        said = f"resuming from {iter_name(tracker.iteration)} (the tracker's)"
    elif complete:
        start = complete[-1]
        said = (f"no {tracker.path.name}: resuming from {iter_name(start)}, the newest complete checkpoint "
                "(its save finished; the tracker was not written)")
    else:
        start, said = None, "no complete checkpoint: training starts from scratch"
    if unfinished and _may_tidy():
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for path in unfinished:
            aside = path.with_name(f"{path.name}.incomplete-{stamp}")
            try:
                os.rename(path, aside)
            except OSError as exc:
                log.warning("cannot move the incomplete %s aside: %s", path, exc.strerror or exc)
                continue
            log.warning("moved the incomplete %s aside to %s: no tracker names it and it has no %s (a save that "
                        "did not finish; kept, delete it to free its space); %s", path, aside.name,
                        MEGATRON_CONFIG, said)
    elif tracker.iteration is None and complete and _may_tidy() and ckpt_dir not in _SAID:
        _SAID.add(ckpt_dir)
        log.warning("%s: %s", ckpt_dir, said)
    # A tracker that names a missing directory is resume.resume's to handle: it falls back to the
    # newest older directory that passes its check.
    return start


_SAID: set[str] = set()  # checkpoint directories whose untracked start latest() has logged


def _may_tidy() -> bool:
    """Whether this process is the one that moves directories aside: rank 0 of an initialized
    process group, or the only process (a world of 1). Imports no torch (entry.py calls latest()
    before it does)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    from .runtime import dist_env

    return dist_env().world_size == 1


def _inner_optimizers(optimizer: Any) -> list[tuple[Any, Any]]:
    """(megatron optimizer, its torch optimizer) pairs, through a ChainedOptimizer."""
    return [(opt, opt.optimizer) for opt in getattr(optimizer, "chained_optimizers", [optimizer])
            if getattr(opt, "optimizer", None) is not None]


def _prime_adam_steps(optimizer: Any) -> None:
    """Before a distributed-optimizer load with torch's Adam (no Apex/TE): allocate the Adam
    state and a `step` per parameter. Building the loading state dict calls the optimizer's
    state_dict(), which reads state[p]["step"] and fails (KeyError) before the first step."""
    import torch

    for opt, inner in _inner_optimizers(optimizer):
        init = getattr(opt, "init_state_fn", None)
        if init is not None and len(inner.state) == 0:
            init(inner, getattr(opt, "config", None))
        for group in inner.param_groups:
            for p in group["params"]:
                st = inner.state[p]
                if len(st) and "step" not in st:
                    st["step"] = torch.tensor(0.0)


def _restore_adam_steps(optimizer: Any) -> None:
    """After that load: put the checkpoint's step (kept in param_groups) into every Adam state.

    megatron-core 0.16's dp_reshardable load sets state[p]["step"] from param_groups first and
    then overwrites it with the per-parameter step of the state dict built for loading (the
    primed 0), and where it does set it, every parameter shares one tensor that torch's Adam
    would advance once per parameter. Verified: without this the losses after a resume differ
    from the second step on."""
    import torch

    for _opt, inner in _inner_optimizers(optimizer):
        for group in inner.param_groups:
            step = group.get("step")
            if step is None:
                continue
            for p in group["params"]:
                st = inner.state.get(p)
                if st is not None and len(st):
                    st["step"] = torch.tensor(float(step), dtype=torch.float32)


def describe_exception(exc: BaseException) -> str:
    """One line for a failed dist_checkpointing load/save: torch's CheckpointException (a
    BaseException whose str() is every rank's traceback) becomes each distinct rank failure,
    e.g. "RuntimeError: Missing key in checkpoint state_dict: rng_state/shard_0.0_1.1 (ranks 0, 1)"."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        by_text: dict[str, list[int]] = {}
        for rank, wrapped in sorted(failures.items()):
            inner = wrapped[0] if isinstance(wrapped, tuple) else wrapped
            by_text.setdefault(describe_exception(inner), []).append(rank)
        return "; ".join(f"{text} (rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))})"
                         for text, r in by_text.items())
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _rng_hint(text: str) -> str:
    if "Missing key" in text and RNG_KEY in text:
        return (" (the checkpoint's RNG state is sharded another way; a checkpoint from an older lingjun-slurm "
                "or another trainer: see docs/checkpoints.md)")
    return ""


class CheckpointReadError(TrainError):
    """The checkpoint's files could not be read back (damaged): resume tries an older one."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# What a load says when the bytes on disk are damaged rather than the run's settings different
# from the checkpoint's: torch's zip reader (caffe2 inline_container.cc "PytorchStreamReader
# failed ..."), pickle on truncated or overwritten bytes, files gone.
_READ_FAILURES = ("PytorchStreamReader", "UnpicklingError", "EOFError", "Ran out of input", "invalid load key",
                  "unexpected EOF", "truncated", "central directory", "CRC", "FileNotFoundError",
                  "No such file", "Input/output error", "BadZipFile", "UnicodeDecodeError")


class CheckpointVersionError(TrainError):
    """The checkpoint is intact but written by a megatron-core newer than the running one (issue 26 item
    2): not damage. Resume stops here (exit 1, one line): nothing is renamed, nothing trained again, no
    older checkpoint is taken instead. `mismatch`: lingjun_slurm.injob.checkpoint.verify.VersionMismatch."""

    def __init__(self, message: str, mismatch: Any) -> None:
        super().__init__(message)
        self.mismatch = mismatch


def version_error(ckpt_dir: str, name: str, mismatch: Any) -> CheckpointVersionError:
    """The one line for a checkpoint this megatron-core cannot read (verify.VersionMismatch.line)."""
    return CheckpointVersionError(f"cannot resume from {ckpt_dir}: {mismatch.line(name)}", mismatch)


def _load_failed(path: str, iteration: int, exc: BaseException) -> TrainError:
    from ..checkpoint.verify import mismatch_from_error

    text = describe_exception(exc)
    # A class or module of megatron-core that this one lacks ("Unsupported global: GLOBAL megatron....",
    # pickle's "Can't get attribute"): a newer writer, not damage, although it is an UnpicklingError too.
    mismatch = mismatch_from_error(text)
    if mismatch is not None:
        return version_error(os.path.dirname(path), os.path.basename(path), mismatch)
    message = f"cannot load checkpoint {path} (iteration {iteration}): {text}{_rng_hint(text)}"
    if any(marker in text for marker in _READ_FAILURES):
        return CheckpointReadError(message, f"the load failed: {text}")
    return TrainError(message)


def _load_weights_only(path: str, iteration: int, model: Any, optimizer: Any, meta: dict[str, Any]) -> Progress:
    """A checkpoint saved without optimizer state (args.no_save_optim: training.init_from's conversion,
    lingjun_slurm/injob/checkpoint/hf/megatron_io.py write_megatron): finetune semantics, as Megatron-LM
    loads --pretrained-checkpoint (checkpointing.py core_v0.16.1:1494-1502 sets args.finetune): the model's
    weights only; iteration and consumed samples 0 (`if args.finetune or release: iteration = 0`, :1731);
    no optimizer, scheduler or RNG state (:1785, :1841); and the optimizer's main parameters refreshed
    from the loaded weights (optimizer.reload_model_params(), :1826-1830), or its first step would put
    the initial weights back. Megatron-LM refreshes them only for fp16/bf16; for fp32 megatron-core's
    FP32Optimizer.reload_model_params does nothing (optimizer/optimizer.py), so it is called always."""
    import torch

    state = {"model": _unwrap(model).sharded_state_dict(metadata=meta)}
    with torch.no_grad():
        loaded = _dcp_load(state, path, iteration)
        _unwrap(model).load_state_dict(loaded["model"], strict=True)
    reload = getattr(optimizer, "reload_model_params", None)
    if reload is not None:
        reload()
    log.info("%s has no optimizer state (a converted model): loaded its weights with finetune semantics, "
             "from iteration 0 with a fresh optimizer, scheduler and RNG state", path)
    return Progress(iteration=0)


def _dcp_load(state: dict, path: str, iteration: int) -> dict:
    """megatron-core's dist_checkpointing.load, its failure as one CheckpointLoadError naming the path."""
    from megatron.core import dist_checkpointing

    try:
        return dist_checkpointing.load(state, path)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # CheckpointException is a BaseException
        raise _load_failed(path, iteration, exc) from None


def load(ckpt_dir: str, iteration: int, model: Any, optimizer: Any, scheduler: Any, settings: TrainSettings,
         rt: Runtime, padded_vocab: int) -> Progress:
    """Restore everything saved at `iteration`; the data position comes back as Progress.

    Reads both RNG layouts (Megatron-LM's (pp, tp) and the builtin's earlier (pp, tp, dp)) and,
    as Megatron-LM's load_checkpoint does (checkpointing.py:1562-1569), restores the RNG state only
    when the checkpoint's (TP, PP) equal this run's, and the distributed optimizer with the
    checkpoint's own content metadata (:1571-1574)."""
    import torch
    from megatron.core import dist_checkpointing

    from ..checkpoint import iter_name

    path = os.path.join(ckpt_dir, iter_name(iteration))
    try:
        common = dist_checkpointing.load_common_state_dict(path)
        saved_rng = saved_rng_sharding(path)
        metadata = dist_checkpointing.load_content_metadata(preloaded_state_dict=common)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        raise _load_failed(path, iteration, exc) from None
    saved_args = common.get("args")
    saved_tp_pp = (getattr(saved_args, "tensor_model_parallel_size", 1),
                   getattr(saved_args, "pipeline_model_parallel_size", 1))
    saved_dp_cp = (getattr(saved_args, "data_parallel_size", None) or 0) * (
        getattr(saved_args, "context_parallel_size", None) or 1)
    use_rng = (saved_rng is not None and saved_tp_pp == (rt.tp, rt.pp)
               and not getattr(saved_args, "no_save_rng", False)
               and (saved_rng != ("pp", "tp", "dp") or saved_dp_cp == rt.dp * rt.cp))
    if saved_args is None or any(getattr(saved_args, k, None) != v for k, v in _layout(rt).items()):
        log.warning("%s was saved with another parallel layout: model and optimizer are resharded%s", path,
                    "" if use_rng else ", the RNG states start fresh (the run is no longer bit-identical to an "
                                       "uninterrupted one)")
    elif not use_rng:
        log.warning("%s has no RNG state this run can restore: the RNG states start fresh", path)
    meta = dict(sharded_metadata(settings))
    if metadata:  # what the checkpoint was saved with (Megatron-LM reads it back the same way)
        meta.update({k: v for k, v in metadata.items() if k != "dp_cp_group"})
    if not settings.parallel.distributed_optimizer:
        meta.pop("distrib_optim_sharding_type", None)
    if saved_args is not None and getattr(saved_args, "no_save_optim", False):
        return _load_weights_only(path, iteration, model, optimizer, meta)
    if settings.parallel.distributed_optimizer:
        _prime_adam_steps(optimizer)
    probe = Progress(iteration=iteration)
    state = sharded_state_dict(model, optimizer, scheduler, settings, rt, probe, padded_vocab, is_loading=True,
                               rng=saved_rng if use_rng else None, metadata=meta)
    with torch.no_grad():
        loaded = _dcp_load(state, path, iteration)
        _unwrap(model).load_state_dict(loaded["model"], strict=True)
        optimizer.load_state_dict(loaded["optimizer"])
    if settings.parallel.distributed_optimizer:
        _restore_adam_steps(optimizer)
    scheduler.load_state_dict(loaded["opt_param_scheduler"])
    if use_rng and loaded.get(RNG_KEY):
        rng = loaded[RNG_KEY]
        if isinstance(rng, list):  # one entry, or one per DP rank (--data-parallel-random-init)
            rng = rng[rt.dp_rank] if len(rng) > 1 else rng[0]
        _set_rng_state(rng, rt)
    args = loaded.get("args") or saved_args
    return Progress(iteration=int(loaded["iteration"]),
                    consumed_train_samples=int(getattr(args, "consumed_train_samples", 0)),
                    consumed_valid_samples=int(getattr(args, "consumed_valid_samples", 0)),
                    flops_so_far=float(loaded.get("num_floating_point_operations_so_far", 0.0)))
