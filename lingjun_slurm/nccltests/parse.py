"""Pure (stdlib-only) parser for NVIDIA nccl-tests output (all_reduce_perf, all_gather_perf, ...).

``parse_text`` reads the stdout table; columns are located from the ``size count ...
time algbw busbw #wrong`` header, so modern (redop/root, #wrong) and old layouts (no
redop/root column, ``error``) both work and extra trailing columns (timestamps, RCCL
algo/proto) are ignored. One run per text. ``parse_json`` reads the file written by
``-J/--output_file <file>.json`` (format from NVIDIA/nccl-tests ``src/util.cu``).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional


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


@dataclass
class NcclTestResult:
    test: Optional[str]
    rows: list[Row] = field(default_factory=list)
    avg_busbw: Optional[float] = None
    out_of_bounds: Optional[int] = None
    ranks: list[RankInfo] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)


# Optional "[1,0]<stdout>:" prefix added by Open MPI --tag-output.
_MPI_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_RANK = re.compile(
    r"Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s*(.*)$")
_AVG = re.compile(r"Avg bus bandwidth\s*:\s*(\S+)")
_OOB = re.compile(r"Out of bounds values\s*:\s*(\d+)")
_STARTING = re.compile(r"Collective test (?:starting|concluded):\s*(\S+)")
_VERSION = re.compile(r"nccl-tests version\s+(\S+)")
_PERF = re.compile(r"\b(\w+_perf)\b")
_PARAM = re.compile(r"([A-Za-z_]+(?: [A-Za-z_]+)?):?\s+(\S+)")
_TIME_COLS = ("time", "cputime")
_PREFIX_COLS = ("size", "count", "type", "redop", "root")


def _na_float(tok: str) -> Optional[float]:
    return None if tok.upper() == "N/A" else float(tok)


def _na_int(tok: str) -> Optional[int]:
    tok = tok.rstrip("*")
    return None if tok.upper() == "N/A" else int(float(tok))


def _parse_params(rest: str) -> dict[str, str]:
    return {k.strip(): v for k, v in _PARAM.findall(rest)}


def _header_prefix(tokens: list[str]) -> Optional[list[str]]:
    """Return the column names before the first time column, or None if not a header."""
    if len(tokens) < 4 or tokens[0] != "size" or tokens[1] != "count":
        return None
    for i, tok in enumerate(tokens):
        if tok in _TIME_COLS:
            prefix = tokens[:i]
            if all(p in _PREFIX_COLS for p in prefix):
                return prefix
            return None
    return None


def _parse_row(tokens: list[str], prefix: list[str], lineno: int) -> Row:
    n = len(prefix)
    if len(tokens) < n + 4:
        raise NcclParseError(
            f"expected at least {n + 8} columns, got {len(tokens)}: {' '.join(tokens)!r}", lineno)
    try:
        cols = dict(zip(prefix, tokens[:n]))
        perf = tokens[n:n + 8]
        if len(perf) < 8:  # out-of-place part omitted: only in-place numbers printed
            perf = ["N/A"] * 4 + perf[:4]
        root = cols.get("root")
        return Row(
            size_bytes=int(cols["size"]), count=int(cols["count"]), dtype=cols.get("type", ""),
            redop=cols.get("redop"), root=int(root) if root is not None else None,
            oop_time_us=_na_float(perf[0]), oop_algbw=_na_float(perf[1]),
            oop_busbw=_na_float(perf[2]), oop_wrong=_na_int(perf[3]),
            ip_time_us=_na_float(perf[4]), ip_algbw=_na_float(perf[5]),
            ip_busbw=_na_float(perf[6]), ip_wrong=_na_int(perf[7]),
        )
    except (KeyError, ValueError) as exc:
        raise NcclParseError(f"malformed data row ({exc}): {' '.join(tokens)!r}", lineno) from None


def parse_text(text: str) -> NcclTestResult:
    """Parse the stdout table of one nccl-tests run.

    Data rows are only recognised after a column header line; a row is a line
    whose first two fields are integers (other log noise is skipped). A data
    row with missing or non-numeric fields raises :class:`NcclParseError`.
    """
    result = NcclTestResult(test=None)
    prefix: Optional[list[str]] = None
    guessed_test: Optional[str] = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = _MPI_TAG.sub("", raw).strip()
        if not line:
            continue
        body = line.lstrip("#").strip()
        tokens = body.split()
        if not tokens:
            continue
        if not line.startswith("#") and prefix is not None and len(tokens) >= 2 \
                and tokens[0].isdigit() and tokens[1].isdigit():
            result.rows.append(_parse_row(tokens, prefix, lineno))
            continue
        hdr = _header_prefix(tokens)
        if hdr is not None:
            prefix = hdr
            continue
        if m := _AVG.search(body):
            try:
                result.avg_busbw = float(m.group(1))
            except ValueError:
                raise NcclParseError(f"bad average bus bandwidth {m.group(1)!r}", lineno) from None
        elif m := _OOB.search(body):
            result.out_of_bounds = int(m.group(1))
        elif m := _RANK.match(body):
            result.ranks.append(RankInfo(rank=int(m.group(1)), host=m.group(2), device=int(m.group(3)),
                                         bus_id=m.group(4), name=m.group(5).strip()))
        elif m := _STARTING.search(body):
            result.test = result.test or m.group(1)
        elif m := _VERSION.search(body):
            result.params["nccl_tests_version"] = m.group(1)
        elif tokens[0] == "nThread":
            result.params.update(_parse_params(body))
        elif guessed_test is None and (m := _PERF.search(line)):
            guessed_test = m.group(1)
    result.test = result.test or guessed_test
    return result


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
    ``out_of_place``/``in_place``), ``out_of_bounds``, ``average_bus_bandwidth``."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NcclParseError(f"invalid JSON: {exc.msg}", exc.lineno) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results", []), list):
        raise NcclParseError("not an nccl-tests JSON report")
    config = doc.get("config") or {}
    result = NcclTestResult(test=None)
    for key, value in config.items():
        if key != "devices":
            result.params[key] = str(value).lower() if isinstance(value, bool) else str(value)
    if "nccl_version" in doc:
        result.params["nccl_version"] = str(doc["nccl_version"])
    for dev in config.get("devices") or []:
        result.ranks.append(RankInfo(rank=int(dev["rank"]), host=str(dev["hostname"]),
                                     device=int(dev["device"]), bus_id=str(dev.get("device_hex", "")),
                                     name=str(dev.get("device_info", ""))))
    args = doc.get("args") or []
    if args:
        m = _PERF.search(str(args[0]))
        result.test = m.group(1) if m else str(args[0]).rsplit("/", 1)[-1]
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
