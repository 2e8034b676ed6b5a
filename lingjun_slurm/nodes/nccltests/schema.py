"""report.json's JSON Schema (report.schema.json, beside this module) and a checker for it.

jsonschema is not a dependency of lingjun-slurm, so this checks the JSON Schema keywords the schema
uses, as JSON Schema 2020-12 defines them: type (with "integer" for whole numbers, bool not a
number), const, enum, minimum, required, properties, additionalProperties (false only), items,
oneOf and local "$ref": "#/$defs/NAME". Any other keyword is refused, so the schema cannot grow a
rule this checker would silently skip.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

_ANNOTATIONS = {"$schema", "$id", "title", "description", "$defs"}
_KEYWORDS = {"type", "const", "enum", "minimum", "required", "properties", "additionalProperties", "items",
             "oneOf", "$ref"} | _ANNOTATIONS
_TYPES = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


@lru_cache(maxsize=1)
def report_schema() -> dict[str, Any]:
    """The schema shipped in the package (lingjun_slurm/nodes/nccltests/report.schema.json)."""
    text = resources.files(__package__).joinpath("report.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def validate(doc: Any, schema: dict[str, Any] | None = None) -> list[str]:
    """Every way doc breaks the schema, as 'PATH: what' lines; [] when it conforms."""
    root = schema if schema is not None else report_schema()
    errors: list[str] = []
    _check(doc, root, root, "$", errors)
    return errors


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    prefix = "#/$defs/"
    if not ref.startswith(prefix) or ref[len(prefix):] not in root.get("$defs", {}):
        raise ValueError(f"unsupported or unknown $ref {ref!r}")
    return root["$defs"][ref[len(prefix):]]


def _type_name(value: Any) -> str:
    return next((name for name in ("null", "boolean", "integer", "number", "string", "array", "object")
                 if _TYPES[name](value)), type(value).__name__)


def _check(value: Any, schema: dict[str, Any], root: dict[str, Any], path: str, errors: list[str]) -> None:
    unknown = set(schema) - _KEYWORDS
    if unknown:
        raise ValueError(f"schema keyword(s) {sorted(unknown)} at {path} are not supported by this checker")
    if "$ref" in schema:
        _check(value, _resolve(schema["$ref"], root), root, path, errors)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            errors.append(f"{path}: expected {' or '.join(types)}, got {_type_name(value)} {value!r:.60}")
            return
    if "const" in schema and (value != schema["const"] or type(value) is not type(schema["const"])):
        errors.append(f"{path}: expected {schema['const']!r}, got {value!r:.60}")
    if "enum" in schema and not any(value == e and type(value) is type(e) for e in schema["enum"]):
        errors.append(f"{path}: {value!r:.60} is not one of {schema['enum']}")
    if "minimum" in schema and _TYPES["number"](value) and value < schema["minimum"]:
        errors.append(f"{path}: {value} is below the minimum {schema['minimum']}")
    if "oneOf" in schema:
        matches = 0
        for option in schema["oneOf"]:
            sub: list[str] = []
            _check(value, option, root, path, sub)
            matches += not sub
        if matches != 1:
            errors.append(f"{path}: matches {matches} of the oneOf alternatives, not exactly one")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing required {key!r}")
        props = schema.get("properties", {})
        if schema.get("additionalProperties", True) is False:
            errors += [f"{path}: unexpected property {key!r}" for key in value if key not in props]
        elif schema.get("additionalProperties", True) is not True:
            raise ValueError(f"additionalProperties other than true/false at {path} is not supported")
        for key, sub_schema in props.items():
            if key in value:
                _check(value[key], sub_schema, root, f"{path}.{key}", errors)
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], root, f"{path}[{i}]", errors)
