"""The SHA-256 manifest of one iteration directory: `iter_NNNNNNN/lingjun-manifest.json`.

Each file also carries its XXH3-128 (`xxh3_128`, the python-xxhash package, Cyan4973's xxHash
0.8) when the writer had xxhash: the trainer's check before every resume compares that one,
because SHA-256 runs at about 1.2 GiB/s a core here (sha_ni) and XXH3 at 10-15: hashing a
checkpoint with SHA-256 cost 0.9x the load itself in bench/ckpt_hash.py, XXH3 a few percent.
XXH3-128 finds corruption (torn writes, flipped bytes, a file from elsewhere); it is not a
defence against someone who rewrites the manifest too, and neither is SHA-256 beside the files.
`checkpoint verify` and `checkpoint copy` keep to SHA-256. The field is optional: a manifest
without it (older lingjun-slurm, no xxhash in the image) is checked with SHA-256.

It lives inside the iteration directory so that it moves, copies and is deleted together
with the checkpoint, and its name cannot collide with Megatron's own files (`.metadata`,
`metadata.json`, `common.pt`, `__R_N.distcp`). Files are hashed streaming (8 MiB reads),
several files at a time on threads (hashlib releases the GIL), because a torch_dist
checkpoint has at least one shard file per rank and writer thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterable

from lingjun_slurm import __version__
from .layout import MANIFEST, OWN_FILES, atomic_write

SCHEMA = "lingjun-slurm/checkpoint-manifest"
VERSION = 1
CHUNK = 8 << 20


FAST = "xxh3_128"  # the manifest's field of the fast hash (python-xxhash xxh3_128().hexdigest())


@dataclass(frozen=True)
class FileHash:
    size: int
    sha256: str
    xxh3_128: str | None = None  # with xxhash importable when it was written


_XXHASH: list = []  # [module or None], once per process
_XXHASH_LOCK = threading.Lock()


def xxhash_module():  # type: ignore[no-untyped-def]
    """python-xxhash with xxh3_128 (python-xxhash >= 2.0), or None where the image lacks it or has
    an older one: the check then falls back to SHA-256. Imported once, under a lock: the hashing
    threads ask at the same time."""
    with _XXHASH_LOCK:
        if not _XXHASH:
            try:
                import xxhash
            except ImportError:
                xxhash = None
            _XXHASH.append(xxhash if xxhash is not None and hasattr(xxhash, "xxh3_128") else None)
        return _XXHASH[0]


def default_workers() -> int:
    """CPUs this process may use (a Slurm job's cgroup/affinity, not the node's count), at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


def checkpoint_files(iter_dir: Path) -> list[str]:
    """Relative POSIX paths of every file of the checkpoint (ours and temporary files left out)."""
    out = []
    for root, dirs, names in os.walk(iter_dir):
        dirs.sort()
        rel_root = Path(root).relative_to(iter_dir)
        for name in sorted(names):
            rel = (rel_root / name).as_posix()
            if rel in OWN_FILES or (name.startswith(".") and name.endswith(".tmp")):
                continue
            out.append(rel)
    return sorted(out)


def sha256_stream(fh: IO[bytes], fast: bool = False) -> FileHash:
    """SHA-256 (and, with fast and xxhash importable, XXH3-128 in the same pass) of a stream."""
    digest = hashlib.sha256()
    xx = xxhash_module() if fast else None
    quick = xx.xxh3_128() if xx is not None else None
    size = 0
    while True:
        block = fh.read(CHUNK)
        if not block:
            break
        size += len(block)
        digest.update(block)
        if quick is not None:
            quick.update(block)
    return FileHash(size, digest.hexdigest(), quick.hexdigest() if quick is not None else None)


def xxh3_stream(path: Path) -> tuple[int, str]:
    """(size, XXH3-128 hex) of a local file read in CHUNK blocks into one buffer: a read error is an
    OSError here (train/xxh3sum.py's mmap, faster, turns it into SIGBUS). Raises OSError, and
    ImportError without python-xxhash >= 2.0."""
    xxhash = xxhash_module()
    if xxhash is None:
        raise ImportError("python-xxhash >= 2.0 is not installed")
    digest = xxhash.xxh3_128()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    size = 0
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            size += n
            digest.update(view[:n])
    return size, digest.hexdigest()


Opener = Callable[[str], IO[bytes]]


def hash_files(rels: Iterable[str], opener: Opener, workers: int | None = None,
               fast: bool = False) -> dict[str, FileHash]:
    """Hash files in parallel; opener(rel) returns a binary file object (local file, fsspec file, ...).
    fast: XXH3-128 too, in the same pass, where xxhash is importable (for a manifest being written)."""
    rels = list(rels)

    def one(rel: str) -> FileHash:
        with opener(rel) as fh:
            return sha256_stream(fh, fast)

    with ThreadPoolExecutor(max_workers=min(len(rels), workers or default_workers()) or 1) as pool:
        return dict(zip(rels, pool.map(one, rels)))


def local_opener(root: Path) -> Opener:
    return lambda rel: open(root / rel, "rb")


def build(iteration: int | str, hashes: dict[str, FileHash], fmt: str = "torch_dist") -> dict:
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "iteration": iteration,
        "format": fmt,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tool": f"lingjun-slurm {__version__}",
        "hash": "sha256",
        "total_bytes": sum(h.size for h in hashes.values()),
        "files": [{"path": rel, "size": h.size, "sha256": h.sha256, **({FAST: h.xxh3_128} if h.xxh3_128 else {})}
                  for rel, h in sorted(hashes.items())],
    }


def dumps(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=1) + "\n").encode()


def write(iter_dir: Path, iteration: int | str, workers: int | None = None) -> dict:
    """Hash every file of the checkpoint and write the manifest atomically."""
    hashes = hash_files(checkpoint_files(iter_dir), local_opener(iter_dir), workers, fast=True)
    manifest = build(iteration, hashes)
    atomic_write(iter_dir / MANIFEST, dumps(manifest))
    return manifest


def parse(data: bytes, where: str, iteration: int | str | None = None) -> tuple[dict | None, list[str]]:
    """(manifest, problems): the manifest is None when it cannot be used at all."""
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        return None, [f"{where} is not valid JSON ({exc})"]
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        return None, [f"{where} is not a lingjun-slurm checkpoint manifest"]
    if not isinstance(manifest.get("version"), int) or manifest["version"] > VERSION:
        return None, [f"{where} has version {manifest.get('version')!r}; this lingjun-slurm reads "
                      f"version {VERSION}: upgrade lingjun-slurm"]
    files = manifest.get("files")
    if not isinstance(files, list) or not all(
            isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("size"), int)
            and isinstance(f.get("sha256"), str) and isinstance(f.get(FAST, ""), str) for f in files):
        return None, [f"{where}: 'files' must be a list of {{path, size, sha256[, {FAST}]}}"]
    problems = []
    if iteration is not None and manifest.get("iteration") != iteration:
        problems.append(f"{where} is for iteration {manifest.get('iteration')!r}, not {iteration}")
    return manifest, problems


def read(iter_dir: Path, iteration: int | str | None = None) -> tuple[dict | None, list[str]]:
    """(None, []) when there is no manifest."""
    path = iter_dir / MANIFEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, []
    except OSError as exc:
        return None, [f"cannot read {MANIFEST}: {exc.strerror or exc}"]
    return parse(data, MANIFEST, iteration)


def expected(manifest: dict) -> dict[str, FileHash]:
    return {f["path"]: FileHash(f["size"], f["sha256"], f.get(FAST) or None) for f in manifest["files"]}


def split(files: dict[str, int], parts: int) -> list[list[str]]:
    """Deal files (relative path -> size) to `parts` ranks, each file to exactly one, balanced by
    bytes: largest first, each to the part with the fewest bytes so far (ties: the lower part).
    Deterministic: every rank computes the same split from the same manifest, without talking."""
    load = [0] * max(1, parts)
    out: list[list[str]] = [[] for _ in load]
    for rel, size in sorted(files.items(), key=lambda kv: (-kv[1], kv[0])):
        i = min(range(len(load)), key=lambda k: (load[k], k))
        out[i].append(rel)
        load[i] += size
    return [sorted(p) for p in out]


def mismatch(rel: str, got: str, want: str, algorithm: str = "sha256") -> str:
    """The problem line of a file whose hash differs from the manifest's (verify's and the trainer's)."""
    return (f"hash mismatch in {rel}: {algorithm} {got[:16]}..., {MANIFEST} says {want[:16]}... "
            "(the file changed after it was verified)")


def check(manifest: dict, sizes: dict[str, int | None], opener: Opener,
          workers: int | None = None) -> tuple[list[str], int]:
    """Compare files with the manifest: sizes first (cheap), then hashes of the files whose size matched.

    sizes maps every listed path to its size, or None when it is missing. Returns
    (problems, bytes hashed).
    """
    want = expected(manifest)
    problems, to_hash = [], []
    for rel, exp in sorted(want.items()):
        size = sizes.get(rel)
        if size is None:
            problems.append(f"missing file {rel} listed in {MANIFEST}")
        elif size != exp.size:
            problems.append(f"file {rel} has {size} bytes; {MANIFEST} says {exp.size}")
        else:
            to_hash.append(rel)
    got = hash_files(to_hash, opener, workers) if to_hash else {}
    for rel in to_hash:
        if got[rel].sha256 != want[rel].sha256:
            problems.append(mismatch(rel, got[rel].sha256, want[rel].sha256))
    return problems, sum(h.size for h in got.values())
