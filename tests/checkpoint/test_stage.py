"""The checkpoint stage body: main(plan) on a plan dict."""

from __future__ import annotations

import json

from pathlib import Path
from typing import Any

import pytest

from lingjun_slurm.injob.checkpoint.layout import MANIFEST
from lingjun_slurm.injob.stages.checkpoint import main

from .helpers import TRACKER, truncate


def plan(ckpt: Path, **overrides: Any) -> dict:
    cfg = {"dir": str(ckpt), "save_interval": 10, "format": "torch_dist", "keep_last": 2, "copy_to": None,
           "verify": True, **overrides}
    return {"schema": 1, "run_id": "tiny", "settings": {"checkpoint": cfg}}


def test_verify_manifest_prune_copy(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(plan(ckpt, copy_to=str(tmp_path / "copy"))) == 0
    out = capsys.readouterr().out
    assert f"checkpoint: {ckpt / 'iter_0000030'}: OK (torch_dist" in out and "manifest written" in out
    assert "checkpoint: deleted      iter_0000010" in out
    assert sorted(p.name for p in ckpt.glob("iter_*")) == ["iter_0000020", "iter_0000030"]
    assert (ckpt / "iter_0000030" / MANIFEST).is_file()
    assert (tmp_path / "copy" / TRACKER).read_text().strip() == "30"
    assert not (ckpt / "iter_0000030" / "lingjun-verified.json").exists()  # written now, not yet checked
    assert main(plan(ckpt)) == 0  # again: the manifest now matches
    assert "hashes match the manifest" in capsys.readouterr().out
    # a hash check passed: `checkpoint list` calls it verified (checkpoint/layout.py write_verified)
    assert json.loads((ckpt / "iter_0000030" / "lingjun-verified.json").read_text())["ok"] is True


def test_damaged_latest_stops_before_pruning(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truncate(ckpt / "iter_0000030" / "__0_1.distcp", 10)
    assert main(plan(ckpt, keep_last=1)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"lingjun-slurm: checkpoint stage of run tiny failed: checkpoint {ckpt / 'iter_0000030'} "
                          "is damaged (1 problem):\n  file __0_1.distcp truncated: expected >= ")
    assert len(list(ckpt.glob("iter_*"))) == 3


def test_no_checkpoint_at_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(plan(tmp_path / "never")) == 1
    assert f"no checkpoint at all: {tmp_path / 'never'} does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(plan(tmp_path / "empty")) == 1
    assert f"no checkpoint in {tmp_path / 'empty'}: no {TRACKER}" in capsys.readouterr().err


def test_verify_off_still_prunes_and_copy_to_url(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import fsspec

    assert main(plan(ckpt, verify=False, keep_last=1, copy_to="memory://stage/run")) == 0
    out = capsys.readouterr().out
    assert "(checkpoint.verify is false: not verified)" in out
    assert sorted(p.name for p in ckpt.glob("iter_*")) == ["iter_0000030"]
    assert fsspec.filesystem("memory").cat_file("/stage/run/" + TRACKER) == b"30\n"
    fsspec.filesystem("memory").rm("/stage", recursive=True)
