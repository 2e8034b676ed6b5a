"""Megatron-LM's checkpoint directory layout: the tracker, iteration directories, pins.

    DIR/latest_checkpointed_iteration.txt   the iteration to resume from ("30"), or "release"
    DIR/iter_0000030/                       one torch_dist checkpoint (7 digits, more past 9,999,999)
    DIR/iter_0000030/lingjun-manifest.json  sizes and SHA-256 of every file (written by verify)
    DIR/iter_0000030/.lingjun-pin           retention never deletes a pinned iteration
    DIR/iter_0000030/lingjun-verified.json  the last hash check against the manifest: when, by whom,
                                            its verdict, and each file's size/mtime/ctime then

Nothing here imports torch: list, prune and pin stay fast.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lingjun_slurm.common.atomicfile import atomic_write  # noqa: F401 (re-exported: the checkpoint modules write through it)
from .errors import CheckpointError, CheckpointUsageError

TRACKER = "latest_checkpointed_iteration.txt"
MANIFEST = "lingjun-manifest.json"
PIN = ".lingjun-pin"
VERIFIED = "lingjun-verified.json"
VERIFIED_SCHEMA = "lingjun-slurm/checkpoint-verified"
DELETING = ".lingjun-deleting"  # suffix of a directory that prune is removing
MEGATRON_CONFIG = "metadata.json"  # written last by dist_checkpointing.save
ITER_RE = re.compile(r"iter_(\d{7,})")
# Files of our own that are not part of the checkpoint: never hashed, never copied.
OWN_FILES = frozenset({MANIFEST, PIN, VERIFIED})


def iter_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def parse_iteration(text: str | int) -> int:
    """'30', 30 or 'iter_0000030' -> 30."""
    s = str(text).strip()
    m = ITER_RE.fullmatch(s)
    if m:
        return int(m.group(1))
    if s.isdigit():
        return int(s)
    raise CheckpointUsageError(f"{text!r} is not an iteration (expected a number such as 30 or iter_0000030)")


def check_dir(ckpt_dir: Path | str) -> Path:
    path = Path(ckpt_dir)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise CheckpointUsageError(f"checkpoint directory {path} {what}")
    return path


@dataclass(frozen=True)
class Tracker:
    """What latest_checkpointed_iteration.txt says; problem is None when it is valid."""

    path: Path
    raw: str | None
    iteration: int | None = None
    release: bool = False
    problem: str | None = None

    @property
    def name(self) -> str | None:
        if self.release:
            return "release"
        return None if self.iteration is None else iter_name(self.iteration)


def read_tracker(ckpt_dir: Path) -> Tracker:
    """Read the tracker the way Megatron-LM does (strip, int() or 'release'), with a reason when invalid."""
    path = Path(ckpt_dir) / TRACKER
    try:
        with open(path, "rb") as fh:
            data = fh.read(4097)
    except FileNotFoundError:
        return Tracker(path, None, problem=f"no {TRACKER} in {ckpt_dir} (no checkpoint was completed)")
    except OSError as exc:
        return Tracker(path, None, problem=f"cannot read {path}: {exc.strerror or exc}")
    raw = data.decode("utf-8", errors="replace")
    text = raw.strip()
    if text == "release":
        return Tracker(path, raw, release=True)
    if text.isascii() and text.isdigit() and len(data) <= 4096:
        return Tracker(path, raw, iteration=int(text))
    shown = repr(text[:60]) + ("..." if len(text) > 60 else "")
    what = "is empty" if not text else f"holds {shown}"
    return Tracker(path, raw, problem=f"tracker {path} {what}: expected an iteration number or 'release'")


def write_tracker(ckpt_dir: Path, iteration: int | str) -> None:
    """Atomically point the tracker at an iteration (only after every rank finished saving)."""
    atomic_write(Path(ckpt_dir) / TRACKER, f"{iteration}\n".encode())


def iterations(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """Iteration directories, oldest first."""
    found = []
    with os.scandir(ckpt_dir) as it:
        for entry in it:
            m = ITER_RE.fullmatch(entry.name)
            if m and entry.is_dir(follow_symlinks=False):
                found.append((int(m.group(1)), Path(entry.path)))
    return sorted(found)


def dir_size(path: Path) -> tuple[int, int]:
    """(files, bytes) below path, symlinks not followed."""
    files = size = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            files += 1
            size += st.st_size
    return files, size


def is_pinned(iter_dir: Path) -> bool:
    return (iter_dir / PIN).exists()


def _existing_iter_dir(ckpt_dir: Path, iteration: int) -> Path:
    path = check_dir(ckpt_dir) / iter_name(iteration)
    if not path.is_dir():
        raise CheckpointError(f"{path} does not exist")
    return path


def pin(ckpt_dir: Path, iteration: int, note: str = "") -> Path:
    """Mark an iteration so that retention never deletes it; idempotent."""
    path = _existing_iter_dir(ckpt_dir, iteration) / PIN
    body = {"pinned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "note": note}
    atomic_write(path, (json.dumps(body) + "\n").encode())
    return path


def unpin(ckpt_dir: Path, iteration: int) -> bool:
    """Remove the pin; False when there was none."""
    path = _existing_iter_dir(ckpt_dir, iteration) / PIN
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _stat_entry(iter_dir: Path, rel: str) -> dict | None:
    try:
        st = os.stat(iter_dir / rel)
    except OSError:
        return None
    return {"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def manifest_sizes(iter_dir: Path) -> dict[str, int] | None:
    """{path: size} of the files lingjun-manifest.json lists; None without a usable manifest.
    (manifest.py parses it fully; this is the little that `list` needs, without hashing.)"""
    try:
        data = json.loads((iter_dir / MANIFEST).read_bytes())
        return {str(f["path"]): int(f["size"]) for f in data["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_verified(iter_dir: Path, iteration: int | str, ok: bool, problems: list[str], by: str,
                   algorithm: str = "sha256") -> None:
    """Record a hash check of iter_dir against its manifest (lingjun-verified.json, atomically):
    its verdict, when, by whom, and the size, mtime and ctime of the manifest and of every file it
    lists as they were checked. `list` calls the iteration "verified" only while that record says
    ok and no such file changed since (a write changes mtime and ctime; a copy gets a new ctime).
    Raises OSError."""
    listed = manifest_sizes(iter_dir) or {}
    files = [e for e in (_stat_entry(iter_dir, rel) for rel in [MANIFEST, *sorted(listed)]) if e is not None]
    body = {"schema": VERIFIED_SCHEMA, "version": 1, "iteration": iteration, "time": _utc(), "by": by,
            "hash": algorithm, "ok": bool(ok), "problems": list(problems), "files": files}
    atomic_write(iter_dir / VERIFIED, (json.dumps(body, indent=1) + "\n").encode())


@dataclass(frozen=True)
class Check:
    """What is known about an iteration's bytes without reading them. verdict: verified (a hash
    check passed and nothing changed since), failed (a hash check failed, nothing changed since),
    sizes-ok (a manifest, every listed file at its size, no current hash check), sizes-differ,
    no-manifest."""

    verdict: str
    time: str | None = None  # of the hash check, for verified / failed
    by: str | None = None
    problems: tuple[str, ...] = ()
    changed: bool = False  # a hash check on record, but a file changed after it
    hash: str = "sha256"  # the hash that check compared (sha256, or the trainer's xxh3_128)

    def text(self) -> str:
        if self.verdict == "verified":
            return f"{self.hash} ok {self.time}"
        if self.verdict == "failed":
            return f"check FAILED {self.time}"
        if self.verdict == "sizes-ok":
            return "sizes ok, changed after its sha256 check" if self.changed else "sizes ok, not hash-checked"
        return {"sizes-differ": "sizes differ from manifest", "no-manifest": "no manifest"}.get(self.verdict,
                                                                                            self.verdict)


def check_of(iter_dir: Path, iteration: int | str | None = None) -> Check:
    """The Check of one iteration directory: stat calls and two small JSON files, no hashing."""
    listed = manifest_sizes(iter_dir)
    if listed is None:
        return Check("no-manifest")
    differ = [rel for rel, size in listed.items() if (_stat_entry(iter_dir, rel) or {}).get("size") != size]
    try:
        record = json.loads((iter_dir / VERIFIED).read_bytes())
        usable = (isinstance(record, dict) and record.get("schema") == VERIFIED_SCHEMA
                  and isinstance(record.get("files"), list)
                  and (iteration is None or record.get("iteration") == iteration))
    except (OSError, ValueError):
        record, usable = None, False
    if differ:
        return Check("sizes-differ", problems=tuple(sorted(differ)))
    if not usable:
        return Check("sizes-ok", changed=record is not None)
    assert isinstance(record, dict)
    recorded = {str(e.get("path")): e for e in record["files"] if isinstance(e, dict)}
    current = all(_stat_entry(iter_dir, rel) == recorded.get(rel) for rel in [MANIFEST, *listed]) and \
        set(recorded) == {MANIFEST, *listed}
    if not current:
        return Check("sizes-ok", changed=True)
    return Check("verified" if record.get("ok") is True else "failed", time=str(record.get("time")),
                 by=str(record.get("by")), problems=tuple(str(p) for p in record.get("problems") or ()),
                 hash=str(record.get("hash") or "sha256"))


@dataclass
class IterationInfo:
    """One iteration directory as `list` shows it.

    state: verified (a hash check against the manifest passed, lingjun-verified.json, and no file
    changed since), damaged (a hash check failed, or a file's size differs from the manifest's),
    complete (Megatron's metadata.json present; its hashes not checked, or no manifest),
    incomplete (no metadata.json: a save that died, or a copy in progress), in-progress (newer than
    the tracker: a save may still be writing it; never touched by prune). check: Check.text().
    """

    iteration: int
    name: str
    path: Path
    state: str
    latest: bool
    pinned: bool
    files: int
    size_bytes: int
    check: str = "no manifest"
    verified_at: str | None = None  # when the hash check that makes it "verified" passed

    def to_json(self) -> dict:
        out = asdict(self)
        out["path"] = str(self.path)
        return out


def state_of(iter_dir: Path, iteration: int, tracker: Tracker, check: Check | None = None) -> str:
    if tracker.iteration is not None and iteration > tracker.iteration:
        return "in-progress"
    check = check_of(iter_dir, iteration) if check is None else check
    if check.verdict == "verified":
        return "verified"
    if check.verdict in ("failed", "sizes-differ"):
        return "damaged"
    if (iter_dir / MEGATRON_CONFIG).is_file():
        return "complete"
    return "incomplete"


def scan(ckpt_dir: Path, sizes: bool = True) -> tuple[Tracker, list[IterationInfo]]:
    ckpt_dir = check_dir(ckpt_dir)
    tracker = read_tracker(ckpt_dir)
    infos = []
    for iteration, path in iterations(ckpt_dir):
        files, size = dir_size(path) if sizes else (0, 0)
        check = check_of(path, iteration)
        infos.append(IterationInfo(iteration, path.name, path, state_of(path, iteration, tracker, check),
                                   latest=tracker.iteration == iteration, pinned=is_pinned(path),
                                   files=files, size_bytes=size, check=check.text(),
                                   verified_at=check.time if check.verdict == "verified" else None))
    return tracker, infos


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover
