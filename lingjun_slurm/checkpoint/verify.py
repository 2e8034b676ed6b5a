"""Verify one torch_dist checkpoint: tracker, files, torch and megatron-core metadata, hashes.

torch and megatron-core are imported inside the functions that need them.
"""

from __future__ import annotations

import importlib
import json
import os
import warnings
import zipfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from . import manifest as mf
from .errors import CheckpointDamaged, CheckpointError, CheckpointUsageError
from .layout import (MANIFEST, MEGATRON_CONFIG, check_dir, human_size, iter_name, iterations, read_tracker,
                     state_of)

TORCH_METADATA = ".metadata"
COMMON = "common.pt"


@dataclass
class VerifyReport:
    """What a successful verification saw. manifest: matched | written | absent."""

    dir: str
    name: str
    iteration: int | str
    files: int
    bytes: int
    shard_files: int
    tensors: int
    objects: int
    manifest: str
    tensors_loaded: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return Path(self.dir) / self.name

    def summary(self) -> str:
        what = {"matched": "hashes match the manifest", "written": "manifest written",
                "absent": "no manifest (hashes not checked)"}[self.manifest]
        loaded = ", every tensor loaded" if self.tensors_loaded else ""
        return (f"{self.path}: OK (torch_dist, {self.files} files, {human_size(self.bytes)}, "
                f"{self.tensors} tensors, {self.objects} objects{loaded}; {what})")

    def to_json(self) -> dict:
        return {"ok": True, **asdict(self), "path": str(self.path)}


def _present(ckpt_dir: Path) -> str:
    found = iterations(ckpt_dir)
    return ", ".join(p.name for _, p in found) if found else "none"


def resolve(ckpt_dir: Path | str, iteration: int | None = None) -> tuple[Path, int | str]:
    """The iteration directory to verify: --iteration N, else the tracker's. Refuses with the reason."""
    ckpt_dir = check_dir(ckpt_dir)
    if iteration is not None:
        path = ckpt_dir / iter_name(iteration)
        if not path.is_dir():
            raise CheckpointError(f"{path} does not exist (iterations present: {_present(ckpt_dir)})")
        return path, iteration
    tracker = read_tracker(ckpt_dir)
    if tracker.raw is None and tracker.problem and not iterations(ckpt_dir):
        raise CheckpointError(f"no checkpoint in {ckpt_dir}: no {tracker.path.name} and no iter_* directories")
    if tracker.problem:
        hint = f" (iterations present: {_present(ckpt_dir)}; pick one with --iteration N)"
        raise CheckpointDamaged(ckpt_dir, [tracker.problem + hint])
    name = tracker.name or ""
    path = ckpt_dir / name
    if not path.is_dir():
        raise CheckpointDamaged(ckpt_dir, [f"tracker points at {name}, which does not exist "
                                           f"(iterations present: {_present(ckpt_dir)})"])
    return path, "release" if tracker.release else tracker.iteration  # type: ignore[return-value]


@contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _imports() -> tuple[Any, bool]:
    """(torch, megatron-core importable). megatron.core registers its safe globals for torch.load
    (argparse.Namespace, its enums, ...) on import, the allow-list Megatron-LM's resume loads with."""
    try:
        with _quiet():
            import torch
    except ImportError:
        raise CheckpointUsageError("verifying a checkpoint needs torch: pip install 'lingjun-slurm[megatron]'") from None
    try:
        with _quiet():
            importlib.import_module("megatron.core")
    except ImportError:
        return torch, False
    return torch, True


def _check_config(iter_dir: Path) -> list[str]:
    path = iter_dir / MEGATRON_CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [f"{MEGATRON_CONFIG} is missing: the save did not finish (dist_checkpointing writes it last)"]
    except (OSError, ValueError) as exc:
        return [f"{MEGATRON_CONFIG} is unreadable: {exc}"]
    backend = config.get("sharded_backend") if isinstance(config, dict) else None
    if backend != "torch_dist":
        return [f"{MEGATRON_CONFIG} says sharded_backend {backend!r}; expected 'torch_dist'"]
    return []


def _check_shards(torch: Any, iter_dir: Path) -> tuple[list[str], int, dict[str, int]]:
    """(problems, storage items, {shard file: bytes the metadata needs})."""
    if not (iter_dir / TORCH_METADATA).is_file():
        return [f"{TORCH_METADATA} (the torch_dist metadata) is missing"], 0, {}
    from torch.distributed.checkpoint import FileSystemReader

    try:
        with _quiet():
            metadata = FileSystemReader(str(iter_dir)).read_metadata()
        storage = metadata.storage_data or {}
        needed: dict[str, int] = {}
        items: dict[str, int] = {}
        for info in storage.values():
            rel = str(info.relative_path)
            needed[rel] = max(needed.get(rel, 0), int(info.offset) + int(info.length))
            items[rel] = items.get(rel, 0) + 1
    except Exception as exc:  # a damaged pickle raises anything
        return [f"cannot read {TORCH_METADATA}: {type(exc).__name__}: {exc}"], 0, {}
    problems = []
    root = iter_dir.resolve()
    for rel, end in sorted(needed.items()):
        path = iter_dir / rel
        if root not in path.resolve().parents:
            problems.append(f"{TORCH_METADATA} references {rel!r}, outside the checkpoint directory")
            continue
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            problems.append(f"missing shard {rel} referenced by {TORCH_METADATA} ({items[rel]} items)")
            continue
        except OSError as exc:  # EACCES, EIO, a stale NFS handle: unreadable is damaged here too
            problems.append(f"cannot stat shard {rel} referenced by {TORCH_METADATA}: {exc.strerror or exc}")
            continue
        if size < end:
            problems.append(f"file {rel} truncated: expected >= {end} bytes, found {size}")
    return problems, sum(items.values()), needed


COMMON_STATE = "common_state/"  # megatron-core >= 0.19: the ShardedObject that replaced common.pt
COMMON_IN_SHARDS_FROM = (0, 19)


def _common_in_shards(iter_dir: Path) -> bool:
    """Whether the checkpoint keeps its common state inside the shards, as megatron-core 0.19 and
    later save it: no common.pt, no "common_backend" in metadata.json, and the ShardedObject
    "common_state/shard_0_1" in .metadata (Megatron-LM commit 40b1fd37c1 "deprecate common
    strategy", first in core_v0.19.0: dist_checkpointing/serialization.py save :439-445, and
    load_common_state_dict :206-233, which still reads a legacy common.pt)."""
    try:
        config = json.loads((iter_dir / MEGATRON_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict) or "common_backend" in config:
        return False
    try:
        from torch.distributed.checkpoint import FileSystemReader

        with _quiet():
            keys = FileSystemReader(str(iter_dir)).read_metadata().state_dict_metadata
    except Exception:  # a damaged .metadata: _check_shards says so
        return False
    return any(str(k).startswith(COMMON_STATE) for k in keys)


def _megatron_core_version() -> tuple[int, ...] | None:
    try:
        with _quiet():
            from megatron.core import package_info
    except ImportError:
        return None
    from ..stages.runtime import version_tuple

    return version_tuple(str(getattr(package_info, "__version__", ""))) or None


def _check_common(torch: Any, iter_dir: Path, iteration: int | str, notes: list[str]) -> tuple[list[str], bool]:
    """(problems, loadable with weights_only=True: False also when there is no common.pt to load)."""
    path = iter_dir / COMMON
    if not path.is_file():
        if not _common_in_shards(iter_dir):
            return [f"{COMMON} is missing"], False
        have = _megatron_core_version()
        if have is not None and have < COMMON_IN_SHARDS_FROM:
            return [f"saved by megatron-core >= 0.19 (its common state is inside the shards, no {COMMON}), which "
                    f"this megatron-core {'.'.join(map(str, have))} cannot load: run with megatron-core >= 0.19"], False
        notes.append(f"no {COMMON}: the common state is the shards' {COMMON_STATE}shard_0_1 (megatron-core >= 0.19)")
        return [], False
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
    except Exception as exc:
        return [f"{COMMON} is not a readable torch archive ({type(exc).__name__}: {exc})"], False
    if bad is not None:
        return [f"{COMMON} is damaged: CRC mismatch in archive member {bad}"], False
    try:
        with _quiet():
            common = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "Weights only load failed" in str(exc):
            notes.append(f"{COMMON} holds objects outside torch's weights_only allow-list (megatron-core's "
                         "included); its archive CRCs match, but it was not unpickled (this tool never "
                         "loads with weights_only=False)")
            return [], False
        return [f"{COMMON} does not load: {type(exc).__name__}: {first}"], False
    saved = common.get("iteration") if isinstance(common, dict) else None
    if isinstance(iteration, int) and isinstance(saved, int) and saved != iteration:
        return [f"{COMMON} says iteration {saved}, but the directory is {iter_name(iteration)}"], True
    return [], True


def _megatron_checks(iter_dir: Path, common_ok: bool, load_tensors: bool) -> tuple[list[str], int, int]:
    """(problems, tensors, objects) as megatron-core's dist_checkpointing sees them."""
    with _quiet():
        from megatron.core.dist_checkpointing import serialization as ser
        from megatron.core.dist_checkpointing.mapping import ShardedObject
    where = str(iter_dir)
    try:
        with _quiet():
            if common_ok:
                ser.load_common_state_dict(where)
            sharded = ser.load_sharded_metadata(where)
    except Exception as exc:
        return [f"megatron-core cannot load the checkpoint metadata: {type(exc).__name__}: {exc}"], 0, 0
    objects = sum(isinstance(v, ShardedObject) for v in sharded.values())
    if load_tensors:
        try:
            with _quiet(), _process_group():
                ser.load_plain_tensors(where)  # read, then dropped
        except Exception as exc:
            return [f"megatron-core cannot load the tensors: {type(exc).__name__}: {exc}"], 0, 0
    return [], len(sharded) - objects, objects


@contextmanager
def _process_group() -> Iterator[None]:
    """load_plain_tensors needs a process group: a 1-rank gloo group on an in-memory store, if none exists."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _file_sizes(iter_dir: Path, rels: list[str]) -> dict[str, int | None]:
    sizes: dict[str, int | None] = {}
    for rel in rels:
        try:
            sizes[rel] = os.stat(iter_dir / rel).st_size
        except OSError:
            sizes[rel] = None
    return sizes


def quick_problems(iter_dir: Path, iteration: int | str) -> list[str]:
    """What `verify` finds without reading any file whole: the manifest's sizes (not its hashes),
    metadata.json, every shard .metadata names at least as long as its recorded extents, and
    common.pt. [] when the checkpoint passes. The trainer runs this before every resume
    (train/resume.py): seconds on a multi-TB checkpoint, where hashing takes minutes."""
    torch, _have_megatron = _imports()
    problems: list[str] = []
    manifest, mproblems = mf.read(iter_dir, iteration)
    problems += mproblems
    if manifest is not None:
        for rel, want in sorted(mf.expected(manifest).items()):
            try:
                size = os.stat(iter_dir / rel).st_size
            except FileNotFoundError:
                problems.append(f"missing file {rel} listed in {MANIFEST}")
                continue
            except OSError as exc:
                problems.append(f"cannot stat {rel} listed in {MANIFEST}: {exc.strerror or exc}")
                continue
            if size != want.size:
                problems.append(f"file {rel} has {size} bytes; {MANIFEST} says {want.size}")
    problems += _check_config(iter_dir)
    problems += _check_shards(torch, iter_dir)[0]
    problems += _check_common(torch, iter_dir, iteration, [])[0]
    return problems


def verify(ckpt_dir: Path | str, iteration: int | None = None, *, write_manifest: bool = False,
           load_tensors: bool = False, workers: int | None = None) -> VerifyReport:
    """Verify the latest checkpoint (or `iteration`); raise CheckpointDamaged listing every problem.

    write_manifest: hash and write lingjun-manifest.json after a successful verification when
    there is none. load_tensors: also read every tensor through megatron-core (memory: the
    whole checkpoint).
    """
    iter_dir, it = resolve(ckpt_dir, iteration)
    torch, have_megatron = _imports()
    problems: list[str] = []
    notes: list[str] = []
    tracker = read_tracker(iter_dir.parent)
    if isinstance(it, int) and state_of(iter_dir, it, tracker) == "in-progress":
        notes.append(f"{iter_dir.name} is newer than the tracker ({tracker.name}): a save may still be writing it")
    manifest, mproblems = mf.read(iter_dir, it)
    problems += mproblems
    rels = mf.checkpoint_files(iter_dir)
    sizes = _file_sizes(iter_dir, rels)
    if manifest is not None:
        listed = {f["path"] for f in manifest["files"]}
        sizes.update(_file_sizes(iter_dir, sorted(listed - set(rels))))
        hproblems, _ = mf.check(manifest, sizes, mf.local_opener(iter_dir), workers)
        problems += hproblems
        notes += [f"file {rel} is not in {MANIFEST} (added after it was written)" for rel in rels if rel not in listed]
    problems += _check_config(iter_dir)
    sproblems, _items, needed = _check_shards(torch, iter_dir)
    problems += sproblems
    cproblems, common_ok = _check_common(torch, iter_dir, it, notes)
    problems += cproblems
    tensors = objects = 0
    if not problems and have_megatron:
        gproblems, tensors, objects = _megatron_checks(iter_dir, common_ok, load_tensors)
        problems += gproblems
    elif not have_megatron:
        notes.append("megatron-core is not installed: its metadata load was skipped")
    if problems:
        raise CheckpointDamaged(iter_dir, problems)
    state = "matched" if manifest is not None else "absent"
    if manifest is None and write_manifest:
        manifest = mf.write(iter_dir, it, workers)
        state = "written"
    present = [s for s in sizes.values() if s is not None]
    return VerifyReport(dir=str(iter_dir.parent), name=iter_dir.name, iteration=it, files=len(present),
                        bytes=sum(present), shard_files=len(needed), tensors=tensors, objects=objects,
                        manifest=state, tensors_loaded=load_tensors and have_megatron, notes=notes)
