"""Which checkpoints the running megatron-core cannot read (issue 26 item 2): a version, not damage.

Input: the real torch_dist checkpoints that Megatron-LM's own pretrain_gpt.py saved at every pinned
release (tests/fixtures/megatron/checkpoints/, made by tools/megatron_checkpoints.py; provenance and
commits in tests/fixtures/megatron/SOURCES.md), in four layouts each, and the builtin trainer's own
(builtin-rng-pp-tp-dp). Ground truth is the running megatron-core itself: every checkpoint the classifier
flags is one whose common state megatron-core's load_common_state_dict fails on here, and every one it
passes, megatron-core reads. Versions the running megatron-core can read are never flagged.
"""

from __future__ import annotations

import importlib
import json
import shutil
import warnings
from pathlib import Path

import pytest

v = importlib.import_module("lingjun_slurm.injob.checkpoint.verify")  # the package exports a function of that name

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "megatron" / "checkpoints"
LAYOUTS = ("single", "dp2", "tp2", "pp2")
# fixture -> the oldest megatron-core that reads it (SOURCES.md: each revision's own megatron-core resumed
# it, losses.json "builtin_resumes_megatron"); why older ones cannot: megatron/versions.py
READ_FROM = {"core_v0.16.1": (0, 16, 0), "core_v0.17.1": (0, 16, 0), "core_v0.18.2": (0, 18, 0),
             "core_v0.19.0": (0, 19, 0), "main-d98e8a64ddf3": (0, 19, 0), "builtin-rng-pp-tp-dp": (0, 16, 0)}
CASES = [(f, layout) for f in READ_FROM for layout in LAYOUTS if (FIXTURES / f / layout).is_dir()]


@pytest.fixture(scope="module")
def running() -> tuple[int, ...]:
    pytest.importorskip("megatron.core", reason="needs megatron-core (pip install '.[megatron]')")
    have = v._megatron_core_version()
    assert have is not None
    return tuple(have[:3])


def _iter_dir(fixture: str, layout: str) -> Path:
    return next(p for p in sorted((FIXTURES / fixture / layout).iterdir()) if p.name.startswith("iter_"))


def _megatron_reads_common(iter_dir: Path) -> bool:
    from megatron.core import dist_checkpointing

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dist_checkpointing.load_common_state_dict(str(iter_dir))
    except Exception:
        return False
    return True


@pytest.mark.parametrize(("fixture", "layout"), CASES)
def test_flagged_exactly_when_this_megatron_core_cannot_read_it(fixture: str, layout: str,
                                                                running: tuple[int, ...]) -> None:
    iter_dir = _iter_dir(fixture, layout)
    assert v.quick_problems(iter_dir, int(iter_dir.name[5:])) == []  # intact: never "damaged"
    mismatch = v.version_mismatch(iter_dir)
    readable = running >= READ_FROM[fixture]
    assert (mismatch is None) == readable, mismatch
    assert _megatron_reads_common(iter_dir) == readable  # the real reader agrees
    if mismatch is not None:
        assert mismatch.needs == READ_FROM[fixture]
        assert mismatch.running == ".".join(map(str, running))


def test_the_one_line_names_both_versions_and_what_to_do(running: tuple[int, ...]) -> None:
    if running >= (0, 19, 0):
        pytest.skip("this megatron-core reads every fixture")
    mismatch = v.version_mismatch(_iter_dir("core_v0.19.0", "single"))
    assert mismatch is not None
    here = ".".join(map(str, running))
    assert mismatch.line("iter_0000003") == (
        "iter_0000003: saved by megatron-core >= 0.19 (its common state is inside the shards, no common.pt), which "
        f"this megatron-core {here} cannot load: run with megatron-core >= 0.19 (a container image with Megatron-LM "
        ">= 0.19, declared as megatron_lm.version), or resume from another checkpoint directory (checkpoint.dir; "
        "Megatron-LM: --load); the checkpoint is intact and was left as it is")


def test_the_classes_a_checkpoint_pickles_are_read_without_unpickling() -> None:
    archive = (_iter_dir("core_v0.18.2", "single") / "common.pt").read_bytes()
    names = {f"{m}.{n}" for m, n in v.pickled_globals(archive)}
    assert {"argparse.Namespace", "megatron.core.transformer.enums.InferenceCudaGraphScope",
            "megatron.core.enums.ModelType"} <= names
    # the shards' common state (megatron-core >= 0.19) is found at the offset .metadata records
    shards = v._common_state_bytes(_iter_dir("core_v0.19.0", "single"))
    assert shards is not None and "argparse.Namespace" in {f"{m}.{n}" for m, n in v.pickled_globals(shards)}
    assert v.pickled_globals(b"not a torch archive") == []


def test_classes_since_agrees_with_this_megatron_core(running: tuple[int, ...]) -> None:
    from lingjun_slurm.megatron.versions import CLASSES_SINCE

    for dotted, since in CLASSES_SINCE.items():
        module, _, name = dotted.rpartition(".")
        assert v.missing_here(module, name) == (running < since), dotted
    assert not v.missing_here("megatron.core.enums", "ModelType")
    assert not v.missing_here("argparse", "Nope")  # only megatron's own names are judged
    assert v.missing_here("megatron.core.no_such_module", "X")


def _copy(fixture: str, tmp: Path) -> Path:
    src = _iter_dir(fixture, "single")
    dst = tmp / src.name
    shutil.copytree(src, dst)
    return dst


def test_a_newer_metadata_json_format_is_a_version(tmp_path: Path, running: tuple[int, ...]) -> None:
    """metadata.json with a backend version above what this megatron-core registers, or a field its
    CheckpointingConfig refuses: megatron-core's own reader fails on both, and both are versions."""
    it = _copy("core_v0.16.1", tmp_path)
    config = json.loads((it / "metadata.json").read_text())
    (it / "metadata.json").write_text(json.dumps({**config, "sharded_backend_version": 99}))
    mismatch = v.version_mismatch(it)
    assert mismatch is not None and "sharded_backend torch_dist version 99" in mismatch.evidence, mismatch
    assert mismatch.needs is None and "newer than" in mismatch.line(it.name)
    from megatron.core.dist_checkpointing.serialization import verify_checkpoint_and_load_strategy

    with pytest.raises(Exception, match="default strategy"):
        verify_checkpoint_and_load_strategy(str(it))
    (it / "metadata.json").write_text(json.dumps({**config, "format_from_the_future": 1}))
    mismatch = v.version_mismatch(it)
    if running < (0, 19, 0):  # 0.16's CheckpointingConfig(**config) raises TypeError; 0.19 drops unknown keys
        assert mismatch is not None and "format_from_the_future" in mismatch.evidence
        assert not _megatron_reads_common(it)
    else:
        assert mismatch is None and _megatron_reads_common(it)


def test_damage_is_not_a_version(tmp_path: Path) -> None:
    """A truncated shard of a newer checkpoint is damage (the size check), and a pickle cut short is an
    unreadable common state, not a missing class."""
    it = _copy("core_v0.19.0", tmp_path)
    shard = it / "__0_0.distcp"
    with open(shard, "r+b") as fh:
        fh.truncate(shard.stat().st_size // 2)
    assert any("truncated" in p for p in v.quick_problems(it, 3))
    assert v.mismatch_from_error("UnpicklingError: invalid load key, '\\x00'.") is None
    assert v.mismatch_from_error("EOFError: Ran out of input") is None


def _real_load_error(weights_only: bool) -> BaseException:
    import torch

    path = _iter_dir("core_v0.18.2", "single") / "common.pt"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.load(str(path), map_location="cpu", weights_only=weights_only)
    except Exception as exc:  # what megatron-core 0.16's load_common (torch.load) raises on it
        return exc
    pytest.skip("this megatron-core unpickles core_v0.18.2's common state")


@pytest.mark.parametrize("weights_only", [True, False])
def test_a_load_that_fails_on_a_missing_class_is_a_version_error(weights_only: bool, running: tuple[int, ...]) -> None:
    from lingjun_slurm.injob.train.ckpt import CheckpointReadError, CheckpointVersionError, _load_failed

    exc = _real_load_error(weights_only)
    err = _load_failed("/c/iter_0000003", 3, exc)
    assert isinstance(err, CheckpointVersionError) and not isinstance(err, CheckpointReadError), err
    assert str(err).startswith("cannot resume from /c: iter_0000003: saved by megatron-core >= 0.18 (its common "
                               "state pickles megatron.core.transformer.enums.InferenceCudaGraphScope, which "
                               f"megatron-core {'.'.join(map(str, running))} does not have)"), str(err)


def test_a_load_that_fails_on_damage_is_still_a_read_error(tmp_path: Path) -> None:
    import torch

    from lingjun_slurm.injob.train.ckpt import CheckpointReadError, CheckpointVersionError, _load_failed

    it = _copy("core_v0.16.1", tmp_path)
    common = it / "common.pt"
    with open(common, "r+b") as fh:  # overwritten bytes: an UnpicklingError too, but naming no class
        fh.write(b"\xff" * 64)
    with pytest.raises(Exception) as info:
        torch.load(str(common), map_location="cpu", weights_only=True)
    err = _load_failed(str(it), 3, info.value)
    assert isinstance(err, CheckpointReadError) and not isinstance(err, CheckpointVersionError), err


def test_verify_says_not_damaged(running: tuple[int, ...]) -> None:
    """`checkpoint verify` passes the files of a newer checkpoint and says why this megatron-core cannot load it."""
    report = v.verify(FIXTURES / "core_v0.19.0" / "single")
    said = [n for n in report.notes if n.startswith("not damaged, but iter_0000003: saved by megatron-core >= 0.19")]
    assert len(said) == (1 if running < (0, 19, 0) else 0), report.notes


def test_the_writer_the_builtin_records_is_named(tmp_path: Path, running: tuple[int, ...]) -> None:
    """The builtin trainer's args carry the run's megatron_lm.version (train/ckpt.py _args); Megatron-LM's
    carry none, and the line then names the version the evidence implies (above). Modelled: the archive is
    torch.save of the shards' common_state object as megatron-core 0.19 wraps it ([state_dict],
    serialization.py :227-237 at core_v0.19.0), with a builtin-style args Namespace."""
    import argparse
    import io

    import torch

    buf = io.BytesIO()
    torch.save([{"args": argparse.Namespace(megatron_lm_version="0.19.0"), "iteration": 3}], buf)
    assert v._recorded_writer(buf.getvalue()) == "0.19.0"
    assert v._recorded_writer(b"garbage") is None
    mismatch = v.VersionMismatch("0.16.1", "its common state is inside the shards, no common.pt", needs=(0, 19, 0),
                                 writer="0.19.0")
    assert mismatch.line("iter_0000003").startswith(
        "iter_0000003: saved by Megatron-LM 0.19.0 (as its args record; its common state is inside the shards, no "
        "common.pt), which this megatron-core 0.16.1 cannot load: run with megatron-core >= 0.19 ")


@pytest.mark.parametrize("edit", [('"common_backend_version": 1', '"common_backend_version": 7'),
                                  ('"common_backend"', '"common_backenx"')])
def test_a_changed_metadata_json_with_a_manifest_is_damage_not_a_newer_version(
        edit: tuple[str, str], tmp_path: Path, running: tuple[int, ...]) -> None:
    """A same-size edit of metadata.json reads like a newer format (an unknown field, a newer backend
    version), but the manifest's hash says the file changed after the save: damage, so the resume
    falls back instead of stopping with "intact, written by a newer megatron-core"."""
    from lingjun_slurm.injob.checkpoint import manifest as mf
    from lingjun_slurm.injob.train import resume

    src = _iter_dir("core_v0.16.1", "single")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(src, ckpt / src.name)
    iteration = int(src.name.removeprefix("iter_"))
    mf.write(ckpt / src.name, iteration)
    meta = ckpt / src.name / "metadata.json"
    text = meta.read_text()
    assert edit[0] in text
    meta.write_text(text.replace(edit[0], edit[1]))
    assert v.version_mismatch(ckpt / src.name) is not None  # alone, it reads like a newer format
    problems = resume.check(str(ckpt), iteration, "hash")
    assert len(problems) == 1 and problems[0].startswith("hash mismatch in metadata.json"), problems
