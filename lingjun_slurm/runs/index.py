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
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..common.errors import RunNotFound, TransportError
from ..transport.local import LocalTransport
from .statedir import state_dir

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


_FIELDS = IndexEntry.__dataclass_fields__
_WARNED: set[str] = set()
# The parsed index by path, kept while the file is unchanged (same inode, size, mtime and ctime:
# every write replaces the file, an edit by hand changes its times): `status RUN...` with 2,000 runs
# resolves each RUN against the index, and parsing the whole file per RUN made it quadratic (issue 31).
_PARSED: dict[str, tuple[tuple[int, ...], list["IndexEntry"], list[object], dict[str, "IndexEntry"]]] = {}
_OPTIONAL = {"cluster"}


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an empty list" if not value else "a list"
    if isinstance(value, dict):
        return "an object"
    return {str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(type(value), "null")


def _row_problem(row: object) -> Optional[str]:
    """Why one row of runs.json is not an IndexEntry, or None."""
    if not isinstance(row, dict):
        return f"{_json_kind(row)}, not an object"
    missing = [k for k in _FIELDS if k not in row and k not in _OPTIONAL]
    if missing:
        return f"missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    for k in _FIELDS:
        if k not in row:
            continue
        v = row[k]
        if k == "created_at":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return f"created_at must be a number (seconds since the epoch), found {_json_kind(v)}"
        elif not isinstance(v, str):
            return f"{k} must be a string, found {_json_kind(v)}"
    if not row["run_id"]:
        return "run_id is empty"
    return None


class AmbiguousRun(RunNotFound):
    """A RUN prefix that matches several runs."""


class RunIndex:
    def __init__(self, directory: Optional[Path] = None) -> None:
        self.dir = directory or state_dir()
        self.path = self.dir / "runs.json"
        self._fs = LocalTransport()  # the index is always on this machine
        self._bad_rows: list[object] = []  # rows that are not runs: kept as written (see _read)

    def _read(self) -> list[IndexEntry]:
        """The index's entries. A file that is not the index at all (garbage, truncated, a bare `[]`
        or `{}`, another schema) is one TransportError naming the file and what to do; single rows
        that are not runs (hand-edited: a field missing or of the wrong type) are skipped with one
        warning on stderr and written back unchanged by the next add/remove, so nothing is lost."""
        return list(self._parsed()[0])

    def _parsed(self) -> tuple[list[IndexEntry], dict[str, IndexEntry]]:
        """(entries oldest first, the newest entry of each run id), from the cache while the file is unchanged."""
        try:
            st = self.path.stat()
            stamp: Optional[tuple[int, ...]] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            stamp = None
        hit = _PARSED.get(str(self.path))
        if stamp is not None and hit is not None and hit[0] == stamp:
            self._bad_rows = list(hit[2])
            return hit[1], hit[3]
        entries = self._parse()
        ordered = sorted(entries, key=lambda e: (e.created_at, e.run_id))
        by_id = {e.run_id: e for e in ordered}
        if stamp is not None:
            _PARSED[str(self.path)] = (stamp, ordered, list(self._bad_rows), by_id)
        return ordered, by_id

    def _parse(self) -> list[IndexEntry]:
        aside = f"move it aside (mv {self.path} {self.path}.bad) to start afresh; the run directories stay"
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self._bad_rows = []
            return []
        except UnicodeDecodeError as exc:
            raise TransportError(f"{self.path}: unreadable run index: not valid JSON (not UTF-8 text at byte "
                                 f"{exc.start}); {aside}") from None
        except OSError as exc:
            raise TransportError(f"{self.path}: cannot read the run index ({exc.strerror or exc})") from None
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            what = "the file is empty" if not raw.strip() else f"not valid JSON (line {exc.lineno}: {exc.msg})"
            raise TransportError(f"{self.path}: unreadable run index: {what}; {aside}") from None
        if not isinstance(data, dict):
            raise TransportError(f"{self.path}: the run index must be a JSON object "
                                 f'{{"schema": {INDEX_SCHEMA}, "runs": [...]}}, found {_json_kind(data)}; {aside}')
        if data.get("schema") != INDEX_SCHEMA:
            found = "no schema field" if "schema" not in data else f"schema {data.get('schema')!r}"
            raise TransportError(f"{self.path}: run index with {found}, expected schema {INDEX_SCHEMA} "
                                 f"(written by another lingjun-slurm version?); {aside}")
        rows = data.get("runs", [])
        if not isinstance(rows, list):
            raise TransportError(f"{self.path}: field runs must be a list of runs, found {_json_kind(rows)}; {aside}")
        entries, bad, problems = [], [], []
        for i, row in enumerate(rows):
            problem = _row_problem(row)
            if problem is None:
                entries.append(IndexEntry(**{k: row[k] for k in _FIELDS if k in row}))
            else:
                bad.append(row)
                problems.append(f"runs[{i}]: {problem}")
        self._bad_rows = bad
        said = f"{self.path}\0{problems}"
        if problems and said not in _WARNED:  # once per command, however many RunIndex objects read it
            _WARNED.add(said)
            one = len(problems) == 1
            sys.stderr.write(f"warning: {self.path}: skipping {len(problems)} entr{'y' if one else 'ies'}"
                             f" that {'is' if one else 'are'} not a run ({'; '.join(problems[:3])}"
                             f"{' ...' if len(problems) > 3 else ''}); "
                             f"{'it is' if one else 'they are'} kept as written: fix or delete "
                             f"{'it' if one else 'them'} by hand\n")
        return entries

    def _write(self, entries: list[IndexEntry]) -> None:
        """One run per line, each by json's C encoder (indent=1 took the pure-Python one: 24 ms per
        submit with 300 runs, issue 31); still one JSON document, still readable and editable by hand."""
        rows = [json.dumps({k: getattr(e, k) for k in _FIELDS}) for e in entries] + [json.dumps(r) for r in self._bad_rows]
        text = f'{{"schema": {INDEX_SCHEMA}, "runs": [\n' + ",\n".join(rows) + ("\n" if rows else "") + "]}\n"
        self._fs.write_atomic(str(self.path), text)
        # What was just written is the index now: the next read (the next submit's add) needs no parse.
        try:
            st = self.path.stat()
        except OSError:
            return
        ordered = sorted(entries, key=lambda e: (e.created_at, e.run_id))
        _PARSED[str(self.path)] = ((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns), ordered,
                                   list(self._bad_rows), {e.run_id: e for e in ordered})

    def check(self) -> None:
        """Raise the clear TransportError now if the index cannot be read (submit asks before writing)."""
        self._read()

    def entries(self) -> list[IndexEntry]:
        """Every run, oldest first."""
        return list(self._parsed()[0])

    def add(self, entry: IndexEntry) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with self._fs.lock(str(self.dir / "runs.lock")):
            entries = [e for e in self._read() if e.run_id != entry.run_id]
            entries.append(entry)
            self._write(entries)

    def remove(self, run_ids: list[str]) -> None:
        gone = set(run_ids)
        with self._fs.lock(str(self.dir / "runs.lock")):
            self._write([e for e in self._read() if e.run_id not in gone])

    def on(self, target: str = "", cluster: str = "") -> list[IndexEntry]:
        """Runs recorded on an SSH target (as written) or submitted with --cluster NAME; oldest first."""
        return [e for e in self.entries() if e.remote and ((target and e.host == target)
                                                          or (cluster and e.cluster == cluster))]

    def resolve(self, ref: str, *, target: str = "", cluster: str = "") -> IndexEntry:
        """RUN is a run id, a run name (run.name of the spec: the newest run with that name, and a
        note on stderr says which when several have it), a unique prefix of a run id, or a run
        directory; tried in that order.

        With a target (--host) or cluster (--cluster), the runs on that host are searched
        first, then every run (the target then only overrides how the run is reached). A
        remote run directory that no entry names is not looked up here (see cli/remote.py).
        """
        everything, by_id = self._parsed()
        exact = by_id.get(ref)
        if exact is not None and not (target or cluster):
            return exact  # a run id: no scan (status RUN... of 2,000 runs, issue 31)
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
        named = [e for e in entries if e.name == ref]  # entries are oldest first
        if named:
            chosen = named[-1]
            if len(named) > 1:
                sys.stderr.write(f"note: {len(named)} runs are named {ref!r}; using the newest, {chosen.run_id} "
                                 f"(give a run id for another: `lingjun-slurm list`)\n")
            return chosen
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
