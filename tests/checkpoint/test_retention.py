"""Retention and pins (no torch needed: prune only reads the layout)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lingjun_slurm.injob.checkpoint import CheckpointError, pin, plan_prune, prune, scan, unpin
from lingjun_slurm.injob.checkpoint.layout import PIN

from .helpers import TRACKER


def names(ckpt: Path) -> list[str]:
    return sorted(p.name for p in ckpt.iterdir() if p.name.startswith("iter_"))


def test_keep_two_of_three(ckpt: Path) -> None:
    plan = prune(ckpt, keep=2, dry_run=True)
    assert [d.name for d in plan.deletions] == ["iter_0000010"]
    assert names(ckpt) == ["iter_0000010", "iter_0000020", "iter_0000030"]  # dry run
    assert plan.lines(dry_run=True)[0].startswith("would delete iter_0000010")
    prune(ckpt, keep=2)
    assert names(ckpt) == ["iter_0000020", "iter_0000030"]
    assert not [p for p in ckpt.iterdir() if "deleting" in p.name]


def test_pinned_iteration_is_kept(ckpt: Path) -> None:
    pin(ckpt, 10, note="release candidate")
    assert (ckpt / "iter_0000010" / PIN).is_file()
    prune(ckpt, keep=1)
    assert names(ckpt) == ["iter_0000010", "iter_0000030"]
    assert unpin(ckpt, 10) and not unpin(ckpt, 10)
    prune(ckpt, keep=1)
    assert names(ckpt) == ["iter_0000030"]


def test_prune_pin_option_pins_persistently(ckpt: Path) -> None:
    prune(ckpt, keep=1, pins=(20,), dry_run=True)
    assert not (ckpt / "iter_0000020" / PIN).exists()  # dry run writes nothing
    prune(ckpt, keep=1, pins=(20,))
    assert names(ckpt) == ["iter_0000020", "iter_0000030"]
    assert (ckpt / "iter_0000020" / PIN).is_file()


def test_tracker_and_in_progress_iterations_are_never_deleted(ckpt: Path) -> None:
    (ckpt / TRACKER).write_text("20")  # iter_0000030 is newer: a save in progress
    shutil.copytree(ckpt / "iter_0000030", ckpt / "iter_0000040")
    (ckpt / "iter_0000040" / "metadata.json").unlink()
    plan = prune(ckpt, keep=1)
    reasons = {d.name: d.reason for d in plan.decisions}
    assert names(ckpt) == ["iter_0000020", "iter_0000030", "iter_0000040"]
    assert reasons["iter_0000020"] == "the tracker's (resume point)"
    assert reasons["iter_0000040"].startswith("newer than the tracker (iter_0000020)")
    states = {i.name: i.state for i in scan(ckpt)[1]}
    assert states == {"iter_0000020": "complete", "iter_0000030": "in-progress", "iter_0000040": "in-progress"}


def test_incomplete_saves_do_not_count_and_are_deleted(ckpt: Path) -> None:
    (ckpt / "iter_0000020" / "metadata.json").unlink()  # a save that died before finishing
    plan = plan_prune(ckpt, keep=2)
    decisions = {d.name: (d.keep, d.reason) for d in plan.decisions}
    assert decisions == {"iter_0000010": (True, "among the newest 2 complete"),
                         "iter_0000020": (False, "incomplete save older than the tracker"),
                         "iter_0000030": (True, "the tracker's (resume point)")}


def test_a_checkpoint_whose_hash_check_failed_is_kept_and_not_counted(ckpt: Path) -> None:
    """Damage is evidence (the trainer renames it aside, never deletes it): prune keeps it too,
    and it does not count among the newest complete ones."""
    from lingjun_slurm.injob.checkpoint import manifest as mf
    from lingjun_slurm.injob.checkpoint.layout import write_verified

    mf.write(ckpt / "iter_0000020", 20)
    write_verified(ckpt / "iter_0000020", 20, False, ["hash mismatch in __0_0.distcp"], "test")
    assert scan(ckpt)[1][1].state == "damaged"
    plan = plan_prune(ckpt, keep=2)
    decisions = {d.name: (d.keep, d.reason) for d in plan.decisions}
    assert decisions["iter_0000010"] == (True, "among the newest 2 complete")
    assert decisions["iter_0000020"][0] is True and "hash check failed" in decisions["iter_0000020"][1]
    prune(ckpt, keep=1)
    assert names(ckpt) == ["iter_0000010", "iter_0000020", "iter_0000030"][1:]


def test_leftovers_of_an_interrupted_prune_are_removed(ckpt: Path) -> None:
    (ckpt / "iter_0000010").rename(ckpt / ".iter_0000010.lingjun-deleting")
    plan = prune(ckpt, keep=3)
    assert [p.name for p in plan.leftovers] == [".iter_0000010.lingjun-deleting"]
    assert sorted(p.name for p in ckpt.iterdir()) == ["iter_0000020", "iter_0000030", TRACKER]


@pytest.mark.parametrize("tracker, message", [
    (None, f"refusing to prune .*: no {TRACKER} in"),
    ("junk", "refusing to prune .*: tracker .* holds 'junk'"),
    ("50", "refusing to prune .*: the tracker points at iter_0000050, which does not exist"),
    ("release", "refusing to prune .*: the tracker says 'release'"),
])
def test_prune_refuses_without_a_valid_tracker(ckpt: Path, tracker: str | None, message: str) -> None:
    if tracker is None:
        (ckpt / TRACKER).unlink()
    else:
        (ckpt / TRACKER).write_text(tracker)
    with pytest.raises(CheckpointError, match=message):
        prune(ckpt, keep=1)
    assert names(ckpt) == ["iter_0000010", "iter_0000020", "iter_0000030"]


def test_pin_errors(ckpt: Path) -> None:
    with pytest.raises(CheckpointError, match="iter_0000040 does not exist"):
        pin(ckpt, 40)
    with pytest.raises(CheckpointError, match="cannot pin iter_0000040: no such iteration"):
        prune(ckpt, keep=1, pins=(40,))
