"""run(settings): one rank of the builtin trainer, from process group to the last save."""

from __future__ import annotations


import logging
import os
import sys
import time
from typing import Any

from . import TrainError
from .settings import TrainSettings

from ..stages.runtime import version_tuple

log = logging.getLogger("lingjun_slurm.train")

MEGATRON_CORE_FLOOR = (0, 16, 1)
TORCH_FLOOR = (2, 4)


def check_versions() -> dict[str, str]:
    """torch, megatron-core and psutil present and new enough; TrainError with the fix otherwise."""
    try:
        import torch
    except ImportError:
        raise TrainError("torch is not installed: pip install 'lingjun-slurm[megatron]' "
                         "(or use a container image with torch and megatron-core)") from None
    try:
        from megatron.core.package_info import __version__ as mcore_version
    except ImportError:
        raise TrainError("megatron-core is not installed: pip install 'lingjun-slurm[megatron]' "
                         f"(megatron-core >= {'.'.join(map(str, MEGATRON_CORE_FLOOR))})") from None
    try:
        import psutil  # noqa: F401
    except ImportError:
        raise TrainError("psutil is not installed: megatron-core's checkpoint writer needs it "
                         "(without it dist_checkpointing.save hangs); pip install psutil") from None
    if version_tuple(torch.__version__)[:2] < TORCH_FLOOR:
        raise TrainError(f"torch {torch.__version__} is too old: the builtin trainer needs torch >= "
                         f"{'.'.join(map(str, TORCH_FLOOR))}")
    if version_tuple(mcore_version)[:3] < MEGATRON_CORE_FLOOR:
        raise TrainError(f"megatron-core {mcore_version} is too old: the builtin trainer needs megatron-core >= "
                         f"{'.'.join(map(str, MEGATRON_CORE_FLOOR))} (pip install -U megatron-core)")
    return {"torch": torch.__version__, "megatron-core": mcore_version}


# Warnings megatron-core and torch print on every start that ask nothing of the user.
_QUIET_WARNINGS = (
    r".*(Apex|Transformer Engine)( and Apex)? (is|are) not installed.*",  # CPU / no-TE fallbacks
    r"full scope is deprecated.*",  # TransformerConfig's own default cuda_graph_scope
    r".*`load_state_dict` is deprecated.*",  # dist_checkpointing's torch.distributed.checkpoint call
    r".*deprecating ShardedTensor.*",
)


# megatron-core's checkpoint writer logs a worker's exception before it raises it
# ("Local process 0 encountered an error: [enforce fail at inline_container.cc:672] . unexpected pos
# 704 vs 598" on a full disk: megatron/core/dist_checkpointing/strategies/filesystem_async.py,
# write_preloaded_data_multiproc, lines 320-326 of the megatron-core 0.16.1 wheel). The same
# exception reaches ckpt.save(), which says it in the tool's one line ("no space left on <mount>
# writing checkpoint ..." via ckpt._no_space, else "cannot save checkpoint ...: <the error>"), so the
# log record only repeats it, in torch's words (issue 26 item 6).
_WRITER_LOGGER = "megatron.core.dist_checkpointing.strategies.filesystem_async"


def _drop_writer_error_repeat(record: logging.LogRecord) -> bool:
    return not (record.name == _WRITER_LOGGER and record.getMessage().startswith("Local process ")
                and " encountered an error: " in record.getMessage())


def setup_logging(rank: int) -> None:
    """Rank 0 logs INFO, the others warnings and errors; megatron-core's own INFO chatter is muted."""
    import warnings

    for pattern in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    fmt = f"%(asctime)s lingjun-slurm train [rank {rank}] %(levelname)s: %(message)s"
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_lingjun_train", False)]:
        root.removeHandler(old)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(fmt, "%Y-%m-%d %H:%M:%S"))
    handler._lingjun_train = True  # type: ignore[attr-defined]
    handler.addFilter(_drop_writer_error_repeat)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("lingjun_slurm").setLevel(logging.INFO if rank == 0 else logging.WARNING)


def _check_finished(ckpt_dir: str, iteration: int, mode: str) -> list[str]:
    """resume.check of the last checkpoint of a finished run: one of a newer megatron-core is intact,
    and there is nothing to train, so it is not loaded (the run stays done; a warning says why)."""
    from . import ckpt, resume

    try:
        return resume.check(ckpt_dir, iteration, mode)
    except ckpt.CheckpointVersionError as exc:
        log.warning("%s (nothing to train: it is not loaded)", exc)
        return []


def process_started_at() -> float | None:
    """When this process started, in epoch seconds: the goodput ledger's `launched_at`, the end of
    the container's start (injob/host/ledger.py). proc(5): field 22 of /proc/self/stat is starttime,
    in clock ticks after boot, on the clock of /proc/uptime's first field (seconds since boot, 0.01 s);
    their difference is the process's age, taken from now. (Not /proc/stat's btime + starttime: btime
    is whole seconds and does not follow later corrections of the wall clock, which put a process
    seen here 0.5 s before its parent.) Inside a pyxis/enroot container /proc is the node's kernel's.
    None where /proc does not have them."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()  # after "(comm)": field 3 onwards
        ticks = int(fields[22 - 3])
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        now = time.time()
        return round(now - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK")), 2)
    except (OSError, ValueError, IndexError):
        return None


def _stop_at() -> int | None:
    """LINGJUN_TRAIN_STOP_AT=N: save and exit 0 after iteration N, as if SIGTERM arrived (tests, drills)."""
    raw = os.environ.get("LINGJUN_TRAIN_STOP_AT", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise TrainError(f"LINGJUN_TRAIN_STOP_AT={raw!r} is not an iteration number >= 1")
    return int(raw)


def run(settings: TrainSettings) -> int:
    """Train (or resume) to settings.training.iterations; 0 when done or stopped by a signal."""
    from . import ckpt, data, resume, runtime  # light: torch and megatron are imported further down
    from .loop import StopFlag

    env = runtime.dist_env()
    setup_logging(env.rank)
    total = settings.training.iterations
    verify_mode = resume.verify_mode()
    seen = ckpt.latest(settings.checkpoint.dir)  # this rank's view: rank 0's decides, below
    if seen is None or seen < total:
        data.check_prefix(settings.data.prefix)
    stop_at = _stop_at()
    versions = check_versions()
    tokenizer = data.dataset_tokenizer(settings.data.tokenizer)

    from . import metrics, model, optim
    from . import steptimes
    from .loop import Trainer, _configure_model_hooks, attach_step_times, train

    stop_flag = StopFlag()
    stop_flag.install()  # before the slow setup: a signal during it still ends in a clean save
    mx: metrics.Metrics | None = None
    started: dict[int, Any] = {}
    try:
        import torch

        rt = runtime.start(settings, env)
        # Every rank goes on from what rank 0 read: ranks that read the tracker apart (a save
        # landing in between, a filesystem's caching) would otherwise take different paths.
        start_iter = resume.from_rank0(rt, lambda: ckpt.latest(settings.checkpoint.dir))
        finished = start_iter is not None and start_iter >= total
        if not finished and seen is not None and seen >= total:
            data.check_prefix(settings.data.prefix)
        checked: dict[int, list[str]] = {}
        if finished:  # check the last checkpoint too: a missing or damaged one is trained again
            assert start_iter is not None
            problems = resume.from_rank0(rt, lambda: _check_finished(settings.checkpoint.dir, start_iter, verify_mode))
            if not problems:
                if rt.rank == 0:
                    resume.clear_note(settings.run_dir)
                log.info("checkpoint %s is at iteration %d of %d (checked %s): nothing to train",
                         settings.checkpoint.dir, start_iter, total,
                         resume.checked_as(verify_mode, f"iter_{start_iter:07d}"))
                return 0
            checked[start_iter] = problems
            data.check_prefix(settings.data.prefix)
        # The tracker's checkpoint: its check starts now, so the hashing (threads on every rank) runs
        # while the model and the datasets are built; its verdict is taken before the load
        # (resume.resume, started=): nothing of a checkpoint that fails is ever loaded.
        started = ({start_iter: resume.start_check(rt, settings.checkpoint.dir, start_iter, verify_mode)}
                   if start_iter is not None and start_iter not in checked else {})
        mx = metrics.Metrics(settings.metrics_path, settings.run_id, enabled=rt.rank == 0,
                             log_interval=settings.training.log_interval)
        vocab = model.padded_vocab_size(max(tokenizer.vocab_size, settings.model.vocab_size or 0), rt.tp)
        ddp, _config, spec_name = model.build(settings, rt, vocab)
        optimizer = optim.build_optimizer(settings, rt, ddp)
        scheduler = optim.build_scheduler(settings, optimizer)
        _configure_model_hooks(ddp, optimizer)
        t0 = time.perf_counter()
        train_ds, valid_ds = data.build_datasets(settings, tokenizer)
        log.info("datasets: %d train samples%s over %s (%.1f s)", len(train_ds),
                 f", {len(valid_ds)} validation samples" if valid_ds is not None else ", no validation split",
                 settings.data.prefix, time.perf_counter() - t0)
        dp_rank = rt.dp_rank
        train_batches = data.Batches(train_ds, settings.parallel.micro_batch, rt.dp, dp_rank, rt.device)
        valid_batches = (data.Batches(valid_ds, settings.parallel.micro_batch, rt.dp, dp_rank, rt.device)
                         if valid_ds is not None else None)
        device_name = torch.cuda.get_device_name() if rt.use_cuda else None
        tr = Trainer(settings, rt, ddp, optimizer, scheduler, train_batches, valid_batches, vocab,
                     metrics.flops_per_sample(settings.model, vocab), metrics.peak_tflops(device_name))
        # Each rank's compute and wait per step for the straggler watchdog, and the LINGJUN_TRAIN_SLOW
        # test hook (steptimes.py); straggler_action: off measures nothing.
        if settings.training.straggler_action != "off":
            tr.steps = steptimes.for_runtime(rt, settings.run_dir, settings.training.log_interval,
                                             settings.training.straggler_action)
            attach_step_times(ddp, tr.steps)
        slow = steptimes.SlowHook(rt.rank, steptimes.node_name())
        tr.slow = slow if slow.path else None
        if start_iter is not None:
            t0 = time.perf_counter()
            outcome = resume.resume(
                settings, rt, start_iter,
                lambda it: ckpt.load(settings.checkpoint.dir, it, ddp, optimizer, scheduler, settings, rt, vocab),
                mx, verify_mode, checked, started)
            tr.progress = outcome.progress
            log.info("resumed from %s/iter_%07d (consumed samples %d; checked %s) in %.2f s", settings.checkpoint.dir,
                     outcome.iteration, tr.progress.consumed_train_samples,
                     resume.checked_as(verify_mode, f"iter_{outcome.iteration:07d}"), time.perf_counter() - t0)
        if start_iter is None:  # Megatron-LM's DataLoaders draw here too; a resume restores the state after them
            data.megatron_loader_draws(rt, data.megatron_split_count(settings, valid_ds))
        params = model.count_parameters(ddp)
        log.info("GPT %d layers, hidden %d, %d heads, vocab %d (padded from %d), seq %d: %s parameters on this rank; "
                 "world %d = TP %d x PP %d x CP %d x DP %d; %s, %s, %s layer spec, %s; torch %s, megatron-core %s",
                 settings.model.num_layers, settings.model.hidden_size, settings.model.num_attention_heads, vocab,
                 tokenizer.vocab_size, settings.model.seq_length, f"{params:,}", rt.world_size, rt.tp, rt.pp, rt.cp,
                 rt.dp, device_name or "CPU", rt.backend, spec_name, rt.dtype_name, versions["torch"],
                 versions["megatron-core"])
        if rt.cpu_compat:
            log.info("CPU mode: gloo, fp32, megatron-core's CUDA-only calls redirected "
                     "(lingjun_slurm.injob.train.cpu_compat)")
        mx.record("start", iteration=tr.progress.iteration, world_size=rt.world_size, tp=rt.tp, pp=rt.pp, cp=rt.cp,
                  dp=rt.dp, device=device_name or "cpu", precision=rt.dtype_name, layer_spec=spec_name,
                  parameters=params, padded_vocab_size=vocab,
                  tokens_per_step=settings.parallel.global_batch * settings.model.seq_length,
                  pid=os.getpid(), launched_at=process_started_at())
        ckpt.start_writer_manager()
        reason = train(tr, mx, stop_flag, stop_at=stop_at)
        mx.record("stop", iteration=tr.progress.iteration, reason=reason)
        return 0
    except ckpt.CheckpointVersionError as exc:
        # A checkpoint of a newer megatron-core (issue 26 item 2): the stage ends with this one line
        # (stages/train.py, exit 1) and `status` shows it as the train stage's REASON (stagenotes.py).
        if env.rank == 0:
            resume.write_note(settings.run_dir, str(exc))
        raise
    except BaseException as exc:
        # Failed between starting the hash check and taking its verdict (the model build, say): the
        # other ranks are told at once, instead of waiting for this rank's share (hashcheck.Pending).
        for _problems, pending in started.values():
            if pending is not None:
                pending.abort(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        stop_flag.uninstall()
        if mx is not None:
            mx.close()
        runtime.stop()  # also undoes cpu_compat
