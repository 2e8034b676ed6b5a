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
# its unique key: ShardedObject("common_state", None, (1,), (0,)) (serialization.py :227 at core_v0.19.0)
COMMON_STATE_KEY = "common_state/shard_0_1"


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


# ---- A checkpoint this megatron-core cannot read is not damage (issue 26 item 2) ----------------------
#
# Evidence that a newer megatron-core wrote the checkpoint, each from the real source:
#  - metadata.json names a field the running megatron-core's CheckpointingConfig lacks (0.16.1 builds it
#    with CheckpointingConfig(**config_dict): TypeError on an unknown key, dist_checkpointing/core.py:72;
#    from 0.19 unknown keys are dropped, core.py maybe_load_config), or a (sharded|common)_backend_version
#    above every version this megatron-core registers a load strategy for (strategies/base.py
#    get_default_strategy: "Cannot find a default strategy for ...", :29-47 at core_v0.16.1);
#  - no common.pt, no common_backend, and the ShardedObject "common_state" in the shards: the layout of
#    megatron-core >= 0.19 (megatron/versions.py COMMON_STATE_IN_SHARDS), on a megatron-core before it;
#  - the common state's pickle names a class under megatron. that the running megatron-core does not have
#    (core_v0.18's args hold megatron.core.transformer.enums.InferenceCudaGraphScope: 0.16.1 fails with
#    "Unsupported global" under weights_only, AttributeError in find_class without).
# The pickle is scanned with pickletools (no object is built, nothing of the checkpoint runs).


@dataclass
class VersionMismatch:
    """A checkpoint the running megatron-core cannot read: intact, written by a newer one."""

    running: str  # the running megatron-core's version
    evidence: str  # what shows it, in words
    needs: tuple[int, ...] | None = None  # the oldest megatron-core known to read it (None: unknown)
    writer: str | None = None  # what the checkpoint records of its writer (the builtin: args.megatron_lm_version)

    def line(self, name: str) -> str:
        """One line: both versions, and what to do."""
        from lingjun_slurm.megatron.versions import version_text

        needs = version_text(self.needs) if self.needs else None
        evidence = self.evidence
        if self.writer:
            by, evidence = f"Megatron-LM {self.writer}", f"as its args record; {evidence}"
        elif needs:
            by = f"megatron-core >= {needs}"
        else:
            by = f"a megatron-core newer than {self.running}"
        todo = (f"run with megatron-core >= {needs} (a container image with Megatron-LM >= {needs}, declared as "
                f"megatron_lm.version)" if needs else
                "run with the megatron-core that wrote it (a container image of that Megatron-LM)")
        return (f"{name}: saved by {by} ({evidence}), which this megatron-core {self.running} cannot load: "
                f"{todo}, or resume from another checkpoint directory (checkpoint.dir; Megatron-LM: --load); "
                "the checkpoint is intact and was left as it is")

    def to_json(self) -> dict:
        return asdict(self)


def _registered_versions() -> dict[str, dict[str, int]]:
    """{"load_sharded"/"load_common": {backend: newest version}} this megatron-core has load strategies for
    (strategies/base.py default_strategies, core_v0.16.1 :29-47; changed in 0.18, gone in 0.19: then {},
    and the backend-version check is skipped)."""
    try:
        from megatron.core.dist_checkpointing.strategies import base
    except ImportError:
        return {}
    try:
        from megatron.core.dist_checkpointing.strategies.torch import register_default_torch_strategies

        register_default_torch_strategies()  # get_default_strategy registers them lazily (base.py :34-36)
    except Exception:
        pass
    out: dict[str, dict[str, int]] = {}
    for action, table in getattr(base, "default_strategies", {}).items():
        for backend, version in table:
            if isinstance(version, int):
                newest = out.setdefault(str(action), {})
                newest[backend] = max(version, newest.get(backend, version))
    return out


def _config_mismatch(iter_dir: Path) -> str | None:
    import dataclasses

    from megatron.core.dist_checkpointing.core import CheckpointingConfig, maybe_load_config

    try:
        config = json.loads((iter_dir / MEGATRON_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # missing or unreadable: _check_config's damage
    if not isinstance(config, dict):
        return None
    known = {f.name for f in dataclasses.fields(CheckpointingConfig)}
    unknown = sorted(str(k) for k in config if k not in known)
    if unknown:
        try:  # the running megatron-core's own reader: 0.16 refuses unknown fields, 0.19 drops them
            with _quiet():
                maybe_load_config(str(iter_dir))
        except TypeError:
            return f"{MEGATRON_CONFIG} has {', '.join(unknown)}, which this megatron-core's CheckpointingConfig lacks"
        except Exception:
            return None
    registered = _registered_versions()
    for kind, action in (("sharded", "load_sharded"), ("common", "load_common")):
        backend, version = config.get(f"{kind}_backend"), config.get(f"{kind}_backend_version")
        newest = registered.get(action, {}).get(backend) if isinstance(backend, str) else None
        if newest is not None and isinstance(version, int) and not isinstance(version, bool) and version > newest:
            return (f"{MEGATRON_CONFIG} says {kind}_backend {backend} version {version}; this megatron-core reads "
                    f"up to version {newest}")
    return None


def _common_state_bytes(iter_dir: Path) -> bytes | None:
    """The torch.save archive of the common state: common.pt, or (megatron-core >= 0.19) the bytes of the
    shards' common_state object, read at the offset .metadata records (torch's _StorageInfo, filesystem.py);
    None when there is none or it cannot be read that way."""
    path = iter_dir / COMMON
    try:
        if path.is_file():
            return path.read_bytes()
        from torch.distributed.checkpoint import FileSystemReader

        with _quiet():
            metadata = FileSystemReader(str(iter_dir)).read_metadata()
        for index, info in (metadata.storage_data or {}).items():
            if getattr(index, "fqn", None) == COMMON_STATE_KEY and not getattr(info, "transform_descriptors", None):
                with open(iter_dir / str(info.relative_path), "rb") as fh:
                    fh.seek(int(info.offset))
                    return fh.read(int(info.length))
    except Exception:  # damaged: the checks for damage say so
        return None
    return None


def pickled_globals(archive: bytes) -> list[tuple[str, str]]:
    """(module, name) of every class or function the pickle of a torch.save archive names (GLOBAL and
    STACK_GLOBAL), read with pickletools: nothing is imported or built. [] when it cannot be read."""
    import io
    import pickletools

    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as zf:
            member = next(n for n in zf.namelist() if n == "data.pkl" or n.endswith("/data.pkl"))
            data = zf.read(member)
        found: list[tuple[str, str]] = []
        pushed: list[Any] = []  # what each opcode pushed (strings; None for anything else)
        memo: dict[Any, Any] = {}
        for op, arg, _pos in pickletools.genops(data):
            if op.name == "GLOBAL":
                module, _, name = str(arg).partition(" ")
                found.append((module, name))
                pushed.append(None)
            elif op.name == "STACK_GLOBAL":
                if len(pushed) >= 2 and isinstance(pushed[-2], str) and isinstance(pushed[-1], str):
                    found.append((pushed[-2], pushed[-1]))
                pushed.append(None)
            elif op.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"):
                pushed.append(arg)
            elif op.name == "MEMOIZE":
                memo[len(memo)] = pushed[-1] if pushed else None
            elif op.name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = pushed[-1] if pushed else None
            elif op.name in ("GET", "BINGET", "LONG_BINGET"):
                pushed.append(memo.get(arg))
            else:
                pushed.append(None)
    except Exception:
        return []
    return list(dict.fromkeys(found))


def missing_here(module: str, name: str) -> bool:
    """True when megatron-core's `module`.`name` (name "": the module itself) does not exist in the running
    megatron-core (what pickle's find_class would fail on). Only names under megatron. are looked up (and
    imported)."""
    import importlib.util

    if module != "megatron" and not module.startswith("megatron."):
        return False
    try:
        if importlib.util.find_spec(module) is None:
            return True
    except ModuleNotFoundError:
        return True  # a parent package is missing
    except Exception:
        return False
    if not name:
        return False
    try:
        with _quiet():
            obj: Any = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        return bool(exc.name) and (exc.name == module or module.startswith(f"{exc.name}."))
    except Exception:
        return False  # broken for another reason (a missing dependency): not a question of versions
    for part in name.split("."):
        if not hasattr(obj, part):
            return True
        obj = getattr(obj, part)
    return False


def _missing_classes_mismatch(names: list[str], running: str) -> VersionMismatch:
    from lingjun_slurm.megatron.versions import CLASSES_SINCE

    since = [CLASSES_SINCE[n] for n in names if n in CLASSES_SINCE]
    what = ", ".join(names)
    return VersionMismatch(running, f"its common state pickles {what}, which megatron-core {running} does not have",
                           needs=max(since) if since and len(since) == len(names) else None)


def _recorded_writer(archive: bytes | None) -> str | None:
    """args.megatron_lm_version of a common state that unpickles here with weights_only=True (the builtin
    trainer records the run's megatron_lm.version there; Megatron-LM records no version of its own)."""
    import io

    if archive is None:
        return None
    try:
        torch, _ = _imports()
        with _quiet():
            state = torch.load(io.BytesIO(archive), map_location="cpu", weights_only=True)
        if isinstance(state, (list, tuple)) and len(state) == 1:  # the shards' common_state: [state_dict]
            state = state[0]
        version = getattr(state.get("args"), "megatron_lm_version", None) if isinstance(state, dict) else None
    except Exception:
        return None
    return str(version) if isinstance(version, (str, int, float)) and str(version).strip() else None


def version_mismatch(iter_dir: Path) -> VersionMismatch | None:
    """Why the running megatron-core cannot read this (otherwise intact) checkpoint, or None: see above.
    None as well without megatron-core (nothing to compare with)."""
    from lingjun_slurm.megatron.versions import COMMON_STATE_IN_SHARDS

    have = _megatron_core_version()
    if have is None:
        return None
    running = ".".join(map(str, have))
    found = _config_mismatch(iter_dir)
    mismatch = VersionMismatch(running, found) if found else None
    if mismatch is None and not (iter_dir / COMMON).is_file() and _common_in_shards(iter_dir) \
            and tuple(have[:3]) < COMMON_STATE_IN_SHARDS:
        mismatch = VersionMismatch(running, f"its common state is inside the shards, no {COMMON}",
                                   needs=COMMON_STATE_IN_SHARDS)
    archive = _common_state_bytes(iter_dir)
    if mismatch is None and archive is not None:
        lacking = [f"{m}.{n}" for m, n in pickled_globals(archive) if missing_here(m, n)]
        if lacking:
            return _missing_classes_mismatch(lacking, running)
    if mismatch is not None:
        mismatch.writer = _recorded_writer(archive)
    return mismatch


# What a failed load says when a class of the checkpoint is missing here: torch.load(weights_only=True)'s
# WeightsUnpickler ("Unsupported global: GLOBAL megatron.x.Y was not an allowed global", torch/_weights_only_
# unpickler.py), pickle's find_class ("Can't get attribute 'Y' on <module 'megatron.x' ...>") and the import
# ("No module named 'megatron.x'").
_GLOBAL_PATTERNS = (
    r"Unsupported global: GLOBAL (?P<dotted>megatron(?:\.\w+)+)",
    r"Can't get attribute '(?P<name>[\w.]+)' on <module '(?P<module>megatron(?:\.\w+)*)'",
    r"No module named '(?P<gone>megatron(?:\.\w+)+)'",
)


def mismatch_from_error(text: str) -> VersionMismatch | None:
    """The VersionMismatch a load error's text shows (a class or module under megatron. that the running
    megatron-core lacks), or None: anything else is for the caller to judge."""
    import re

    have = _megatron_core_version()
    if have is None:
        return None
    names: list[str] = []
    for pattern in _GLOBAL_PATTERNS:
        for m in re.finditer(pattern, text):
            if m.groupdict().get("dotted"):
                module, _, name = m.group("dotted").rpartition(".")
            elif m.groupdict().get("gone"):
                module, name = m.group("gone"), ""
            else:
                module, name = m.group("module"), m.group("name")
            if missing_here(module, name):
                names.append(f"{module}.{name}" if name else module)
    if not names:
        return None
    return _missing_classes_mismatch(list(dict.fromkeys(names)), ".".join(map(str, have)))


def _check_common(torch: Any, iter_dir: Path, iteration: int | str, notes: list[str]) -> tuple[list[str], bool]:
    """(problems, loadable with weights_only=True: False also when there is no common.pt to load)."""
    path = iter_dir / COMMON
    if not path.is_file():
        if not _common_in_shards(iter_dir):
            return [f"{COMMON} is missing"], False
        # Not damage, whichever megatron-core runs here: version_mismatch says when this one cannot read it.
        notes.append(f"no {COMMON}: the common state is the shards' {COMMON_STATE_KEY} (megatron-core >= 0.19)")
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
        mismatch = version_mismatch(iter_dir)
        if mismatch is None:
            problems += gproblems
        else:  # not damage: its files passed, and this megatron-core is too old to read what they hold
            failed = f"; megatron-core's own check failed here: {gproblems[0]}" if gproblems else ""
            notes.append(f"not damaged, but {mismatch.line(iter_dir.name)}{failed}")
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
