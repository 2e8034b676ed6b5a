"""Pure (stdlib-only) parser for NVIDIA nccl-tests output (all_reduce_perf, all_gather_perf, ...).

The format is nccl-tests' own (NVIDIA/nccl-tests; the lines cited are at a0b82b2, 2.19.6):

- ``src/util.cu`` ``writeResultHeader`` (L737-765): the column header ``size count type redop root
  time algbw busbw #wrong time algbw busbw #wrong`` (``cputime`` with ``-C 1``, a ``timestamp``
  column with ``-S 1``, ``i_min i_max i_p99 i_cv%`` after each ``#wrong`` with per-iteration timing);
  ``writeBenchmarkLinePreamble`` (L454) prints a row's first five columns *before* the size is
  measured, ``writeBenchmarkLineBody`` (L499-510) its numbers after, so a test that dies mid-size
  leaves a row cut short, or followed on the same line by the error message;
  ``writeResultFooter`` (L773-781): ``# Out of bounds values : N OK|FAILED``, ``# Avg bus
  bandwidth : X [OK|FAILED]`` (FAILED below 0.9 x ``NCCL_TESTS_MIN_BW``, common.cu L1829-1854),
  ``# Collective test concluded: <binary>``; ``writeDeviceReport`` (L667-720) the ``#  Rank  N
  Group  G Pid  P on HOST device  D [bus] NAME`` lines, rank 0 printing every process' lines.
- ``src/common.cu``: ``# nccl-tests version`` and ``# Collective test starting: <binary>`` (L623-624;
  printed since 2025, commits dafb704 and 9641693), ``# nThread ...`` (L625), ``# Reducing maxBytes
  to N due to memory limitation`` (L1545).
- ``src/common.h`` L29-91: failures print ``<host>: Test CUDA failure <file>:<line> '<why>'`` or
  ``<host>: Test NCCL failure <file>:<line> '<why> / <last error>'``, then one ``.. <host> pid <pid>:
  Test failure <file>:<line>`` line per frame on the way up (the traceback, which says nothing about why).
- Older layouts: before 2.13 (51af557, 2022-08) the last column of each half was ``error``, the
  maximum deviation (``%5.0le``), not a count of wrong elements; each test printed its own header,
  all_gather/sendrecv/hypercube without ``redop``/``root``, broadcast/gather/scatter with ``root``
  only; alltoall passed an empty op name until d313d20 (2022-09), so its ``redop`` column is blank
  in the rows although the header names it.

Launchers prefix every line: ``srun -l`` puts ``"%*d: "`` (the task id, SchedMD/slurm
``src/common/write_labelled_message.c`` ``_build_label``), Open MPI's ``--tag-output`` ``[1,0]<stdout>:``,
SkyPilot ``(head, rank=0, pid=3808) ``, and kubectl ``--timestamps`` an RFC 3339 time. The prefix is
learned from the line that carries nccl-tests' first ``#`` line (rank 0 prints the table), and only
lines with that prefix are read as the table; every line is searched for failures.

``parse_runs`` splits a text holding several tests one after another (a job log) into runs;
``parse_text`` reads one. ``parse_json`` reads ``-J <file>.json`` (``src/util.cu``, JSON_FILE_VERSION 1).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

# The nccl-tests binaries (<op>_perf, or <op>_perf_mpi as NGC images name the MPI builds).
OPS = ("all_reduce", "all_gather", "alltoall", "broadcast", "gather", "hypercube", "reduce", "reduce_scatter",
       "scatter", "sendrecv")


_OP_RE = re.compile(r"^(\w+?)_perf(?:_mpi)?$")


def op_of(test_name: Optional[str]) -> Optional[str]:
    """'all_reduce_perf' or 'all_reduce_perf_mpi' -> 'all_reduce'; None when it is not a known test."""
    match = _OP_RE.match(test_name or "")
    return match.group(1) if match and match.group(1) in OPS else None


class NcclParseError(ValueError):
    """Malformed nccl-tests output; ``line`` is the 1-based line number (if known)."""

    def __init__(self, message: str, line: Optional[int] = None) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message)


@dataclass
class RankInfo:
    rank: int
    host: str
    device: int
    bus_id: str
    name: str
    # The "Group G" column (nccl-tests 2.13+): the MPI_Comm_split color of the rank's process, 0 unless
    # NCCL_TESTS_SPLIT[_MASK] split the processes into several tests (src/common.cu L1496-1525 at a0b82b2).
    group: Optional[int] = None


@dataclass
class Row:
    size_bytes: int
    count: int
    dtype: str
    redop: Optional[str]
    root: Optional[int]
    oop_time_us: Optional[float]
    oop_algbw: Optional[float]
    oop_busbw: Optional[float]
    oop_wrong: Optional[int]
    ip_time_us: Optional[float]
    ip_algbw: Optional[float]
    ip_busbw: Optional[float]
    ip_wrong: Optional[int]
    # Layouts before nccl-tests 2.13 print the maximum deviation ("error" column) instead of #wrong.
    oop_error: Optional[float] = None
    ip_error: Optional[float] = None

    @property
    def wrong(self) -> Optional[int]:
        """Wrong elements of the row (out-of-place + in-place); None where the data was not counted."""
        counts = [w for w in (self.oop_wrong, self.ip_wrong) if w is not None]
        return sum(counts) if counts else None


@dataclass
class Interrupted:
    """A row that nccl-tests started (its size columns) but never finished."""
    line: int
    size_bytes: Optional[int]
    text: str  # what follows the size columns on that line (an error message), "" when the output just stops


@dataclass
class NcclTestResult:
    test: Optional[str]
    rows: list[Row] = field(default_factory=list)
    avg_busbw: Optional[float] = None
    out_of_bounds: Optional[int] = None
    ranks: list[RankInfo] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)
    test_from: Optional[str] = None  # "name line", "command line", "json args": where `test` was read
    command: Optional[str] = None  # the command line shown before the table (continuation lines joined)
    ended: bool = False  # nccl-tests printed its closing "Avg bus bandwidth" line
    avg_check: Optional[str] = None  # "OK"/"FAILED" after the average (only with NCCL_TESTS_MIN_BW)
    failures: list[str] = field(default_factory=list)  # "<host>: Test CUDA|NCCL failure <file:line> '<why>'"
    tracebacks: int = 0  # ".. <host> pid N: Test failure <file:line>" lines
    nccl_warnings: list[str] = field(default_factory=list)  # NCCL's "NCCL WARN ..." lines
    launcher_errors: list[str] = field(default_factory=list)  # srun/slurmstepd/mpirun/nccl-tests usage errors
    last_error: Optional[str] = None  # "# error: ..." (ncclGetLastError after the test)
    interrupted: Optional[Interrupted] = None
    columns: tuple[str, ...] = ()  # the header's columns before the times: size count type [redop] [root]
    said: Optional[str] = None  # the last line that looks like an error (nccl-tests', NCCL's, the launcher's)
    prefix: str = ""  # the launcher prefix of the lines the table was read from
    streams: int = 1  # launcher streams (tasks) that each printed their own nccl-tests header
    first_line: int = 1
    last_line: int = 0

    @property
    def rank_count(self) -> Optional[int]:
        """The number of ranks the rank lines show (highest rank + 1: an excerpt may keep only the last
        lines), None without rank lines."""
        return max(r.rank for r in self.ranks) + 1 if self.ranks else None

    @property
    def hosts(self) -> list[str]:
        return sorted({r.host for r in self.ranks})

    @property
    def complete(self) -> bool:
        """Every size measured: a results table, no row cut short and nccl-tests' closing average line."""
        return bool(self.rows) and self.ended and self.interrupted is None


# Open MPI's --tag-output, also stripped when rank 0's header lines have no prefix (older behaviour).
_MPI_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# kubectl logs --timestamps / Open MPI --timestamp-output style times at the start of a line.
_TIMESTAMP = re.compile(r"^\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?\s+")
# The first '#' of an nccl-tests comment line, after whatever the launcher put in front of it.
_ANCHOR = re.compile(r"^(?P<prefix>.*?)#\s*(?P<kind>nccl-tests version|Collective test starting|Collective test "
                     r"concluded|nThread\b|Using devices|Rank\s+\d+\s|size\s+count\b|Out of bounds values|"
                     r"Avg bus bandwidth|Reducing maxBytes)")
_RANK = re.compile(r"Rank\s+(\d+)\s+(?:Group\s+(?P<group>\d+)\s+)?(?:Pid\s+\d+\s+)?on\s+(\S+)\s+device\s+(\d+)\s+"
                   r"\[([^\]]*)\]\s*(.*)$")
_AVG = re.compile(r"Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?")
_OOB = re.compile(r"Out of bounds values\s*:\s*(\d+)")
_STARTING = re.compile(r"Collective test (?:starting|concluded):\s*(\S+)")
_VERSION = re.compile(r"nccl-tests version\s+(\S+)")
_REDUCED = re.compile(r"Reducing maxBytes to\s+(\d+)")
_LAST_ERROR = re.compile(r"^#\s*error:\s*(.+)$")
_PS2 = re.compile(r"^\s*(?:>\s?)?")
# A known test binary named on a command line ("./build/all_reduce_perf -b 8", "alltoall_perf_mpi").
_PERF = re.compile(r"(?<![\w-])((?:" + "|".join(sorted(OPS, key=len, reverse=True)) + r")_perf(?:_mpi)?)\b")
_PARAM = re.compile(r"([A-Za-z_]+(?: [A-Za-z_]+)?):?\s+(\S+)")
# common.h CUDACHECK/NCCLCHECK (and NCCL 1.x era "NCCL failure all_reduce.cu:95 '...'").
_FAILURE = re.compile(r"(?:(?P<host>[^\s:]+):\s+)?(?:Test\s+)?(?:CUDA|NCCL)\s+failure\s+\S+:\d+\s+'.*'")
_TRACEBACK = re.compile(r"\.\.\s+\S+\s+pid\s+\d+:\s+Test failure\s+\S+:\d+")
_NCCL_WARN = re.compile(r"NCCL WARN\s+(.*)$")
# The launcher's own word that a task failed, was killed or could not start; nccl-tests' usage errors.
_LAUNCHER_ERROR = re.compile(
    r"(srun: error: .*|slurmstepd: error: .*|srun: Job step aborted.*|mpirun noticed that .*|"
    r"mpirun detected that one or more processes exited with non-zero status.*|"
    r"Primary job\s+terminated normally, but \d+ process returned.*|"
    r"Invalid number of GPUs: .*|invalid option '.*'|.*: (?:command not found|No such file or directory)|"
    r".*error while loading shared libraries: .*)")
_ERRORISH = re.compile(r"error|fail|abort|invalid|denied|not found|no such|neither|killed|cancelled|"
                       r"busy or unavailable|signal \d+", re.IGNORECASE)
_TIME_COLS = ("time", "cputime")
_PREFIX_COLS = ("size", "count", "type", "redop", "root")
_NUMBER = re.compile(r"^(?:[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\*?|N/A|[-+]?nan|[-+]?inf)$", re.IGNORECASE)


def _na_float(tok: str) -> Optional[float]:
    tok = tok.rstrip("*")
    return None if tok.upper() == "N/A" else float(tok)


def _na_int(tok: str) -> Optional[int]:
    tok = tok.rstrip("*")
    return None if tok.upper() == "N/A" else int(float(tok))


def _parse_params(rest: str) -> dict[str, str]:
    return {k.strip(): v for k, v in _PARAM.findall(rest)}


@dataclass(frozen=True)
class _Header:
    prefix: tuple[str, ...]  # size count type [redop] [root]
    half: tuple[str, ...]  # one half's columns: time algbw busbw #wrong|error [i_min i_max i_p99 i_cv%]

    @property
    def width(self) -> int:
        return len(self.prefix) + 2 * len(self.half)


def _header(tokens: list[str]) -> Optional[_Header]:
    """The column layout of a header line, or None when the line is not one."""
    if len(tokens) < 4 or tokens[0] != "size" or tokens[1] != "count":
        return None
    times = [i for i, tok in enumerate(tokens) if tok in _TIME_COLS]
    if not times or not all(p in _PREFIX_COLS for p in tokens[:times[0]]):
        return None
    first = times[0]
    second = times[1] if len(times) > 1 else len(tokens)
    half = tuple(tokens[first:second])
    if len(half) < 4:
        return None
    return _Header(tuple(tokens[:first]), half)


class _RowError(Exception):
    def __init__(self, message: str, cut: bool, text: str = "") -> None:
        super().__init__(message)
        self.cut = cut  # the row stops early or turns into other text (a test that died mid-size)
        self.text = text


def _half(values: list[str], names: tuple[str, ...]) -> tuple[Optional[float], ...]:
    """(time, algbw, busbw, wrong, error) of one half; wrong is a count, error the old deviation."""
    cols = dict(zip(names, values))
    last = names[3]
    time = _na_float(cols[names[0]])
    algbw, busbw = _na_float(cols["algbw"]), _na_float(cols["busbw"])
    if last == "error":
        return time, algbw, busbw, None, _na_float(cols[last])
    wrong = _na_int(cols[last])
    return time, algbw, busbw, wrong, None


def _parse_row(tokens: list[str], header: _Header) -> tuple[Row, bool]:
    """One data row, and whether it had one half (the out-of-place numbers) only. Raises _RowError (cut=True) when the row stops early or an error message follows
    its size columns, (cut=False) when a complete-looking row holds something that is not a number."""
    cols: dict[str, Optional[str]] = {}
    pos = 0
    for name in header.prefix:
        if pos >= len(tokens):
            raise _RowError("the row stops in its size columns", cut=True)
        tok = tokens[pos]
        if name == "redop" and _NUMBER.match(tok) and not tok.isalpha():
            cols[name] = None  # alltoall before d313d20 printed an empty op name: the column is blank
            continue
        cols[name] = tok
        pos += 1
    rest = tokens[pos:]
    numeric = 0
    for tok in rest:
        if not _NUMBER.match(tok):
            break
        numeric += 1
    per_half = len(header.half)
    if numeric < len(rest) and numeric < 2 * per_half:
        tail = rest[numeric:]
        text = " ".join(tail)
        # One bad value in a row of the full width is a corrupt row; words after the size columns are a
        # message that cut the row short (the test died while measuring that size).
        words = sum(not _NUMBER.match(tok) for tok in tail)
        cut = len(tokens) < header.width or words > 1 or bool(_FAILURE.search(text) or _NCCL_WARN.search(text))
        raise _RowError(f"expected numbers after the size columns, got {text!r}", cut=cut, text=text if cut else "")
    if numeric < 2 * per_half and numeric != per_half:
        raise _RowError(f"expected {header.width} columns, got {len(tokens)}", cut=True)
    perf = rest[:2 * per_half] if numeric >= 2 * per_half else ["N/A"] * per_half + rest[:per_half]
    try:
        size, count = int(cols["size"] or ""), int(cols["count"] or "")
        root = cols.get("root")
        oop = _half(perf[:per_half], header.half)
        ip = _half(perf[per_half:], header.half)
        row = Row(size_bytes=size, count=count, dtype=cols.get("type") or "", redop=cols.get("redop"),
                   root=int(root) if root is not None else None,
                   oop_time_us=oop[0], oop_algbw=oop[1], oop_busbw=oop[2],
                   oop_wrong=None if oop[3] is None else int(oop[3]),
                   ip_time_us=ip[0], ip_algbw=ip[1], ip_busbw=ip[2], ip_wrong=None if ip[3] is None else int(ip[3]),
                  oop_error=oop[4], ip_error=ip[4])
    except (KeyError, ValueError) as exc:
        raise _RowError(f"malformed data row ({exc})", cut=False) from None
    return row, numeric < 2 * per_half


def _clean(raw: str) -> str:
    return _TIMESTAMP.sub("", _ANSI.sub("", raw)).rstrip()


def _primary_prefix(lines: list[str]) -> tuple[str, int]:
    """(the prefix of rank 0's lines, the number of streams that printed an nccl-tests header).
    Leading blanks are not part of it: srun -l pads the task id to the width of the largest one."""
    prefix: Optional[str] = None
    headers: set[str] = set()
    for line in lines:
        m = _ANCHOR.match(line)
        if not m:
            continue
        if prefix is None:
            prefix = m.group("prefix").lstrip()
        if m.group("kind").startswith(("nThread", "Using devices")):
            headers.add(m.group("prefix").lstrip())
    return prefix or "", max(1, len(headers))


class _Builder:
    """Accumulates one run from the lines of rank 0's stream (table) and from every line (failures)."""

    def __init__(self, first_line: int, hint: Optional[str], command: Optional[str] = None) -> None:
        self.result = NcclTestResult(test=None, first_line=first_line, last_line=first_line - 1)
        self.header: Optional[_Header] = None
        self.pending: Optional[tuple[int, list[str], _RowError]] = None
        self.half_only_last = False  # the last row had one half (out-of-place) only
        self.hint = hint  # a test named on a command line seen before this run's table
        self.next_hint: Optional[str] = None  # one named after this run ended: the next run's
        self.command = command  # the command line that named it
        self.next_command: Optional[str] = None

    def starts_next(self, body: str) -> bool:
        """True when this line of rank 0's stream is the first header line of another run."""
        r = self.result
        if not (r.rows or r.ended or self.pending):
            return False
        text = body.strip()
        if not text.startswith("#"):
            return False
        text = text.lstrip("#").strip()
        return text.startswith(("nThread", "nccl-tests version", "Collective test starting"))

    def scan_anywhere(self, line: str, command: Optional[str] = None, continued: bool = False) -> None:
        """Failures, NCCL warnings and launcher errors, whichever task printed them. `command` is the
        command line this line ends, with its continuation lines joined; `continued`: the line ends
        with a backslash, so the command goes on (see parse_runs)."""
        r = self.result
        if _TRACEBACK.search(line):
            r.tracebacks += 1
        elif m := _FAILURE.search(line):
            r.failures.append(m.group(0).strip())
        elif _NCCL_WARN.search(line):
            r.nccl_warnings.append(line.strip())
        elif "NCCL INFO" not in line and _LAUNCHER_ERROR.search(line):
            r.launcher_errors.append(line.strip())
        if "NCCL INFO" not in line and not _TRACEBACK.search(line) and not _ANCHOR.match(line) \
                and not line.lstrip().startswith("#") and _ERRORISH.search(line):
            r.said = line.strip()
        if not continued and not _ANCHOR.match(line) and (m := _PERF.search(command or line)):
            if r.ended:
                self.next_hint = self.next_hint or m.group(1)
                self.next_command = self.next_command or command or line.strip()
            elif self.hint is None:
                self.hint = m.group(1)
                self.command = command or line.strip()

    def table(self, lineno: int, body: str) -> None:
        """A line of rank 0's stream, the launcher prefix removed."""
        r = self.result
        stripped = body.strip()
        comment = stripped.startswith("#")
        tokens = stripped.lstrip("#").split()
        if not tokens:
            return
        if not comment:
            if self.header is not None and len(tokens) >= 2 and tokens[0].isdigit() and tokens[1].isdigit():
                self._row(lineno, tokens)
            return
        header = _header(tokens)
        if header is not None:
            self.header = header
            r.columns = header.prefix
            return
        text = stripped.lstrip("#").strip()
        if m := _AVG.search(text):
            try:
                r.avg_busbw = float(m.group(1))
            except ValueError:
                raise NcclParseError(f"bad average bus bandwidth {m.group(1)!r}", lineno) from None
            r.ended = True
            r.avg_check = m.group(2)
        elif m := _OOB.search(text):
            r.out_of_bounds = int(m.group(1))
        elif m := _RANK.match(text):
            group = m.group("group")
            r.ranks.append(RankInfo(rank=int(m.group(1)), host=m.group(3), device=int(m.group(4)),
                                    bus_id=m.group(5), name=m.group(6).strip(),
                                    group=int(group) if group is not None else None))
        elif m := _STARTING.search(text):
            if r.test is None:
                r.test, r.test_from = m.group(1), "name line"
        elif m := _VERSION.search(text):
            r.params["nccl_tests_version"] = m.group(1)
        elif m := _REDUCED.search(text):
            r.params["reduced_max_bytes"] = m.group(1)
        elif tokens[0] == "nThread":
            r.params.update(_parse_params(text))
        elif m := _LAST_ERROR.match(stripped):
            r.last_error = m.group(1).strip()

    def _row(self, lineno: int, tokens: list[str]) -> None:
        assert self.header is not None
        if self.pending is not None:  # a bad row followed by more rows: it was not a test that stopped
            line, bad, err = self.pending
            raise NcclParseError(f"{err}: {' '.join(bad)!r}", line)
        try:
            row, self.half_only_last = _parse_row(tokens, self.header)
        except _RowError as exc:
            if not exc.cut:
                raise NcclParseError(f"{exc}: {' '.join(tokens)!r}", lineno) from None
            self.pending = (lineno, tokens, exc)
            return
        self.result.rows.append(row)
        self.result.said = None  # only what is printed after the last row can say why the table stopped

    def finish(self, last_line: int) -> NcclTestResult:
        r = self.result
        r.last_line = last_line
        if self.pending is not None:
            line, tokens, exc = self.pending
            if r.ended:  # rows never follow the average: this one is malformed, not cut short
                raise NcclParseError(f"{exc}: {' '.join(tokens)!r}", line)
            size = int(tokens[0]) if tokens and tokens[0].isdigit() else None
            r.interrupted = Interrupted(line=line, size_bytes=size, text=exc.text)
        elif self.half_only_last and not r.ended and r.rows:
            # Out-of-place printed, in-place never: the test stopped while measuring this size.
            row = r.rows.pop()
            r.interrupted = Interrupted(line=0, size_bytes=row.size_bytes, text="")
        if r.test is None and self.hint is not None:
            r.test, r.test_from = self.hint, "command line"
        r.command = self.command
        return r


def parse_runs(text: str) -> list[NcclTestResult]:
    """Every nccl-tests run in the text, in order (a job log holds one per test; most files one).

    A new run starts at nccl-tests' first header line (``# nccl-tests version``, ``# Collective test
    starting``, ``# nThread``) after the previous run printed rows or its average. Rows are read only
    after a column header. A data row with missing or non-numeric fields raises
    :class:`NcclParseError`, except the last row of an output that stops there or turns into an
    error message: a test that died while measuring that size (``NcclTestResult.interrupted``)."""
    lines = [_clean(raw) for raw in text.splitlines()]
    prefix, streams = _primary_prefix(lines)
    runs: list[NcclTestResult] = []
    builder = _Builder(1, None)
    carried = ""  # a shell command continued with a trailing backslash, so far
    for lineno, line in enumerate(lines, start=1):
        primary = line.lstrip().startswith(prefix)
        body = line.lstrip()[len(prefix):] if prefix else _MPI_TAG.sub("", line)
        if primary and builder.starts_next(body):
            runs.append(builder.finish(lineno - 1))
            builder = _Builder(lineno, builder.next_hint, builder.next_command)
        # A continuation line as a shell echoes it: after bash's PS2 "> " (or a quote's "> ").
        piece = _PS2.sub("", line) if carried else line
        continued = piece.endswith("\\")
        if continued:
            carried, command = carried + piece[:-1] + " ", None
        else:
            command, carried = (carried + piece).strip() if carried else None, ""
        builder.scan_anywhere(line, command, continued)
        if primary:
            builder.table(lineno, body)
    runs.append(builder.finish(len(lines)))
    for run in runs:
        run.prefix, run.streams = prefix, streams
    return runs


def parse_text(text: str) -> NcclTestResult:
    """Parse the stdout of one nccl-tests run (the first, when the text holds several: see parse_runs)."""
    return parse_runs(text)[0]


def _num(v: Any) -> Optional[float]:
    return None if v is None else (math.nan if v == "nan" else float(v))


def _json_perf(obj: Any) -> tuple[Optional[float], Optional[float], Optional[float], Optional[int]]:
    if not obj:
        return None, None, None, None
    wrong = obj.get("nwrong")
    return (_num(obj.get("time", obj.get("cpu_time"))), _num(obj.get("alg_bw")),
            _num(obj.get("bus_bw")), None if wrong is None else int(float(wrong)))


def parse_json(text: str) -> NcclTestResult:
    """Parse the JSON written by ``nccl-tests -J <file>.json`` (JSON_FILE_VERSION 1, src/util.cu):
    ``args``, ``nccl_version``, ``config`` (+ ``devices``), ``results`` (rows with
    ``out_of_place``/``in_place``), ``out_of_bounds``, ``average_bus_bandwidth`` (written by
    writeResultFooter after the last size: without it the run did not end), ``errors``."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NcclParseError(f"invalid JSON: {exc.msg}", exc.lineno) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results", []), list):
        raise NcclParseError("not an nccl-tests JSON report")
    if "results" not in doc and "ops" in doc and "schema" in doc:
        raise NcclParseError("this is a lingjun-slurm report.json, not an nccl-tests output")
    config = doc.get("config") or {}
    result = NcclTestResult(test=None)
    for key, value in config.items():
        if key != "devices":
            result.params[key] = str(value).lower() if isinstance(value, bool) else str(value)
    if "nccl_version" in doc:
        result.params["nccl_version"] = str(doc["nccl_version"])
    for i, dev in enumerate(config.get("devices") or []):
        try:
            result.ranks.append(RankInfo(rank=int(dev["rank"]), host=str(dev["hostname"]),
                                         device=int(dev["device"]), bus_id=str(dev.get("device_hex", "")),
                                         name=str(dev.get("device_info", "")),
                                         group=int(dev["group"]) if dev.get("group") is not None else None))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise NcclParseError(f"config.devices[{i}]: bad device record ({exc!r})") from None
    args = doc.get("args") or []
    if args:
        m = _PERF.search(str(args[0]))
        result.test = m.group(1) if m else str(args[0]).rsplit("/", 1)[-1]
        result.test_from = "json args"
    for i, rec in enumerate(doc.get("results") or []):
        try:
            oop = _json_perf(rec.get("out_of_place"))
            ip = _json_perf(rec.get("in_place"))
            root = str(rec.get("root", "")).strip()
            result.rows.append(Row(
                size_bytes=int(rec["size"]), count=int(rec["count"]), dtype=str(rec["type"]),
                redop=rec.get("redop"), root=int(root) if root else None,
                oop_time_us=oop[0], oop_algbw=oop[1], oop_busbw=oop[2], oop_wrong=oop[3],
                ip_time_us=ip[0], ip_algbw=ip[1], ip_busbw=ip[2], ip_wrong=ip[3]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise NcclParseError(f"malformed results[{i}]: {exc}") from None
    oob = doc.get("out_of_bounds")
    if isinstance(oob, dict) and "count" in oob:
        result.out_of_bounds = int(oob["count"])
    avg = doc.get("average_bus_bandwidth")
    if isinstance(avg, dict) and avg.get("bandwidth") is not None:
        result.avg_busbw = _num(avg["bandwidth"])
        result.ended = True
        okay = avg.get("okay")
        if okay in (False, "false"):
            result.avg_check = "FAILED"
        elif okay in (True, "true"):
            result.avg_check = "OK"
    errors = [str(e) for e in doc.get("errors") or [] if str(e).strip()]
    if errors:
        result.last_error = errors[0]
    return result


def _row_busbw(row: Row) -> list[float]:
    return [b for b in (row.oop_busbw, row.ip_busbw) if b is not None and not math.isnan(b)]


def max_busbw(result: NcclTestResult) -> float:
    """Highest bus bandwidth (GB/s) over all rows, out-of-place and in-place."""
    values = [b for row in result.rows for b in _row_busbw(row)]
    if not values:
        raise ValueError("no bus bandwidth values in result")
    return max(values)


def busbw_at(result: NcclTestResult, size_bytes: int) -> Optional[float]:
    """Best (max of out-of-place / in-place) bus bandwidth for a message size, or None."""
    for row in result.rows:
        if row.size_bytes == size_bytes:
            values = _row_busbw(row)
            return max(values) if values else None
    return None
