"""Pass/fail of one nccl-tests result against a reference figure (pure, stdlib only).

A reference comes from the network profile (published figures only, with their source) or from
the user (`--expect OP=GBPS[@SIZE]`). The value compared is the one the published checks use:
Azure's check_nccl_allreduce reads nccl-tests' "Avg bus bandwidth" of a run over one size, which
is the mean of the out-of-place and in-place busbw at that size; "peak" takes the best row.
The reference's own threshold is used as is (no margin of our own). A profile figure applies only
to the test shape it was published for (Azure's: one VM, 8 GPUs); other shapes get no verdict.

Before any figure, the output itself can fail the test (``failure_reasons``): no results table, a row
cut short, nccl-tests' own failure lines (quoted as the line that says why: ``<host>: Test CUDA
failure <file>:<line> '<why>'``, NVIDIA/nccl-tests src/common.h CUDACHECK/NCCLCHECK, not the
``.. <host> pid N: Test failure`` traceback TESTCHECK prints after it), wrong elements, out-of-bounds
values, no closing "Avg bus bandwidth" line, nccl-tests' own NCCL_TESTS_MIN_BW check, or tasks that
each ran their own test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from lingjun_slurm.network import Profile
from .parse import OPS, NcclTestResult, Row
from .sizes import human_size, parse_size

PASS, FAIL, NONE = "PASS", "FAIL", "NONE"


@dataclass(frozen=True)
class Reference:
    op: str
    busbw_gbps: float
    size_bytes: Optional[int]  # None: the peak (best) busbw over every size measured
    nodes: Optional[int]  # the shape the figure is for; None: any shape
    gpus_per_node: Optional[int]
    source: str

    def describe(self) -> str:
        where = f"at {human_size(self.size_bytes)}" if self.size_bytes else "at its best message size"
        return f"{self.op} busbw >= {self.busbw_gbps:g} GB/s {where}"

    def shape(self) -> str:
        return shape_text(self.nodes, self.gpus_per_node)


def shape_text(nodes: Optional[int], per_node: Optional[int]) -> str:
    return f"{nodes or '?'} node{'' if nodes == 1 else 's'} x {per_node or '?'} GPU{'' if per_node == 1 else 's'}"


def profile_references(profile: Profile) -> list[Reference]:
    return [Reference(op=r.op, busbw_gbps=r.busbw_gbps, size_bytes=None if r.size == "peak" else parse_size(r.size),
                      nodes=r.nodes, gpus_per_node=r.gpus_per_node, source=f"{r.source} (profile {profile.name})")
            for r in profile.nccl_references]


def parse_expect(text: str) -> Reference:
    """'all_reduce=350' (peak) or 'all_reduce=350@16G' -> a user reference for any test shape."""
    op, sep, rest = text.partition("=")
    value, _, size = rest.partition("@")
    if not sep or op not in OPS:
        raise ValueError(f"expected OP=GBPS[@SIZE] with OP one of {', '.join(OPS)}, got {text!r}")
    try:
        gbps = float(value)
    except ValueError:
        raise ValueError(f"{text!r}: {value!r} is not a bandwidth in GB/s") from None
    if not math.isfinite(gbps) or gbps <= 0:
        raise ValueError(f"{text!r}: the bandwidth must be a positive number of GB/s")
    size_bytes = None if size in ("", "peak") else parse_size(size)
    return Reference(op=op, busbw_gbps=gbps, size_bytes=size_bytes, nodes=None, gpus_per_node=None,
                     source="--expect on the command line")


@dataclass(frozen=True)
class Shape:
    nodes: Optional[int]
    tasks_per_node: Optional[int]

    @property
    def ranks(self) -> Optional[int]:
        return self.nodes * self.tasks_per_node if self.nodes and self.tasks_per_node else None

    def describe(self) -> str:
        return shape_text(self.nodes, self.tasks_per_node)


def observed_shape(result: NcclTestResult) -> Optional[Shape]:
    """The shape the output itself reports in its rank lines, None when it has none."""
    ranks = {r.rank: r.host for r in result.ranks}
    if not ranks:
        return None
    hosts = len(set(ranks.values()))
    return Shape(nodes=hosts, tasks_per_node=len(ranks) // hosts if len(ranks) % hosts == 0 else None)


def busbw_value(result: NcclTestResult, size_bytes: Optional[int]) -> Optional[float]:
    """Mean of the out-of-place and in-place busbw at size_bytes (what 'Avg bus bandwidth' is for a
    one-size run); with size None, the best busbw of any row. None when not measured."""
    def usable(row_values: tuple[Optional[float], ...]) -> list[float]:
        return [v for v in row_values if v is not None and not math.isnan(v)]

    if size_bytes is None:
        values = [v for row in result.rows for v in usable((row.oop_busbw, row.ip_busbw))]
        return max(values) if values else None
    row = row_at(result, size_bytes)
    if row is None:
        return None
    values = usable((row.oop_busbw, row.ip_busbw))
    return sum(values) / len(values) if values else None


def row_at(result: NcclTestResult, size_bytes: int) -> Optional[Row]:
    """The row of the requested size. nccl-tests rounds a size down to a multiple of the rank count
    for all_gather, reduce_scatter and alltoall (16G on 24 ranks prints 17179869120), so the row
    just below it (within 0.1 %) is that size when no row matches exactly."""
    exact = [row for row in result.rows if row.size_bytes == size_bytes]
    if exact:
        return exact[0]
    near = [row for row in result.rows if size_bytes - size_bytes // 1000 <= row.size_bytes < size_bytes]
    return max(near, key=lambda row: row.size_bytes) if near else None


@dataclass(frozen=True)
class Verdict:
    op: str
    status: str  # PASS | FAIL | NONE (no verdict: measurement only)
    reason: str
    measured_gbps: Optional[float] = None
    reference: Optional[Reference] = None

    def line(self, name: Optional[str] = None) -> str:
        label = {PASS: "PASS", FAIL: "FAIL", NONE: "no verdict"}[self.status]
        return f"{name or self.op}: {label}: {self.reason}"


_GENERIC_LAUNCHER = ("srun: error: ", "mpirun detected that", "Primary job", "srun: Job step aborted")


def cause(result: NcclTestResult) -> Optional[str]:
    """The line that says why a test failed: nccl-tests' own failure line ("<host>: Test CUDA failure
    common.cu:1304 'CUDA-capable device(s) is/are busy or unavailable'", not the ".. Test failure
    common.cu:891" traceback after it), with NCCL's first warning when it printed one; else the message
    that cut a row short; else the launcher's most specific error line. None when nothing says."""
    if result.failures:
        line = result.failures[0]
        others = len(result.failures) - 1
        if others:
            line += f" (and {others} more failure line{'s' if others > 1 else ''})"
        if result.nccl_warnings:
            line += f"; first NCCL warning: {result.nccl_warnings[0]}"
        return line
    if result.interrupted is not None and result.interrupted.text:
        return result.interrupted.text
    if result.launcher_errors:
        specific = [e for e in result.launcher_errors if not e.startswith(_GENERIC_LAUNCHER)
                    or "Invalid MPI" in e or "CANCELLED" in e or "Unable" in e]
        return (specific or result.launcher_errors)[0]
    return None


def data_errors(result: NcclTestResult) -> Optional[str]:
    """What the data check found: wrong elements (#wrong, nccl-tests >= 2.13) and out-of-bounds values
    (the count of checks that found errors; before 2.13 the only sign, the error column being the
    maximum deviation)."""
    bad = [row for row in result.rows if row.wrong]
    parts = []
    if bad:
        total = sum(row.wrong or 0 for row in bad)
        sizes = ", ".join(human_size(row.size_bytes) for row in bad[:4]) + (" ..." if len(bad) > 4 else "")
        parts.append(f"{total} wrong elements in the data check (#wrong) at {sizes}")
    if result.out_of_bounds:
        parts.append(f"Out of bounds values: {result.out_of_bounds} FAILED")
    return "; ".join(parts) or None


def failure_reasons(result: NcclTestResult) -> list[str]:
    """Every reason the output itself gives to fail, most telling first; [] when it shows a finished,
    clean run. Independent of any reference figure or expected shape."""
    reasons: list[str] = []
    why = cause(result)
    if not result.rows:
        if result.interrupted is not None:
            where = f" (it died in the {human_size(result.interrupted.size_bytes)} row)" \
                if result.interrupted.size_bytes is not None else ""
            reasons.append(f"no results table{where}: {why or 'the output stops in the first row'}")
        else:
            said = why or result.said
            reasons.append("no results table (nccl-tests did not run)" + (f": {said}" if said else
                           ": the output is empty" if result.last_line == 0 else ""))
        return reasons
    last = human_size(result.rows[-1].size_bytes)
    if result.interrupted is not None:
        size = result.interrupted.size_bytes
        during = f"during the {human_size(size)} measurement" if size is not None else "in a row cut short"
        reasons.append(f"{why} ({during})" if why else
                       f"incomplete: the output stops {during}, after the {last} row, without the 'Avg bus "
                       "bandwidth' line (the test was killed, failed or is still running)")
    elif why and result.failures:
        reasons.append(why if result.ended else f"{why} (after the {last} row)")
    errors = data_errors(result)
    if errors:
        reasons.append(errors)
    if not result.ended and result.interrupted is None:
        said = f"; it says: {why or result.said}" if (why or result.said) and not result.failures else ""
        reasons.append(f"incomplete: the output stops after the {last} row without the 'Avg bus bandwidth' line "
                       f"(the test was killed, failed or is still running){said}")
    if result.avg_check == "FAILED":
        reasons.append(f"nccl-tests' own check failed: Avg bus bandwidth {result.avg_busbw:g} FAILED "
                       "(below 0.9 x NCCL_TESTS_MIN_BW)")
    repeated = len(result.ranks) - len({r.rank for r in result.ranks})
    if repeated and result.streams == 1:
        reasons.append(f"the rank lines repeat ({repeated} of {len(result.ranks)} are a rank already listed): "
                       "each task ran its own test (a binary built without MPI=1, or --mpi does not match its MPI)")
    if result.streams > 1:
        reasons.append(f"{result.streams} tasks each printed their own nccl-tests header: each ran as its own "
                       "test (a binary built without MPI=1, or --mpi does not match its MPI)")
    return reasons


def judge(op: str, result: Optional[NcclTestResult], *, expected: Optional[Shape], references: list[Reference],
          profile: Optional[str], problem: Optional[str] = None) -> Verdict:
    """The verdict for one op. `problem` explains a missing result (no output file, unparseable).
    FAIL when the output shows a failure (failure_reasons), when it reports another rank count than
    the job's tasks, or when a reference applies and the busbw is below it; PASS when a reference
    applies and is met; NONE (measurement only) otherwise."""
    if result is None:
        return Verdict(op, FAIL, problem or f"no {op} output")
    reasons = failure_reasons(result)
    if reasons:
        return Verdict(op, FAIL, "; ".join(reasons))
    count = result.rank_count
    if count and expected and expected.ranks and count != expected.ranks:
        return Verdict(op, FAIL, f"nccl-tests reports {count} rank(s) but the job ran {expected.ranks} tasks: each "
                                 "task ran on its own (a binary built without MPI=1, or --mpi does not match its MPI)")
    shape = observed_shape(result) or expected
    mine = [r for r in references if r.op == op and r.nodes is None]
    published = [r for r in references if r.op == op and r.nodes is not None]
    if mine:
        ref = mine[0]
    elif not published:
        return Verdict(op, NONE, f"no published reference for {op}_perf"
                                 + (f" (profile {profile}); measurement only" if profile else "; measurement only"))
    else:
        matching = [r for r in published if shape and shape.nodes == r.nodes and shape.tasks_per_node == r.gpus_per_node]
        if not matching:
            ref = published[0]
            ran = shape.describe() if shape else "an unknown shape"
            return Verdict(op, NONE, f"the published figure ({ref.describe()}) is for {ref.shape()}; this test "
                                     f"ran {ran}")
        ref = matching[0]
    value = busbw_value(result, ref.size_bytes)
    if value is None:
        sizes = [row.size_bytes for row in result.rows]
        return Verdict(op, NONE, f"{human_size(ref.size_bytes or 0)} was not measured (sizes "
                                 f"{human_size(min(sizes))}..{human_size(max(sizes))}); raise --max-bytes (nccl-tests "
                                 "also lowers it to fit the GPUs' memory: see 'Reducing maxBytes' in its output)",
                       None, ref)
    where = f"at {human_size(ref.size_bytes)}" if ref.size_bytes else "peak"
    if value >= ref.busbw_gbps:
        return Verdict(op, PASS, f"busbw {value:.2f} GB/s {where} >= {ref.busbw_gbps:g} GB/s ({ref.source})", value, ref)
    return Verdict(op, FAIL, f"busbw {value:.2f} GB/s {where} < {ref.busbw_gbps:g} GB/s ({ref.source})", value, ref)
