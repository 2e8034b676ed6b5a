"""The SHA-256 manifest of one iteration directory: `iter_NNNNNNN/lingjun-manifest.json`.

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
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterable

from .. import __version__
from .layout import MANIFEST, OWN_FILES, atomic_write

SCHEMA = "lingjun-slurm/checkpoint-manifest"
VERSION = 1
CHUNK = 8 << 20


@dataclass(frozen=True)
class FileHash:
    size: int
    sha256: str


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


def sha256_stream(fh: IO[bytes]) -> FileHash:
    digest = hashlib.sha256()
    size = 0
    while True:
        block = fh.read(CHUNK)
        if not block:
            break
        size += len(block)
        digest.update(block)
    return FileHash(size, digest.hexdigest())


Opener = Callable[[str], IO[bytes]]


def hash_files(rels: Iterable[str], opener: Opener, workers: int | None = None) -> dict[str, FileHash]:
    """Hash files in parallel; opener(rel) returns a binary file object (local file, fsspec file, ...)."""
    rels = list(rels)

    def one(rel: str) -> FileHash:
        with opener(rel) as fh:
            return sha256_stream(fh)

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
        "files": [{"path": rel, "size": h.size, "sha256": h.sha256} for rel, h in sorted(hashes.items())],
    }


def dumps(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=1) + "\n").encode()


def write(iter_dir: Path, iteration: int | str, workers: int | None = None) -> dict:
    """Hash every file of the checkpoint and write the manifest atomically."""
    hashes = hash_files(checkpoint_files(iter_dir), local_opener(iter_dir), workers)
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
            and isinstance(f.get("sha256"), str) for f in files):
        return None, [f"{where}: 'files' must be a list of {{path, size, sha256}}"]
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
    return {f["path"]: FileHash(f["size"], f["sha256"]) for f in manifest["files"]}


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
            problems.append(f"hash mismatch in {rel}: sha256 {got[rel].sha256[:16]}..., "
                            f"{MANIFEST} says {want[rel].sha256[:16]}... (the file changed after it was verified)")
    return problems, sum(h.size for h in got.values())
