"""verify on real megatron-core torch_dist checkpoints: the good case and each kind of damage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lingjun_slurm.injob.checkpoint import CheckpointDamaged, CheckpointError, CheckpointUsageError, verify
from lingjun_slurm.injob.checkpoint.layout import MANIFEST

from .helpers import TRACKER, flip_byte, truncate

PRESENT = "iterations present: iter_0000010, iter_0000020, iter_0000030"


def damaged(ckpt: Path, **kwargs) -> list[str]:
    with pytest.raises(CheckpointDamaged) as info:
        verify(ckpt, **kwargs)
    assert info.value.exit_code == 1
    return info.value.problems


def test_layout_written_by_megatron_core(megatron_checkpoints: Path) -> None:
    names = sorted(p.name for p in (megatron_checkpoints / "iter_0000030").iterdir())
    assert names == [".metadata", "__0_0.distcp", "__0_1.distcp", "common.pt", "metadata.json"]
    assert (megatron_checkpoints / TRACKER).read_text() == "30"
    config = json.loads((megatron_checkpoints / "iter_0000030" / "metadata.json").read_text())
    assert config["sharded_backend"] == "torch_dist"


def test_good_checkpoint_and_manifest(ckpt: Path) -> None:
    report = verify(ckpt)
    assert (report.name, report.iteration, report.manifest) == ("iter_0000030", 30, "absent")
    assert report.files == 5 and report.shard_files == 2 and report.tensors > 10 and report.objects >= 1
    assert not (ckpt / "iter_0000030" / MANIFEST).exists()

    report = verify(ckpt, write_manifest=True)
    assert report.manifest == "written"
    manifest = json.loads((ckpt / "iter_0000030" / MANIFEST).read_text())
    assert manifest["schema"] == "lingjun-slurm/checkpoint-manifest" and manifest["version"] == 1
    assert manifest["iteration"] == 30 and manifest["tool"].startswith("lingjun-slurm ")
    files = {f["path"]: f for f in manifest["files"]}
    assert sorted(files) == [".metadata", "__0_0.distcp", "__0_1.distcp", "common.pt", "metadata.json"]
    assert files["common.pt"]["size"] == (ckpt / "iter_0000030" / "common.pt").stat().st_size
    assert all(len(f["sha256"]) == 64 for f in files.values())
    assert verify(ckpt, write_manifest=True).manifest == "matched"  # not rewritten
    assert verify(ckpt, iteration=10).name == "iter_0000010"


def test_load_tensors_through_megatron_core(ckpt: Path) -> None:
    import torch.distributed as dist

    report = verify(ckpt, load_tensors=True)
    assert report.tensors_loaded
    assert not dist.is_initialized()  # the temporary 1-rank gloo group is gone


def test_missing_shard(ckpt: Path) -> None:
    (ckpt / "iter_0000030" / "__0_1.distcp").unlink()
    [problem] = damaged(ckpt)
    assert problem.startswith("missing shard __0_1.distcp referenced by .metadata (")


def test_truncated_shard(ckpt: Path) -> None:
    before = truncate(ckpt / "iter_0000030" / "__0_0.distcp", 5000)
    assert damaged(ckpt) == [f"file __0_0.distcp truncated: expected >= {before} bytes, found 5000"]


def test_flipped_byte_is_caught_by_the_manifest(ckpt: Path) -> None:
    shard = ckpt / "iter_0000030" / "__0_0.distcp"
    flip_byte(shard)
    assert verify(ckpt).manifest == "absent"  # raw tensor bytes: only a hash can tell
    flip_byte(shard)  # restore, write the manifest, damage again
    verify(ckpt, write_manifest=True)
    flip_byte(shard)
    [problem] = damaged(ckpt)
    assert problem.startswith("hash mismatch in __0_0.distcp: sha256 ")
    assert problem.endswith("(the file changed after it was verified)")


def test_manifest_size_change_and_missing_file(ckpt: Path) -> None:
    verify(ckpt, write_manifest=True)
    d = ckpt / "iter_0000030"
    with open(d / "__0_1.distcp", "ab") as fh:
        fh.write(b"x")
    size = (d / "__0_1.distcp").stat().st_size
    (d / "metadata.json").unlink()
    problems = damaged(ckpt)
    assert f"file __0_1.distcp has {size} bytes; {MANIFEST} says {size - 1}" in problems
    assert f"missing file metadata.json listed in {MANIFEST}" in problems
    assert "metadata.json is missing: the save did not finish (dist_checkpointing writes it last)" in problems


def test_flipped_byte_in_common_pt_fails_its_crc(ckpt: Path) -> None:
    import struct
    import zipfile

    path = ckpt / "iter_0000030" / "common.pt"
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(next(n for n in zf.namelist() if n.endswith("data.pkl")))
    raw = path.read_bytes()
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    flip_byte(path, info.header_offset + 30 + name_len + extra_len + 2)  # inside the pickle
    problems = damaged(ckpt)
    assert problems == [f"common.pt is damaged: CRC mismatch in archive member {info.filename}"]


def test_tracker_points_at_missing_directory(ckpt: Path) -> None:
    (ckpt / TRACKER).write_text("40")
    assert damaged(ckpt) == [f"tracker points at iter_0000040, which does not exist ({PRESENT})"]


@pytest.mark.parametrize("content", ["garbage\n", "", "-5", "3O"])
def test_invalid_tracker(ckpt: Path, content: str) -> None:
    (ckpt / TRACKER).write_text(content)
    [problem] = damaged(ckpt)
    what = "is empty" if not content else f"holds {content.strip()!r}"
    assert problem == (f"tracker {ckpt / TRACKER} {what}: expected an iteration number or 'release' "
                       f"({PRESENT}; pick one with --iteration N)")


def test_missing_torch_metadata(ckpt: Path) -> None:
    (ckpt / "iter_0000030" / ".metadata").unlink()
    assert damaged(ckpt) == [".metadata (the torch_dist metadata) is missing"]


def test_garbage_torch_metadata(ckpt: Path) -> None:
    (ckpt / "iter_0000030" / ".metadata").write_bytes(b"not a pickle")
    [problem] = damaged(ckpt)
    assert problem.startswith("cannot read .metadata: ")


def test_wrong_backend_and_iteration_mismatch(ckpt: Path) -> None:
    (ckpt / "iter_0000030" / "metadata.json").write_text('{"sharded_backend": "zarr"}')
    assert damaged(ckpt) == ["metadata.json says sharded_backend 'zarr'; expected 'torch_dist'"]
    (ckpt / "iter_0000030" / "metadata.json").write_bytes((ckpt / "iter_0000020" / "metadata.json").read_bytes())
    (ckpt / "iter_0000030" / "common.pt").write_bytes((ckpt / "iter_0000020" / "common.pt").read_bytes())
    assert damaged(ckpt) == ["common.pt says iteration 20, but the directory is iter_0000030"]


def test_no_checkpoint_and_no_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointUsageError, match="does not exist") as info:
        verify(tmp_path / "nope")
    assert info.value.exit_code == 2
    with pytest.raises(CheckpointError, match=f"no checkpoint in {tmp_path}: no {TRACKER} and no iter_"):
        verify(tmp_path)


def test_missing_iteration_and_tracker(ckpt: Path) -> None:
    with pytest.raises(CheckpointError, match=r"iter_0000040 does not exist \(iterations present: iter_0000010"):
        verify(ckpt, iteration=40)
    (ckpt / TRACKER).unlink()
    [problem] = damaged(ckpt)
    assert problem == f"no {TRACKER} in {ckpt} (no checkpoint was completed) ({PRESENT}; pick one with --iteration N)"
    assert verify(ckpt, iteration=20).iteration == 20


def test_release_tracker_and_in_progress_note(ckpt: Path) -> None:
    (ckpt / TRACKER).write_text("20")
    report = verify(ckpt, iteration=30)
    assert report.notes == ["iter_0000030 is newer than the tracker (iter_0000020): a save may still be writing it"]
    (ckpt / "iter_0000030").rename(ckpt / "release")
    (ckpt / TRACKER).write_text("release\n")
    report = verify(ckpt)
    assert (report.name, report.iteration) == ("release", "release")


def test_unusable_manifest(ckpt: Path) -> None:
    (ckpt / "iter_0000030" / MANIFEST).write_text("{not json")
    [problem] = damaged(ckpt)
    assert problem.startswith(f"{MANIFEST} is not valid JSON (")
    verify(ckpt, iteration=20, write_manifest=True)
    (ckpt / "iter_0000030" / MANIFEST).write_bytes((ckpt / "iter_0000020" / MANIFEST).read_bytes())
    problems = damaged(ckpt)
    assert problems[0] == f"{MANIFEST} is for iteration 20, not 30"
    assert any(p.startswith("hash mismatch in __0_0.distcp") for p in problems)


def test_common_pt_with_objects_outside_the_allow_list(ckpt: Path) -> None:
    import datetime

    import torch

    path = ckpt / "iter_0000030" / "common.pt"
    common = torch.load(path, weights_only=True)  # megatron-core's safe globals cover Megatron-LM's args
    assert common["args"].attention_backend.name == "auto"
    torch.save({**common, "saved_at": datetime.datetime(2025, 1, 1)}, path)
    report = verify(ckpt)
    assert report.notes[0].startswith("common.pt holds objects outside torch's weights_only allow-list")
