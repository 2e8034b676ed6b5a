"""runs/manifest.py reads manifest.json without pydantic (issue 15 item 9): the records are plain
dataclasses, a file of exactly their shape is read by the strict reader, and any other file by
pydantic models built from the same dataclasses. This checks both against the pydantic models the
records replaced (copied below as they were), file by file: the same values, the same first
error, and the same bytes written back."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest
from pydantic import ValidationError

from lingjun_slurm.common.errors import TransportError
from lingjun_slurm.runs import manifest as mod
from lingjun_slurm.runs.manifest import (Attempt, ClusterRecord, DependencyRecord, Manifest, SpecRecord, StageRecord,
                                         TransportRecord, load_manifest, save_manifest)
from lingjun_slurm.transport.local import LocalTransport
from tests.conftest import REPO

# --- the pydantic models as they were before issue 15 item 9 (the reference) ---------------------

# Executed in a namespace of its own: the class names are the ones in pydantic's messages.
OLD_MODELS = """
from typing import Any, Literal, Optional
from pydantic import BaseModel, ConfigDict, Field

MANIFEST_SCHEMA = 1


def _no_items() -> list[Any]:
    return []


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)


class DependencyRecord(_Model):
    stage: str
    type: str
    job_ids: list[str] = Field(default_factory=_no_items)


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
    job_ids: list[str] = Field(default_factory=_no_items)
    depends_on: list[DependencyRecord] = Field(default_factory=_no_items)
    submitted_at: Optional[float] = None
    nodes: int = 1
    ntasks: int = 1
    previous: list[Attempt] = Field(default_factory=_no_items)


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
    cluster: str = ""
    applied: dict[str, str] = Field(default_factory=dict)


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
    shipped: list[str] = Field(default_factory=_no_items)
    stages: list[StageRecord] = Field(default_factory=_no_items)
    events: list[dict[str, Any]] = Field(default_factory=_no_items)

    model_config = ConfigDict(extra="ignore", populate_by_name=True, defer_build=True)
"""
_old: dict[str, Any] = {}
exec(compile(OLD_MODELS, "<manifest models before issue 15 item 9>", "exec", dont_inherit=True), _old)  # noqa: S102
OldManifest = _old["Manifest"]


def old_read(data: dict[str, Any]) -> tuple[str, Any]:
    """("ok", the old model's json dump) or ("error", the message load_manifest made of it)."""
    try:
        m = OldManifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        return "error", f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return "ok", json.dumps(m.model_dump(mode="json", by_alias=True), indent=2) + "\n"


def new_read(tmp_path: Path, data: Any) -> tuple[str, Any]:
    (tmp_path / "manifest.json").write_text(json.dumps(data), encoding="utf-8")
    try:
        m = load_manifest(LocalTransport(), str(tmp_path))
    except TransportError as exc:
        return "error", str(exc).removeprefix(f"{tmp_path}/manifest.json: ")
    return "ok", m.to_json()


# --- manifests to read ---------------------------------------------------------------------------

def written() -> dict[str, Any]:
    """A manifest as this tool writes it: two stages, a dependency, a resubmit, events."""
    stage = {"name": "a", "kind": "command", "script": "a.sbatch", "job_name": "r-a", "array": None, "job_ids": ["1"],
             "depends_on": [], "submitted_at": 1700000000.5, "nodes": 1, "ntasks": 1, "previous": []}
    second = {**stage, "name": "b", "script": "b.sbatch", "job_name": "r-b", "array": "0-3%2", "job_ids": ["3"],
              "depends_on": [{"stage": "a", "type": "afterok", "job_ids": ["1"]}], "nodes": 2, "ntasks": 16,
              "previous": [{"job_ids": ["2"], "submitted_at": 1700000000.25, "replaced_at": 1700000001.0,
                            "reason": "resubmit --from b"}]}
    return {"schema": 1, "run_id": "r", "name": "n", "created_at": 1700000000.123, "updated_at": 1700000002.0,
            "tool_version": "0.1.0", "user": "u", "executor": "slurm", "transport": {"kind": "ssh", "host": "login"},
            "cluster": {"name": "c", "slurm_version": "23.02.1", "accounting": True, "jobcomp_type": "jobcomp/none",
                        "jobcomp_loc": ""},
            "spec": {"source": "/s.yaml", "file": "spec.yaml", "sha256": "ab"},
            "defaults": {"cluster": "c", "applied": {"cluster.defaults.partition": "gpu"}},
            "run_dir": "/w/runs/r", "log_dir": "/w/logs", "state": "submitted", "shipped": ["x.whl"],
            "stages": [stage, second],
            "events": [{"event": "submit", "at": 1700000000.2, "stages": ["a", "b"]},
                       {"event": "odd", "at": 1, "nested": {"x": [1, 2.5, None, True]}}]}


VALUES: list[Any] = [None, True, False, 0, 1, 2, -1, 1.0, 2.5, float("nan"), float("inf"), 10 ** 30, "", "x", "1",
                     "2.5", "true", "yes", "local", "slurm", [], ["1"], [1], {}, {"a": 1}, {"kind": "local"}]


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key and index path in a JSON document."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield prefix + (k,)
            yield from paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield prefix + (i,)
            yield from paths(v, prefix + (i,))


def variants() -> Iterator[tuple[str, dict[str, Any]]]:
    """The written manifest, then each field missing, and each field set to each of VALUES."""
    base = written()
    yield "as written", base
    for path in paths(base):
        if path == ("schema",):
            continue  # load_manifest checks the schema before either reader
        parent_path, key = path[:-1], path[-1]
        if isinstance(key, str):
            doc = copy.deepcopy(base)
            parent = doc
            for p in parent_path:
                parent = parent[p]
            del parent[key]
            yield f"no {path}", doc
        for value in VALUES:
            doc = copy.deepcopy(base)
            parent = doc
            for p in parent_path:
                parent = parent[p]
            parent[key] = value
            yield f"{path} = {value!r}", doc
    for extra in ({"schema_": 2}, {"unknown": 1}, {"schema": 1.0}, {"schema": True}):
        yield f"with {extra}", {**base, **extra}
    minimal = {k: base[k] for k in ("schema", "run_id", "name", "created_at", "updated_at", "tool_version", "user",
                                    "executor", "transport", "spec", "run_dir", "log_dir")}
    yield "minimal", minimal
    yield "int times", {**minimal, "created_at": 5, "updated_at": 6}


CASES = list(variants())


def test_every_variant_reads_as_the_old_models_read_it(tmp_path: Path) -> None:
    """The same value written back, or the same first error, as the old pydantic models, for each
    of several hundred hand-edited manifests."""
    assert len(CASES) > 500
    differ = []
    for label, doc in CASES:
        old, new = old_read(doc), new_read(tmp_path, doc)
        if old != new:
            differ.append((label, old, new))
    assert differ == []


def test_a_written_manifest_takes_the_strict_reader_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A manifest this tool wrote never reaches pydantic."""
    def refuse(cls: type) -> Any:
        raise AssertionError(f"pydantic model of {cls.__name__} asked for")

    monkeypatch.setattr(mod, "_pydantic_model", refuse)
    doc = written()
    assert new_read(tmp_path, doc) == old_read(doc)


def test_records_built_in_code_copy_their_lists_and_make_ints_floats() -> None:
    """As the pydantic models did on construction: no list shared with the caller, a float field
    given an int holds a float (and is written as 5.0)."""
    ids = ["1"]
    rec = StageRecord(name="a", kind="command", script="a.sbatch", job_name="r-a", job_ids=ids, submitted_at=5)
    ids.append("2")
    assert rec.job_ids == ["1"] and type(rec.submitted_at) is float
    attempt = Attempt(job_ids=rec.job_ids, submitted_at=1)
    rec.job_ids.append("3")
    assert attempt.job_ids == ["1"] and attempt.submitted_at == 1.0
    dep = DependencyRecord(stage="a", type="afterok")
    assert dep.job_ids == [] and DependencyRecord(stage="a", type="afterok").job_ids is not dep.job_ids
    with pytest.raises(TypeError):
        TransportRecord("local", "h")  # type: ignore[misc]  # keywords only, as pydantic's models


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    m = Manifest(run_id="r", name="n", created_at=1, updated_at=2, tool_version="0", user="u", executor="local",
                 transport=TransportRecord(kind="local", host="h"), cluster=ClusterRecord(name="local"),
                 spec=SpecRecord(source="s.yaml", sha256="0"), run_dir=str(tmp_path), log_dir=str(tmp_path),
                 stages=[StageRecord(name="a", kind="command", script="a.sbatch", job_name="r-a", job_ids=["1"])])
    m.event("submit", stages=m.stage_names())
    save_manifest(LocalTransport(), m)
    back = load_manifest(LocalTransport(), str(tmp_path))
    assert back == m and back.to_json() == m.to_json()
    text = (tmp_path / "manifest.json").read_text()
    assert json.loads(text)["schema"] == 1 and '"created_at": 1.0' in text
    assert old_read(json.loads(text)) == ("ok", text)


def test_reading_a_manifest_imports_no_pydantic(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps(written()), encoding="utf-8")
    code = textwrap.dedent(f"""
        import sys
        from lingjun_slurm.runs.manifest import load_manifest
        from lingjun_slurm.transport.local import LocalTransport
        m = load_manifest(LocalTransport(), {str(tmp_path)!r})
        m.to_json()
        print(sorted(x for x in sys.modules if x.split(".")[0] in ("pydantic", "pydantic_core", "yaml")))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
