"""manifest.json: what was submitted, where, and as which jobs (schema pinned by MANIFEST_SCHEMA).

The manifest lives in the run directory beside the rendered scripts and the spec as
submitted. It is rewritten atomically, under the run's lock, whenever jobs change
(submit, resubmit, the local executor's progress). For a run on another host (the SSH
transport) every save and every load also refreshes the local mirror (runs/mirror.py).
"""

from __future__ import annotations

import getpass
import json
import time
from contextlib import contextmanager
from typing import Any, Iterator, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import TransportError
from ..transport.base import Transport

MANIFEST_SCHEMA = 1
MANIFEST = "manifest.json"
LOCK = ".lock"


def _no_items() -> list[Any]:
    """default_factory of the list fields, instead of `list`: pydantic calls inspect.signature on
    every default factory (pydantic 2.14 _internal/_fields.py takes_validated_data_argument),
    and for the builtin `list` that parses its text signature with tokenize, whose first use
    compiles tokenize's large regex (10-20 ms of a `status`; issue 15 item 9)."""
    return []


class _Model(BaseModel):
    """Built on first use (defer_build): only Manifest's validator is made, when a manifest is
    read or written, not one per record class at import (issue 15 item 9)."""

    model_config = ConfigDict(extra="ignore", defer_build=True)


class DependencyRecord(_Model):
    stage: str
    type: str
    job_ids: list[str] = Field(default_factory=_no_items, description="Upstream job ids at submit time; [] if none.")


class Attempt(_Model):
    job_ids: list[str]
    submitted_at: float
    replaced_at: Optional[float] = None
    reason: str = ""


class StageRecord(_Model):
    name: str
    kind: str
    script: str
    job_name: str
    array: Optional[str] = None
    job_ids: list[str] = Field(default_factory=_no_items, description="Current job id(s); an array is one id.")
    depends_on: list[DependencyRecord] = Field(default_factory=_no_items)
    submitted_at: Optional[float] = None
    nodes: int = 1
    ntasks: int = 1
    previous: list[Attempt] = Field(default_factory=_no_items, description="Jobs replaced by resubmit, oldest first.")


class ClusterRecord(_Model):
    name: str = ""
    slurm_version: str = ""
    accounting: bool = False
    jobcomp_type: str = ""
    jobcomp_loc: str = ""


class TransportRecord(_Model):
    kind: str
    host: str


class DefaultsRecord(_Model):
    """Cluster defaults (clusters.yaml) that filled fields the spec left unset, as submitted."""

    cluster: str = ""
    applied: dict[str, str] = Field(default_factory=dict, description='{"cluster.defaults.partition": "gpu", ...}')


class SpecRecord(_Model):
    source: str
    file: str = "spec.yaml"
    sha256: str


class Manifest(_Model):
    schema_: int = Field(MANIFEST_SCHEMA, alias="schema")
    run_id: str
    name: str
    created_at: float
    updated_at: float
    tool_version: str
    user: str
    executor: Literal["slurm", "local"]
    transport: TransportRecord
    cluster: ClusterRecord = Field(default_factory=ClusterRecord)
    spec: SpecRecord
    defaults: DefaultsRecord = Field(default_factory=DefaultsRecord)
    run_dir: str
    log_dir: str
    state: Literal["submitting", "submitted", "failed"] = "submitting"
    shipped: list[str] = Field(default_factory=_no_items, description="Wheels unpacked into <run_dir>/site.")
    stages: list[StageRecord] = Field(default_factory=_no_items)
    events: list[dict[str, Any]] = Field(default_factory=_no_items, description="submit / resubmit / cancel history.")

    model_config = ConfigDict(extra="ignore", populate_by_name=True, defer_build=True)

    def stage(self, name: str) -> StageRecord:
        for st in self.stages:
            if st.name == name:
                return st
        raise KeyError(name)

    def stage_names(self) -> list[str]:
        return [st.name for st in self.stages]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=2) + "\n"

    def event(self, kind: str, **fields: Any) -> None:
        self.events.append({"event": kind, "at": round(time.time(), 3), **fields})


def current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def manifest_path(run_dir: str) -> str:
    return f"{run_dir.rstrip('/')}/{MANIFEST}"


def load_manifest(transport: Transport, run_dir: str) -> Manifest:
    path = manifest_path(run_dir)
    try:
        raw = transport.read_text(path)
    except FileNotFoundError:
        raise TransportError(f"{path}: no run manifest (not a lingjun-slurm run directory?)") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TransportError(f"{path}: not valid JSON (line {exc.lineno}): {exc.msg}") from None
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else None
        raise TransportError(f"{path}: manifest schema {found!r}; this lingjun-slurm reads schema {MANIFEST_SCHEMA}")
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise TransportError(f"{path}: {where}: {first['msg']}") from None
    if transport.kind != "local":
        from . import mirror

        mirror.save_manifest(manifest)
    return manifest


def save_manifest(transport: Transport, manifest: Manifest) -> None:
    manifest.updated_at = round(time.time(), 3)
    transport.write_atomic(manifest_path(manifest.run_dir), manifest.to_json())
    if transport.kind != "local":
        from . import mirror

        mirror.save_manifest(manifest)


@contextmanager
def locked_manifest(transport: Transport, run_dir: str) -> Iterator[Manifest]:
    """Read-modify-write under the run's lock; the manifest is saved when the block succeeds."""
    with transport.lock(f"{run_dir.rstrip('/')}/{LOCK}"):
        manifest = load_manifest(transport, run_dir)
        yield manifest
        save_manifest(transport, manifest)
