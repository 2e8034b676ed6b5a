"""Pass/fail of one nccl-tests result against a reference figure (pure, stdlib only).

A reference comes from the network profile (published figures only, with their source) or from
the user (`--expect OP=GBPS[@SIZE]`). The value compared is the one the published checks use:
Azure's check_nccl_allreduce reads nccl-tests' "Avg bus bandwidth" of a run over one size, which
is the mean of the out-of-place and in-place busbw at that size; "peak" takes the best row.
The reference's own threshold is used as is (no margin of our own). A profile figure applies only
to the test shape it was published for (Azure's: one VM, 8 GPUs); other shapes get no verdict.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional

from ..network import Profile
from .parse import NcclTestResult, Row
from .sizes import human_size, parse_size

# The nccl-tests binaries (<op>_perf, or <op>_perf_mpi as NGC images name the MPI builds).
OPS = ("all_reduce", "all_gather", "alltoall", "broadcast", "gather", "hypercube", "reduce", "reduce_scatter",
       "scatter", "sendrecv")
PASS, FAIL, NONE = "PASS", "FAIL", "NONE"
_OP_RE = re.compile(r"^(\w+?)_perf(?:_mpi)?$")


def op_of(test_name: Optional[str]) -> Optional[str]:
    """'all_reduce_perf' or 'all_reduce_perf_mpi' -> 'all_reduce'; None when it is not a known test."""
    match = _OP_RE.match(test_name or "")
    return match.group(1) if match and match.group(1) in OPS else None


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

    def line(self) -> str:
        label = {PASS: "PASS", FAIL: "FAIL", NONE: "no verdict"}[self.status]
        return f"{self.op}: {label}: {self.reason}"


def data_errors(result: NcclTestResult) -> Optional[str]:
    wrong = sum(w for row in result.rows for w in (row.oop_wrong, row.ip_wrong) if w and w > 0)
    if wrong:
        return f"{wrong} wrong elements in the data check (#wrong column)"
    if result.out_of_bounds:
        return f"{result.out_of_bounds} out-of-bounds values (the test's own bandwidth or data check failed)"
    return None


def judge(op: str, result: Optional[NcclTestResult], *, expected: Optional[Shape], references: list[Reference],
          profile: Optional[str], problem: Optional[str] = None) -> Verdict:
    """The verdict for one op. `problem` explains a missing result (no output file, unparseable)."""
    if result is None:
        return Verdict(op, FAIL, problem or f"no {op} output")
    if not result.rows:
        return Verdict(op, FAIL, problem or "no results table in the output (nccl-tests did not run)")
    errors = data_errors(result)
    if errors:
        return Verdict(op, FAIL, errors)
    seen = observed_shape(result)
    if seen and expected and expected.ranks and len({r.rank for r in result.ranks}) != expected.ranks:
        count = len({r.rank for r in result.ranks})
        return Verdict(op, FAIL, f"nccl-tests reports {count} rank(s) but the job ran {expected.ranks} tasks: each "
                                 "task ran on its own (a binary built without MPI=1, or --mpi does not match its MPI)")
    shape = seen or expected
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
