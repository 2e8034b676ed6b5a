"""common/jsonobj.json_object and common/atomicfile.atomic_write's options (the helpers the
watchdog, the straggler check, the ledger and the Prometheus textfile writer share)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from lingjun_slurm.common import atomicfile
from lingjun_slurm.common.jsonobj import json_object


@pytest.mark.parametrize("text", [None, "", "   ", "[1]", '"{"', "{", '{"a": 1', "1", "null", "lingjun {\"a\": 1}",
                                  '{"a": 1}\n{"b": 2}'])
def test_anything_but_one_json_object_is_none(text: str | None) -> None:
    assert json_object(text) is None


def test_one_object_with_white_space_around() -> None:
    assert json_object('  {"type": "train", "iteration": 3}\n') == {"type": "train", "iteration": 3}


def test_atomic_write_mode_and_no_fsync_when_not_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(atomicfile.os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    path = tmp_path / "m.prom"
    atomicfile.atomic_write(path, "x 1\n", mode=0o640, durable=False)
    assert path.read_text() == "x 1\n" and stat.S_IMODE(path.stat().st_mode) == 0o640 and synced == []
    atomicfile.atomic_write(path, b"x 2\n")
    assert path.read_bytes() == b"x 2\n" and len(synced) == 2  # the file and its directory
    assert os.listdir(tmp_path) == ["m.prom"]
