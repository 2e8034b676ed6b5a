"""manifest.json: what was submitted, where, and as which jobs (schema pinned by MANIFEST_SCHEMA).

The manifest lives in the run directory beside the rendered scripts and the spec as
submitted. It is rewritten atomically, under the run's lock, whenever jobs change
(submit, resubmit, the local executor's progress). For a run on another host (the SSH
transport) every save and every load also refreshes the local mirror (runs/mirror.py).
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Optional

from ..common.errors import LingjunError, TransportError
from ..transport.base import Transport

MANIFEST_SCHEMA = 1
MANIFEST = "manifest.json"
LOCK = ".lock"


def _no_items() -> list[Any]:
    """default_factory of the list fields, instead of `list`: pydantic (the fallback reader's models,
    _pydantic_model) calls inspect.signature on every default factory (pydantic 2.14
    _internal/_fields.py takes_validated_data_argument), and for the builtin `list` that parses its
    text signature with tokenize, whose first use compiles tokenize's large regex."""
    return []


def _describe(text: str) -> dict[str, str]:
    return {"description": text}


class _Record:
    """The manifest's records are plain dataclasses (issue 15 item 9: `status` reads manifests
    without importing pydantic, about 60 ms). Their fields are the manifest's shape, and the one
    source of truth for both readers of a file (see _read): the strict reader, and the pydantic
    models built from the same fields when a file is not strictly of that shape. Constructed in
    code, a record copies its lists and dicts and makes an int given for a float a float, as the
    pydantic models these records replace did."""

    def __post_init__(self) -> None:
        for name, kind in _shape(type(self)).copies:
            value = getattr(self, name)
            if kind == "float":
                if type(value) is int:
                    setattr(self, name, float(value))
            elif kind == "list" and type(value) is list:
                setattr(self, name, list(value))
            elif kind == "dict" and type(value) is dict:
                setattr(self, name, dict(value))


@dataclass(kw_only=True)
class DependencyRecord(_Record):
    stage: str
    type: str
    job_ids: list[str] = field(default_factory=_no_items,
                               metadata=_describe("Upstream job ids at submit time; [] if none."))


@dataclass(kw_only=True)
class Attempt(_Record):
    job_ids: list[str]
    submitted_at: float
    replaced_at: Optional[float] = None
    reason: str = ""


@dataclass(kw_only=True)
class StageRecord(_Record):
    name: str
    kind: str
    script: str
    job_name: str
    array: Optional[str] = None
    job_ids: list[str] = field(default_factory=_no_items, metadata=_describe("Current job id(s); an array is one id."))
    depends_on: list[DependencyRecord] = field(default_factory=_no_items)
    submitted_at: Optional[float] = None
    nodes: int = 1
    ntasks: int = 1
    previous: list[Attempt] = field(default_factory=_no_items,
                                    metadata=_describe("Jobs replaced by resubmit, oldest first."))


@dataclass(kw_only=True)
class ClusterRecord(_Record):
    name: str = ""
    slurm_version: str = ""
    accounting: bool = False
    jobcomp_type: str = ""
    jobcomp_loc: str = ""


@dataclass(kw_only=True)
class TransportRecord(_Record):
    kind: str
    host: str


@dataclass(kw_only=True)
class DefaultsRecord(_Record):
    """Cluster defaults (clusters.yaml) that filled fields the spec left unset, as submitted."""

    cluster: str = ""
    applied: dict[str, str] = field(default_factory=dict,
                                    metadata=_describe('{"cluster.defaults.partition": "gpu", ...}'))


@dataclass(kw_only=True)
class SpecRecord(_Record):
    source: str
    file: str = "spec.yaml"
    sha256: str


@dataclass(kw_only=True)
class Manifest(_Record):
    schema_: int = field(default=MANIFEST_SCHEMA, metadata={"alias": "schema"})
    run_id: str
    name: str
    created_at: float
    updated_at: float
    tool_version: str
    user: str
    executor: Literal["slurm", "local"]
    transport: TransportRecord
    cluster: ClusterRecord = field(default_factory=ClusterRecord)
    spec: SpecRecord
    defaults: DefaultsRecord = field(default_factory=DefaultsRecord)
    run_dir: str
    log_dir: str
    state: Literal["submitting", "submitted", "failed"] = "submitting"
    shipped: list[str] = field(default_factory=_no_items, metadata=_describe("Wheels unpacked into <run_dir>/site."))
    stages: list[StageRecord] = field(default_factory=_no_items)
    events: list[dict[str, Any]] = field(default_factory=_no_items,
                                         metadata=_describe("submit / resubmit / cancel history."))

    def stage(self, name: str) -> StageRecord:
        for st in self.stages:
            if st.name == name:
                return st
        raise KeyError(name)

    def stage_names(self) -> list[str]:
        return [st.name for st in self.stages]

    def to_json(self) -> str:
        return json.dumps(_dump(self), indent=2) + "\n"

    def event(self, kind: str, **fields: Any) -> None:
        self.events.append({"event": kind, "at": round(time.time(), 3), **fields})


# --- the manifest's shape, from the dataclasses above -------------------------------------------

# pydantic model_config of the fallback models beyond extra="ignore"
_CONFIG: dict[type, dict[str, Any]] = {Manifest: {"populate_by_name": True}}


class _Field:
    """One field of a record: its name, its key in the file (the alias), its resolved annotation."""

    __slots__ = ("name", "key", "kind", "required")

    def __init__(self, name: str, key: str, kind: Any, required: bool) -> None:
        self.name, self.key, self.kind, self.required = name, key, kind, required


class _Shape:
    """A record class's fields in file order, and the fields __post_init__ copies or makes floats
    ("float" | "list" | "dict"). Plain classes, not dataclasses: each dataclass costs start-up."""

    __slots__ = ("fields", "copies")

    def __init__(self, fields: list[_Field], copies: list[tuple[str, str]]) -> None:
        self.fields, self.copies = fields, copies


_SHAPES: dict[type, _Shape] = {}


def _shape(cls: type) -> _Shape:
    got = _SHAPES.get(cls)
    if got is None:
        import typing

        hints = typing.get_type_hints(cls)
        fields, copies = [], []
        for f in dataclasses.fields(cls):  # in the file in this order, as the pydantic models wrote it
            name, kind = f.name, hints[f.name]
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            fields.append(_Field(name, f.metadata.get("alias", name), kind, required))
            base = _optional_of(kind)
            if base is float:
                copies.append((name, "float"))
            elif typing.get_origin(base) in (list, dict):
                copies.append((name, typing.get_origin(base).__name__))
        got = _SHAPES[cls] = _Shape(fields, copies)
    return got


def _optional_of(kind: Any) -> Any:
    """X for Optional[X], else kind."""
    import typing

    if typing.get_origin(kind) is typing.Union:
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind


class _NotStrict(Exception):
    """The file is not strictly of the manifest's shape: the pydantic models decide (_read)."""


def _strict(kind: Any, value: Any) -> Any:
    """value as `kind`, when it is exactly of that JSON shape (a str for str, an int and not a bool
    for int, an int or a float for float, a list for list, an object for a record...), where the
    pydantic models would give the same value; anything else raises _NotStrict."""
    import typing

    if kind is str or kind is bool:
        if type(value) is not kind:
            raise _NotStrict
        return value
    if kind is int:
        if type(value) is not int:
            raise _NotStrict
        return value
    if kind is float:
        if type(value) is float:
            return value
        if type(value) is int and -(1 << 53) <= value <= 1 << 53:
            return float(value)
        raise _NotStrict
    if kind is Any:
        return value
    known = _KINDS.get(kind)
    if known is None:  # typing's introspection once per type, not per value (status loads 2,000 manifests)
        known = _KINDS[kind] = (dataclasses.is_dataclass(kind), typing.get_origin(kind), typing.get_args(kind))
    is_record, origin, type_args = known
    if is_record:
        if type(value) is not dict:
            raise _NotStrict
        args = {}
        for f in _shape(kind).fields:
            if f.key != f.name and f.name in value:
                raise _NotStrict  # populate_by_name: which one wins is pydantic's to say
            if f.key in value:
                args[f.name] = _strict(f.kind, value[f.key])
            elif f.required:
                raise _NotStrict
        return kind(**args)
    if origin is list:
        if type(value) is not list:
            raise _NotStrict
        (item,) = type_args
        return [_strict(item, v) for v in value]
    if origin is dict:
        if type(value) is not dict:
            raise _NotStrict
        key, item = type_args
        if key is not str:
            raise _NotStrict
        return {k: _strict(item, v) for k, v in value.items()}
    if origin is Literal:
        if type(value) is not str or value not in type_args:
            raise _NotStrict
        return value
    if origin is typing.Union:
        if value is None and type(None) in type_args:
            return None
        return _strict(_optional_of(kind), value)
    raise _NotStrict


# kind -> (is a record dataclass, typing.get_origin, typing.get_args), filled by _strict.
_KINDS: dict[Any, tuple[bool, Any, tuple[Any, ...]]] = {}


_MODELS: dict[type, Any] = {}


def _pydantic_model(cls: type) -> Any:
    """The pydantic model of a record class: same name, fields, types, defaults and aliases, with
    extra="ignore" (and Manifest's populate_by_name), as the models these records replace."""
    got = _MODELS.get(cls)
    if got is None:
        from pydantic import ConfigDict, Field, create_model

        fields: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            shaped = next(s for s in _shape(cls).fields if s.name == f.name)
            options: dict[str, Any] = {}
            if f.default_factory is not dataclasses.MISSING:
                options["default_factory"] = (_pydantic_model(f.default_factory)  # type: ignore[arg-type]
                                              if dataclasses.is_dataclass(f.default_factory) else f.default_factory)
            elif f.default is not dataclasses.MISSING:
                options["default"] = f.default
            options.update(f.metadata)  # alias, description
            fields[f.name] = (_swap(shaped.kind), Field(**options))
        got = _MODELS[cls] = create_model(  # type: ignore[call-overload]
            cls.__name__, __config__=ConfigDict(extra="ignore", **_CONFIG.get(cls, {})), **fields)
    return got


def _swap(kind: Any) -> Any:
    """kind with each record class in it replaced by its pydantic model."""
    import typing

    if dataclasses.is_dataclass(kind):
        return _pydantic_model(kind)  # type: ignore[arg-type]
    origin = typing.get_origin(kind)
    if origin is list:
        return list[_swap(typing.get_args(kind)[0])]  # type: ignore[misc]
    if origin is dict:
        key, item = typing.get_args(kind)
        return dict[key, _swap(item)]  # type: ignore[valid-type]
    if origin is typing.Union:
        return typing.Union[tuple(_swap(a) for a in typing.get_args(kind))]
    return kind


def _read(path: str, data: dict[str, Any]) -> Manifest:
    """The Manifest in a manifest file's data. The strict reader takes a file written by this
    tool; anything else (hand-edited: a "2" for a number, a field missing, a wrong type) goes to
    the pydantic models of the same records, which coerce it or name its first error exactly as
    the pydantic Manifest model did before issue 15 item 9."""
    try:
        return _strict(Manifest, data)  # type: ignore[no-any-return]
    except _NotStrict:
        pass
    from pydantic import ValidationError

    try:
        model = _pydantic_model(Manifest).model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise TransportError(f"{path}: {where}: {first['msg']}") from None
    return _strict(Manifest, model.model_dump(by_alias=True))  # type: ignore[no-any-return]


def _dump(value: Any, kind: Any = None) -> Any:
    """What model_dump(mode="json", by_alias=True) of the pydantic models gave: fields by alias in
    their order, and in the Any-typed values (events) tuples as lists and NaN and infinities as null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.key: _dump(getattr(value, f.name), f.kind) for f in _shape(type(value)).fields}
    if isinstance(value, (list, tuple)):
        import typing

        args = typing.get_args(_optional_of(kind)) if kind not in (None, Any) else ()
        return [_dump(v, args[0] if args else kind) for v in value]
    if isinstance(value, dict):
        import typing

        args = typing.get_args(_optional_of(kind)) if kind not in (None, Any) else ()
        return {k: _dump(v, args[1] if len(args) == 2 else kind) for k, v in value.items()}
    if kind is Any and type(value) is float and not math.isfinite(value):
        return None
    return value


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
    manifest = _read(path, data)
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


def load_mirrored(run_id: str) -> Optional[Manifest]:
    """The manifest of a remote run as last mirrored on this machine (runs/mirror.py), or None."""
    from . import mirror
    from ..transport.local import LocalTransport

    where = mirror.mirror_dir(run_id)
    if where is None or not (where / "manifest.json").is_file():
        return None
    try:
        return load_manifest(LocalTransport(), str(where))
    except LingjunError:
        return None
