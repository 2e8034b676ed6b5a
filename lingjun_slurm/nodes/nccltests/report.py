"""The report of one nccl-tests run: verdicts, a table of bandwidth by message size, a JSON document.

The table shows the out-of-place algbw and busbw (nccl-tests' first set of columns; the in-place
value where out-of-place is N/A). Verdicts use the reference's own definition (verdict.py).
``to_json`` writes report.json, schema 2: pinned by ``report.schema.json`` beside this module and
described in docs/nccl-tests.md ("report.json").
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from .parse import NcclTestResult, Row
from .results import OpOutput
from .run import JobEnd
from .sizes import human_size
from .verdict import FAIL, Reference, Shape, Verdict, judge

REPORT_SCHEMA = 2


@dataclass
class OpReport:
    output: OpOutput
    verdict: Verdict


@dataclass
class Report:
    title: str
    ops: list[OpReport]
    jobs: list[JobEnd] = field(default_factory=list)
    chart: Optional[str] = None
    log: Optional[str] = None  # the Slurm log of the job, shown when something failed
    json_path: Optional[str] = None  # where report.json was written (not part of it)

    @property
    def ok(self) -> bool:
        return all(o.verdict.status != FAIL for o in self.ops) and all(j.ok for j in self.jobs)


def build(outputs: list[OpOutput], *, title: str, expected: Optional[Shape], references: list[Reference],
          profile: Optional[str], jobs: Optional[list[JobEnd]] = None) -> Report:
    ops = [OpReport(o, judge(o.op, o.result, expected=expected, references=references, profile=profile,
                             problem=o.problem)) for o in outputs]
    return Report(title=title, ops=ops, jobs=list(jobs or []))


def _bw(row: Row) -> tuple[Optional[float], Optional[float]]:
    """(algbw, busbw) of a row: out-of-place, or in-place when out-of-place is N/A."""
    if row.oop_busbw is not None:
        return row.oop_algbw, row.oop_busbw
    return row.ip_algbw, row.ip_busbw


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"


def _labels(ops: list[OpReport]) -> list[str]:
    """The op names, with the file's name where two outputs are of the same op."""
    names = [o.output.op for o in ops]
    return [name if names.count(name) == 1 else f"{name} ({os.path.basename(o.output.path or '?')})"
            for name, o in zip(names, ops)]


def table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Header and rows: size, then algbw and busbw (GB/s) of each op; '-' where not measured."""
    with_rows = [o for o in report.ops if o.output.result is not None and o.output.result.rows]
    header = ["size"] + [f"{label} {kind}" for label in _labels(with_rows) for kind in ("algbw", "busbw")]
    by_op = [{row.size_bytes: _bw(row) for row in o.output.result.rows} for o in with_rows]  # type: ignore[union-attr]
    sizes = sorted({s for rows in by_op for s in rows})
    body = []
    for size in sizes:
        line = [human_size(size)]
        for rows in by_op:
            alg, bus = rows.get(size, (None, None))
            line += [_fmt(alg), _fmt(bus)]
        body.append(line)
    return header, body


def verdict_lines(report: Report) -> list[str]:
    lines = [o.verdict.line(label) for label, o in zip(_labels(report.ops), report.ops)]
    for o in report.ops:
        lines += [f"{o.output.op}: note: {note}" for note in o.output.report_notes]
    for job in report.jobs:
        if not job.ok:
            code = "" if job.exit_code is None else f", exit {job.exit_code}"
            lines.append(f"job {job.job_id}: {job.state}{code}" + (f" ({job.reason})" if job.reason else ""))
    if report.log and not report.ok:
        lines.append(f"job log: {report.log}")
    return lines


def format_plain(report: Report) -> str:
    header, body = table(report)
    out = [report.title]
    if body:
        widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]
        out.append("  ".join(h.rjust(w) for h, w in zip(header, widths)) + "   (GB/s, out-of-place)")
        out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in body]
    out += verdict_lines(report)
    if report.chart:
        out.append(f"chart: {report.chart}")
    if report.json_path:
        out.append(f"report.json: {report.json_path}")
    return "\n".join(out) + "\n"


def _num(value: Optional[float]) -> Optional[float]:
    return None if value is None or math.isnan(value) else value


def _rows(result: NcclTestResult) -> list[dict[str, Any]]:
    out = []
    for r in result.rows:
        errors = [e for e in (r.oop_error, r.ip_error) if e is not None and not math.isnan(e)]
        out.append({"size_bytes": r.size_bytes, "count": r.count, "type": r.dtype, "redop": r.redop, "root": r.root,
                    "time_out_us": _num(r.oop_time_us), "algbw_out": _num(r.oop_algbw), "busbw_out": _num(r.oop_busbw),
                    "time_in_us": _num(r.ip_time_us), "algbw_in": _num(r.ip_algbw), "busbw_in": _num(r.ip_busbw),
                    "wrong": r.wrong, "max_error": max(errors) if errors else None})
    return out


def op_json(o: OpReport) -> dict[str, Any]:
    """One op of report.json (schema 2): what the output says and the verdict on it."""
    out, res, ref = o.output, o.output.result, o.verdict.reference
    return {
        "op": out.op, "file": out.path, "op_from": out.op_from,
        "ranks": out.ranks, "ranks_from": out.ranks_from, "hosts": res.hosts if res else [],
        "rows": _rows(res) if res else [],
        "avg_busbw": _num(res.avg_busbw) if res and res.avg_busbw is not None else None,
        "out_of_bounds": res.out_of_bounds if res else None,
        "complete": out.complete,
        "verdict": o.verdict.status, "reason": o.verdict.reason,
        "measured_gbps": o.verdict.measured_gbps, "reference": asdict(ref) if ref else None,
        "problem": out.problem, "notes": list(out.report_notes),
    }


def to_json(report: Report) -> dict[str, Any]:
    """report.json, schema 2 (report.schema.json): {"schema": 2, "title", "ok", "jobs": [{"job_id", "state",
    "exit_code", "reason", "nodes"}], "ops": [op_json(...)], "chart", "log"}."""
    return {"schema": REPORT_SCHEMA, "title": report.title, "ok": report.ok,
            "jobs": [asdict(j) for j in report.jobs], "ops": [op_json(o) for o in report.ops],
            "chart": report.chart, "log": report.log}
