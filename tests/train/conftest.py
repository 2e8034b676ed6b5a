"""Session fixtures for the trainer tests: one tiny corpus, and the reference runs the other tests
compare against (each trains once per session, in subprocesses, the way the stage runs)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from .helpers import make_dataset, make_plan, run_stage, write_plan


@dataclass
class Run:
    dir: Path  # the run's workdir: runs/<run_id>/metrics.jsonl, ckpt/
    plan: Path
    proc: subprocess.CompletedProcess
    run_id: str = "t"

    @property
    def ckpt(self) -> Path:
        return self.dir / "ckpt"

    @property
    def run_dir(self) -> Path:
        return self.dir / "runs" / self.run_id


def _needs_megatron() -> None:
    pytest.importorskip("megatron.core", reason="needs megatron-core (pip install '.[megatron]')")
    pytest.importorskip("psutil", reason="dist_checkpointing.save hangs without psutil")


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The .bin/.idx prefix of a 400-document null-tokenizer corpus (uint16, eod 512)."""
    _needs_megatron()
    return make_dataset(tmp_path_factory.mktemp("corpus") / "corpus_text_document")


def _train(tmp: Path, corpus: Path, ntasks: int = 1, env: dict[str, str] | None = None, **plan_args) -> Run:
    plan = write_plan(tmp, make_plan(tmp, corpus, **plan_args))
    proc = run_stage(plan, ntasks=ntasks, **(env or {}))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return Run(tmp, plan, proc)


@pytest.fixture(scope="session")
def straight_run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """1 process, 20 iterations with dropout 0.1 (so the RNG state matters), saves at 10 and 20."""
    return _train(tmp_path_factory.mktemp("straight"), corpus, dropout=0.1)


LONG = dict(iterations=40, save_interval=20, eval_interval=20)  # the DP=2 / signal comparisons


@pytest.fixture(scope="session")
def dp2_run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """2 processes through the local launcher: DP=2 with the distributed optimizer, 40 iterations."""
    return _train(tmp_path_factory.mktemp("dp2"), corpus, ntasks=2, distributed_optimizer=True, **LONG)
