"""The user's index of runs, in the local state directory (XDG): one JSON file, locked.

    $LINGJUN_STATE_DIR, else $XDG_STATE_HOME/lingjun-slurm, else ~/.local/state/lingjun-slurm
        runs.json       {"schema": 1, "runs": [{run_id, name, created_at, executor, transport, host, run_dir, spec,
                                                cluster}]}
        runs/<run-id>/  the local copy of a remote run's record (runs/mirror.py)
        runs.lock       flock taken for every read-modify-write

Writes are atomic (temp file + rename) and serialized by the lock, so concurrent
submits never lose an entry.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from ..errors import RunNotFound, TransportError
from ..transport.local import LocalTransport

INDEX_SCHEMA = 1


@dataclass(frozen=True)
class IndexEntry:
    run_id: str
    name: str
    created_at: float
    executor: str
    transport: str
    host: str
    run_dir: str
    spec: str
    cluster: str = ""  # the --cluster name it was submitted with, if any

    @property
    def remote(self) -> bool:
        return self.transport != "local"


class AmbiguousRun(RunNotFound):
    """A RUN prefix that matches several runs."""


def state_dir() -> Path:
    if os.environ.get("LINGJUN_STATE_DIR"):
        return Path(os.environ["LINGJUN_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "lingjun-slurm"


class RunIndex:
    def __init__(self, directory: Optional[Path] = None) -> None:
        self.dir = directory or state_dir()
        self.path = self.dir / "runs.json"
        self._fs = LocalTransport()  # the index is always on this machine

    def _read(self) -> list[IndexEntry]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, json.JSONDecodeError) as exc:
            raise TransportError(f"{self.path}: unreadable run index ({exc}); move it aside to start afresh") from None
        if data.get("schema") != INDEX_SCHEMA:
            raise TransportError(f"{self.path}: index schema {data.get('schema')!r}, expected {INDEX_SCHEMA}")
        fields = IndexEntry.__dataclass_fields__
        return [IndexEntry(**{k: v for k, v in row.items() if k in fields}) for row in data.get("runs", [])]

    def _write(self, entries: list[IndexEntry]) -> None:
        doc = {"schema": INDEX_SCHEMA, "runs": [asdict(e) for e in entries]}
        self._fs.write_atomic(str(self.path), json.dumps(doc, indent=1) + "\n")

    def entries(self) -> list[IndexEntry]:
        """Every run, oldest first."""
        return sorted(self._read(), key=lambda e: (e.created_at, e.run_id))

    def add(self, entry: IndexEntry) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with self._fs.lock(str(self.dir / "runs.lock")):
            entries = [e for e in self._read() if e.run_id != entry.run_id]
            entries.append(entry)
            self._write(entries)

    def remove(self, run_ids: list[str]) -> None:
        with self._fs.lock(str(self.dir / "runs.lock")):
            self._write([e for e in self._read() if e.run_id not in set(run_ids)])

    def on(self, target: str = "", cluster: str = "") -> list[IndexEntry]:
        """Runs recorded on an SSH target (as written) or submitted with --cluster NAME; oldest first."""
        return [e for e in self.entries() if e.remote and ((target and e.host == target)
                                                          or (cluster and e.cluster == cluster))]

    def resolve(self, ref: str, *, target: str = "", cluster: str = "") -> IndexEntry:
        """RUN is a run id, a unique prefix of one, or a run directory.

        With a target (--host) or cluster (--cluster), the runs on that host are searched
        first, then every run (the target then only overrides how the run is reached). A
        remote run directory that no entry names is not looked up here (see cli_remote).
        """
        everything = self.entries()
        if target or cluster:
            mine = [e for e in everything if e.remote and ((target and e.host == target)
                                                          or (cluster and e.cluster == cluster))]
            try:
                return self._resolve(ref, mine, local_paths=False)
            except AmbiguousRun:
                raise  # several of this host's runs match: more of the run id is needed
            except RunNotFound:
                pass
            return self._resolve(ref, everything, local_paths=False)
        return self._resolve(ref, everything, local_paths=True)

    def _resolve(self, ref: str, entries: list[IndexEntry], *, local_paths: bool) -> IndexEntry:
        exact = [e for e in entries if e.run_id == ref]
        if exact:
            return exact[-1]
        if "/" in ref or ref.startswith("."):
            for e in entries:  # a remote run directory is compared as written
                if e.remote and e.run_dir.rstrip("/") == ref.rstrip("/"):
                    return e
            if not local_paths:
                raise RunNotFound(f"{ref}: no run with this run directory in the index")
            path = Path(ref).resolve()
            for e in entries:
                if not e.remote and Path(e.run_dir) == path:
                    return e
            if (path / "manifest.json").is_file():
                return _entry_from_dir(path)
            raise RunNotFound(f"{ref}: no run directory with a manifest.json there")
        matches = [e for e in entries if e.run_id.startswith(ref)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise RunNotFound(f"no run matches {ref!r} (see `lingjun-slurm list`)")
        names = ", ".join(e.run_id for e in matches[:5]) + (" ..." if len(matches) > 5 else "")
        raise AmbiguousRun(f"{ref!r} matches {len(matches)} runs ({names}); give more of the run id")

    def recent(self, limit: int) -> list[IndexEntry]:
        return self.entries()[-limit:]


def _entry_from_dir(path: Path) -> IndexEntry:
    from .manifest import load_manifest

    m = load_manifest(LocalTransport(), str(path))
    return entry_for(m.run_id, m.name, m.created_at, m.executor, m.transport.kind, m.transport.host, m.run_dir,
                     m.spec.source)


def entry_for(run_id: str, name: str, created_at: float, executor: str, transport: str, host: str, run_dir: str,
              spec: str, cluster: str = "") -> IndexEntry:
    return IndexEntry(run_id=run_id, name=name, created_at=round(created_at or time.time(), 3), executor=executor,
                      transport=transport, host=host, run_dir=run_dir, spec=spec, cluster=cluster)
