"""`checkpoint copy` into a local directory holds <target>/checkpoint.lock, the lock a chain holds
on the checkpoint directory it trains into (runs/workdir_lock.py): a live holder refuses the copy,
naming it; a stale one (its process gone) is broken; the lock is held while the files go over and
released after."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from lingjun_slurm.common.holderlock import me, read_holder
from lingjun_slurm.injob.checkpoint import CheckpointUsageError, copy_checkpoint
from lingjun_slurm.injob.checkpoint import transfer
from lingjun_slurm.runs.workdir_lock import CKPT_LOCK_NAME

from .helpers import TRACKER


def test_the_copy_takes_the_chains_lock_name() -> None:
    assert transfer.LOCK_NAME == CKPT_LOCK_NAME


def _holder_file(target: Path, pid: int, start: str, jobs: tuple[str, ...] = ()) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    holder = replace(me("training run x"), pid=pid, start=start, jobs=jobs)
    lock = target / CKPT_LOCK_NAME
    lock.write_text(holder.to_json() + "\n")
    return lock


def test_a_live_holder_refuses_the_copy_and_names_it(ckpt: Path, tmp_path: Path) -> None:
    target = tmp_path / "live"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        from lingjun_slurm.common.holderlock import process_start

        lock = _holder_file(target, sleeper.pid, process_start(sleeper.pid) or "")
        with pytest.raises(CheckpointUsageError) as err:
            copy_checkpoint(ckpt, str(target))
        assert f"copy target {target} is in use" in str(err.value) and f"pid {sleeper.pid}" in str(err.value)
        assert "training run x" in str(err.value)
        assert not (target / TRACKER).exists() and not (target / "iter_0000030").exists()
        assert read_holder(lock).pid == sleeper.pid  # left alone
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_holder_that_cannot_be_judged_refuses_too(ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain's jobs while slurmctld does not answer: cannot tell, so the copy does not go ahead."""
    monkeypatch.setattr(transfer, "run_squeue", lambda argv: (1, "slurm_load_jobs error: Unable to contact slurm controller"))
    target = tmp_path / "chain"
    _holder_file(target, 1, "x", jobs=("4242",))
    with pytest.raises(CheckpointUsageError, match="Slurm job 4242"):
        copy_checkpoint(ckpt, str(target))


def test_a_stale_holder_is_broken_and_the_lock_held_while_copying(ckpt: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "stale"
    dead = subprocess.Popen(["true"])
    dead.wait()
    _holder_file(target, dead.pid, "gone")
    seen = []
    upload = transfer._upload

    def watching(fs, src, dest, manifest):  # type: ignore[no-untyped-def]
        holder = read_holder(target / CKPT_LOCK_NAME)
        seen.append(holder.purpose if holder else None)
        return upload(fs, src, dest, manifest)

    monkeypatch.setattr(transfer, "_upload", watching)
    result = copy_checkpoint(ckpt, str(target))
    assert not result.skipped and (target / TRACKER).read_text().strip() == "30"
    assert seen == [f"lingjun-slurm checkpoint copy of {ckpt / 'iter_0000030'}"]
    assert not (target / CKPT_LOCK_NAME).exists()  # released
