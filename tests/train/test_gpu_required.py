"""A train stage that asks for GPUs and finds no CUDA fails loudly (issue 16 item 3: the builtin
trainer's first GPU run must not fall back to the CPU), while a CPU plan still trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import make_plan, run_stage, write_plan


def test_gpus_asked_for_and_no_cuda_is_one_line_exit_1(corpus: Path, tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the stage would train on it")
    plan = make_plan(tmp_path, corpus, iterations=2)
    [train] = [st for st in plan["stages"] if st["kind"] == "train"]
    train["resources"]["gpus_per_node"] = 8
    proc = run_stage(write_plan(tmp_path, plan))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    ours = [line for line in proc.stderr.splitlines() if line.startswith("lingjun-slurm: train:")]
    assert len(ours) == 1 and "asks for 8 GPUs per node, but torch" in ours[0] and "sees no CUDA device" in ours[0]
    assert not (tmp_path / "ckpt").exists()
