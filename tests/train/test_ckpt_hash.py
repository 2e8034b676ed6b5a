"""The hash check before a resume (issue 26 item 1), with the real trainer on the CPU.

One 6-iteration run (saves at 2, 4 and 6, each with the lingjun-manifest.json the trainer writes at
save time) is the reference; every test takes a copy of its checkpoints cut back to iteration 4
(iter_0000006 removed, the tracker at 4), damages or strips it, and starts the stage on it the way a
requeued job would. A resume that trained on a damaged checkpoint would not reproduce the
reference's losses (the resume is bit-identical: tests/train/test_trainer.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .conftest import Run, _train
from .helpers import losses, make_plan, metrics, run_stage, write_plan

TRACKER = "latest_checkpointed_iteration.txt"
MANIFEST = "lingjun-manifest.json"
PLAN_ARGS = dict(iterations=6, save_interval=2, eval_iters=0, eval_interval=1000, log_interval=1)


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _train(tmp_path_factory.mktemp("hash-ref"), corpus, **PLAN_ARGS)


def _at_4(reference: Run, tmp: Path) -> Path:
    dst = tmp / "ckpt"
    shutil.copytree(reference.ckpt, dst, symlinks=True)
    shutil.rmtree(dst / "iter_0000006")
    (dst / TRACKER).write_text("4\n")
    return dst


def _plan(tmp: Path, corpus: Path, iterations: int = 6) -> Path:
    return write_plan(tmp, make_plan(tmp, corpus, **{**PLAN_ARGS, "iterations": iterations}))


def _flip(path: Path, offset: int, length: int = 400) -> None:
    """Same size, every bit of `length` bytes at `offset` inverted."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        old = fh.read(length)
        fh.seek(offset)
        fh.write(bytes(b ^ 0xFF for b in old))


def _ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("lingjun-slurm: train:")]


def _note(run_dir: Path) -> dict:
    return json.loads((run_dir / "stage-notes" / "train.txt").read_text())


def _no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-4000:]


def test_every_save_writes_a_manifest_of_every_file(reference: Run) -> None:
    from lingjun_slurm.injob.checkpoint import manifest as mf
    from lingjun_slurm.injob.checkpoint.verify import verify

    for it in (2, 4, 6):
        iter_dir = reference.ckpt / f"iter_{it:07d}"
        data = json.loads((iter_dir / MANIFEST).read_text())
        assert data["iteration"] == it and data["schema"] == mf.SCHEMA
        assert [f["path"] for f in data["files"]] == mf.checkpoint_files(iter_dir)
        assert {".metadata", "metadata.json", "common.pt", "__0_0.distcp"} <= {f["path"] for f in data["files"]}
    assert verify(reference.ckpt, 6).manifest == "matched"  # `checkpoint verify` reads it: hashes match
    assert "hashed checkpoint" in reference.proc.stdout and "for its manifest" in reference.proc.stdout


def test_a_same_size_byte_flip_is_never_trained_on(reference: Run, corpus: Path, tmp_path: Path) -> None:
    """400 bytes inverted in the middle of a shard of the newest checkpoint: the sizes and the
    structure still pass, the hashes do not; the run goes back to iter_0000002 and reproduces the
    reference's losses from iteration 3 on."""
    from lingjun_slurm.cli.checkpoint import checkpoint
    from click.testing import CliRunner

    ckpt = _at_4(reference, tmp_path)
    shard = ckpt / "iter_0000004" / "__0_0.distcp"
    size = shard.stat().st_size
    _flip(shard, size // 2)
    before = CliRunner().invoke(checkpoint, ["list", str(ckpt)]).output
    assert "verified" not in before and "sizes ok, not hash-checked" in before, before
    proc = run_stage(_plan(tmp_path, corpus), SLURM_JOB_ID="701")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _no_traceback(proc)
    [line] = _ours(proc.stderr)
    assert line.startswith("lingjun-slurm: train: checkpoint iter_0000004 is damaged (hash mismatch in __0_0.distcp: "
                           "xxh3_128 "), line  # the fast hash the save recorded beside the SHA-256 (xxhash installed)
    assert f"{MANIFEST} says" in line and line.endswith("; resuming from iter_0000002, the newest that passes")
    run_dir = tmp_path / "runs" / "t"
    assert [r["iteration"] for r in metrics(run_dir)] == [3, 4, 5, 6]
    ref = losses(reference.dir)
    assert losses(tmp_path) == {it: ref[it] for it in (3, 4, 5, 6)}  # == on floats: the intact state
    note = _note(run_dir)
    assert note["job"] == "701" and note["note"] == line.removeprefix("lingjun-slurm: train: ")
    checks = metrics(run_dir, "resume_check")
    assert [(c["iteration"], c["ok"]) for c in checks] == [(4, False), (2, True)]
    # the damaged directory is kept aside, flipped bytes and all; 4 and 6 were saved afresh
    aside = [p.name for p in ckpt.iterdir() if p.name.startswith("iter_0000004.damaged-")]
    assert len(aside) == 1 and sorted(p.name for p in ckpt.iterdir()) == sorted(
        [TRACKER, "iter_0000002", "iter_0000004", "iter_0000006", *aside])
    assert (ckpt / aside[0] / "__0_0.distcp").read_bytes() != (ckpt / "iter_0000004" / "__0_0.distcp").read_bytes()
    assert (ckpt / TRACKER).read_text().strip() == "6"
    # `checkpoint list`: the one hash-checked at the resume is "verified", with the check's time
    data = json.loads(CliRunner().invoke(checkpoint, ["list", str(ckpt), "--json"]).output)
    state = {i["name"]: (i["state"], i["check"].split(" ")[:2], bool(i["verified_at"])) for i in data["iterations"]}
    assert state == {"iter_0000002": ("verified", ["xxh3_128", "ok"], True),
                     "iter_0000004": ("complete", ["sizes", "ok,"], False),
                     "iter_0000006": ("complete", ["sizes", "ok,"], False)}


def test_a_flipped_final_checkpoint_is_trained_again(reference: Run, corpus: Path, tmp_path: Path) -> None:
    """The tracker at the last iteration (entry.py's "nothing to train" check, one rank): hashed too."""
    ckpt = _at_4(reference, tmp_path)
    _flip(ckpt / "iter_0000004" / "__0_1.distcp", 1000)
    proc = run_stage(_plan(tmp_path, corpus, iterations=4))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [line] = _ours(proc.stderr)
    assert "iter_0000004 is damaged (hash mismatch in __0_1.distcp" in line, line
    assert "nothing to train" not in proc.stdout
    assert [r["iteration"] for r in metrics(tmp_path / "runs" / "t")] == [3, 4]


def test_no_manifest_is_said_in_the_log_and_in_status(reference: Run, corpus: Path, tmp_path: Path) -> None:
    from lingjun_slurm import status

    ckpt = _at_4(reference, tmp_path)
    (ckpt / "iter_0000004" / MANIFEST).unlink()
    proc = run_stage(_plan(tmp_path, corpus), SLURM_JOB_ID="702")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _no_traceback(proc)
    assert "iter_0000004 not hash-checked: no manifest" in proc.stdout
    assert _ours(proc.stderr) == []  # not a fallback: the load goes on
    run_dir = tmp_path / "runs" / "t"
    assert [r["iteration"] for r in metrics(run_dir)] == [5, 6]
    note = _note(run_dir)
    assert note == {**note, "job": "702", "note": "iter_0000004 not hash-checked: no manifest"}
    st = status.StageStatus("train", ["702"], "COMPLETED", None, 0, 12, "host", 0)
    status._add_note(st, None, str(run_dir))
    table = status.format_table([status.RunStatus("t", "t", "local", "localhost", [st])])
    assert "not hash-checked" in table
    # an intact checkpoint with its manifest: hashed, no note left
    again = run_stage(_plan(tmp_path, corpus, iterations=8), SLURM_JOB_ID="703")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "not hash-checked" not in again.stdout and not (run_dir / "stage-notes" / "train.txt").exists()
    assert metrics(run_dir, "resume_check")[-1]["ok"] is True


def test_an_image_without_xxhash_checks_the_sha256(reference: Run, corpus: Path, tmp_path: Path) -> None:
    """The manifest has both hashes; where the image lacks python-xxhash the check compares the
    SHA-256s (slower, and says so) and still catches the flipped bytes."""
    import os

    ckpt = _at_4(reference, tmp_path)
    shard = ckpt / "iter_0000004" / "__0_0.distcp"
    _flip(shard, shard.stat().st_size // 2)
    hide = tmp_path / "no-xxhash"
    hide.mkdir()
    (hide / "xxhash.py").write_text('raise ImportError("no xxhash in this image (hidden by the test)")\n')
    path = os.pathsep.join(p for p in (str(hide), os.environ.get("PYTHONPATH", "")) if p)
    proc = run_stage(_plan(tmp_path, corpus), PYTHONPATH=path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [line] = _ours(proc.stderr)
    assert "is damaged (hash mismatch in __0_0.distcp: sha256 " in line, line
    assert "xxhash is not installed in this image: the check used SHA-256" in proc.stdout + proc.stderr
    assert [c.get("hash") for c in metrics(tmp_path / "runs" / "t", "resume_check")] == ["sha256", "sha256"]


def test_cheap_mode_does_not_hash(reference: Run, corpus: Path, tmp_path: Path) -> None:
    """LINGJUN_VERIFY_CHECKPOINT=cheap: what it says, structure and sizes only (the flipped bytes
    are loaded), so that the hash check above is what catches them."""
    ckpt = _at_4(reference, tmp_path)
    _flip(ckpt / "iter_0000004" / "__0_0.distcp", (ckpt / "iter_0000004" / "__0_0.distcp").stat().st_size // 2)
    proc = run_stage(_plan(tmp_path, corpus), LINGJUN_VERIFY_CHECKPOINT="cheap")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _ours(proc.stderr) == [] and [r["iteration"] for r in metrics(tmp_path / "runs" / "t")] == [5, 6]


def test_split_gives_each_file_to_exactly_one_rank() -> None:
    from lingjun_slurm.injob.checkpoint.manifest import split

    files = {"__0_0.distcp": 900, "__0_1.distcp": 850, "__1_0.distcp": 880, "__1_1.distcp": 870, ".metadata": 30,
             "common.pt": 20, "metadata.json": 1}
    parts = split(files, 2)
    assert sorted(sum(parts, [])) == sorted(files) and split(dict(reversed(files.items())), 2) == parts
    loads = [sum(files[f] for f in p) for p in parts]
    assert max(loads) - min(loads) <= max(files.values())
    assert split(files, 1) == [sorted(files)] and [p for p in split({"a": 1}, 3) if p] == [["a"]]


def test_dp2_each_rank_hashes_its_share(dp2_run: Run, corpus: Path, tmp_path: Path) -> None:
    """2 processes: the manifest written at save holds both ranks' shards; at the resume each file
    is hashed by one rank, and a flip in rank 1's shard sends both ranks to the older checkpoint."""
    from .conftest import LONG

    data = json.loads((dp2_run.ckpt / "iter_0000040" / MANIFEST).read_text())
    assert {"__0_0.distcp", "__1_0.distcp"} <= {f["path"] for f in data["files"]}
    ckpt = tmp_path / "ckpt"
    shutil.copytree(dp2_run.ckpt, ckpt, symlinks=True)
    shard = ckpt / "iter_0000040" / "__1_0.distcp"
    _flip(shard, shard.stat().st_size // 2)
    plan = make_plan(tmp_path, corpus, distributed_optimizer=True, **{**LONG, "iterations": 41})
    proc = run_stage(write_plan(tmp_path, plan), ntasks=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [line] = _ours(proc.stderr)
    assert "iter_0000040 is damaged (hash mismatch in __1_0.distcp" in line and "resuming from iter_0000020" in line
    checks = metrics(tmp_path / "runs" / "t", "resume_check")
    assert [(c["iteration"], c["ok"], c["ranks"]) for c in checks] == [(40, False, 2), (20, True, 2)]
    assert metrics(tmp_path / "runs" / "t")[0]["iteration"] == 21


def test_a_check_started_early_is_judged_before_the_load(reference: Run, tmp_path: Path) -> None:
    """resume(started=...): the hashes begun before the model is built (start_check), the verdict
    taken in resume() before anything is loaded: the flipped iteration is never passed to load()."""
    from types import SimpleNamespace

    from lingjun_slurm.injob.train import resume

    ckpt = _at_4(reference, tmp_path)
    _flip(ckpt / "iter_0000004" / "__0_1.distcp", 2000)
    rt = SimpleNamespace(rank=0, world_size=1)
    settings = SimpleNamespace(checkpoint=SimpleNamespace(dir=str(ckpt)), run_dir=str(tmp_path / "run"))
    started = {4: resume.start_check(rt, str(ckpt), 4, "hash")}
    loaded: list[int] = []
    outcome = resume.resume(settings, rt, 4, lambda it: loaded.append(it) or it, None, "hash", None, started)
    assert loaded == [2] and outcome.iteration == 2
    assert outcome.damaged[0][0] == "iter_0000004" and outcome.damaged[0][1].startswith("hash mismatch in __0_1")
