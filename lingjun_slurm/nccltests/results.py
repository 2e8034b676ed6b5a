"""Find and parse the outputs of a run: <dir>/<op>.json when present and readable, else <dir>/<op>.txt."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

from ..transport.base import Transport
from .parse import NcclParseError, NcclTestResult, parse_json, parse_text
from .sizes import human_size
from .verdict import OPS, op_of


@dataclass(frozen=True)
class OpOutput:
    op: str
    result: Optional[NcclTestResult]
    path: Optional[str]  # the file the result came from
    problem: Optional[str] = None  # why there is no result, or why the JSON was not used
    incomplete: bool = False  # a table without nccl-tests' closing lines: the test did not finish


def _read(t: Transport, path: str) -> Optional[str]:
    try:
        return t.read_text(path)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return None
    except OSError:
        return None


def load_op(t: Transport, directory: str, op: str) -> OpOutput:
    """The JSON report is preferred (exact numbers); the text output is the fallback, always kept."""
    json_path, txt_path = f"{directory}/{op}.json", f"{directory}/{op}.txt"
    note = None
    raw = _read(t, json_path)
    if raw is not None:
        try:
            result = parse_json(raw)
            if result.rows:
                return OpOutput(op, result, json_path)
            note = f"{json_path} has no results"
        except NcclParseError as exc:
            note = f"{json_path} unreadable ({exc})"
    raw = _read(t, txt_path)
    if raw is None:
        return OpOutput(op, None, None, f"no {op} output: {txt_path} is missing (the job failed before the test ran?)")
    try:
        result = parse_text(raw)
    except NcclParseError as exc:
        return OpOutput(op, None, txt_path, f"{txt_path}: {exc}")
    if not result.rows:
        line = telling_line(raw)
        note = f"no results table in {txt_path}" + (f"; it says: {line[:200]}" if line else " (empty)")
    elif result.avg_busbw is None:
        # nccl-tests ends every run with "# Avg bus bandwidth : X": without it the sizes after the
        # last row were never measured (the job was killed, a size failed, or it is still running).
        line = telling_line(raw)
        said = f"; it says: {line[:200]}" if _ERRORISH.search(line) else ""
        return OpOutput(op, result, txt_path,
                        f"incomplete output: {txt_path} stops after the {human_size(result.rows[-1].size_bytes)} row "
                        f"without the 'Avg bus bandwidth' line (the test was killed, failed or is still running)"
                        f"{said}", incomplete=True)
    return OpOutput(op, result, txt_path, note)


_ERRORISH = re.compile(r"error|fail|abort|invalid|denied|not found|no such|neither", re.IGNORECASE)


def telling_line(text: str) -> str:
    """The line most likely to say what went wrong: the last error-like line that is not srun's own
    follow-up (the test's or NCCL's message), else srun's, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if _ERRORISH.search(line)]
    own = [line for line in errors if not line.startswith("srun:")]
    return (own or errors or lines or [""])[-1]


def load_file(t: Transport, path: str) -> OpOutput:
    """One file given to --report: JSON when it looks like JSON, else the text table. The op comes
    from the test name in the output, else from the file name (all_reduce.txt, all_reduce_perf.log)."""
    raw = _read(t, path)
    stem = os.path.basename(path).split(".")[0]
    named = sorted((op for op in OPS if op in stem), key=len, reverse=True)  # gke_all_gather.txt -> all_gather
    fallback = named[0] if named else stem
    if raw is None:
        return OpOutput(fallback, None, path, f"cannot read {path}")
    try:
        result = parse_json(raw) if raw.lstrip().startswith("{") else parse_text(raw)
    except NcclParseError as exc:
        return OpOutput(fallback, None, path, f"{path}: {exc}")
    return OpOutput(op_of(result.test) or fallback, result, path)


def load_paths(t: Transport, paths: list[str]) -> list[OpOutput]:
    """--report arguments: files, or run directories (every <op>.json/<op>.txt found in them)."""
    outputs: list[OpOutput] = []
    for path in paths:
        names = t.listdir(path)
        if names:
            ops = [op for op in OPS if f"{op}.json" in names or f"{op}.txt" in names]
            outputs += [load_op(t, path.rstrip("/"), op) for op in ops]
            if not ops:
                outputs.append(OpOutput("?", None, path, f"{path}: no <op>.txt or <op>.json in this directory"))
        else:
            outputs.append(load_file(t, path))
    return outputs
