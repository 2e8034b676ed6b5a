"""Read a spec file: YAML with line numbers -> pydantic Spec -> cross-field checks.

Every problem becomes an Issue naming file, line and dotted field path; all of them
are reported at once as one SpecError (exit code 2 at the CLI).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..common.errors import Issue, Loc, SpecError
from . import models
from .checks import check
from .models import Spec
from .yamlpos import MAX_BYTES, YamlDocument, YamlParseError, field_at_line, load_yaml

# More problems than this are summed up in one last line: a spec of 20000 bad values would
# otherwise print 20000 lines.
MAX_ISSUES = 50

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
        return f"expected {_PATTERN_HELP.get(pattern, 'a value matching ' + pattern)}; got {_shown(err['input'])}"
    msg = err["msg"]
    if kind == "less_than_equal":
        reason = models.FIELD_LIMIT_REASONS.get(str(loc[-1]) if loc else "") or \
            models.LIMIT_REASONS.get(err.get("ctx", {}).get("le"))
        msg += f" ({reason})" if reason else ""
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if "input" in err and kind.endswith(("_type", "_parsing")) and kind not in ("model_type", "dict_type"):
        msg += f" (got {_shown(err['input'])})"
    elif kind == "finite_number":
        msg += f" (got {_shown(err['input'])}: NaN and infinities such as .nan, .inf or 1.0e+400 cannot be used)"
    return msg


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text[:limit] + "..." if len(text) > limit else text


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
    except RecursionError:  # yamlpos's depth limit keeps far from it; never a traceback
        raise SpecError(source, [Issue((), "nested too deeply")]) from None
    issues = [Issue(i.loc, i.message, doc.line_of(i.loc)) for i in check(spec)]
    if issues:
        raise SpecError(source, _sorted(issues))
    return LoadedSpec(spec, source, text, hashlib.sha256(text.encode()).hexdigest(), doc)


def _sorted(issues: list[Issue]) -> list[Issue]:
    ordered = sorted(issues, key=lambda i: (i.line or 0, str(i.loc)))
    if len(ordered) > MAX_ISSUES:
        rest = len(ordered) - MAX_ISSUES
        ordered = ordered[:MAX_ISSUES] + [Issue((), f"{rest} more problem{'s' if rest != 1 else ''} not shown")]
    return ordered


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


STDIN_NAMES = ("-",)
STDIN_SOURCE = "<stdin>"
# How long a FIFO is given to deliver its first bytes (or its end): `<(envsubst ...)` writes at
# once; a named FIFO nobody writes to is refused after this, never waited on forever.
FIFO_WAIT_S = 10.0


def _writer_wrote(fd: int, wait_s: float) -> bool:
    """Wait for a FIFO opened O_NONBLOCK to have bytes, or an end after a writer came; then make it
    blocking, so the reads that follow wait for the writer as cat's would. False after wait_s.

    On Linux, poll(2) on a FIFO's read end reports POLLHUP only once a writer has come and gone
    (fs/pipe.c pipe_poll: "POLLHUP only if there was a writer since the open"), so a FIFO that no
    writer has opened yet reads as "wait", not as an empty spec (a non-blocking read there would
    return 0 bytes at once, fifo(7))."""
    import fcntl
    import select
    import time

    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if poller.poll(max(1, int(left * 1000))):
            break
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return True


def spec_source(path: str | Path) -> str:
    """The name errors give a spec: its path, or <stdin> for `-`."""
    return STDIN_SOURCE if str(path) in STDIN_NAMES else str(path)


def read_spec_text(path: str | Path) -> str:
    """A spec file's text (SpecError naming the file if it cannot be read).

    At most MAX_BYTES (1 MiB) are read, whatever the source. A regular file's size is checked
    before reading (a 50 MB file is refused at once). `-` reads standard input, and a FIFO or
    pipe, such as bash's `<(envsubst < spec.yaml)` (/dev/fd/63, a pipe), is read as `cat` would
    read it, to its end, but never past MAX_BYTES + 1 bytes: an endless writer is refused, not
    waited for; a FIFO that nobody writes to within FIFO_WAIT_S is refused too. Everything is
    opened without blocking (O_NONBLOCK: opening a FIFO blocks until a writer comes). Directories
    and devices such as /dev/zero are refused without reading. Bytes that are not UTF-8 name
    their line and the field on it.
    """
    name = spec_source(path)

    def fail(message: str, line: int | None = None, loc: tuple[str | int, ...] = ()) -> SpecError:
        return SpecError(name, [Issue(loc, message, line)])

    if name == STDIN_SOURCE:
        fd, own = 0, False
    else:
        try:
            fd, own = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC), True
        except FileNotFoundError:
            raise fail("no such file") from None
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise fail(f"cannot read the spec: {reason}") from None
    try:
        info = os.fstat(fd)
        if own:  # a pipe (bash's <(...) is /dev/fd/N) or a named FIFO
            streamed = stat.S_ISFIFO(info.st_mode)
            if streamed and not _writer_wrote(fd, FIFO_WAIT_S):
                raise fail(f"is a FIFO (named pipe) that nobody wrote to within {FIFO_WAIT_S:g} s: write the spec "
                           "into it (`envsubst < spec.yaml > FIFO`), or give the spec file itself")
        else:  # standard input: a pipe, a socket or a redirected file; never a terminal
            streamed = stat.S_ISFIFO(info.st_mode) or stat.S_ISSOCK(info.st_mode)
        if not (stat.S_ISREG(info.st_mode) or streamed):
            kind = next((what for test, what in _KINDS if test(info.st_mode)), "not a regular file")
            if not own:
                raise fail(f"standard input is {kind}: give the spec on a pipe or a redirected file "
                           "(`lingjun-slurm validate - < spec.yaml`)")
            raise fail(f"is {kind}, not a spec file: give the path of the spec's YAML file")
        if stat.S_ISREG(info.st_mode) and info.st_size > MAX_BYTES:
            raise fail(f"the file is {info.st_size} bytes; a spec may be at most {MAX_BYTES} (1 MiB): "
                       "real specs are a few KB")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_BYTES:  # st_size can be 0 (/proc, a pipe) or stale: never read past the limit
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise fail(f"cannot read the spec: {exc.strerror or exc}") from None
    finally:
        if own:
            os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_BYTES:
        raise fail(f"more than {MAX_BYTES} bytes (1 MiB): a spec is a few KB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        loc = field_at_line(data.decode("utf-8", "replace"), line)
        raise fail(f"not UTF-8: byte 0x{data[exc.start]:02x} at column {column} ({exc.reason}); save the spec "
                   "as UTF-8", line, loc) from None


def load_spec(path: str | Path) -> LoadedSpec:
    """Read and validate a spec file (SpecError if unreadable or invalid)."""
    return parse_spec(read_spec_text(path), spec_source(path))
