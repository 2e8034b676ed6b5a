"""SHA-256 of a checkpoint across the ranks: the manifest at save, the check against it at load.

At save (ckpt.save, after dist_checkpointing.save returned on every rank and before the tracker
moves) each rank hashes the files it wrote itself, and rank 0 writes lingjun-manifest.json from
every rank's hashes, in the format of lingjun_slurm.injob.checkpoint.manifest.build (what `lingjun-slurm
checkpoint verify` reads). Who writes what, in megatron-core 0.16.1 (the version the CPU tests run)
and torch 2.13:

  - __<rank>_<n>.distcp: rank <rank>. torch_dist's writer names each rank's files with the prefix
    "__{rank}_" (megatron/core/dist_checkpointing/strategies/filesystem_async.py
    prepare_decentralized_global_plan :460-473, gen_file :130-134; torch's own
    FileSystemWriter.prepare_global_plan gives plan i, i.e. rank i, the same prefix:
    torch/distributed/checkpoint/filesystem.py), one file per writer thread (thread_count,
    strategies/torch.py :602-624);
  - .metadata: the coordinator, rank 0 (strategies/torch.py async_save `coordinator = 0` :674;
    FileSystemWriter.finish writes it, filesystem.py);
  - common.pt: rank 0 (strategies/common.py save_common :40-43);
  - metadata.json: rank 0, last (serialization.py metadata_finalize_fn :420-430, then a barrier).

So rank r hashes "__r_*.distcp" and rank 0 also every other file; each file is hashed by exactly
the rank that wrote it, while its pages are still in that node's page cache, and no rank depends
on seeing another node's files.

At load (resume.resume) the manifest's files are dealt to the ranks by size (manifest.split: each
file to exactly one rank, so a resharded load, which reads byte ranges of other ranks' files, does
not multiply the reads) and hashed on threads in every rank at once; every rank learns every
problem. The ranks exchange their results through the default process group's store with a wait
of CHECK_WAIT, not in a collective, which gives up after the process group's timeout
(LINGJUN_DIST_TIMEOUT_MIN) while hashing terabytes may take longer (resume.py's docstring).
Every rank always posts its result, an error included, so no rank waits for one that gave up.
"""

from __future__ import annotations

import datetime
import itertools
import json
import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..checkpoint import manifest as mf
from ..checkpoint.layout import MANIFEST, atomic_write
from . import TrainError

log = logging.getLogger(__name__)

CHECK_WAIT = datetime.timedelta(hours=24)
SHARD_RE = re.compile(r"__(\d+)_\d+\.distcp")
_KEYS = itertools.count()  # every rank gathers in the same order: the n-th gather has the same key


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def written_by(rel: str, rank: int, world_size: int) -> bool:
    """Whether `rank` wrote the file `rel` of a torch_dist save (see the module's docstring)."""
    m = SHARD_RE.fullmatch(rel)
    owner = int(m.group(1)) if m and int(m.group(1)) < world_size else 0
    return owner == rank


def gather(rt: Any, value: Any) -> list[Any]:
    """Every rank's JSON `value`, in rank order, on every rank; through the process group's store
    (TCPStore.wait with CHECK_WAIT), as resume.from_rank0. Rank 0 returns only after every rank
    has read everything (with init_method tcp:// its process is the store's server), then deletes
    the keys. The key carries TORCHELASTIC_RESTART_COUNT (a torchrun restart keeps the store)."""
    import torch.distributed as dist

    if rt.world_size == 1 or not dist.is_initialized():
        return [value]
    store = dist.distributed_c10d._get_default_store()
    key = f"lingjun/hash/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{next(_KEYS)}"
    store.set(f"{key}/{rt.rank}", json.dumps(value))
    keys = [f"{key}/{r}" for r in range(rt.world_size)]
    store.wait(keys, CHECK_WAIT)
    out = [json.loads(store.get(k)) for k in keys]
    if store.add(f"{key}/read", 1) == rt.world_size:
        store.set(f"{key}/done", "1")
    if rt.rank == 0:
        from .runtime import dist_timeout

        store.wait([f"{key}/done"], dist_timeout())
        for k in [*keys, f"{key}/read", f"{key}/done"]:
            store.delete_key(k)
    return out


SAVE = "sha256+xxh3_128"  # what the save hashes (both, one pass); the check hashes one of them


def algorithm_for(files: dict[str, list[Any]]) -> str:
    """The hash the check compares: XXH3-128 when the manifest has it for every file and xxhash is
    importable here (manifest.py's docstring: SHA-256 would cost about as much as the load), else
    SHA-256. files: {rel: [size, sha256, xxh3_128 or None]}."""
    fast = bool(files) and all(len(v) > 2 and v[2] for v in files.values())
    return mf.FAST if fast and mf.xxhash_module() is not None else "sha256"


XXH3SUM = Path(__file__).with_name("xxh3sum.py")


def _xxh3_mapped(root: Path, rels: list[str], workers: int, procs: list[Any]) -> dict[str, Any] | None:
    """train/xxh3sum.py's answer ({rel: [size, hex] | problem}), or None when it did not give one
    (killed by SIGBUS on an unreadable page, or anything else): the caller hashes with read()."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, str(XXH3SUM)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    procs.append(proc)
    out, err = proc.communicate(json.dumps({"root": str(root), "rels": rels, "workers": workers}))
    if proc.returncode != 0:
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        log.warning("the mmap hasher (%s) ended with %s%s: hashing %d files with read() instead", XXH3SUM.name, how,
                    f" ({_one_line(err)[-300:]})" if err.strip() else "", len(rels))
        return None
    try:
        got = json.loads(out)
    except ValueError:
        return None
    return got if isinstance(got, dict) and set(got) == set(rels) else None


def post(rt: Any, value: Any) -> None:
    """This rank's part of the next gather, without waiting for the others' (a rank that stops)."""
    import torch.distributed as dist

    if rt.world_size == 1 or not dist.is_initialized():
        return
    store = dist.distributed_c10d._get_default_store()
    key = f"lingjun/hash/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{next(_KEYS)}"
    store.set(f"{key}/{rt.rank}", json.dumps(value))
    store.add(f"{key}/read", 1)


def hash_files(root: Path, rels: list[str], workers: int | None = None,
               algorithm: str = "sha256", procs: list[Any] | None = None) -> tuple[dict[str, mf.FileHash], list[str]]:
    """({rel: FileHash}, problems): files hashed on threads (hashlib and xxhash release the GIL);
    algorithm: "sha256" (8 MiB reads), "xxh3_128" (over mmaps in a process of its own,
    train/xxh3sum.py, whose pid goes into procs; FileHash.sha256 left empty; read() where it did
    not answer) or SAVE (both, one pass). A file that cannot be read is a problem, not an exception."""
    if not rels:
        return {}, []
    n = min(len(rels), workers or mf.default_workers())
    if algorithm == mf.FAST:
        got = _xxh3_mapped(root, rels, n, procs if procs is not None else [])
        if got is not None:
            return ({r: mf.FileHash(int(v[0]), "", str(v[1])) for r, v in got.items() if isinstance(v, list)},
                    [str(v) for v in got.values() if not isinstance(v, list)])

    def one(rel: str) -> mf.FileHash | str:
        try:
            if algorithm == mf.FAST:
                size, digest = mf.xxh3_stream(root / rel)
                return mf.FileHash(size, "", digest)
            with open(root / rel, "rb") as fh:
                return mf.sha256_stream(fh, fast=algorithm == SAVE)
        except OSError as exc:
            return _one_line(f"cannot read {rel}: {exc.strerror or exc}")

    with ThreadPoolExecutor(max_workers=n) as pool:
        results = dict(zip(rels, pool.map(one, rels)))
    return ({r: h for r, h in results.items() if isinstance(h, mf.FileHash)},
            [h for h in results.values() if isinstance(h, str)])


def save_manifest(rt: Any, iter_dir: str, iteration: int) -> tuple[int, int, float]:
    """Every rank: hash the files this rank wrote; rank 0: write lingjun-manifest.json of them all.
    Call after dist_checkpointing.save returned on every rank, before the tracker moves. Returns
    (files, bytes, seconds) of the whole checkpoint; TrainError on every rank when a rank could not
    read a file it wrote; OSError from rank 0's write (ckpt.save names a full disk)."""
    start = time.perf_counter()
    root = Path(iter_dir)
    mine = [rel for rel in mf.checkpoint_files(root) if written_by(rel, rt.rank, rt.world_size)]
    hashes, problems = hash_files(root, mine, algorithm=SAVE)
    posted = {"files": {r: [h.size, h.sha256, h.xxh3_128] for r, h in hashes.items()}, "problems": problems}
    every = gather(rt, posted)
    problems = [f"rank {r}: {p}" for r, got in enumerate(every) for p in got["problems"]]
    if problems:
        raise TrainError(f"cannot hash checkpoint {iter_dir} for its manifest: {'; '.join(problems)}")
    merged = {rel: mf.FileHash(int(size), str(sha), xxh or None)
              for got in every for rel, (size, sha, xxh) in got["files"].items()}
    if rt.rank == 0:
        atomic_write(root / MANIFEST, mf.dumps(mf.build(iteration, merged)))
    return len(merged), sum(h.size for h in merged.values()), time.perf_counter() - start


class Pending:
    """This rank's share of a hash check, running beside the caller (start); result() waits for it
    and combines every rank's verdict. Every rank must call result(), or abort() when it fails
    before it gets there: the others wait for its answer. The hashing runs on a daemon thread (and
    the mmap hasher in a child process), so a rank that fails meanwhile exits without waiting for
    its share to be hashed."""

    def __init__(self, rt: Any, iter_dir: str, files: dict[str, list[Any]], workers: int | None = None) -> None:
        import threading

        self.rt, self.files, self.start = rt, files, time.perf_counter()
        self.algorithm = algorithm_for(files)  # the same on every rank: the same manifest, the same image
        share = mf.split({rel: int(v[0]) for rel, v in files.items()}, rt.world_size)[rt.rank]
        self._procs: list[Any] = []
        self._done: list[Any] = []
        self._finished = False

        def run() -> None:
            try:
                self._done.append(hash_files(Path(iter_dir), share, workers, self.algorithm, self._procs))
            except BaseException as exc:  # reported by result() on every rank
                self._done.append(exc)

        self._thread = threading.Thread(target=run, name="lingjun-hash", daemon=True)
        self._thread.start()

    def result(self) -> tuple[list[str], int, float]:
        """(every rank's problems, sorted; bytes hashed by all ranks; seconds since start), on every
        rank. TrainError on every rank when a rank gave up before its verdict (abort)."""
        self._thread.join()
        self._finished = True
        done = self._done[0] if self._done else RuntimeError("the hashing thread ended without an answer")
        if isinstance(done, BaseException):  # never leave the other ranks waiting for this one's answer
            got, problems = {}, [_one_line(f"hashing failed on rank {self.rt.rank}: {type(done).__name__}: {done}")]
        else:
            got, problems = done
        fast = self.algorithm == mf.FAST
        for rel, h in sorted(got.items()):
            want_size = int(self.files[rel][0])
            want = str(self.files[rel][2] if fast else self.files[rel][1])
            digest = (h.xxh3_128 if fast else h.sha256) or ""
            if h.size != want_size:
                problems.append(f"file {rel} has {h.size} bytes; {MANIFEST} says {want_size}")
            elif digest != want:
                problems.append(mf.mismatch(rel, digest, want, self.algorithm))
        every = gather(self.rt, {"problems": problems, "bytes": sum(h.size for h in got.values())})
        gave_up = [g["aborted"] for g in every if g.get("aborted")]
        if gave_up:
            raise TrainError(f"the hash check before the resume was abandoned: {'; '.join(gave_up)}")
        return (sorted(p for got_r in every for p in got_r["problems"]), sum(int(g["bytes"]) for g in every),
                time.perf_counter() - self.start)

    def abort(self, why: str) -> None:
        """This rank failed before result(): stop its hashing and give the other ranks its answer
        ("aborted", so they stop too instead of waiting CHECK_WAIT for it). Once, and not after result()."""
        if self._finished:
            return
        self._finished = True
        for proc in self._procs:
            try:
                proc.kill()
            except OSError:
                pass
        try:
            post(self.rt, {"problems": [], "bytes": 0,
                           "aborted": _one_line(f"rank {self.rt.rank} stopped before its share was hashed: {why}")})
        except Exception as exc:  # the store may be gone with rank 0: the launcher ends the others
            log.warning("cannot tell the other ranks that this one stopped: %s", exc)


def start(rt: Any, iter_dir: str, files: dict[str, list[Any]], workers: int | None = None) -> Pending:
    """Every rank: begin hashing this rank's share of the manifest's files (files: {rel: [size,
    sha256, xxh3_128 or None]}, the same on every rank; manifest.split deals them) on threads, and
    return at once."""
    return Pending(rt, iter_dir, files, workers)


def check(rt: Any, iter_dir: str, files: dict[str, list[Any]], workers: int | None = None) -> tuple[list[str], int, float]:
    """start(...).result(): hash this rank's share now and combine the verdicts."""
    return start(rt, iter_dir, files, workers).result()
