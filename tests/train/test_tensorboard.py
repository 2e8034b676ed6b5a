"""The builtin trainer's TensorBoard event files (issue 16 item 4): Megatron-LM's tags, the same
numbers as metrics.jsonl. tensorboard is in the test extra; without it the trainer writes none."""

from __future__ import annotations

import pytest

from .conftest import Run
from .helpers import metrics


def test_event_files_carry_megatron_lms_tags_and_the_metrics(straight_run: Run) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = straight_run.run_dir
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"lm loss", "lm loss vs samples", "learning-rate", "grad-norm", "iteration-time", "tokens-per-second",
            "lm loss validation", "lm loss validation ppl"} <= tags
    train = {r["iteration"]: r for r in metrics(run_dir)}
    got = {e.step: e.value for e in acc.Scalars("lm loss")}
    assert sorted(got) == sorted(train)
    assert all(got[i] == pytest.approx(train[i]["loss"], rel=1e-6) for i in got)  # float32 in the event file
    evals = metrics(run_dir, "eval")
    assert [e.step for e in acc.Scalars("lm loss validation")] == [r["iteration"] for r in evals]


def test_no_tensorboard_no_event_files(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from lingjun_slurm.injob.train.metrics import Metrics

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    m = Metrics(str(tmp_path / "metrics.jsonl"), "r", enabled=True, log_interval=1)
    m.train(1, iteration=1, loss=1.0, lr=0.1, grad_norm=1.0, step_time_s=0.1, tokens_per_s=10.0, consumed_samples=8)
    m.close()
    assert (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "tensorboard").exists()
