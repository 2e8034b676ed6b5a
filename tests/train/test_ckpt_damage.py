"""Resuming past damaged checkpoints, and a full disk during a save (issue 15 item 5).

One tiny model is trained once for the module (4 iterations, saves at 2 and 4); every test damages
a copy of its checkpoint directory and starts the stage on it, the way a requeued job would.
The full-disk test saves onto a real tmpfs that is full (a private mount namespace, `unshare -rm`):
the ENOSPC comes from the kernel, not from a mocked exception.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import Run, _train
from .helpers import REPO, launch_env, make_plan, metrics, run_stage, stage_command, write_plan

TRACKER = "latest_checkpointed_iteration.txt"
PLAN_ARGS = dict(iterations=4, save_interval=2, eval_iters=0, eval_interval=1000, log_interval=1)


@pytest.fixture(scope="module")
def saved(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """4 iterations, checkpoints iter_0000002 and iter_0000004, the tracker at 4."""
    return _train(tmp_path_factory.mktemp("damage-src"), corpus, **PLAN_ARGS)


def _copy(saved: Run, tmp: Path) -> Path:
    dst = tmp / "ckpt"
    shutil.copytree(saved.ckpt, dst, symlinks=True)
    return dst


def _plan(tmp: Path, corpus: Path, iterations: int = 4) -> Path:
    return write_plan(tmp, make_plan(tmp, corpus, **{**PLAN_ARGS, "iterations": iterations}))


def _no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-4000:]


def _ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("lingjun-slurm: train:")]


def _truncate(path: Path, keep: int) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(keep)


def _overwrite(path: Path, offset: int, length: int, invert: bool = False) -> None:
    """Same size, other bytes: zeros, or every bit of the range flipped."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        old = fh.read(length)
        fh.seek(offset)
        fh.write(bytes(b ^ 0xFF for b in old) if invert else bytes(len(old)))


def test_truncated_shard_falls_back_to_the_older_checkpoint(saved: Run, corpus: Path, tmp_path: Path) -> None:
    from lingjun_slurm import status

    ckpt = _copy(saved, tmp_path)
    shard = ckpt / "iter_0000004" / "__0_0.distcp"
    size = shard.stat().st_size
    _truncate(shard, size // 2)
    proc = run_stage(_plan(tmp_path, corpus, iterations=6), SLURM_JOB_ID="local-1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _no_traceback(proc)
    line = (f"lingjun-slurm: train: checkpoint iter_0000004 is damaged (file __0_0.distcp truncated: expected >= "
            f"{size} bytes, found {size // 2}); resuming from iter_0000002, the newest that passes")
    assert _ours(proc.stderr) == [line]
    assert "resumed from " + str(ckpt / "iter_0000002") in proc.stdout
    # iterations 3.. again; the damaged directory was moved aside at the fallback, never deleted
    assert [r["iteration"] for r in metrics(tmp_path / "runs" / "t")] == [3, 4, 5, 6]
    aside = [p for p in ckpt.iterdir() if p.name.startswith("iter_0000004.damaged-")]
    assert len(aside) == 1 and (aside[0] / "__0_0.distcp").stat().st_size == size // 2
    assert (ckpt / "iter_0000004" / "__0_0.distcp").stat().st_size > size // 2  # saved afresh
    assert (ckpt / TRACKER).read_text().strip() == "6"
    fallback = metrics(tmp_path / "runs" / "t", "resume_fallback")
    assert fallback and fallback[0]["resumed_from"] == "iter_0000002" and fallback[0]["tracker"] == "iter_0000004"
    # what `lingjun-slurm status` shows for the train stage
    note = _note(tmp_path / "runs" / "t")
    assert note["note"] == line.removeprefix("lingjun-slurm: train: ") and note["job"] == "local-1"
    st = status.StageStatus("train", ["local-1"], "COMPLETED", None, 0, 12, "host", 0)
    status._add_note(st, None, str(tmp_path / "runs" / "t"))
    table = status.format_table([status.RunStatus("t", "t", "local", "localhost", [st])])
    assert "resuming from iter_0000002, the newest that passes" in table and "iter_0000004 is damaged" in table


def _note(run_dir: Path) -> dict:
    return json.loads((run_dir / "stage-notes" / "train.txt").read_text())


def test_a_damaged_final_checkpoint_is_trained_again(saved: Run, corpus: Path, tmp_path: Path) -> None:
    """The tracker at the last iteration used to mean "nothing to train" without a look at that
    checkpoint: a damaged last checkpoint then ended the stage with exit 0. It is checked, and
    training falls back and saves it again."""
    ckpt = _copy(saved, tmp_path)
    shard = ckpt / "iter_0000004" / "__0_0.distcp"
    size = shard.stat().st_size
    _truncate(shard, 100)
    proc = run_stage(_plan(tmp_path, corpus, iterations=4), SLURM_JOB_ID="501")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _no_traceback(proc)
    assert _ours(proc.stderr) == [f"lingjun-slurm: train: checkpoint iter_0000004 is damaged (file __0_0.distcp "
                                  f"truncated: expected >= {size} bytes, found 100); resuming from iter_0000002, "
                                  "the newest that passes"]
    assert "nothing to train" not in proc.stdout
    assert [r["iteration"] for r in metrics(tmp_path / "runs" / "t")] == [3, 4]
    assert (ckpt / TRACKER).read_text().strip() == "4" and (ckpt / "iter_0000004" / "__0_0.distcp").stat().st_size > 100
    assert _note(tmp_path / "runs" / "t")["job"] == "501"
    # the next start finds it intact: nothing to train, and the note of the fallback is gone
    again = run_stage(_plan(tmp_path, corpus, iterations=4), SLURM_JOB_ID="502")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "is at iteration 4 of 4 (checked structure, sizes and the manifest's SHA-256s): nothing to train" in again.stdout
    assert _ours(again.stderr) == [] and not (tmp_path / "runs" / "t" / "stage-notes" / "train.txt").exists()


def test_the_damaged_directory_is_moved_aside_at_the_fallback(saved: Run, corpus: Path, tmp_path: Path) -> None:
    """Renamed right after the fallback, not when training reaches that iteration again: a job
    that stops earlier (here at 3, the tracker then at 3) leaves iter_0000004 newer than the
    tracker, and the next job's save of 4 took it for an unfinished save and deleted it."""
    ckpt = _copy(saved, tmp_path)
    shard = ckpt / "iter_0000004" / "__0_0.distcp"
    _truncate(shard, 100)
    first = run_stage(_plan(tmp_path, corpus, iterations=6), LINGJUN_TRAIN_STOP_AT="3", SLURM_JOB_ID="601")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert (ckpt / TRACKER).read_text().strip() == "3"
    aside = [p for p in ckpt.iterdir() if p.name.startswith("iter_0000004.damaged-")]
    assert len(aside) == 1 and not (ckpt / "iter_0000004").exists()
    assert "moved the damaged" in first.stdout + first.stderr
    second = run_stage(_plan(tmp_path, corpus, iterations=6), SLURM_JOB_ID="602")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    _no_traceback(second)
    assert _ours(second.stderr) == []  # a clean resume from 3
    assert (aside[0] / "__0_0.distcp").stat().st_size == 100  # still there, never deleted
    assert (ckpt / TRACKER).read_text().strip() == "6"
    assert not (tmp_path / "runs" / "t" / "stage-notes" / "train.txt").exists()  # a clean start clears it


def test_missing_torch_metadata_is_damage(saved: Run, tmp_path: Path) -> None:
    from lingjun_slurm.injob.train import resume

    ckpt = _copy(saved, tmp_path)
    assert resume.check(str(ckpt), 4) == []
    (ckpt / "iter_0000004" / ".metadata").unlink()
    assert resume.check(str(ckpt), 4) == [".metadata (the torch_dist metadata) is missing"]
    assert resume.candidates(str(ckpt), 4) == [4, 2]


def test_an_unreadable_shard_is_damage_not_a_crash(saved: Run, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """EIO/EACCES on a shard (a failing disk, a stale NFS handle; root, which runs CI, reads
    through any mode bits, so the error is injected at stat): a problem the resume falls back
    on, where only a missing file was one before and anything else ended the job."""
    from lingjun_slurm.injob.train import resume

    ckpt = _copy(saved, tmp_path)
    real_stat = Path.stat

    def stat(self: Path, *args: object, **kwargs: object) -> os.stat_result:
        if self.name == "__0_1.distcp" and self.parent.name == "iter_0000004":
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(self))
        return real_stat(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "stat", stat)
    assert resume.check(str(ckpt), 4) == [
        "cannot stat shard __0_1.distcp referenced by .metadata: Input/output error"]
    assert resume.check(str(ckpt), 2) == []
    full = resume.check(str(ckpt), 4, "full")  # hashing opens the file: the same error, a problem too
    assert full and all("__0_1.distcp" in p and "Input/output error" in p for p in full), full
    # the rename aside on rank 0 alone: an error there is a warning, never an exception
    real_is_dir = Path.is_dir
    monkeypatch.setattr(Path, "is_dir", lambda self: (_ for _ in ()).throw(OSError(errno.EACCES, "Permission denied"))
                        if self.name == "iter_0000004" else real_is_dir(self))
    resume.move_aside(str(ckpt), ["iter_0000004"])
    assert (ckpt / "iter_0000004").exists()


def test_tracker_naming_a_missing_directory_falls_back(saved: Run, corpus: Path, tmp_path: Path) -> None:
    ckpt = _copy(saved, tmp_path)
    (ckpt / TRACKER).write_text("6\n")  # a tracker that ran ahead of the files (a copy that lost iter_0000006)
    proc = run_stage(_plan(tmp_path, corpus, iterations=8))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _no_traceback(proc)
    assert _ours(proc.stderr) == [f"lingjun-slurm: train: checkpoint iter_0000006 is damaged (iter_0000006 does not "
                                  f"exist in {ckpt}); resuming from iter_0000004, the newest that passes"]
    assert [r["iteration"] for r in metrics(tmp_path / "runs" / "t")] == [5, 6, 7, 8]
    assert (ckpt / TRACKER).read_text().strip() == "8"


def test_every_checkpoint_damaged_is_one_line_and_exit_1(saved: Run, corpus: Path, tmp_path: Path) -> None:
    ckpt = _copy(saved, tmp_path)
    (ckpt / "iter_0000004" / ".metadata").unlink()
    shard = ckpt / "iter_0000002" / "__0_1.distcp"
    size = shard.stat().st_size
    _truncate(shard, 100)
    before = sorted(p.name for p in ckpt.rglob("*"))
    proc = run_stage(_plan(tmp_path, corpus, iterations=6))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    _no_traceback(proc)
    assert _ours(proc.stderr) == [
        f"lingjun-slurm: train: cannot resume from {ckpt}: no checkpoint passes the check (iter_0000004: .metadata "
        f"(the torch_dist metadata) is missing; iter_0000002: file __0_1.distcp truncated: expected >= {size} bytes, "
        "found 100); the damaged directories were left as they are"]
    assert sorted(p.name for p in ckpt.rglob("*")) == before and (ckpt / TRACKER).read_text().strip() == "4"


def _bytes_item(iter_dir: Path, prefix: str) -> tuple[str, int, int]:
    """(shard file, offset, length) of the first pickled object under `prefix` that .metadata records."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    md = FileSystemReader(str(iter_dir)).read_metadata()
    for index, info in md.storage_data.items():
        if index.fqn.startswith(prefix) and isinstance(md.state_dict_metadata[index.fqn], BytesStorageMetadata):
            return info.relative_path, info.offset, info.length
    raise AssertionError(f"no object {prefix}* in {iter_dir}")


def test_a_load_that_fails_to_read_falls_back(saved: Run, corpus: Path, tmp_path: Path) -> None:
    """Same sizes (the cheap check passes), a damaged pickle inside a shard: torch's reader fails in
    the load itself, and the resume goes on to the older checkpoint."""
    from lingjun_slurm.injob.train import resume

    ckpt = _copy(saved, tmp_path)
    rel, offset, length = _bytes_item(ckpt / "iter_0000004", "rng_state")
    _overwrite(ckpt / "iter_0000004" / rel, offset, length)
    assert resume.check(str(ckpt), 4, "cheap") == []
    # The hash check (the default) would see it first: the cheap check lets the load itself meet it.
    proc = run_stage(_plan(tmp_path, corpus, iterations=6), LINGJUN_VERIFY_CHECKPOINT="cheap")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _no_traceback(proc)
    [line] = _ours(proc.stderr)
    assert line.startswith("lingjun-slurm: train: checkpoint iter_0000004 is damaged (the load failed: ")
    assert line.endswith("); resuming from iter_0000002, the newest that passes")
    assert [r["iteration"] for r in metrics(tmp_path / "runs" / "t")] == [3, 4, 5, 6]


def test_full_verification_catches_a_same_size_corruption(saved: Run, corpus: Path, tmp_path: Path) -> None:
    from lingjun_slurm.injob.checkpoint import manifest as mf
    from lingjun_slurm.injob.train import resume

    ckpt = _copy(saved, tmp_path)
    mf.write(ckpt / "iter_0000004", 4)  # as `lingjun-slurm checkpoint verify --write-manifest` does
    shard = ckpt / "iter_0000004" / "__0_0.distcp"
    _overwrite(shard, shard.stat().st_size // 2, 64, invert=True)  # inside tensor bytes: nothing but a hash sees it
    assert resume.check(str(ckpt), 4) == []
    full = resume.check(str(ckpt), 4, "full")
    assert len(full) == 1 and full[0].startswith("hash mismatch in __0_0.distcp"), full
    proc = run_stage(_plan(tmp_path, corpus, iterations=6), LINGJUN_VERIFY_CHECKPOINT="full")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _no_traceback(proc)
    [line] = _ours(proc.stderr)
    assert line.startswith("lingjun-slurm: train: checkpoint iter_0000004 is damaged (hash mismatch in __0_0.distcp")
    assert line.endswith("resuming from iter_0000002, the newest that passes")


def test_a_bad_verify_mode_is_one_line(saved: Run, corpus: Path, tmp_path: Path) -> None:
    _copy(saved, tmp_path)
    proc = run_stage(_plan(tmp_path, corpus), LINGJUN_VERIFY_CHECKPOINT="hashes")
    assert proc.returncode == 1
    _no_traceback(proc)
    assert _ours(proc.stderr) == ["lingjun-slurm: train: LINGJUN_VERIFY_CHECKPOINT='hashes' is not one of: "
                                  "hash, full, cheap, off"]


def _unshare_works(tmp: Path) -> bool:
    probe = tmp / "probe"
    probe.mkdir()
    r = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(probe))}"],
                       capture_output=True)
    return r.returncode == 0


def test_full_disk_during_save_is_one_line(saved: Run, corpus: Path, tmp_path: Path) -> None:
    """Resume from iter_0000002 on a tmpfs with 400 kB left: the save of iteration 4 (1.9 MB) hits
    ENOSPC. One line naming the mount, exit 1, the tracker still at 2."""
    if shutil.which("unshare") is None or not _unshare_works(tmp_path):
        pytest.skip("needs `unshare -rm` and tmpfs mounts in a user namespace")
    mnt, after = tmp_path / "mnt", tmp_path / "after"
    mnt.mkdir()
    ckpt = mnt / "ckpt"
    plan = write_plan(tmp_path, make_plan(tmp_path, corpus, **PLAN_ARGS, ckpt_dir=ckpt))
    q = {k: shlex.quote(str(v)) for k, v in dict(mnt=mnt, ckpt=ckpt, after=after, src=saved.ckpt / "iter_0000002",
                                                 tracker=ckpt / TRACKER).items()}
    script = f"""set -u
mount -t tmpfs -o size=8m tmpfs {q['mnt']}
mkdir {q['ckpt']} && cp -a {q['src']} {q['ckpt']}/ && echo 2 > {q['tracker']}
free=$(df -B1 --output=avail {q['mnt']} | tail -1)
dd if=/dev/zero of={q['mnt']}/filler bs=4096 count=$(( (free - 400000) / 4096 )) status=none
{' '.join(map(shlex.quote, stage_command(plan)))}; rc=$?
cp -a {q['ckpt']} {q['after']}
exit $rc"""
    proc = subprocess.run(["unshare", "-rm", "bash", "-c", script], capture_output=True, text=True, timeout=300,
                          env=launch_env(1), cwd=str(REPO))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    _no_traceback(proc)
    assert _ours(proc.stderr) == [f"lingjun-slurm: train: no space left on {mnt} writing checkpoint "
                                  f"{ckpt / 'iter_0000004'} (iteration 4)"]
    assert (after / TRACKER).read_text().strip() == "2"  # the half-written iter_0000004 is not named
    assert (after / "iter_0000004").is_dir() and not (after / "iter_0000004" / "metadata.json").exists()
    assert not [p for p in (after / "iter_0000004").iterdir() if p.name.startswith(".lingjun-space-probe")]


def test_no_space_names_the_quota(tmp_path: Path) -> None:
    """EDQUOT cannot be produced here (no quota-enabled filesystem): the errno the kernel gives
    for it is mapped to "disk quota exceeded on <mount>"."""
    from lingjun_slurm.common.diskspace import mount_point
    from lingjun_slurm.injob.train.ckpt import _no_space

    path = str(tmp_path / "iter_0000004")
    os.mkdir(path)
    err = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), path + "/__0_0.distcp")
    try:
        raise RuntimeError("worker failed") from err
    except RuntimeError as exc:
        assert _no_space(path, exc) == f"disk quota exceeded on {mount_point(path)}"
    assert _no_space(path, RuntimeError("unrelated")) is None  # this filesystem has room: not a full disk
    assert json.dumps(os.listdir(path)) == "[]"  # the space probe leaves nothing behind


def test_dp2_ranks_agree_on_the_fallback(dp2_run: Run, corpus: Path, tmp_path: Path) -> None:
    """2 processes (the local launcher), distributed optimizer: rank 0 checks, both ranks resume
    from the same older checkpoint. Reuses the session's DP=2 run (saves at 20 and 40)."""
    from .conftest import LONG

    ckpt = _copy(dp2_run, tmp_path)
    shard = ckpt / "iter_0000040" / "__1_0.distcp"
    size = shard.stat().st_size
    _truncate(shard, 10)
    plan = make_plan(tmp_path, corpus, distributed_optimizer=True, **{**LONG, "iterations": 41})
    proc = run_stage(write_plan(tmp_path, plan), ntasks=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _no_traceback(proc)
    assert _ours(proc.stderr) == [f"lingjun-slurm: train: checkpoint iter_0000040 is damaged (file __1_0.distcp "
                                  f"truncated: expected >= {size} bytes, found 10); resuming from iter_0000020, "
                                  "the newest that passes"]
    assert metrics(tmp_path / "runs" / "t")[0]["iteration"] == 21
    assert (ckpt / TRACKER).read_text().strip() == "41"


def test_dp2_finished_run_exits_0_on_every_rank(dp2_run: Run, corpus: Path, tmp_path: Path) -> None:
    """2 processes, the tracker at the last iteration: rank 0 reads and checks, the other rank
    waits for its answer, and both exit 0 without building a model (the launcher returns the first
    non-zero exit of any task)."""
    from .conftest import LONG

    _copy(dp2_run, tmp_path)
    plan = make_plan(tmp_path, corpus, distributed_optimizer=True, **{**LONG, "iterations": 40})
    proc = run_stage(write_plan(tmp_path, plan), ntasks=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _no_traceback(proc)
    assert "is at iteration 40 of 40 (checked structure, sizes and the manifest's SHA-256s): nothing to train" in proc.stdout
    assert "datasets:" not in proc.stdout
