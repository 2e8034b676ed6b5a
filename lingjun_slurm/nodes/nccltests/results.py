"""Find and parse the outputs of a run: <dir>/<op>.json when present and readable, else <dir>/<op>.txt;
or files given to --report, each holding one or more runs. Which collective a run measured comes from
the output itself (its "Collective test starting" line, the -J args, the command line it shows), else
from the file name (nccl_allreduce.log, all_gather_perf.txt), else from the table's layout when only
one test prints it that way (see ``table_ops``)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Optional

from lingjun_slurm.transport.base import Transport
from .parse import OPS, NcclParseError, NcclTestResult, op_of, parse_json, parse_runs
from .ranks import Ranks, derive


def op_from_file_name(path: str) -> Optional[str]:
    """The test a file name names, with or without underscores: nccl_allreduce.log -> all_reduce,
    reducescatter -> reduce_scatter, all_gather_perf.txt -> all_gather (the longest name wins, so
    'allreduce' is not read as reduce, nor 'allgather' as gather)."""
    squashed = re.sub(r"[^a-z0-9]", "", os.path.basename(path).lower())
    for op in sorted(OPS, key=lambda o: len(o.replace("_", "")), reverse=True):
        if op.replace("_", "") in squashed:
            return op
    return None


# Bytes per element of nccl-tests' type names (src/common.cu test_typenames; "char"/"int" in NCCL 1.x).
_TYPE_SIZES = {"int8": 1, "uint8": 1, "char": 1, "f8e4m3": 1, "f8e5m2": 1, "half": 2, "bfloat16": 2, "int32": 4,
               "uint32": 4, "int": 4, "float": 4, "int64": 8, "uint64": 8, "double": 8}
_REDUCTIONS = {"all_reduce", "reduce", "reduce_scatter"}
_ROOTED = {"broadcast", "reduce", "gather", "scatter"}
# Tests whose count column is the per-rank share: size = count x element size x ranks (the
# <Op>GetCollByteCount functions of src/all_gather.cu, reduce_scatter.cu, alltoall.cu, gather.cu,
# scatter.cu, hypercube.cu); the others print size = count x element size.
DIVIDED = {"all_gather", "reduce_scatter", "alltoall", "gather", "scatter", "hypercube"}


def size_ratio(result: NcclTestResult) -> Optional[int]:
    """size / (count x element size) of the rows (1, or the rank count for DIVIDED tests); None when
    the rows do not say (no count, an unknown type, or rows that disagree)."""
    ratios = set()
    for row in result.rows:
        width = _TYPE_SIZES.get(row.dtype)
        if not width or row.count <= 0:
            continue
        ratios.add(row.size_bytes // (row.count * width) if row.size_bytes % (row.count * width) == 0 else -1)
    return ratios.pop() if len(ratios) == 1 and -1 not in ratios else None


def table_ops(result: NcclTestResult) -> set[str]:
    """The tests whose output has this table's layout (nccl-tests' per-test headers before 2.13, the
    redop/root values, the count column); every test when nothing tells them apart."""
    ops = set(OPS)
    columns = result.columns
    if result.rows and columns:
        if "redop" not in columns:  # before 2.13: all_gather, sendrecv, hypercube; broadcast, gather, scatter
            ops -= _REDUCTIONS | {"alltoall"}
        if "root" not in columns:
            ops -= _ROOTED
        if "root" in columns and "redop" not in columns:
            ops &= {"broadcast", "gather", "scatter"}
        if "redop" in columns and "root" not in columns:  # before 2.13: all_reduce, reduce_scatter, alltoall
            ops &= {"all_reduce", "reduce_scatter", "alltoall"}
    redops = {row.redop for row in result.rows}
    if None in redops and "redop" in columns:
        ops &= {"alltoall"}  # the one test that printed an empty op name (until d313d20)
    elif redops == {"none"}:
        ops -= _REDUCTIONS
    elif redops and None not in redops and "none" not in redops:
        ops &= _REDUCTIONS
    roots = {row.root for row in result.rows if row.root is not None}
    if roots and roots != {-1}:
        ops &= _ROOTED
    elif roots == {-1}:
        ops -= _ROOTED
    ratio = size_ratio(result)
    if ratio == 1:
        ops -= DIVIDED
    elif ratio is not None and ratio > 1:
        ops &= DIVIDED
    return ops


def ranks_from_sizes(op: str, result: NcclTestResult) -> Optional[int]:
    """For a DIVIDED test without rank lines: the rank count its size and count columns imply."""
    ratio = size_ratio(result) if op in DIVIDED else None
    return ratio if ratio and ratio > 1 else None


@dataclass(frozen=True)
class OpOutput:
    op: str
    result: Optional[NcclTestResult]
    path: Optional[str]  # the file the result came from
    problem: Optional[str] = None  # why there is no result
    notes: tuple[str, ...] = field(default_factory=tuple)  # why the JSON was not used, where the op came from
    op_from: Optional[str] = None  # "name line", "json args", "command line", "file name", "table", "run directory"

    @property
    def complete(self) -> bool:
        return self.result is not None and self.result.complete

    @property
    def incomplete(self) -> bool:
        """A results table without its end: some sizes were never measured."""
        return self.result is not None and bool(self.result.rows) and not self.result.complete

    @property
    def derived_ranks(self) -> Ranks:
        """The rank count, where it came from, and notes where the output's sources disagree (ranks.py)."""
        if self.result is None:
            return Ranks(None, None)
        return derive(self.op, self.result, ranks_from_sizes(self.op, self.result))

    @property
    def ranks(self) -> Optional[int]:
        return self.derived_ranks.count

    @property
    def ranks_from(self) -> Optional[str]:
        """"command line", "rank lines", "sizes" or "busbw/algbw"; None without a rank count."""
        return self.derived_ranks.source

    @property
    def report_notes(self) -> tuple[str, ...]:
        return self.notes + self.derived_ranks.notes


def _read(t: Transport, path: str) -> Optional[str]:
    try:
        return t.read_text(path)
    except OSError:
        return None
    except UnicodeDecodeError:
        return None


def _resolve(result: NcclTestResult, file_op: Optional[str], file_from: str) -> tuple[str, str, list[str]]:
    """(op, where it came from, notes). The output's own name wins over the file's; the table's layout
    settles a file without a name, and is checked against the name a file or command line gives."""
    notes: list[str] = []
    layout = table_ops(result)
    named = op_of(result.test)
    if named and result.test_from in ("name line", "json args"):
        if file_op and file_op != named:
            notes.append(f"the file is named for {file_op} but the output is {result.test}")
        return named, result.test_from or "output", notes
    for op, source in ((named, result.test_from or "command line"), (file_op, file_from)):
        if op is None:
            continue
        if len(layout) < len(OPS) and op not in layout:
            notes.append(f"{source} says {op}, but the table is laid out as {' or '.join(sorted(layout))} prints it")
        return op, source, notes
    if len(layout) == 1:
        return next(iter(layout)), "table", notes
    if result.test:
        return result.test, result.test_from or "output", notes
    return "?", "", notes + ["the output does not name its test and neither does the file name"]


def _text_outputs(raw: str, path: str, file_op: Optional[str], file_from: str) -> list[OpOutput]:
    try:
        runs = parse_runs(raw)
    except NcclParseError as exc:
        return [OpOutput(file_op or "?", None, path, f"{path}: {exc}", op_from=file_from if file_op else None)]
    # A file that is only noise around one failed start is one run; several runs each get a report.
    outs = []
    for run in runs:
        op, source, notes = _resolve(run, file_op if len(runs) == 1 or file_from == "run directory" else None,
                                     file_from)
        if len(runs) > 1:
            notes = [f"run {len(outs) + 1} of {len(runs)} in this file (lines {run.first_line}-{run.last_line})"] + notes
        outs.append(OpOutput(op, run, path, None, tuple(notes), source))
    return outs


def load_op(t: Transport, directory: str, op: str) -> OpOutput:
    """<op>.json is preferred (exact numbers); <op>.txt, always kept, is the fallback."""
    json_path, txt_path = f"{directory}/{op}.json", f"{directory}/{op}.txt"
    notes: list[str] = []
    raw = _read(t, json_path)
    if raw is not None:
        try:
            result = parse_json(raw)
            if result.rows:
                resolved, source, more = _resolve(result, op, "run directory")
                return OpOutput(resolved, result, json_path, None, tuple(more), source)
            notes.append(f"{json_path} has no results")
        except NcclParseError as exc:
            notes.append(f"{json_path} unreadable ({exc})")
    raw = _read(t, txt_path)
    if raw is None:
        return OpOutput(op, None, None, f"no {op} output: {txt_path} is missing (the job failed before the test ran?)",
                        tuple(notes), "run directory")
    outs = _text_outputs(raw, txt_path, op, "run directory")
    out = outs[-1]  # the script truncates <op>.txt for each attempt: the last run is the one that counts
    return OpOutput(out.op, out.result, out.path, out.problem, tuple(notes) + out.notes, out.op_from)


def load_file(t: Transport, path: str) -> list[OpOutput]:
    """One file given to --report: JSON when it looks like JSON, else text with one or more runs."""
    raw = _read(t, path)
    file_op = op_from_file_name(path)
    if raw is None:
        return [OpOutput(file_op or "?", None, path, f"cannot read {path}", op_from="file name" if file_op else None)]
    if raw.lstrip().startswith("{"):
        try:
            result = parse_json(raw)
        except NcclParseError as exc:
            return [OpOutput(file_op or "?", None, path, f"{path}: {exc}")]
        op, source, notes = _resolve(result, file_op, "file name")
        return [OpOutput(op, result, path, None, tuple(notes), source)]
    return _text_outputs(raw, path, file_op, "file name")


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
            outputs += load_file(t, path)
    return outputs
