"""The local copy of a remote run's record: <state dir>/runs/<run-id>/.

A run submitted over SSH lives on the cluster (its run directory, the record of truth) and,
for this machine, in a mirror beside the index:

    <state dir>/runs/<run-id>/
        manifest.json    rewritten whenever a command here reads or changes the remote one
        spec.yaml        the spec as submitted, spec.sha256, the rendered scripts, plan.json
        status.json      the last status seen here: {"as_of": EPOCH, "run": {...}} (schema 1 run)

`list` reads only the index; `status` falls back to manifest.json + status.json (labelled
stale) when the host cannot be reached. A failure to write the mirror never fails the remote
operation: it is reported on stderr and the remote record stays authoritative.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Optional, Protocol

from ..common.errors import LingjunError
from ..transport.local import LocalTransport
from .statedir import state_dir


class _Manifest(Protocol):
    """What the mirror needs of runs/manifest.py's Manifest (that module writes through this one)."""

    run_id: str

    def to_json(self) -> str: ...


_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # spec NAME_RE: a safe directory name
STATUS_FILE = "status.json"


def mirror_dir(run_id: str) -> Optional[Path]:
    """The mirror of a run; None for a run id that is not a safe directory name."""
    if not _RUN_ID_RE.match(run_id):
        return None
    return state_dir() / "runs" / run_id


def _warn(run_id: str, exc: Exception) -> None:
    print(f"warning: the local copy of run {run_id}'s record was not updated: {exc}", file=sys.stderr)


def save_files(run_id: str, files: dict[str, str | bytes]) -> None:
    where = mirror_dir(run_id)
    if where is None:
        return
    fs = LocalTransport()
    try:
        where.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            if "/" in name or name.startswith("."):
                continue
            fs.write_atomic(str(where / name), data)
    except (OSError, LingjunError) as exc:
        _warn(run_id, exc)


def save_manifest(manifest: _Manifest) -> None:
    """Write manifest.json when it differs from the copy already there."""
    where = mirror_dir(manifest.run_id)
    if where is None:
        return
    text = manifest.to_json()
    try:
        if (where / "manifest.json").read_text(encoding="utf-8") == text:
            return
    except (OSError, UnicodeDecodeError):
        pass
    save_files(manifest.run_id, {"manifest.json": text})


def save_status(run_id: str, run: dict[str, Any]) -> None:
    save_files(run_id, {STATUS_FILE: json.dumps({"as_of": round(time.time(), 3), "run": run}, indent=1) + "\n"})


def load_status(run_id: str) -> Optional[tuple[float, dict[str, Any]]]:
    """(as_of, the run's status document) from the last status seen here, or None."""
    where = mirror_dir(run_id)
    if where is None:
        return None
    try:
        doc = json.loads((where / STATUS_FILE).read_text(encoding="utf-8"))
        return float(doc["as_of"]), dict(doc["run"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove(run_id: str) -> None:
    where = mirror_dir(run_id)
    if where is not None:
        shutil.rmtree(where, ignore_errors=True)
