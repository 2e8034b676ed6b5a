"""Which checkpoint to resume from: check it before loading, fall back past damaged ones.

Before the load, rank 0 checks the checkpoint the tracker names, cheaply, with what the format
itself records (lingjun_slurm.checkpoint.verify's checks, not a second verifier):

  - the tracker: read the way Megatron-LM's read_metadata reads it (strip, int(); anything
    else is an error there, `sys.exit()`: NVIDIA/Megatron-LM megatron/training/checkpointing.py
    :388-405 at d98e8a64), done by ckpt.latest();
  - the iteration directory exists;
  - metadata.json (megatron-core's CONFIG_FNAME, dist_checkpointing/core.py:12, written last by
    dist_checkpointing.save, serialization.py:340-345) reads and says torch_dist;
  - .metadata (torch's _metadata_fn, torch/distributed/checkpoint/filesystem.py:69) unpickles,
    and every shard file its storage_data names (_StorageInfo relative_path, offset, length,
    filesystem.py:75-80, filled per item at :328-369 and gathered at :763-764) is present and at
    least offset + length bytes long;
  - common.pt is an intact torch archive (zip CRCs) that loads with weights_only=True;
  - when the iteration has a lingjun-manifest.json: every file it lists with its recorded size.

Hashing every file against the manifest reads the whole checkpoint (minutes for terabytes), so
it happens only when asked: LINGJUN_VERIFY_CHECKPOINT=full runs `checkpoint verify`'s full
verification (lingjun_slurm.checkpoint.verify.verify) instead.

A checkpoint that fails the check, or whose load raises a read error (torch's
"PytorchStreamReader failed ...", a truncated pickle), is damaged: the next older iteration
directory is tried, down to the oldest. The fallback is said once on stderr, recorded in
metrics.jsonl ("resume_fallback") and in <run_dir>/stage-notes/train.txt with this job's id,
which `lingjun-slurm status` shows in the train stage's REASON while that job is the stage's
latest (a later start without a fallback removes it). The tracker is not rewritten (Megatron-LM
never rewrites it on a load; it writes it only after a complete save, checkpointing.py:1074-1084).
Right after the fallback the damaged directories newer than the one resumed are renamed to
iter_NNNNNNN.damaged-<UTC time> (kept, never deleted): left under their names, a later job whose
tracker is older would take one for an unfinished save and remove it (ckpt.save; megatron-core
itself would save over it with a warning, dist_checkpointing/serialization.py:383-387).

Rank 0 checks; the other ranks wait for its answer in the process group's store, with a wait of
their own (CHECK_WAIT), not in a collective: a collective gives up after the process group's
timeout (LINGJUN_DIST_TIMEOUT_MIN, 30 min), and hashing a checkpoint of terabytes takes longer.
"""

from __future__ import annotations

import datetime
import itertools
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import stagenotes
from . import TrainError

log = logging.getLogger(__name__)

VERIFY_ENV = "LINGJUN_VERIFY_CHECKPOINT"
MODES = ("cheap", "full")
NOTES_DIR = stagenotes.NOTES_DIR  # <run_dir>/stage-notes/<stage>.txt: read by lingjun_slurm.status
STAGE = "train"
# How long the other ranks wait for rank 0's check of one checkpoint (see the module's docstring).
# With init_method tcp:// (runtime.start) rank 0 hosts the store: if it dies, the wait ends at
# once (the clients see EOF); under torchrun's agent store the agent ends the other workers.
CHECK_WAIT = datetime.timedelta(hours=24)
_KEYS = itertools.count()  # every rank asks in the same order: the n-th question has the same key


def verify_mode() -> str:
    """LINGJUN_VERIFY_CHECKPOINT: "cheap" (default: structure and sizes) or "full" (hashes too)."""
    raw = os.environ.get(VERIFY_ENV, "").strip().lower()
    if raw in ("", "cheap"):
        return "cheap"
    if raw == "full":
        return "full"
    raise TrainError(f"{VERIFY_ENV}={os.environ[VERIFY_ENV]!r} is not one of: {', '.join(MODES)}")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def check(ckpt_dir: str, iteration: int, mode: str = "cheap") -> list[str]:
    """The problems of iteration `iteration` in ckpt_dir; [] when it passes. A file that cannot be
    read (EIO, EACCES: OSError from any check, in either mode) is a problem, not an error."""
    from ..checkpoint import iter_name

    iter_dir = Path(ckpt_dir) / iter_name(iteration)
    try:
        return _check(ckpt_dir, iter_dir, iteration, mode)
    except OSError as exc:  # a file the checks open and cannot read (EIO, EACCES): damaged for the resume
        where = exc.filename or iter_dir
        return [_one_line(f"cannot read {where}: {exc.strerror or exc}")]


def _check(ckpt_dir: str, iter_dir: Path, iteration: int, mode: str) -> list[str]:
    from ..checkpoint import iter_name
    from ..checkpoint.errors import CheckpointDamaged, CheckpointError
    from ..checkpoint.verify import quick_problems, verify

    if not iter_dir.is_dir():
        return [f"{iter_name(iteration)} does not exist in {ckpt_dir}"]
    if mode == "full":
        try:
            report = verify(ckpt_dir, iteration)
        except CheckpointDamaged as exc:
            return [_one_line(p) for p in exc.problems]
        except CheckpointError as exc:
            return [_one_line(str(exc))]
        if report.manifest == "absent":
            log.warning("%s has no lingjun-manifest.json: full verification had no hashes to compare "
                        "(`lingjun-slurm checkpoint verify DIR --write-manifest` writes one)", iter_dir)
        return []
    return [_one_line(p) for p in quick_problems(iter_dir, iteration)]


def candidates(ckpt_dir: str, tracker_iteration: int) -> list[int]:
    """The tracker's iteration, then every older iteration directory, newest first. Directories
    newer than the tracker are unfinished saves: never resumed from."""
    from ..checkpoint.layout import iterations

    older = [it for it, _ in iterations(Path(ckpt_dir)) if it < tracker_iteration]
    return [tracker_iteration, *sorted(older, reverse=True)]


@dataclass
class Outcome:
    progress: Any  # ckpt.Progress
    iteration: int
    damaged: list[tuple[str, str]] = field(default_factory=list)  # (iter_NNNNNNN, reason), newest first


def from_rank0(rt: Any, compute: Any) -> Any:
    """compute() on rank 0; its (JSON) result on every rank. The other ranks wait in the default
    process group's store (TCPStore.wait with CHECK_WAIT, torch/distributed/distributed_c10d.py
    _get_default_store), so a rank 0 that hashes for hours is waited for, where broadcast_object_list
    would fail after the process group's timeout. An error on rank 0 is raised on every rank.

    Rank 0 returns only when every other rank has read the answer (each adds 1 to a counter; the
    last one says so), then deletes the keys: with init_method tcp:// rank 0's process is the
    store's server (torch/distributed/rendezvous.py _create_c10d_store), and a rank 0 that went on
    to exit ("nothing to train") took the answer with it from a rank still on its way to read it.
    The key carries TORCHELASTIC_RESTART_COUNT: under torchrun the agent's store outlives a
    restart of the workers, and must not answer a new attempt with an old attempt's value."""
    import torch.distributed as dist

    if rt.world_size == 1 or not dist.is_initialized():
        return compute()
    store = dist.distributed_c10d._get_default_store()
    key = f"lingjun/resume/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{next(_KEYS)}"
    if rt.rank != 0:
        store.wait([key], CHECK_WAIT)
        got = json.loads(store.get(key))
        if store.add(f"{key}/read", 1) == rt.world_size - 1:
            store.set(f"{key}/done", "1")
        if "error" in got:
            raise TrainError(f"rank 0 could not check the checkpoint: {got['error']}")
        return got["value"]

    def answer(record: dict[str, Any], wait: datetime.timedelta) -> None:
        store.set(key, json.dumps(record))
        store.wait([f"{key}/done"], wait)
        for k in (key, f"{key}/read", f"{key}/done"):
            store.delete_key(k)

    try:
        value = compute()
    except BaseException as exc:
        try:  # the others are waiting already: a minute is plenty for them to read it
            answer({"error": _one_line(str(exc)) or type(exc).__name__}, datetime.timedelta(minutes=1))
        except Exception:
            pass
        raise
    from .runtime import dist_timeout

    answer({"value": value}, dist_timeout())  # the others are waiting, or nearly there
    return value


def _any_rank(rt: Any, flag: bool) -> bool:
    import torch
    import torch.distributed as dist

    if rt.world_size == 1 or not dist.is_initialized():
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=rt.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def fallback_line(damaged: list[tuple[str, str]], resumed: str) -> str:
    said = ", ".join(f"{name} is damaged ({reason})" for name, reason in damaged)
    return f"checkpoint {said}; resuming from {resumed}, the newest that passes"


def _note_path(run_dir: str) -> Path:
    return stagenotes.note_path(run_dir, STAGE)


def write_note(run_dir: str, text: str) -> None:
    """<run_dir>/stage-notes/train.txt: what `status` shows for the train stage (stagenotes.py)."""
    try:
        stagenotes.write_note(run_dir, STAGE, text)
    except OSError as exc:
        log.warning("cannot record the checkpoint fallback for `status` in %s: %s", run_dir, exc.strerror or exc)


def clear_note(run_dir: str) -> None:
    """A start without a fallback: an earlier job's note no longer describes the stage."""
    try:
        _note_path(run_dir).unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove the earlier checkpoint-fallback note %s: %s", _note_path(run_dir),
                    exc.strerror or exc)


def move_aside(ckpt_dir: str, names: list[str]) -> None:
    """Rename damaged iteration directories to iter_NNNNNNN.damaged-<UTC> (never delete them).
    Rank 0 only. A rename that fails is a warning: the directory is then left where it is."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for name in names:
        path = Path(ckpt_dir) / name
        aside = path.with_name(f"{name}.damaged-{stamp}")
        try:
            if not path.is_dir():
                continue
            os.rename(path, aside)
        except OSError as exc:  # rank 0 alone must not fail here: the others have gone on to train
            log.warning("cannot move the damaged %s aside: %s", path, exc.strerror or exc)
            continue
        log.warning("moved the damaged %s aside to %s (it is kept; delete it when no longer needed)", path, aside)


def resume(settings: Any, rt: Any, tracker_iteration: int, load: Any, metrics: Any = None,
           mode: str = "cheap", checked: dict[int, list[str]] | None = None) -> Outcome:
    """Check, then load, the newest checkpoint that passes, from the tracker's down.

    load(iteration) restores that iteration (ckpt.load) and returns its Progress; it raises
    ckpt.CheckpointReadError for a damaged checkpoint (anything else is raised as it is).
    Every rank calls this; rank 0 checks the files and says what it found to the others, and a
    load that fails on any rank sends every rank to the next candidate. checked: iterations
    already checked (their problems), not checked again."""
    from . import ckpt
    from ..checkpoint import iter_name

    ckpt_dir = settings.checkpoint.dir
    order = from_rank0(rt, lambda: candidates(ckpt_dir, tracker_iteration))
    damaged: list[tuple[str, str]] = []
    for it in order:
        name = iter_name(it)
        problems = (checked or {}).get(it)
        if problems is None:
            problems = from_rank0(rt, lambda it=it: check(ckpt_dir, it, mode))
        if problems:
            damaged.append((name, "; ".join(problems)))
            continue
        error: str | None = None
        progress = None
        try:
            progress = load(it)
        except ckpt.CheckpointReadError as exc:
            error = exc.reason
        if _any_rank(rt, error is not None):
            damaged.append((name, error or "the load failed on another rank"))
            continue
        outcome = Outcome(progress, it, damaged)
        if rt.rank == 0 and not damaged:
            clear_note(settings.run_dir)
        elif rt.rank == 0:
            line = fallback_line(damaged, name)
            print(f"lingjun-slurm: train: {line}", file=sys.stderr, flush=True)
            move_aside(ckpt_dir, [n for n, _ in damaged])  # every rank has loaded: none reads them now
            write_note(settings.run_dir, line)
            if metrics is not None:
                metrics.record("resume_fallback", iteration=it, resumed_from=name, tracker=iter_name(tracker_iteration),
                               damaged=[{"name": n, "reason": r} for n, r in damaged])
        return outcome
    said = "; ".join(f"{name}: {reason}" for name, reason in damaged)
    raise TrainError(f"cannot resume from {ckpt_dir}: no checkpoint passes the check ({said}); "
                     "the damaged directories were left as they are")

