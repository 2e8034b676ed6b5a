"""A checkpoint the running megatron-core cannot read is not damage (issue 26 item 2), with the real trainer.

Beside an older intact checkpoint that the builtin trainer saved (iter_0000002, trained here once per
module), the tracker names iteration 3 saved by Megatron-LM's own pretrain_gpt.py at a newer release: the
real checkpoints of tests/fixtures/megatron/checkpoints (tools/megatron_checkpoints.py; provenance in its
SOURCES.md; the same tiny GPT as helpers.cross_plan()):

  - core_v0.19.0 and main d98e8a6 (megatron-core 0.20.0): no common.pt, the common state inside the
    shards (Megatron-LM commit 40b1fd37c1, dist_checkpointing/serialization.py :439-445 at core_v0.19.0);
  - core_v0.18.2: common.pt pickles megatron.core.transformer.enums.InferenceCudaGraphScope (enums.py:101,
    first in core_v0.18.0), which the project's megatron-core 0.16.1 does not have.

The trainer runs on the project's megatron-core (0.16.1), which reads none of them. Before this change it
took each for damaged, renamed it to iter_0000003.damaged-<time>, resumed from iter_0000002 and trained
iterations 3.. again with exit 0. Now: exit 1 with one line naming both versions and what to do, no
directory renamed or written, no training step, and the line is the train stage's note for `status`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .helpers import REPO, cross_plan, metrics, run_stage, write_plan

FIXTURES = REPO / "tests" / "fixtures" / "megatron" / "checkpoints"
TRACKER = "latest_checkpointed_iteration.txt"
JOB = "local-26"
# fixture directory -> (the version the one line asks for, what it names as the evidence)
NEWER = {
    "core_v0.19.0": ("0.19", "its common state is inside the shards, no common.pt"),
    "main-d98e8a64ddf3": ("0.19", "its common state is inside the shards, no common.pt"),
    "core_v0.18.2": ("0.18", "its common state pickles megatron.core.transformer.enums.InferenceCudaGraphScope, "
                             "which megatron-core {running} does not have"),
}


def _running() -> str:
    from megatron.core import package_info

    return str(package_info.__version__)


def _readable_here(fixture: str) -> bool:
    want = tuple(int(x) for x in NEWER[fixture][0].split("."))
    return tuple(int(x) for x in _running().split(".")[:2]) >= want


def _data(tmp: Path) -> Path:
    data = tmp / "data"
    data.mkdir(exist_ok=True)
    for suffix in (".bin", ".idx"):
        shutil.copy(FIXTURES / f"corpus_text_document{suffix}", data / f"corpus_text_document{suffix}")
    return data / "corpus_text_document"


@pytest.fixture(scope="module")
def older(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The builtin's own checkpoint of the cross_plan GPT (6 iterations) at iteration 2 (tracker 2): stopped
    there as by the save-and-exit signal (LINGJUN_TRAIN_STOP_AT)."""
    pytest.importorskip("megatron.core", reason="needs megatron-core (pip install '.[megatron]')")
    pytest.importorskip("psutil", reason="dist_checkpointing.save hangs without psutil")
    tmp = tmp_path_factory.mktemp("version-older")
    plan = write_plan(tmp, cross_plan(tmp, _data(tmp)))
    proc = run_stage(plan, timeout=180, LINGJUN_TRAIN_STOP_AT="2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp / "ckpt" / TRACKER).read_text().strip() == "2"
    return tmp / "ckpt"


def _listing(root: Path) -> dict[str, int]:
    """Every path under root with its size (directories -1): what a rename or a save would change."""
    out: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = -1
        for name in filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = os.path.getsize(path)
    return out


@pytest.mark.parametrize("fixture", list(NEWER))
def test_a_newer_megatron_core_checkpoint_stops_the_run_instead_of_falling_back(fixture: str, older: Path,
                                                                                 tmp_path: Path) -> None:
    if _readable_here(fixture):
        pytest.skip(f"megatron-core {_running()} reads the checkpoints of {fixture}")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(older, ckpt)
    shutil.copytree(FIXTURES / fixture / "single" / "iter_0000003", ckpt / "iter_0000003")
    (ckpt / TRACKER).write_text("3")
    before = _listing(ckpt)
    plan = write_plan(tmp_path, cross_plan(tmp_path, _data(tmp_path), ckpt_dir=ckpt))  # 6 iterations, saves at 3
    proc = run_stage(plan, timeout=180, SLURM_JOB_ID=JOB)

    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-4000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("lingjun-slurm: train:")]
    needs, evidence = NEWER[fixture]
    running = _running()
    expected = (f"cannot resume from {ckpt}: iter_0000003: saved by megatron-core >= {needs} "
                f"({evidence.format(running=running)}), which this megatron-core {running} cannot load: run with "
                f"megatron-core >= {needs} (a container image with Megatron-LM >= {needs}, declared as "
                "megatron_lm.version), or resume from another checkpoint directory (checkpoint.dir; Megatron-LM: "
                "--load); the checkpoint is intact and was left as it is")
    assert ours == [f"lingjun-slurm: train: {expected}"], proc.stderr[-3000:]
    # nothing renamed, removed or written; no fallback, no training step
    assert _listing(ckpt) == before
    assert "resum" not in proc.stdout and "damaged" not in proc.stderr + proc.stdout
    run_dir = tmp_path / "runs" / "t"
    assert not (run_dir / "metrics.jsonl").exists() or metrics(run_dir) == []
    # the cause is the train stage's note, for this job: what `status` shows as its REASON
    record = json.loads((run_dir / "stage-notes" / "train.txt").read_text())
    assert record["job"] == JOB and record["note"] == expected
    from lingjun_slurm.status import _read_note

    assert _read_note(None, str(run_dir / "stage-notes" / "train.txt"), [JOB]) == expected


def test_damage_beside_it_still_falls_back(older: Path, tmp_path: Path) -> None:
    """Only damage triggers the fallback: the same 0.19 checkpoint with a truncated shard is damaged
    (the size check comes first), so the trainer resumes from iter_0000002 and renames it aside."""
    if _readable_here("core_v0.19.0"):
        pytest.skip(f"megatron-core {_running()} reads the 0.19 layout")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(older, ckpt)
    shutil.copytree(FIXTURES / "core_v0.19.0" / "single" / "iter_0000003", ckpt / "iter_0000003")
    shard = ckpt / "iter_0000003" / "__0_0.distcp"
    size = shard.stat().st_size
    with open(shard, "r+b") as fh:
        fh.truncate(size // 2)
    (ckpt / TRACKER).write_text("3")
    plan = write_plan(tmp_path, cross_plan(tmp_path, _data(tmp_path), iterations=3, ckpt_dir=ckpt))
    proc = run_stage(plan, timeout=180, SLURM_JOB_ID=JOB)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resuming from iter_0000002" in proc.stderr, proc.stderr[-3000:]
    assert [p.name for p in ckpt.iterdir() if p.name.startswith("iter_0000003.damaged-")], sorted(os.listdir(ckpt))


def test_a_finished_run_whose_last_checkpoint_is_newer_stays_finished(older: Path, tmp_path: Path) -> None:
    """The tracker is at the last iteration: nothing to train, so the newer checkpoint is not loaded and
    the run ends 0 with a warning (before: taken for damaged, renamed aside and iteration 3 trained again)."""
    if _readable_here("core_v0.19.0"):
        pytest.skip(f"megatron-core {_running()} reads the 0.19 layout")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(older, ckpt)
    shutil.copytree(FIXTURES / "core_v0.19.0" / "single" / "iter_0000003", ckpt / "iter_0000003")
    (ckpt / TRACKER).write_text("3")
    before = _listing(ckpt)
    plan = write_plan(tmp_path, cross_plan(tmp_path, _data(tmp_path), iterations=3, ckpt_dir=ckpt))
    proc = run_stage(plan, timeout=180, SLURM_JOB_ID=JOB)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "iter_0000003: saved by megatron-core >= 0.19" in proc.stdout and "nothing to train" in proc.stdout
    assert _listing(ckpt) == before
    # the one thing status has to say: Megatron-LM wrote it without a manifest, so it was not hashed
    note = json.loads((tmp_path / "runs" / "t" / "stage-notes" / "train.txt").read_text())["note"]
    assert note == "iter_0000003 not hash-checked: no manifest"
