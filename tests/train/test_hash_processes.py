"""The hash check's moving parts (train/hashcheck.py): the mmap hasher's own process, and a rank
that stops before its verdict."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lingjun_slurm.injob.checkpoint import manifest as mf
from lingjun_slurm.injob.train import hashcheck

from .helpers import REPO, free_port

pytest.importorskip("xxhash")


def _files(root: Path) -> dict[str, list]:
    root.mkdir()
    (root / "__0_0.distcp").write_bytes(os.urandom(3 << 20))
    (root / "empty.bin").write_bytes(b"")
    hashes = mf.hash_files(["__0_0.distcp", "empty.bin"], mf.local_opener(root), fast=True)
    return {rel: [h.size, h.sha256, h.xxh3_128] for rel, h in hashes.items()}


def test_the_mmap_hasher_agrees_with_the_streamed_hash(tmp_path: Path) -> None:
    files = _files(tmp_path / "ck")
    got, problems = hashcheck.hash_files(tmp_path / "ck", sorted(files), 2, mf.FAST)
    assert problems == [] and {r: [h.size, h.xxh3_128] for r, h in got.items()} == {
        r: [v[0], v[2]] for r, v in files.items()}


def test_a_hasher_killed_by_sigbus_falls_back_to_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """An unreadable page of an mmap is SIGBUS (not an OSError): it ends the child, and the rank
    hashes the same files with read(), which reports a read error as a problem instead of dying."""
    files = _files(tmp_path / "ck")
    crash = tmp_path / "crash.py"
    crash.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGBUS)\n")
    monkeypatch.setattr(hashcheck, "XXH3SUM", crash)
    got, problems = hashcheck.hash_files(tmp_path / "ck", sorted(files), 2, mf.FAST)
    assert problems == [] and got["__0_0.distcp"].xxh3_128 == files["__0_0.distcp"][2]
    assert "ended with signal 7" in caplog.text and "with read() instead" in caplog.text
    missing, problems = hashcheck.hash_files(tmp_path / "ck", ["gone.distcp"], 1, mf.FAST)
    assert missing == {} and problems == ["cannot read gone.distcp: No such file or directory"]


RANK = """
import sys, time
import torch.distributed as dist
from lingjun_slurm.injob.train import hashcheck
from lingjun_slurm.injob.train import TrainError
rank, port, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
class Rt: pass
rt = Rt(); rt.rank, rt.world_size = rank, 2
import json
files = json.loads(open(root + ".json").read())
pending = hashcheck.start(rt, root, files)
if rank == 1:
    pending.abort("RuntimeError: out of memory while building the model")
    sys.exit(3)
start = time.monotonic()
try:
    pending.result()
except TrainError as exc:
    print(f"stopped after {time.monotonic() - start:.1f} s: {exc}", flush=True)
    sys.exit(0)
print("no error", flush=True)
sys.exit(1)
"""


def test_a_rank_that_stops_before_its_verdict_stops_the_others(tmp_path: Path) -> None:
    import json

    files = _files(tmp_path / "ck")
    (tmp_path / "ck.json").write_text(json.dumps(files))
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port, str(tmp_path / "ck")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    started = time.monotonic()
    outs = [p.communicate(timeout=120) for p in procs]
    assert time.monotonic() - started < 60
    assert procs[1].returncode == 3, outs[1]
    assert procs[0].returncode == 0, outs[0]
    assert "the hash check before the resume was abandoned: rank 1 stopped before its share was hashed: " \
           "RuntimeError: out of memory" in outs[0][0], outs[0]
