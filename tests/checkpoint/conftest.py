"""Real torch_dist checkpoints, written once per session in a subprocess, copied per test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def megatron_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DIR with iter_0000010, iter_0000020, iter_0000030 and the tracker at 30 (read-only: copy it)."""
    pytest.importorskip("megatron.core", reason="needs megatron-core (pip install '.[megatron]')")
    pytest.importorskip("psutil", reason="dist_checkpointing.save hangs without psutil")
    out = tmp_path_factory.mktemp("megatron-ckpt") / "ckpt"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(HERE / "make_checkpoints.py"), str(out), "10", "20", "30"],
                          capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture
def ckpt(megatron_checkpoints: Path, tmp_path: Path) -> Path:
    """A private copy of the session's checkpoints for one test to damage."""
    dst = tmp_path / "ckpt"
    shutil.copytree(megatron_checkpoints, dst)
    return dst

