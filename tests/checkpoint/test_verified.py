"""`checkpoint list` says "verified" only after a hash check, with its time, and only while no file
changed since (issue 26 item 1: a checkpoint with 400 flipped bytes was listed as "verified" because
its manifest sat beside it). Real torch_dist checkpoints (conftest.py), the CLI in-process."""

from __future__ import annotations

import json
import os
from pathlib import Path

from click.testing import CliRunner

from lingjun_slurm.injob.checkpoint.layout import VERIFIED, check_of, write_verified
from lingjun_slurm.cli.checkpoint import checkpoint

from .helpers import flip_byte, truncate


def _invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(checkpoint, [str(a) for a in args])
    return result.exit_code, result.output


def _listed(ckpt: Path) -> dict[str, tuple[str, str, str | None]]:
    code, out = _invoke("list", ckpt, "--json")
    assert code == 0, out
    return {i["name"]: (i["state"], i["check"], i["verified_at"]) for i in json.loads(out)["iterations"]}


def test_verified_only_after_a_hash_check_and_until_a_byte_changes(ckpt: Path) -> None:
    it30 = ckpt / "iter_0000030"
    assert _invoke("verify", ckpt, "--write-manifest")[0] == 0
    # a manifest just written from the files is no check of them: the sizes are all that is known
    assert _listed(ckpt)["iter_0000030"] == ("complete", "sizes ok, not hash-checked", None)
    assert not (it30 / VERIFIED).exists()
    code, out = _invoke("verify", ckpt)  # hashes every file against the manifest: a check that passed
    assert code == 0 and "hashes match the manifest" in out
    state, check, when = _listed(ckpt)["iter_0000030"]
    record = json.loads((it30 / VERIFIED).read_text())
    assert (state, check, when) == ("verified", f"sha256 ok {record['time']}", record["time"])
    assert record["ok"] is True and record["by"] == "lingjun-slurm checkpoint verify" and record["iteration"] == 30
    code, out = _invoke("list", ckpt)
    row = next(line for line in out.splitlines() if line.split()[0] == "iter_0000030")
    assert row.split()[1:4] == ["verified", "sha256", "ok"] and record["time"] in row
    # one byte flipped, same size: list no longer says verified (it hashes nothing; the file changed)
    shard = it30 / "__0_0.distcp"
    flip_byte(shard)
    assert _listed(ckpt)["iter_0000030"] == ("complete", "sizes ok, changed after its sha256 check", None)
    # the check that finds it is recorded too
    code, _ = _invoke("verify", ckpt)
    assert code == 1
    state, check, when = _listed(ckpt)["iter_0000030"]
    assert state == "damaged" and check.startswith("check FAILED ") and when is None
    assert json.loads((it30 / VERIFIED).read_text())["problems"][0].startswith("hash mismatch in __0_0.distcp")
    # a size that differs from the manifest's needs no record
    truncate(shard, 100)
    assert _listed(ckpt)["iter_0000030"][:2] == ("damaged", "sizes differ from manifest")


def test_a_change_that_keeps_the_mtime_still_ends_verified(ckpt: Path) -> None:
    """`touch -r` (or a copy that keeps times) restores the mtime; the ctime it cannot."""
    it20 = ckpt / "iter_0000020"
    assert _invoke("verify", ckpt, "--iteration", "20", "--write-manifest")[0] == 0
    assert _invoke("verify", ckpt, "--iteration", "20")[0] == 0
    assert _listed(ckpt)["iter_0000020"][0] == "verified"
    shard = it20 / "__0_1.distcp"
    st = shard.stat()
    flip_byte(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert shard.stat().st_mtime_ns == st.st_mtime_ns
    assert _listed(ckpt)["iter_0000020"][0] == "complete"


def test_a_record_for_another_iteration_or_unreadable_is_ignored(ckpt: Path) -> None:
    it10 = ckpt / "iter_0000010"
    assert _invoke("verify", ckpt, "--iteration", "10", "--write-manifest")[0] == 0
    write_verified(it10, 20, True, [], "test")  # copied in from iteration 20
    assert check_of(it10, 10).verdict == "sizes-ok"
    (it10 / VERIFIED).write_text("{not json")
    assert check_of(it10, 10).verdict == "sizes-ok"
    write_verified(it10, 10, True, [], "test")
    assert check_of(it10, 10).verdict == "verified"
    # the record is the tool's own file: not hashed, not in a manifest, not copied
    from lingjun_slurm.injob.checkpoint.manifest import checkpoint_files

    assert VERIFIED not in checkpoint_files(it10)
