"""Checkpoints that cross between Megatron-LM's pretrain_gpt.py and the builtin trainer.

The fixtures under tests/fixtures/megatron/checkpoints/ were saved by Megatron-LM core_v0.16.1's own
pretrain_gpt.py on the CPU (tools/megatron_checkpoints.py; provenance in SOURCES.md): the tiny GPT
of helpers.cross_plan() at iteration 3 of 6, 1 process, DP=2 with the distributed optimizer, TP=2
and PP=2, with the losses of Megatron-LM's uninterrupted run and of its own resume. Also kept: the
builtin's checkpoints from before it saved Megatron-LM's RNG layout (rng by (pp, tp, dp)).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .helpers import CROSS_SAVED_AT, REPO, cross_plan, losses, run_stage, write_plan

FIXTURES = REPO / "tests" / "fixtures" / "megatron" / "checkpoints"
MLM = FIXTURES / "core_v0.16.1"
OLD = FIXTURES / "builtin-rng-pp-tp-dp"
LAYOUTS = {"single": ({}, 1), "dp2": ({"distributed_optimizer": True}, 2), "tp2": ({"tensor": 2}, 2),
           "pp2": ({"pipeline": 2}, 2)}
TOL = 1e-5  # the trainers reduce the loss in float32 (Megatron-LM) and float64 (builtin)
# TP=2: the builtin's continuation differs from Megatron-LM's by up to 2.2e-4 (7e-5 at the first
# step); not explained yet (dropout in tensor-parallel regions is the suspect). Loose here, and
# said so in docs/training.md; Megatron-LM's own resume differs from its straight run by 2.2e-3.
LAYOUT_TOL = {"tp2": 5e-4}


@pytest.fixture(autouse=True)
def _megatron() -> None:
    pytest.importorskip("megatron.core", reason="needs megatron-core (pip install '.[megatron]')")
    pytest.importorskip("psutil", reason="dist_checkpointing.save hangs without psutil")


def _setup(tmp: Path, ckpt: Path | None, layout: str, **extra) -> Path:
    data = tmp / "data"
    data.mkdir()
    for suffix in (".bin", ".idx"):
        shutil.copy(FIXTURES / f"corpus_text_document{suffix}", data / f"corpus_text_document{suffix}")
    if ckpt is not None:
        shutil.copytree(ckpt, tmp / "ckpt", ignore=shutil.ignore_patterns("losses.json"))
    return write_plan(tmp, cross_plan(tmp, data / "corpus_text_document", ckpt_dir=tmp / "ckpt",
                                      **LAYOUTS[layout][0], **extra))


def _record(root: Path, layout: str) -> dict:
    return json.loads((root / layout / "losses.json").read_text())


def _rng_keys(path: Path) -> list[str]:
    from torch.distributed.checkpoint import FileSystemReader

    return sorted(k for k in FileSystemReader(str(path)).read_metadata().state_dict_metadata if k.startswith("rng"))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_builtin_resumes_megatron_lm_checkpoint(layout: str, tmp_path: Path) -> None:
    """The builtin resumes iteration 3 that Megatron-LM saved and continues Megatron-LM's uninterrupted
    run: the RNG state, optimizer (distributed or not), scheduler and data position all came back.
    That is also the builtin's own resume (bit-identical to its uninterrupted run, test_trainer.py);
    Megatron-LM's own resume differs from both by one DataLoader draw of the RNG (its record)."""
    rec = _record(MLM, layout)
    proc = run_stage(_setup(tmp_path, MLM / layout, layout), ntasks=LAYOUTS[layout][1])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resumed from {tmp_path / 'ckpt'}/iter_0000003" in proc.stdout
    assert "RNG states start fresh" not in proc.stdout + proc.stderr
    got = losses(tmp_path)
    assert sorted(got) == [4, 5, 6]
    straight = {int(k): v for k, v in rec["straight"]["losses"].items()}
    assert max(abs(got[i] - straight[i]) for i in got) < LAYOUT_TOL.get(layout, TOL), (got, straight)
    # the builtin saved Megatron-LM's layout again
    assert _rng_keys(tmp_path / "ckpt" / "iter_0000006") == _rng_keys(MLM / layout / "iter_0000003")


def test_fresh_builtin_run_equals_megatron_lms(tmp_path: Path) -> None:
    """Same settings, same data, 1 process: the builtin's steps 1-6 are Megatron-LM's (to float32),
    dropout included. So a cross-trainer resume equals the same trainer's resume, both ways."""
    rec = _record(MLM, "single")
    proc = run_stage(_setup(tmp_path, None, "single"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = losses(tmp_path)
    straight = {int(k): v for k, v in rec["straight"]["losses"].items()}
    assert sorted(got) == sorted(straight) == list(range(1, 7))
    assert max(abs(got[i] - straight[i]) for i in got) < TOL, (got, straight)
    assert _rng_keys(tmp_path / "ckpt" / "iter_0000003") == ["rng_state/shard_0.0_1.1"]
    # Megatron-LM resumed the builtin's checkpoint with default flags exactly as its own (the script's record)
    assert rec["builtin_resumed"]["losses"] == rec["resumed"]["losses"]
    assert "--no-load-rng" not in rec["builtin_resumed"]["argv"]


@pytest.mark.parametrize("layout", ["single", "dp2"])
def test_checkpoints_of_the_earlier_builtin_still_resume(layout: str, tmp_path: Path) -> None:
    """Checkpoints saved before the builtin followed Megatron-LM's RNG layout (rng by (pp, tp, dp))
    resume, RNG state included: the continuation is that run's own."""
    rec = _record(OLD, layout)
    assert len(_rng_keys(OLD / layout / "iter_0000003")[0].split("_")[-1].split(".")) == 3
    proc = run_stage(_setup(tmp_path, OLD / layout, layout), ntasks=LAYOUTS[layout][1])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "RNG states start fresh" not in proc.stdout + proc.stderr
    got = losses(tmp_path)
    straight = {int(k): v for k, v in rec["straight"].items()}
    assert sorted(got) == [4, 5, 6]
    assert max(abs(got[i] - straight[i]) for i in got) < 1e-6, (got, straight)
    assert len(_rng_keys(tmp_path / "ckpt" / "iter_0000006")[0].split("_")[-1].split(".")) == 2


def test_damaged_checkpoint_is_one_line_without_traceback(tmp_path: Path) -> None:
    plan = _setup(tmp_path, MLM / "single", "single")
    victim = sorted((tmp_path / "ckpt" / "iter_0000003").glob("__*.distcp"))[-1]
    victim.unlink()
    proc = run_stage(plan, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("lingjun-slurm: train:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    path = tmp_path / "ckpt" / f"iter_{CROSS_SAVED_AT:07d}"
    assert lines[0].startswith(f"lingjun-slurm: train: cannot load checkpoint {path} (iteration 3): ")
    assert victim.name in lines[0]
    assert "Traceback" not in proc.stderr


def _checkpoint_exception(message: str, ranks: tuple[int, ...] = (0, 1)) -> BaseException:
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException("load failed", {r: (RuntimeError(message), None) for r in ranks})


def test_describe_names_what_is_missing() -> None:
    from lingjun_slurm.train.ckpt import _load_failed

    err = _load_failed("/c/iter_0000003", 3, _checkpoint_exception(
        "Missing key in checkpoint state_dict: rng_state/shard_0.0.0_1.1.1."))
    text = str(err)
    assert text.startswith("cannot load checkpoint /c/iter_0000003 (iteration 3): RuntimeError: Missing key in "
                           "checkpoint state_dict: rng_state/shard_0.0.0_1.1.1. (ranks 0, 1)")
    assert "RNG state is sharded another way" in text and "Traceback" not in text


def test_stage_edge_catches_checkpoint_exception(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                                 tmp_path: Path) -> None:
    """A CheckpointException (a BaseException) from anywhere in the run: one line, exit 1, no traceback."""
    from lingjun_slurm.stages import train as stage
    from lingjun_slurm.train import entry

    def boom(_settings):
        raise _checkpoint_exception("Missing key in checkpoint state_dict: optimizer.state.exp_avg.x", (0,))

    monkeypatch.setattr(entry, "run", boom)
    plan = json.loads(_setup(tmp_path, None, "single").read_text())
    assert stage.main(plan) == 1
    err = capsys.readouterr().err
    assert err.strip() == ("lingjun-slurm: train: RuntimeError: Missing key in checkpoint state_dict: "
                           "optimizer.state.exp_avg.x (rank 0)")
