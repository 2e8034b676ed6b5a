"""The builtin trainer end to end on the CPU: the stage command in subprocesses, 1 and 2 processes
(the local launcher, as the rendered scripts start it), checkpoints, resume, SIGTERM."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from .conftest import LONG, Run, _train
from .helpers import (REPO, dispatcher_wired, launch_env, losses, make_plan, metrics, run_stage, stage_command,
                      write_plan)


def test_one_process_trains_and_checkpoints(straight_run: Run) -> None:
    out = straight_run.proc.stdout
    train = metrics(straight_run.run_dir)
    assert [r["iteration"] for r in train] == list(range(1, 21))
    first, last = train[0]["loss"], train[-1]["loss"]
    assert first > 6.0 and last < first - 0.8, (first, last)  # ln(640) = 6.46 at the start
    for rec in train:
        assert {"loss", "lr", "grad_norm", "step_time_s", "tokens_per_s", "consumed_samples"} <= rec.keys()
        assert "mfu" not in rec and "tflops_per_gpu" not in rec  # GPUs only
    assert train[-1]["consumed_samples"] == 20 * 8
    evals = metrics(straight_run.run_dir, "eval")
    assert [e["iteration"] for e in evals] == [10, 20] and all(math.isfinite(e["loss"]) for e in evals)
    assert [s["iteration"] for s in metrics(straight_run.run_dir, "save")] == [10, 20]
    assert metrics(straight_run.run_dir, "stop")[-1]["reason"] == "done"
    assert "iteration       20/20 | loss" in out and "CPU mode: gloo, fp32" in out
    assert "validation at iteration 20" in out
    # Megatron-LM's layout, the tracker written after the save
    assert (straight_run.ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "20"
    assert sorted(p.name for p in straight_run.ckpt.iterdir() if p.is_dir()) == ["iter_0000010", "iter_0000020"]


def test_checkpoint_passes_verify(straight_run: Run) -> None:
    """`lingjun-slurm checkpoint verify DIR --load-tensors` accepts what the trainer wrote."""
    from lingjun_slurm.cli.checkpoint import checkpoint

    result = CliRunner().invoke(checkpoint, ["verify", str(straight_run.ckpt), "--load-tensors", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ok"] and report["iteration"] == 20, report
    from lingjun_slurm.injob.checkpoint import verify

    assert verify(straight_run.ckpt, 10).iteration == 10  # raises CheckpointDamaged otherwise


def test_checkpoint_content_is_megatron_lms(straight_run: Run) -> None:
    """common.pt holds Megatron-LM's keys and the data position; no "module." prefix on weights."""
    import megatron.core  # noqa: F401  (registers the safe globals, as a Megatron-LM resume does)
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    common = torch.load(straight_run.ckpt / "iter_0000010" / "common.pt", weights_only=True)
    assert common["iteration"] == 10 and common["checkpoint_version"] == 3.0
    assert common["args"].consumed_train_samples == 80 and common["args"].padded_vocab_size == 640
    assert {"opt_param_scheduler", "num_floating_point_operations_so_far"} <= common.keys()
    keys = FileSystemReader(str(straight_run.ckpt / "iter_0000010")).read_metadata().state_dict_metadata
    assert "embedding.word_embeddings.weight" in keys and not any(k.startswith("module.") for k in keys)
    assert any(k.startswith("rng_state") for k in keys)
    assert any(k.startswith("optimizer.state.exp_avg") for k in keys)


def test_resume_is_bit_identical(straight_run: Run, corpus: Path, tmp_path: Path) -> None:
    """Stop after 10 (as a signal would), start again: iterations 11-20 equal the straight run's bit for bit."""
    plan = write_plan(tmp_path, make_plan(tmp_path, corpus, dropout=0.1))
    first = run_stage(plan, LINGJUN_TRAIN_STOP_AT="10")
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "10"
    second = run_stage(plan)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout
    run_dir = tmp_path / "runs" / "t"
    assert [s["iteration"] for s in metrics(run_dir, "start")] == [0, 10]
    assert losses(tmp_path) == losses(straight_run.dir)  # == on floats: bit-identical
    assert metrics(run_dir, "eval")[-1]["loss"] == metrics(straight_run.run_dir, "eval")[-1]["loss"]
    assert [r["lr"] for r in metrics(run_dir)][-10:] == [r["lr"] for r in metrics(straight_run.run_dir)][-10:]


def test_finished_run_exits_without_training(straight_run: Run) -> None:
    proc = run_stage(straight_run.plan)
    assert proc.returncode == 0, proc.stderr
    assert "is at iteration 20 of 20 (checked structure, sizes and the manifest's SHA-256s): nothing to train" in proc.stdout


def test_two_processes_data_parallel_match_one(dp2_run: Run, corpus: Path, tmp_path: Path) -> None:
    """DP=2 + the distributed optimizer through the local launcher = 1 process, to float noise."""
    one = _train(tmp_path, corpus, **LONG)
    dp2, single = losses(dp2_run.dir), losses(one.dir)
    assert sorted(dp2) == list(range(1, 41))
    assert max(abs(dp2[i] - single[i]) for i in dp2) < 1e-4
    assert dp2[40] < dp2[1] - 1.0
    assert "world 2 = TP 1 x PP 1 x CP 1 x DP 2" in dp2_run.proc.stdout
    from lingjun_slurm.injob.checkpoint import verify

    assert verify(dp2_run.ckpt, load_tensors=True).tensors_loaded
    shards = {p.name for p in (dp2_run.ckpt / "iter_0000040").glob("__*.distcp")}
    assert any(s.startswith("__1_") for s in shards), shards  # rank 1 wrote its optimizer shard


def test_sigterm_saves_exits_0_and_resume_continues(dp2_run: Run, corpus: Path, tmp_path: Path) -> None:
    """SIGTERM to the whole process group (what Slurm's scancel --signal=TERM and the local runner do)
    in the middle of a DP=2 run: every rank finishes the same step, the checkpoint of that
    iteration is saved, exit 0; the next start continues to the end bit-identically."""
    plan = write_plan(tmp_path, make_plan(tmp_path, corpus, distributed_optimizer=True, **LONG))
    proc = subprocess.Popen(stage_command(plan, ntasks=2), env=launch_env(2), cwd=str(REPO), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics_file = tmp_path / "runs" / "t" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics_file.exists() and metrics_file.read_text().count('"type": "train"') >= 3:
            break
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-4000:]
    stop = metrics(tmp_path / "runs" / "t", "stop")[-1]
    assert stop["reason"] == "signal", out[-3000:]
    stopped_at = stop["iteration"]
    assert 3 <= stopped_at < 40
    tracker = (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip()
    assert tracker == str(stopped_at)
    assert out.count(f"stopping after iteration {stopped_at}") == 1  # rank 0 logs; both stopped there
    resumed = run_stage(plan, ntasks=2)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert metrics(tmp_path / "runs" / "t", "start")[-1]["iteration"] == stopped_at
    assert losses(tmp_path) == losses(dp2_run.dir)  # the distributed optimizer's state came back exactly


# TP=2 also carries the other architecture switches: RMSNorm, SwiGLU, RoPE, untied embeddings, no
# biases, grouped-query attention, full recompute (megatron's CheckpointFunction and its RNG
# handling on the CPU) and the WSD schedule.
VARIANTS = dict(normalization="RMSNorm", activation="swiglu", position_embedding="rope", rotary_base=10000,
                untie_embeddings=True, bias_linear=False, num_query_groups=2)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [{"tensor": 2}, {"pipeline": 2}], ids=["tp2", "pp2"])
def test_model_parallel_two_processes(layout: dict, corpus: Path, tmp_path: Path) -> None:
    """TP=2 / PP=2 with dropout train, save what verify loads, and a stop at 5 + resume gives the
    straight run's losses bit for bit. For TP=2 that needs the tensor-parallel ranks' replicated
    parameters to stay equal (the checkpoint keeps rank 0's copy): dropout outside tensor-parallel
    regions draws the same masks on both ranks (cpu_compat's device generator, as on a GPU)."""
    tp, pp = layout.get("tensor", 1), layout.get("pipeline", 1)
    extra = dict(lr_decay_style="WSD", recompute={"granularity": "full", "method": "uniform", "num_layers": 1})

    def plan_in(work: Path) -> Path:
        work.mkdir()
        plan = make_plan(work, corpus, iterations=10, save_interval=10, dropout=0.1, **layout,
                         **(extra if tp > 1 else {}))
        if tp > 1:
            plan["settings"]["model"].update(VARIANTS)
        return write_plan(work, plan)

    proc = run_stage(plan_in(tmp_path / "straight"), ntasks=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train = losses(tmp_path / "straight")
    assert sorted(train) == list(range(1, 11)) and all(math.isfinite(v) for v in train.values())
    assert train[10] < train[1]
    assert f"world 2 = TP {tp} x PP {pp} x CP 1 x DP 1" in proc.stdout
    from lingjun_slurm.injob.checkpoint import verify

    assert verify(tmp_path / "straight" / "ckpt", load_tensors=True).tensors_loaded
    plan = plan_in(tmp_path / "resumed")
    for env in ({"LINGJUN_TRAIN_STOP_AT": "5"}, {}):
        proc = run_stage(plan, ntasks=2, **env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from" in proc.stdout
    assert losses(tmp_path / "resumed") == train  # == on floats: bit-identical


def test_stage_dispatcher_runs_train(straight_run: Run) -> None:
    """`python3 -m lingjun_slurm.stages train --plan P` (the rendered command) reaches this trainer."""
    if not dispatcher_wired():
        pytest.skip("lingjun_slurm/injob/stages/dispatch.py does not dispatch train to stages/train.py yet")
    assert stage_command(straight_run.plan)[1:4] == ["-m", "lingjun_slurm.stages", "train"]
    assert "iteration       20/20" in straight_run.proc.stdout  # the session runs went through it


def test_missing_dataset_names_the_prefix(corpus: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "corpus_text_document"
    plan = write_plan(tmp_path, make_plan(tmp_path, missing))
    proc = run_stage(plan, timeout=60)
    assert proc.returncode == 1
    assert f"the training data {missing} (.bin/.idx) is missing" in proc.stderr
    assert "Traceback" not in proc.stderr
