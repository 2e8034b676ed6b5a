"""Transport (local), run index and manifest: atomic writes, locks, follow, typed errors."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest

from lingjun_slurm.common.errors import CommandError, RunNotFound, TransportError
from lingjun_slurm.runs.index import RunIndex, entry_for
from lingjun_slurm.runs.logs import array_indices, resolve_pattern
from lingjun_slurm.transport import LocalTransport


def test_run_records_history_and_raises_typed_errors() -> None:
    t = LocalTransport()
    ok = t.run(["sh", "-c", "echo out; echo err >&2"])
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "out\n", "err\n")
    with pytest.raises(CommandError) as info:
        t.run(["sh", "-c", "echo 'sbatch: error: invalid partition' >&2; exit 1"], check=True, what="sbatch failed")
    err = info.value
    assert err.returncode == 1 and "invalid partition" in err.stderr
    assert "sbatch failed (exit 1)" in str(err) and "command: sh -c" in str(err)
    missing = t.run(["no-such-program-xyz"])
    assert missing.returncode == 127 and "not found" in missing.stderr
    assert [argv[0] for argv in t.history] == ["sh", "sh", "no-such-program-xyz"]


def test_run_never_uses_a_shell(tmp_path: Path) -> None:
    t = LocalTransport()
    evil = f"$(touch {tmp_path}/pwned); `touch {tmp_path}/pwned2`"
    assert t.run(["echo", evil]).stdout.strip() == evil
    assert not list(tmp_path.iterdir())


def test_write_atomic_and_files(tmp_path: Path) -> None:
    t = LocalTransport()
    target = str(tmp_path / "d" / "f.txt")
    t.mkdir(str(tmp_path / "d"))
    t.write_atomic(target, "one", 0o600)
    t.write_atomic(target, b"two")
    assert t.read_text(target) == "two" and (os.stat(target).st_mode & 0o777) == 0o644
    assert t.listdir(str(tmp_path / "d")) == ["f.txt"]  # no temp files left behind
    assert t.listdir(str(tmp_path / "missing")) == []
    with pytest.raises(FileNotFoundError):
        t.read_text(str(tmp_path / "missing"))
    with pytest.raises(TransportError):
        t.write_atomic(str(tmp_path / "nodir" / "x"), "x")
    local = tmp_path / "copy.txt"
    t.get(target, local)
    t.put(local, str(tmp_path / "d" / "back.txt"))
    assert (tmp_path / "d" / "back.txt").read_text() == "two"


def _hold_lock(path: str, seconds: float, out: "multiprocessing.Queue[float]") -> None:
    with LocalTransport().lock(path):
        out.put(time.monotonic())
        time.sleep(seconds)
        out.put(time.monotonic())


def test_lock_is_exclusive_across_processes(tmp_path: Path) -> None:
    q: "multiprocessing.Queue[float]" = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_hold_lock, args=(str(tmp_path / "l"), 0.2, q)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    a_in, a_out, b_in, b_out = (q.get() for _ in range(4))
    assert b_in >= a_out  # the second holder entered only after the first left
    with pytest.raises(TransportError, match="timed out"):
        with LocalTransport().lock(str(tmp_path / "l2")):
            with LocalTransport().lock(str(tmp_path / "l2"), timeout=0.1):
                pass


def test_follow_streams_a_growing_file_until_done(tmp_path: Path) -> None:
    path = tmp_path / "log"
    finished = threading.Event()

    def writer() -> None:
        for i in range(5):
            with open(path, "a") as fh:
                fh.write(f"line {i}\n")
            time.sleep(0.05)
        finished.set()

    threading.Thread(target=writer).start()
    got = b"".join(LocalTransport().follow(str(path), poll_s=0.02, done=finished.is_set))
    assert got.decode().splitlines() == [f"line {i}" for i in range(5)]


def _add(args: tuple[str, int]) -> None:
    directory, i = args
    RunIndex(Path(directory)).add(entry_for(f"run-{i:02d}", "r", time.time(), "slurm", "local", "h", f"/w/{i}", "s"))


def test_index_twenty_concurrent_adds_lose_nothing(tmp_path: Path) -> None:
    with multiprocessing.Pool(20) as pool:
        pool.map(_add, [(str(tmp_path), i) for i in range(20)])
    index = RunIndex(tmp_path)
    assert sorted(e.run_id for e in index.entries()) == [f"run-{i:02d}" for i in range(20)]
    data = json.loads((tmp_path / "runs.json").read_text())
    assert data["schema"] == 1


def test_index_resolves_ids_prefixes_and_directories(tmp_path: Path) -> None:
    index = RunIndex(tmp_path)
    now = time.time()  # one second apart: three time.time() calls in a row may round to one value
    for i, rid in enumerate(("tiny-20261129-1", "tiny-20261129-2", "other-1")):
        index.add(entry_for(rid, "tiny", now + i, "local", "local", "h", f"/w/{rid}", "s"))
    assert index.resolve("other").run_id == "other-1"
    assert index.resolve("tiny-20261129-2").run_id == "tiny-20261129-2"
    assert index.resolve("tiny").run_id == "other-1"  # a name: the newest run with it
    with pytest.raises(RunNotFound, match="matches 2 runs"):
        index.resolve("tiny-2026")  # an ambiguous prefix is still refused
    with pytest.raises(RunNotFound, match="no run matches"):
        index.resolve("nope")
    with pytest.raises(RunNotFound, match="no run directory"):
        index.resolve(str(tmp_path / "not-a-run"))


def test_corrupt_index_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "runs.json").write_text("{not json")
    with pytest.raises(TransportError, match="unreadable run index"):
        RunIndex(tmp_path).entries()


def test_log_patterns_resolve_like_sbatch() -> None:
    assert resolve_pattern("/l/%x-%j.out", "r-train", "12", None, "/run") == "/l/r-train-12.out"
    assert resolve_pattern("%x-%A_%a.out", "r-pre", "7", 3, "/run") == "/run/r-pre-7_3.out"
    assert resolve_pattern("/l/100%%-%j", "n", "5", None, "/") == "/l/100%-5"
    assert array_indices("0-3") == [0, 1, 2, 3]
    assert array_indices("1,4,7-9%2") == [1, 4, 7, 8, 9]
    assert array_indices("0-10:5") == [0, 5, 10]
