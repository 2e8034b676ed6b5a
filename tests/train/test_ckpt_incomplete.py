"""After a save that died (ENOSPC), the next run starts (issue 26 item 5), with the real trainer.

An iteration directory that no tracker names and that has no metadata.json (dist_checkpointing
writes it last) is moved aside to iter_NNNNNNN.incomplete-<UTC>, kept, with a log line saying
where training starts: the newest complete checkpoint, or from scratch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .conftest import Run, _train
from .helpers import losses, make_plan, metrics, run_stage, write_plan

TRACKER = "latest_checkpointed_iteration.txt"
PLAN_ARGS = dict(iterations=4, save_interval=2, eval_iters=0, eval_interval=1000, log_interval=1)


@pytest.fixture(scope="module")
def saved(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """4 iterations, checkpoints iter_0000002 and iter_0000004, the tracker at 4."""
    return _train(tmp_path_factory.mktemp("incomplete-src"), corpus, **PLAN_ARGS)


def _half_save(src: Path, dst: Path) -> None:
    """What a save that ran out of space leaves: some shards, one cut short, no metadata.json."""
    dst.mkdir(parents=True)
    for name in ("__0_0.distcp", "common.pt"):
        shutil.copy2(src / name, dst / name)
    with open(dst / "__0_0.distcp", "r+b") as fh:
        fh.truncate(4096)


def _run(tmp: Path, corpus: Path) -> object:
    proc = run_stage(write_plan(tmp, make_plan(tmp, corpus, **PLAN_ARGS)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    return proc


def _aside(ckpt: Path, name: str) -> list[Path]:
    return [p for p in ckpt.iterdir() if p.name.startswith(f"{name}.incomplete-")]


def test_first_save_died_no_tracker_starts_from_scratch(saved: Run, corpus: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _half_save(saved.ckpt / "iter_0000002", ckpt / "iter_0000002")
    proc = _run(tmp_path, corpus)
    assert "moved the incomplete" in proc.stdout and "training starts from scratch" in proc.stdout
    assert [r["iteration"] for r in metrics(tmp_path / "runs" / "t")] == [1, 2, 3, 4]
    assert losses(tmp_path) == losses(saved.dir)  # the same run as the first one, from scratch
    [aside] = _aside(ckpt, "iter_0000002")
    assert (aside / "__0_0.distcp").stat().st_size == 4096  # kept as it was
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([TRACKER, "iter_0000002", "iter_0000004", aside.name])
    assert (ckpt / TRACKER).read_text().strip() == "4"


def test_a_died_save_newer_than_the_tracker_is_moved_aside(saved: Run, corpus: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copytree(saved.ckpt / "iter_0000002", ckpt / "iter_0000002")
    (ckpt / TRACKER).write_text("2\n")
    _half_save(saved.ckpt / "iter_0000004", ckpt / "iter_0000004")
    proc = _run(tmp_path, corpus)
    assert "moved the incomplete" in proc.stdout and "resuming from iter_0000002 (the tracker's)" in proc.stdout
    assert [r["iteration"] for r in metrics(tmp_path / "runs" / "t")] == [3, 4]
    ref = losses(saved.dir)
    assert losses(tmp_path) == {3: ref[3], 4: ref[4]}
    [aside] = _aside(ckpt, "iter_0000004")
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([TRACKER, "iter_0000002", "iter_0000004", aside.name])


def test_no_tracker_resumes_from_the_newest_complete(saved: Run, corpus: Path, tmp_path: Path) -> None:
    """The tracker write itself failed after a complete save of 2, then the save of 4 died."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copytree(saved.ckpt / "iter_0000002", ckpt / "iter_0000002")
    _half_save(saved.ckpt / "iter_0000004", ckpt / "iter_0000004")
    proc = _run(tmp_path, corpus)
    assert "resuming from iter_0000002, the newest complete checkpoint" in proc.stdout
    assert [r["iteration"] for r in metrics(tmp_path / "runs" / "t")] == [3, 4]
    assert len(_aside(ckpt, "iter_0000004")) == 1 and (ckpt / TRACKER).read_text().strip() == "4"
