"""copy/upload: local path, file:// and memory:// through fsspec; hashes of the copy; refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lingjun_slurm.injob.checkpoint import CheckpointDamaged, CheckpointUsageError, copy_checkpoint, verify
from lingjun_slurm.injob.checkpoint.layout import MANIFEST

from .helpers import TRACKER, flip_byte

FILES = [".metadata", "__0_0.distcp", "__0_1.distcp", "common.pt", MANIFEST, "metadata.json"]


def test_copy_to_a_local_path_is_a_valid_checkpoint(ckpt: Path, tmp_path: Path) -> None:
    target = tmp_path / "backup"
    result = copy_checkpoint(ckpt, str(target))
    assert not result.skipped and result.files == 5
    assert sorted(p.name for p in (target / "iter_0000030").iterdir()) == FILES
    assert (target / TRACKER).read_text().strip() == "30"
    assert verify(target).manifest == "matched"  # the copy verifies on its own
    assert (ckpt / "iter_0000030" / MANIFEST).is_file()  # copy wrote the source manifest

    again = copy_checkpoint(ckpt, str(target))
    assert again.skipped and again.tracker == "left at 30 (not older than 30)"
    older = copy_checkpoint(ckpt, str(target), iteration=10)
    assert older.tracker == "left at 30 (not older than 10)"  # never moves the target backwards
    assert (target / TRACKER).read_text().strip() == "30"


def test_copy_to_file_url(ckpt: Path, tmp_path: Path) -> None:
    result = copy_checkpoint(ckpt, f"file://{tmp_path}/remote", iteration=20)
    assert result.target == f"file://{tmp_path}/remote/iter_0000020"
    assert (tmp_path / "remote" / TRACKER).read_text().strip() == "20"
    assert verify(tmp_path / "remote").name == "iter_0000020"


def test_copy_to_memory_url_checks_hashes(ckpt: Path) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    result = copy_checkpoint(ckpt, "memory://bucket/run1")
    assert result.target == "memory://bucket/run1/iter_0000030"
    assert sorted(p.rsplit("/", 1)[1] for p in fs.find("/bucket/run1/iter_0000030")) == FILES
    assert fs.cat_file("/bucket/run1/" + TRACKER) == b"30\n"
    manifest = json.loads(fs.cat_file("/bucket/run1/iter_0000030/" + MANIFEST))
    src = ckpt / "iter_0000030"
    assert {f["path"]: f["size"] for f in manifest["files"]} == {
        p.name: p.stat().st_size for p in src.iterdir() if p.name != MANIFEST}
    # damage the remote copy: the next copy notices and replaces it
    fs.pipe_file("/bucket/run1/iter_0000030/__0_0.distcp", b"x" * manifest["files"][1]["size"])
    assert not copy_checkpoint(ckpt, "memory://bucket/run1").skipped
    assert fs.cat_file("/bucket/run1/iter_0000030/__0_0.distcp") == (src / "__0_0.distcp").read_bytes()
    fs.rm("/bucket", recursive=True)


def test_copy_refuses_a_damaged_source(ckpt: Path, tmp_path: Path) -> None:
    verify(ckpt, write_manifest=True)
    flip_byte(ckpt / "iter_0000030" / "__0_1.distcp")
    with pytest.raises(CheckpointDamaged) as info:
        copy_checkpoint(ckpt, str(tmp_path / "backup"))
    assert info.value.problems[0].startswith("refusing to copy: hash mismatch in __0_1.distcp")
    assert not (tmp_path / "backup" / TRACKER).exists()
    assert not (tmp_path / "backup" / "iter_0000030").exists()


def test_copy_target_errors(ckpt: Path) -> None:
    with pytest.raises(CheckpointUsageError, match="the az:// protocol needs a package .*pip install adlfs") as info:
        copy_checkpoint(ckpt, "az://container/run1")
    assert info.value.exit_code == 2
    with pytest.raises(CheckpointUsageError, match="Protocol not known: nosuch"):
        copy_checkpoint(ckpt, "nosuch://x")
    with pytest.raises(CheckpointUsageError, match="is the checkpoint directory itself"):
        copy_checkpoint(ckpt, str(ckpt))
