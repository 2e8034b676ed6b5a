"""Checkpoints that cross between Megatron-LM's pretrain_gpt.py and the builtin trainer.

The fixtures under tests/fixtures/megatron/checkpoints/<revision>/ were saved by Megatron-LM's own
pretrain_gpt.py on the CPU at every pinned revision in VERSIONS (tools/megatron_checkpoints.py;
provenance in SOURCES.md): the tiny GPT of helpers.cross_plan() at iteration 3 of 6, 1 process, DP=2
with the distributed optimizer, TP=2 and PP=2, with the losses of Megatron-LM's uninterrupted run,
of its own resume and of its resume of the builtin's checkpoint. Also kept: the builtin's
checkpoints from before it saved Megatron-LM's RNG layout (rng by (pp, tp, dp)).

Both trainers run with lingjun_slurm.injob.train.cpu_compat, whose emulated CUDA generator is what dropout
draws from (as on a GPU), apart from the CPU generator that Megatron-LM's DataLoaders draw from on
tensor-parallel rank 0 only. With one generator for both (before), the TP ranks' dropout masks
outside tensor-parallel regions differed, the replicated parameters (layer norms, row-parallel
biases, position embeddings) drifted apart between the TP ranks, and the checkpoint (TP rank 0's
copy of them) resumed neither trainer's TP=2 run exactly (2.2e-4 off by iteration 6).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .helpers import CROSS_SAVED_AT, REPO, cross_plan, losses, run_stage, write_plan

FIXTURES = REPO / "tests" / "fixtures" / "megatron" / "checkpoints"
# declared megatron_lm.version -> the checkpoints Megatron-LM at that pinned revision saved (SOURCES.md)
VERSIONS = {"0.16.1": FIXTURES / "core_v0.16.1", "0.17.1": FIXTURES / "core_v0.17.1",
            "0.18.2": FIXTURES / "core_v0.18.2", "0.19.0": FIXTURES / "core_v0.19.0",
            "0.20.0": FIXTURES / "main-d98e8a64ddf3"}
MLM = VERSIONS["0.16.1"]
OLD = FIXTURES / "builtin-rng-pp-tp-dp"
LAYOUTS = {"single": ({}, 1), "dp2": ({"distributed_optimizer": True}, 2), "tp2": ({"tensor": 2}, 2),
           "pp2": ({"pipeline": 2}, 2)}
# From megatron-core 0.19 (Megatron-LM commit 40b1fd37c1 "deprecate common strategy", first in
# core_v0.19.0) dist_checkpointing.save writes no common.pt: the common state (args, iteration, ...)
# is the ShardedObject "common_state" inside the .distcp shards (serialization.py save, core_v0.19.0
# :439-445; read back by load_common_state_dict :206-233), and metadata.json has no common_backend.
# The builtin's pre-resume check (lingjun_slurm/injob/checkpoint/verify.py version_mismatch) takes that
# layout from megatron-core 0.19 on, and on an older megatron-core stops the run in one line as a
# version it cannot read (train/ckpt.py CheckpointVersionError), never as damage.
COMMON_IN_SHARDS = ("0.19.0", "0.20.0")
# The builtin runs here on the project's megatron-core (0.16), which reads the common state of
# checkpoints up to 0.17.1 only: from core_v0.18.0 Megatron-LM's args hold
# megatron.core.transformer.enums.InferenceCudaGraphScope (core_v0.18.2 enums.py:101), which 0.16
# does not have, so common.pt does not unpickle. The script ran the builtin on each revision's own
# megatron-core instead (losses.json "builtin_resumes_megatron", test_the_builtin_on_that_megatron_core...).
READABLE_HERE = ("0.16.1", "0.17.1")
# What runs the builtin live: every layout at the floor, 1 process at 0.17.1 (2 processes on CI's
# 2 cores are the slow half). Megatron-LM's records of every version and layout are checked
# without running anything.
RESUME_CASES = [(v, layout) for v in READABLE_HERE for layout in LAYOUTS if layout == "single" or v == "0.16.1"]
TOL = 1e-5  # every layout: the trainers reduce the loss in float32 (Megatron-LM) and float64 (builtin)


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


def _rng_states(path: Path) -> dict[str, dict]:
    """Every (pp, tp) shard's RNG state in the checkpoint at `path` (one process, no process group)."""
    import io
    import warnings

    from torch.distributed.checkpoint import FileSystemReader, load

    state = {k: io.BytesIO() for k in _rng_keys(path)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # no_dist is the intent
        load(state, storage_reader=FileSystemReader(str(path)), no_dist=True)  # a ShardedObject is pickled bytes
    out = {}
    for key, value in state.items():
        while isinstance(value, list):  # the object is the list [state] (checkpointing.py get_rng_state), as loaded
            assert len(value) == 1, (key, len(value))
            value = value[0]
        out[key] = value
    return out


def _same_rng(a: dict, b: dict) -> list[str]:
    """The generators whose states differ between two saved RNG states."""
    import numpy as np
    import torch

    differ = [n for n in ("random_rng_state",) if a[n] != b[n]]
    if a["np_rng_state"][0] != b["np_rng_state"][0] or not np.array_equal(a["np_rng_state"][1], b["np_rng_state"][1]) \
            or a["np_rng_state"][2:] != b["np_rng_state"][2:]:
        differ.append("np_rng_state")
    differ += [n for n in ("torch_rng_state", "cuda_rng_state") if not torch.equal(a[n], b[n])]
    ta, tb = a["rng_tracker_states"], b["rng_tracker_states"]
    if sorted(ta) != sorted(tb):
        differ.append(f"rng_tracker_states {sorted(ta)} vs {sorted(tb)}")
    else:
        differ += [f"rng_tracker_states[{k}]" for k in ta if not torch.equal(ta[k], tb[k])]
    return differ


@pytest.mark.parametrize(("version", "layout"), RESUME_CASES)
def test_builtin_resumes_megatron_lm_checkpoint(version: str, layout: str, tmp_path: Path) -> None:
    """The builtin, declared as that Megatron-LM version, resumes iteration 3 that Megatron-LM of
    that version saved and continues Megatron-LM's uninterrupted run: the RNG state, optimizer
    (distributed or not), scheduler and data position all came back. That is also the builtin's own
    resume (bit-identical to its uninterrupted run, test_trainer.py) and Megatron-LM's own (its record)."""
    root = VERSIONS[version]
    rec = _record(root, layout)
    assert rec.get("declared_version", "0.16.1") == version
    proc = run_stage(_setup(tmp_path, root / layout, layout, version=version), ntasks=LAYOUTS[layout][1])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resumed from {tmp_path / 'ckpt'}/iter_0000003" in proc.stdout
    assert "RNG states start fresh" not in proc.stdout + proc.stderr
    got = losses(tmp_path)
    assert sorted(got) == [4, 5, 6]
    straight = {int(k): v for k, v in rec["straight"]["losses"].items()}
    assert max(abs(got[i] - straight[i]) for i in got) < TOL, (got, straight)
    # the builtin saved Megatron-LM's layout again
    assert _rng_keys(tmp_path / "ckpt" / "iter_0000006") == _rng_keys(root / layout / "iter_0000003")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fresh_builtin_run_equals_megatron_lms(layout: str, tmp_path: Path) -> None:
    """Same settings, same data: the builtin's steps 1-6 are Megatron-LM's (to float32), dropout
    included, and at iteration 3 it saved the RNG state Megatron-LM saved, every generator of every
    (pp, tp) rank bit for bit, at every pinned version (their runs differ by float32 rounding at
    most; the builtin's run does not depend on the declared version). So a cross-trainer resume
    equals the same trainer's resume, both ways."""
    proc = run_stage(_setup(tmp_path, None, layout), ntasks=LAYOUTS[layout][1])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = losses(tmp_path)
    ours = _rng_states(tmp_path / "ckpt" / "iter_0000003")
    for version, root in VERSIONS.items():
        straight = {int(k): v for k, v in _record(root, layout)["straight"]["losses"].items()}
        assert sorted(got) == sorted(straight) == list(range(1, 7)), version
        assert max(abs(got[i] - straight[i]) for i in got) < TOL, (version, got, straight)
        theirs = _rng_states(root / layout / "iter_0000003")
        assert sorted(ours) == sorted(theirs), version
        assert {k: _same_rng(ours[k], theirs[k]) for k in ours} == {k: [] for k in ours}, version


@pytest.mark.parametrize("version", list(VERSIONS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_megatron_lm_resumed_the_builtins_checkpoint(version: str, layout: str) -> None:
    """The script's record: Megatron-LM of that version resumed the builtin's checkpoint (the builtin
    declared as that version) with default flags exactly as its own, and its own resume continues
    its straight run (the RNG states hold everything dropout needs)."""
    rec = _record(VERSIONS[version], layout)
    straight = {int(k): v for k, v in rec["straight"]["losses"].items()}
    assert sorted(rec["builtin_resumed"]["losses"]) == ["4", "5", "6"]
    assert rec["builtin_resumed"]["losses"] == rec["resumed"]["losses"]
    assert "--no-load-rng" not in rec["builtin_resumed"]["argv"]
    assert max(abs(v - straight[int(k)]) for k, v in rec["resumed"]["losses"].items()) < TOL


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


@pytest.mark.parametrize("version", list(VERSIONS))
def test_where_the_common_state_is(version: str) -> None:
    """What COMMON_IN_SHARDS says about each version's checkpoints, on the committed files."""
    from torch.distributed.checkpoint import FileSystemReader

    for layout in LAYOUTS:
        iter_dir = VERSIONS[version] / layout / "iter_0000003"
        config = json.loads((iter_dir / "metadata.json").read_text())
        keys = FileSystemReader(str(iter_dir)).read_metadata().state_dict_metadata
        if version in COMMON_IN_SHARDS:
            assert not (iter_dir / "common.pt").exists() and "common_backend" not in config, layout
            assert "common_state/shard_0_1" in keys, layout
        else:
            assert (iter_dir / "common.pt").is_file() and config["common_backend"] == "torch", layout
            assert not any(k.startswith("common_state") for k in keys), layout


@pytest.mark.parametrize("version", list(VERSIONS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_builtin_on_that_megatron_core_resumed_megatron_lms_checkpoint(version: str, layout: str) -> None:
    """The script's record of the builtin (this project's trainer at the commit of the fixtures),
    declared as that version and running on the revision's own megatron-core, resuming iteration 3
    that Megatron-LM saved: Megatron-LM's straight run to TOL, at every version (from 0.19 with
    the common state inside the shards, COMMON_IN_SHARDS)."""
    rec = _record(VERSIONS[version], layout)
    got = rec["builtin_resumes_megatron"]
    straight = {k: v for k, v in rec["straight"]["losses"].items()}
    assert got["rc"] == 0 and sorted(got["losses"]) == ["4", "5", "6"], got
    assert max(abs(v - straight[k]) for k, v in got["losses"].items()) < TOL, (got, straight)


def test_a_checkpoint_of_megatron_core_0_19_is_refused_in_one_line_on_an_older_one(tmp_path: Path) -> None:
    """The project's megatron-core (0.16) cannot read the common state that 0.19 keeps inside the
    shards: the pre-resume check says so and which version is needed, instead of megatron-core's
    "'str' object has no attribute 'iterdir'" (strategies/common.py:96 at 0.16.1)."""
    from megatron.core import package_info

    if tuple(int(x) for x in package_info.__version__.split(".")[:2]) >= (0, 19):
        pytest.skip("this megatron-core reads the layout")
    plan = _setup(tmp_path, VERSIONS["0.19.0"] / "single", "single")
    proc = run_stage(plan, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("lingjun-slurm: train:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "iter_0000003: saved by megatron-core >= 0.19 (its common state is inside the shards, no common.pt), " \
           f"which this megatron-core {package_info.__version__} cannot load: run with megatron-core >= 0.19" in lines[0]


def test_damaged_checkpoint_is_one_line_without_traceback(tmp_path: Path) -> None:
    plan = _setup(tmp_path, MLM / "single", "single")
    victim = sorted((tmp_path / "ckpt" / "iter_0000003").glob("__*.distcp"))[-1]
    victim.unlink()
    proc = run_stage(plan, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("lingjun-slurm: train:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    # The check before the load finds it (the only checkpoint: nothing to fall back to)
    assert lines[0].startswith(f"lingjun-slurm: train: cannot resume from {tmp_path / 'ckpt'}: no checkpoint passes "
                               f"the check (iter_{CROSS_SAVED_AT:07d}: missing shard {victim.name} referenced by "
                               ".metadata"), lines[0]
    assert "Traceback" not in proc.stderr


def _checkpoint_exception(message: str, ranks: tuple[int, ...] = (0, 1)) -> BaseException:
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException("load failed", {r: (RuntimeError(message), None) for r in ranks})


def test_describe_names_what_is_missing() -> None:
    from lingjun_slurm.injob.train.ckpt import _load_failed

    err = _load_failed("/c/iter_0000003", 3, _checkpoint_exception(
        "Missing key in checkpoint state_dict: rng_state/shard_0.0.0_1.1.1."))
    text = str(err)
    assert text.startswith("cannot load checkpoint /c/iter_0000003 (iteration 3): RuntimeError: Missing key in "
                           "checkpoint state_dict: rng_state/shard_0.0.0_1.1.1. (ranks 0, 1)")
    assert "RNG state is sharded another way" in text and "Traceback" not in text


def test_stage_edge_catches_checkpoint_exception(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                                 tmp_path: Path) -> None:
    """A CheckpointException (a BaseException) from anywhere in the run: one line, exit 1, no traceback."""
    from lingjun_slurm.injob.stages import train as stage
    from lingjun_slurm.injob.train import entry

    def boom(_settings):
        raise _checkpoint_exception("Missing key in checkpoint state_dict: optimizer.state.exp_avg.x", (0,))

    monkeypatch.setattr(entry, "run", boom)
    plan = json.loads(_setup(tmp_path, None, "single").read_text())
    assert stage.main(plan) == 1
    err = capsys.readouterr().err
    assert err.strip() == ("lingjun-slurm: train: RuntimeError: Missing key in checkpoint state_dict: "
                           "optimizer.state.exp_avg.x (rank 0)")
