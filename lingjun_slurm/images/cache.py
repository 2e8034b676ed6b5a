"""The staged-image cache: one squashfs per image digest on shared storage.

    <cache_dir>/sha256-<hex>.sqsh        the image, complete (only ever renamed into place)
    <cache_dir>/sha256-<hex>.json        what it is: image reference, digest, size, times
    <cache_dir>/sha256-<hex>.lock        held while one process imports it (holderlock.py)
    <cache_dir>/.import-<hex>-<host>-<pid>.sqsh   an import in progress (never used)

A concurrent stage of another run waits on the lock instead of importing the same image twice,
then finds the finished file. A partial file is never used: enroot writes its output in place
(src/docker.sh:469-485), so the import goes to a private name and is renamed only after enroot
succeeded and the file starts with the squashfs magic.

A cache someone else can write to would let them swap the squashfs that runs as you: the
directory and every file used must be owned by you or root and not writable by group or others.

Standard library only (the image stage runs on cluster hosts).
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ..common.holderlock import HolderLock, JobAlive, this_host

SQUASHFS_MAGIC = b"hsqs"  # the superblock's s_magic 0x73717368, little-endian (squashfs-tools, squashfs_fs.h)
DIGEST_RE = re.compile(r"^sha256:([0-9a-f]{64})$")
ENTRY_RE = re.compile(r"^sha256-([0-9a-f]{64})\.sqsh$")
PARTIAL_RE = re.compile(r"^\.import-([0-9a-f]{64})-.+\.sqsh$")
LOCK_WAIT_S = 6 * 3600.0  # a large image over a slow link; the holder's job limit ends it sooner


class CacheError(Exception):
    pass


@dataclass(frozen=True)
class Entry:
    digest: str
    path: str
    size: int
    image: str
    created: float
    last_used: float


def _hex(digest: str) -> str:
    match = DIGEST_RE.fullmatch(digest)
    if not match:
        raise CacheError(f"not an image digest: {digest!r}")
    return match.group(1)


def check_owner(path: Path, uid: Optional[int] = None) -> None:
    """Refuse a path someone other than you (or root) owns or may write to."""
    uid = os.getuid() if uid is None else uid
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        raise CacheError(f"{path} is a symbolic link; the image cache uses real files only")
    if st.st_uid not in (uid, 0):
        raise CacheError(f"{path} belongs to uid {st.st_uid}: an image cache must be owned by you or root, "
                         "since its squashfs files run as you (set container.cache_dir to your own directory)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheError(f"{path} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} "
                         f"(mode {stat.S_IMODE(st.st_mode):o}): someone else could replace an image that runs as you")


class ImageCache:
    def __init__(self, root: str | Path, job_alive: Optional[JobAlive] = None) -> None:
        self.root = Path(root)
        self.job_alive = job_alive

    def path_for(self, digest: str) -> Path:
        return self.root / f"sha256-{_hex(digest)}.sqsh"

    def _meta_path(self, digest: str) -> Path:
        return self.root / f"sha256-{_hex(digest)}.json"

    def ensure_root(self) -> None:
        """Create the cache (0700, yours) or check that an existing one is safe to use."""
        if not self.root.exists():
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.root.is_dir():
            raise CacheError(f"{self.root} is not a directory")
        check_owner(self.root)

    def lookup(self, digest: str) -> Optional[Path]:
        """The complete squashfs for this digest, checked, or None."""
        path = self.path_for(digest)
        if not path.exists():
            return None
        check_owner(path)
        with open(path, "rb") as f:
            if f.read(4) != SQUASHFS_MAGIC:
                raise CacheError(f"{path} is not a squashfs image (damaged?): remove it with "
                                 "`lingjun-slurm image prune --digest " + digest + "` and resubmit")
        return path

    def stage(self, image: str, digest: str, importer: Callable[[str], None],
              on_wait: Optional[Callable[[str], None]] = None) -> tuple[Path, bool]:
        """(path, imported): the cached file for digest, importing it once if missing.

        importer(output_path) must write the squashfs to output_path (which does not exist yet).
        """
        self.ensure_root()
        found = self.lookup(digest)
        if found:
            self.touch(digest)
            return found, False
        if not os.access(self.root, os.W_OK):
            raise CacheError(f"{image} ({digest}) is not in {self.root}, and you cannot write there (a shared cache "
                             "of its owner's): ask them to stage it, or set container.cache_dir to your own directory")
        lock = HolderLock(self.root / f"sha256-{_hex(digest)}.lock", purpose=f"importing {image}",
                          job_alive=self.job_alive)
        lock.acquire(timeout=LOCK_WAIT_S, poll_s=5.0,
                     on_wait=(lambda h: on_wait(h.describe() if h else "another process")) if on_wait else None)
        try:
            found = self.lookup(digest)
            if found:  # imported by the holder we waited for
                self.touch(digest)
                return found, False
            partial = self.root / f".import-{_hex(digest)}-{this_host()}-{os.getpid()}.sqsh"
            partial.unlink(missing_ok=True)
            try:
                importer(str(partial))
                with open(partial, "rb") as f:
                    if f.read(4) != SQUASHFS_MAGIC:
                        raise CacheError(f"the import of {image} wrote no squashfs image to {partial}")
                os.chmod(partial, 0o644)
                os.replace(partial, self.path_for(digest))
            finally:
                partial.unlink(missing_ok=True)
            now = time.time()
            self._write_meta(digest, {"image": image, "digest": digest, "size": self.path_for(digest).stat().st_size,
                                      "created": now, "last_used": now})
            return self.path_for(digest), True
        finally:
            lock.release()

    def _read_meta(self, digest: str) -> dict:
        try:
            return json.loads(self._meta_path(digest).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def _write_meta(self, digest: str, meta: dict) -> None:
        path = self._meta_path(digest)
        tmp = path.with_name(f".{path.name}.{this_host()}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)

    def touch(self, digest: str) -> None:
        """Record a use (prune keeps recently used images). Best effort: a shared cache owned by root
        is read-only for its users, and a use it cannot record must not fail the run."""
        meta = self._read_meta(digest)
        meta.update(digest=digest, last_used=time.time())
        try:
            meta.setdefault("size", self.path_for(digest).stat().st_size)
            self._write_meta(digest, meta)
        except OSError:
            pass

    def entries(self) -> list[Entry]:
        if not self.root.is_dir():
            return []
        out = []
        for name in sorted(os.listdir(self.root)):
            match = ENTRY_RE.fullmatch(name)
            if not match:
                continue
            digest = f"sha256:{match.group(1)}"
            path = self.root / name
            meta = self._read_meta(digest)
            st = path.stat()
            # Every stage that runs the image touches the .sqsh (partials/containers.sh.j2): a run in
            # progress keeps it recent even weeks after its image stage.
            out.append(Entry(digest=digest, path=str(path), size=st.st_size, image=str(meta.get("image") or "?"),
                             created=float(meta.get("created") or st.st_mtime),
                             last_used=max(float(meta.get("last_used") or 0), st.st_mtime)))
        return out

    def partials(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [self.root / n for n in sorted(os.listdir(self.root)) if PARTIAL_RE.fullmatch(n)]

    def remove(self, digest: str) -> bool:
        """Remove one image unless an import of it holds the lock. False when it was busy."""
        lock = HolderLock(self.root / f"sha256-{_hex(digest)}.lock", purpose="pruning", job_alive=self.job_alive)
        if not lock.try_acquire():
            return False
        try:
            self.path_for(digest).unlink(missing_ok=True)
            self._meta_path(digest).unlink(missing_ok=True)
        finally:
            lock.release()
        return True
