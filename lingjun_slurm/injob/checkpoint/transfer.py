"""Copy/upload a verified checkpoint to a local path or an fsspec URL (file://, az://, s3://, ...).

Order: verify the source (writing its manifest if missing) -> copy the iteration's files ->
write the manifest -> read every copied file back and compare its SHA-256 with the manifest ->
write the target's latest_checkpointed_iteration.txt last. A target is therefore a valid
resume point only once the copy is complete and checked.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lingjun_slurm.common.errors import LingjunError
from lingjun_slurm.common.holderlock import run_squeue
from . import manifest as mf
from .errors import CheckpointDamaged, CheckpointError, CheckpointUsageError
from .layout import MANIFEST, TRACKER, atomic_write, human_size, iter_name
from .verify import VerifyReport, verify

# Protocols whose fsspec implementation lives in a separate package.
PACKAGES = {"az": "adlfs", "abfs": "adlfs", "abfss": "adlfs", "adl": "adlfs", "s3": "s3fs", "s3a": "s3fs",
            "gs": "gcsfs", "gcs": "gcsfs", "oci": "ocifs", "oss": "ossfs", "hf": "huggingface_hub",
            "sftp": "paramiko", "ssh": "paramiko"}


@dataclass
class CopyResult:
    source: str
    target: str
    files: int
    bytes: int
    skipped: bool
    tracker: str
    report: VerifyReport

    def lines(self) -> list[str]:
        what = ("already present with matching hashes" if self.skipped
                else f"copied {self.files} files, {human_size(self.bytes)}; hashes match the manifest")
        return [f"{self.source} -> {self.target}: {what}", f"target tracker: {self.tracker}"]

    def to_json(self) -> dict:
        return {"source": self.source, "target": self.target, "files": self.files, "bytes": self.bytes,
                "skipped": self.skipped, "tracker": self.tracker}


@contextmanager
def _target_errors(target: str, doing: str) -> Iterator[None]:
    """A failure of the target's filesystem as one line naming the target (CheckpointError, exit 1):
    fsspec's backends raise their own exceptions (paramiko's NoValidConnectionsError for an sftp://
    port that refuses, aiohttp's and botocore's for http:// and s3://), never a traceback. The
    tool's own errors and Ctrl-C pass through."""
    try:
        yield
    except (LingjunError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - any backend's failure, said in one line
        if isinstance(exc, OSError) and exc.strerror:
            what = exc.strerror + (f": {exc.filename}" if exc.filename else "")
        else:
            what = " ".join(str(exc).split()) or type(exc).__name__
        raise CheckpointError(f"copy target {target}: cannot {doing}: {what[:300]}") from None


def open_target(target: str) -> tuple[Any, str, bool]:
    """(filesystem, root path on it, is_local). Refuses unknown protocols and names missing packages;
    a target that cannot be reached (sftp:// connects here) is one line, exit 1."""
    try:
        import fsspec
        from fsspec.implementations.local import LocalFileSystem
    except ImportError:
        raise CheckpointUsageError("copying a checkpoint needs fsspec: pip install 'lingjun-slurm[remote]'") from None
    protocol = target.split("://", 1)[0] if "://" in target else "file"
    try:
        fs, root = fsspec.core.url_to_fs(target)
    except ImportError as exc:
        pkg = PACKAGES.get(protocol)
        hint = f": pip install {pkg}" if pkg else ""
        raise CheckpointUsageError(f"copy target {target}: the {protocol}:// protocol needs a package that "
                                   f"is not installed ({exc}){hint}") from None
    except ValueError as exc:
        raise CheckpointUsageError(f"copy target {target}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - connecting (sftp://) failed: one line, not a traceback
        with _target_errors(target, "connect"):
            raise exc
    return fs, root.rstrip("/") or "/", isinstance(fs, LocalFileSystem)


def _overlap(ckpt_dir: Path | str, root: str) -> str | None:
    """Why copying the checkpoint directory into a local target `root` would copy it into itself."""
    src, dst = Path(ckpt_dir).resolve(), Path(root).resolve()
    if dst == src:
        return "is the checkpoint directory itself"
    if dst.is_relative_to(src):
        return f"is inside the checkpoint directory {src}: the copy would land among the checkpoints it copies"
    return None


def _join(root: str, *parts: str) -> str:
    return posixpath.join(root, *parts)


def _read_tracker(fs: Any, root: str) -> str | None:
    try:
        return fs.cat_file(_join(root, TRACKER)).decode("utf-8", errors="replace").strip()
    except (FileNotFoundError, OSError):
        return None


def _check_copy(fs: Any, dest: str, manifest: dict, workers: int | None) -> list[str]:
    sizes: dict[str, int | None] = {}
    for f in manifest["files"]:
        try:
            sizes[f["path"]] = int(fs.size(_join(dest, f["path"])))
        except (FileNotFoundError, OSError):
            sizes[f["path"]] = None
    problems, _ = mf.check(manifest, sizes, lambda rel: fs.open(_join(dest, rel), "rb"), workers)
    return problems


def _already_there(fs: Any, dest: str, manifest: dict, workers: int | None) -> bool:
    try:
        theirs = json.loads(fs.cat_file(_join(dest, MANIFEST)))
    except (FileNotFoundError, OSError, ValueError):
        return False
    if not isinstance(theirs, dict) or theirs.get("files") != manifest["files"]:
        return False
    return not _check_copy(fs, dest, manifest, workers)


def _upload(fs: Any, src: Path, dest: str, manifest: dict) -> None:
    if fs.exists(dest):
        fs.rm(dest, recursive=True)
    rels = [f["path"] for f in manifest["files"]]
    for d in sorted({posixpath.dirname(_join(dest, rel)) for rel in rels} | {dest}):
        fs.makedirs(d, exist_ok=True)
    fs.put([str(src / rel) for rel in rels], [_join(dest, rel) for rel in rels])
    fs.pipe_file(_join(dest, MANIFEST), mf.dumps(manifest))


def _write_tracker(fs: Any, root: str, local: bool, iteration: int | str) -> str:
    current = _read_tracker(fs, root)
    if current is not None and current.isdigit() and isinstance(iteration, int) and int(current) >= iteration:
        return f"left at {current} (not older than {iteration})"
    data = f"{iteration}\n".encode()
    if local:
        atomic_write(Path(root) / TRACKER, data)
    else:
        fs.pipe_file(_join(root, TRACKER), data)  # one object put: atomic on object stores
    return f"{TRACKER} = {iteration}" + (f" (was {current})" if current else "")


def copy_checkpoint(ckpt_dir: Path | str, target: str, iteration: int | None = None,
                    workers: int | None = None) -> CopyResult:
    """Verify, copy, check the copy's hashes, then point the target's tracker at it (never backwards)."""
    fs, root, local = open_target(target)
    overlap = _overlap(ckpt_dir, root) if local else None
    if overlap:
        raise CheckpointUsageError(f"copy target {target} {overlap}; copy it elsewhere")
    try:
        report = verify(ckpt_dir, iteration, write_manifest=True, workers=workers)
    except CheckpointDamaged as exc:
        raise CheckpointDamaged(exc.path, [f"refusing to copy: {p}" for p in exc.problems]) from None
    src = report.path
    manifest, problems = mf.read(src, report.iteration)
    if manifest is None or problems:  # pragma: no cover - verify just wrote or matched it
        raise CheckpointError(f"refusing to copy {src}: " + "; ".join(problems or ["no manifest"]))
    name = iter_name(report.iteration) if isinstance(report.iteration, int) else str(report.iteration)
    dest = _join(root, name)
    if local and Path(src).resolve().is_relative_to(Path(dest).resolve()):
        raise CheckpointUsageError(f"copy target {target}: {dest} holds the checkpoint being copied "
                                   f"({src}); copying there would replace it")
    with _target_errors(target, "write to it"):
        if local:
            fs.makedirs(root, exist_ok=True)
        with _target_lock(root if local else None, src):
            return _copy_locked(fs, root, local, target, src, dest, name, manifest, report, workers)


# The lock a chain with a train or checkpoint stage holds on its checkpoint directory while it runs
# (runs/workdir_lock.py CKPT_LOCK_NAME; tests/checkpoint/test_copy_lock.py keeps the two equal).
LOCK_NAME = "checkpoint.lock"


@contextmanager
def _target_lock(root: str | None, src: str) -> Iterator[None]:
    """Hold <target>/checkpoint.lock while copying into a local directory: a chain training into it
    (or a second copy) would move its tracker while this copy moves it too. A live holder refuses
    the copy, naming it (a chain's jobs are judged with one squeue; a holder that cannot be judged,
    e.g. slurmctld unreachable, counts as live). Remote targets (s3://...) have no such lock."""
    if root is None:
        yield
        return
    from lingjun_slurm.common.holderlock import HolderLock, LockHeld, slurm_job_alive, slurm_jobs_alive

    lock = HolderLock(posixpath.join(root, LOCK_NAME), purpose=f"lingjun-slurm checkpoint copy of {src}",
                      job_alive=lambda job: slurm_job_alive(job, run_squeue),
                      jobs_alive=lambda jobs: slurm_jobs_alive(jobs, run_squeue))
    try:
        lock.acquire()
    except LockHeld as exc:
        raise CheckpointUsageError(f"copy target {root} is in use: {exc}; copy after it ends, or elsewhere") from None
    try:
        yield
    finally:
        lock.release()


def _copy_locked(fs: Any, root: str, local: bool, target: str, src: str, dest: str, name: str,
                 manifest: dict, report: VerifyReport, workers: int | None) -> CopyResult:
    with _target_errors(target, "write to it"):
        skipped = _already_there(fs, dest, manifest, workers)
        if not skipped:
            _upload(fs, src, dest, manifest)
            problems = _check_copy(fs, dest, manifest, workers)
            if problems:
                raise CheckpointDamaged(dest, [f"copy does not match the source manifest: {p}" for p in problems]
                                        + [f"the target's {TRACKER} was not changed"])
        tracker = _write_tracker(fs, root, local, report.iteration)
    shown = dest if "://" not in target else f"{target.rstrip('/')}/{name}"
    return CopyResult(str(src), shown, len(manifest["files"]), manifest["total_bytes"], skipped, tracker, report)
