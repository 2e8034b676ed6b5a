"""Read a spec file: YAML with line numbers -> pydantic Spec -> cross-field checks.

Every problem becomes an Issue naming file, line and dotted field path; all of them
are reported at once as one SpecError (exit code 2 at the CLI).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..errors import Issue, Loc, SpecError
from . import models
from .checks import check
from .models import Spec
from .yamlpos import YamlDocument, YamlParseError, load_yaml

_PATTERN_HELP = {
    models.NAME_RE: "letters, digits, '.', '_' and '-' (starting with a letter or digit, at most 63)",
    models.SLURM_WORD_RE: "a Slurm name: letters, digits and . _ + - (comma-separated for several); "
                          "it goes on an #SBATCH line, which cannot be quoted",
    models.CONSTRAINT_RE: "a Slurm constraint expression of letters, digits and . _ & | [ ] * ( ) ! : , -",
    models.SAFE_PATH_RE: "an absolute path of letters, digits and . _ + @ = / - only: it goes on #SBATCH lines or "
                         "pyxis mount lists, which cannot be quoted",
    models.ENV_NAME_RE: "an environment variable name (letters, digits, '_'; not starting with a digit)",
    r"^/[^\x00]*$": "an absolute path (starting with '/'): it is used on the cluster's nodes",
    r"^[^\x00]*$": "text without NUL bytes",
}
_TAG_RE = re.compile(r"[\[\](),]")


@dataclass(frozen=True)
class LoadedSpec:
    spec: Spec
    source: str
    text: str
    sha256: str
    doc: YamlDocument


def _clean_loc(loc: tuple[Any, ...], data: Any) -> Loc:
    """Drop pydantic's union-member tags ('str', 'Mount', 'function-after[...]') from a location."""
    out: list[str | int] = []
    cur = data
    for part in loc:
        if isinstance(cur, dict) and part in cur:
            out.append(part)
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, int) and part < len(cur):
            out.append(part)
            cur = cur[part]
        elif isinstance(part, str) and (_TAG_RE.search(part) or part[:1].isupper() or
                                        part in ("str", "int", "float", "bool", "none")):
            continue
        else:
            out.append(part)
            cur = None
    return tuple(out)


def _allowed_fields(loc: Loc) -> list[str] | None:
    """Field names of the model at loc (for 'unknown field' messages)."""
    model: Any = Spec
    skip_key = False
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if skip_key:  # the key of a dict[str, Model] field (e.g. cluster.stages.train)
            skip_key = False
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        skip_key = getattr(field.annotation, "__origin__", None) is dict
        model = _model_in(field.annotation)
    return sorted(model.model_fields) if model is not None and hasattr(model, "model_fields") else None


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, models.Strict):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _message(err: dict[str, Any], loc: Loc) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_fields(loc)
        return "unknown field" + (f"; expected one of: {', '.join(allowed)}" if allowed else "")
    if kind == "missing":
        return "required field is missing"
    if kind == "string_pattern_mismatch":
        pattern = err.get("ctx", {}).get("pattern", "")
        return f"expected {_PATTERN_HELP.get(pattern, 'a value matching ' + pattern)}; got {err['input']!r}"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if "input" in err and kind.endswith(("_type", "_parsing")) and kind not in ("model_type", "dict_type"):
        shown = repr(err["input"])
        msg += f" (got {shown[:80] + '...' if len(shown) > 80 else shown})"
    return msg


def issues_from_validation(exc: ValidationError, doc: YamlDocument) -> list[Issue]:
    issues: dict[tuple[Loc, str], Issue] = {}
    errors = [(err, _clean_loc(err["loc"], doc.data)) for err in exc.errors()]
    deeper = {loc[:n] for _err, loc in errors for n in range(len(loc))}
    for err, loc in errors:
        if err["type"].endswith("_type") and loc in deeper:
            continue  # a union's other branch failed deeper down: that message is the useful one
        message = _message(err, loc)
        issues.setdefault((loc, message), Issue(loc, message, doc.line_of(loc)))
    return list(issues.values())


def parse_spec(text: str, source: str) -> LoadedSpec:
    """Validate spec text; raises SpecError listing every problem."""
    try:
        doc = load_yaml(text)
    except YamlParseError as exc:
        raise SpecError(source, [exc.issue]) from None
    if not isinstance(doc.data, dict):
        raise SpecError(source, [Issue((), "the spec must be a YAML mapping (run:, cluster:, ...)", 1)])
    try:
        spec = Spec.model_validate(doc.data)
    except ValidationError as exc:
        raise SpecError(source, _sorted(issues_from_validation(exc, doc))) from None
    issues = [Issue(i.loc, i.message, doc.line_of(i.loc)) for i in check(spec)]
    if issues:
        raise SpecError(source, _sorted(issues))
    return LoadedSpec(spec, source, text, hashlib.sha256(text.encode()).hexdigest(), doc)


def _sorted(issues: list[Issue]) -> list[Issue]:
    return sorted(issues, key=lambda i: (i.line or 0, str(i.loc)))


def read_spec_text(path: str | Path) -> str:
    """A spec file's text (SpecError naming the file if it cannot be read)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(str(path), [Issue((), "no such file")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(str(path), [Issue((), f"cannot read the spec: {exc}")]) from None


def load_spec(path: str | Path) -> LoadedSpec:
    """Read and validate a spec file (SpecError if unreadable or invalid)."""
    return parse_spec(read_spec_text(path), str(path))
