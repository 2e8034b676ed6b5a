"""Retention: keep the newest N complete iterations, the tracker's, the pinned and the in-progress ones.

Rules (docs/checkpoints.md):
- a valid tracker pointing at an existing iteration is required, else nothing is deleted;
- iterations newer than the tracker are a save in progress: never touched;
- the tracker's iteration and pinned iterations are always kept;
- of the others up to the tracker, the newest `keep` *complete* ones (Megatron's metadata.json
  present) are kept; the rest, including incomplete saves the tracker has moved past, are
  deleted oldest first;
- a directory is first renamed to `.iter_NNNNNNN.lingjun-deleting` (Megatron and `list` ignore
  it) and then removed, so a crash half-way never leaves a half-deleted `iter_*`; leftovers of
  an interrupted prune are removed by the next one.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CheckpointError, CheckpointUsageError
from .layout import (DELETING, IterationInfo, check_dir, human_size, iter_name, pin, scan)


@dataclass
class Decision:
    name: str
    iteration: int
    keep: bool
    reason: str
    size_bytes: int


@dataclass
class PrunePlan:
    dir: Path
    keep: int
    decisions: list[Decision] = field(default_factory=list)
    leftovers: list[Path] = field(default_factory=list)

    @property
    def deletions(self) -> list[Decision]:
        return [d for d in self.decisions if not d.keep]

    def lines(self, dry_run: bool) -> list[str]:
        out = []
        for path in self.leftovers:
            out.append(f"{'would remove' if dry_run else 'removed'} {path.name} (left by an interrupted prune)")
        for d in self.decisions:
            verb = "keep" if d.keep else ("would delete" if dry_run else "deleted")
            out.append(f"{verb:12} {d.name}  {human_size(d.size_bytes):>10}  {d.reason}")
        freed = sum(d.size_bytes for d in self.deletions)
        n = len(self.deletions)
        out.append(f"{'would free' if dry_run else 'freed'} {human_size(freed)} "
                   f"({n} iteration{'s' if n != 1 else ''}) in {self.dir}")
        return out


def plan_prune(ckpt_dir: Path | str, keep: int, extra_pins: tuple[int, ...] = ()) -> PrunePlan:
    if keep < 1:
        raise CheckpointUsageError(f"--keep must be at least 1, got {keep}")
    ckpt_dir = check_dir(ckpt_dir)
    tracker, infos = scan(ckpt_dir)
    if tracker.problem or tracker.release:
        why = tracker.problem or "the tracker says 'release'; prune handles iteration checkpoints only"
        raise CheckpointError(f"refusing to prune {ckpt_dir}: {why}; without it the newest checkpoint "
                              "and a save in progress cannot be told apart")
    by_iter = {i.iteration: i for i in infos}
    latest = tracker.iteration
    assert latest is not None
    if latest not in by_iter:
        raise CheckpointError(f"refusing to prune {ckpt_dir}: the tracker points at {iter_name(latest)}, "
                              "which does not exist")
    for it in extra_pins:
        if it not in by_iter:
            raise CheckpointError(f"cannot pin {iter_name(it)}: no such iteration in {ckpt_dir}")
    newest_complete = [i.iteration for i in reversed(infos)
                       if i.iteration <= latest and i.state in ("complete", "verified")][:keep]
    plan = PrunePlan(ckpt_dir, keep)
    plan.leftovers = sorted(p for p in ckpt_dir.iterdir() if p.name.endswith(DELETING) and p.is_dir())
    for info in infos:
        plan.decisions.append(_decide(info, latest, newest_complete, keep, info.iteration in extra_pins))
    return plan


def _decide(info: IterationInfo, latest: int, newest: list[int], keep: int, pinned_now: bool) -> Decision:
    def d(keep_it: bool, reason: str) -> Decision:
        return Decision(info.name, info.iteration, keep_it, reason, info.size_bytes)

    if info.iteration > latest:
        return d(True, f"newer than the tracker ({iter_name(latest)}): a save may be in progress")
    if info.iteration == latest:
        return d(True, "the tracker's (resume point)")
    if info.pinned or pinned_now:
        return d(True, "pinned")
    if info.iteration in newest:
        return d(True, f"among the newest {keep} complete")
    if info.state == "damaged":  # like the trainer's .damaged-<time> directories: evidence, never deleted here
        return d(True, "its hash check failed (lingjun-verified.json): kept for a look; delete it yourself")
    if info.state == "incomplete":
        return d(False, "incomplete save older than the tracker")
    return d(False, f"older than the newest {keep} complete")


def _remove(path: Path) -> None:
    shutil.rmtree(path)


def prune(ckpt_dir: Path | str, keep: int, pins: tuple[int, ...] = (), dry_run: bool = False) -> PrunePlan:
    """Plan, then (unless dry_run) pin `pins` and delete oldest first. Returns the plan that was carried out."""
    plan = plan_prune(ckpt_dir, keep, pins)
    if dry_run:
        return plan
    for it in pins:
        pin(plan.dir, it, note="prune --pin")
    for path in plan.leftovers:
        _remove(path)
    for d in sorted(plan.deletions, key=lambda x: x.iteration):
        src = plan.dir / d.name
        doomed = plan.dir / f".{d.name}{DELETING}"
        os.rename(src, doomed)
        _remove(doomed)
    return plan
