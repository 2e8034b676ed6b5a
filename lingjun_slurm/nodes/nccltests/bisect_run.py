"""Run a bisection on Slurm: each round's 2-node all_reduce jobs are submitted together and waited
for with one squeue per poll; bisect.py decides the pairs and reads the results."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from lingjun_slurm.transport.base import Transport
from .bisect import Bisection, Outcome, PairResult
from .plan import SCRIPT, NcclJob, render, with_options
from .results import load_op
from .run import JobEnd, Waiter, submit_all
from .sizes import human_size
from .verdict import Reference, busbw_value, failure_reasons

OP = "all_reduce"


@dataclass
class BisectReport:
    outcome: Outcome
    metric: str  # what a pair's busbw is: "peak busbw" or "busbw at 16 GiB"
    directories: dict[tuple[str, str], str]
    chart: Optional[str] = None

    @property
    def ok(self) -> bool:
        return not self.outcome.slow and not self.outcome.undetermined


def pair_busbw(t: Transport, directory: str, end: JobEnd, size: Optional[int],
               expected_ranks: int) -> tuple[Optional[float], str]:
    """A pair's bandwidth figure and the evidence line; None when the job or the test failed."""
    out = load_op(t, directory, OP)
    where = f"job {end.job_id} {end.state}" + ("" if end.exit_code in (None, 0) else f" exit {end.exit_code}")
    if out.result is None:
        return None, f"{where}: {out.problem or 'no results table'}"
    failed = failure_reasons(out.result)
    if failed:
        return None, f"{where}: {'; '.join(failed)}"
    ranks = out.result.rank_count or 0
    if ranks and ranks != expected_ranks:
        return None, f"{where}: {ranks} rank(s) reported for {expected_ranks} tasks (each task ran alone?)"
    value = busbw_value(out.result, size)
    if value is None:
        return None, f"{where}: {human_size(size or 0)} not measured ({out.path})"
    if not end.ok:
        return None, f"{where} ({out.path})"
    return value, f"{where}, {ranks or '?'} ranks ({out.path})"


def run_bisection(t: Transport, waiter: Waiter, base: NcclJob, nodes: list[str], *,
                  reference: Optional[Reference], progress: Callable[[str], None],
                  max_rounds: int = 20) -> BisectReport:
    bis = Bisection(nodes, threshold=reference.busbw_gbps if reference else None)
    size = reference.size_bytes if reference else None
    metric = f"busbw at {human_size(size)}" if size else "peak busbw"
    dirs: dict[tuple[str, str], str] = {}
    while bis.round < max_rounds:
        pairs = bis.next_pairs()
        if not pairs:
            break
        scripts = []
        for i, (a, b) in enumerate(pairs, start=1):
            directory = f"{base.out_dir}/round{bis.round}/{a}-{b}"
            name = f"{base.job_name}-r{bis.round}p{i}"
            job = replace(base, job_name=name, out_dir=directory, nodes=2, nodelist=f"{a},{b}", ops=(OP,),
                          reproduce=with_options(base.reproduce, render_only=directory, nodes="2",
                                                 nodelist=f"{a},{b}", ops=OP, job_name=name))
            Path(directory).mkdir(parents=True, exist_ok=True)
            t.write_atomic(f"{directory}/{SCRIPT}", render(job), mode=0o755)
            scripts.append((SCRIPT, directory, f"round {bis.round}: {a}+{b}"))
            dirs[(a, b)] = directory
        progress(f"round {bis.round}: {len(pairs)} pair job(s): " + ", ".join(f"{a}+{b}" for a, b in pairs))
        jobs = submit_all(waiter.sched, scripts)
        ends = waiter.wait(jobs)
        results = []
        for (a, b), job in zip(pairs, jobs):
            value, detail = pair_busbw(t, job.directory, ends[job.job_id], size, 2 * base.tasks_per_node)
            results.append(PairResult((a, b), value, bis.round, detail))
        bis.record(results)
    return BisectReport(outcome=bis.outcome(), metric=metric, directories=dirs)


def format_bisect(report: BisectReport) -> str:
    o = report.outcome
    th = o.threshold
    lines = [f"bisection of {len(o.good) + len(o.slow) + len(o.undetermined)} nodes: {len(o.results)} pair job(s), "
             f"pair figure = {report.metric}; good when {o.rule}",
             f"{'round':>5}  {'pair':<32} {'busbw':>9}  result"]
    for r in o.results:
        value = "failed" if r.busbw is None else f"{r.busbw:.2f}"
        ok = r.busbw is not None and th is not None and r.busbw >= th
        lines.append(f"{r.round:>5}  {'+'.join(r.nodes):<32} {value:>9}  {'ok' if ok else 'BELOW'}  {r.detail}")
    if o.slow:
        lines.append("slow node(s): " + ", ".join(o.slow))
        for node in o.slow:
            for r in o.evidence.get(node, []):
                value = "failed" if r.busbw is None else f"{r.busbw:.2f} GB/s"
                lines.append(f"  {node}: with {next(n for n in r.nodes if n != node)}: {value}"
                             + (f" < {th:.2f} GB/s" if th is not None and r.busbw is not None else ""))
    if o.undetermined:
        lines.append("undetermined: " + ", ".join(o.undetermined)
                     + " (no pair with a known-good node: every pair is below the threshold, so the cause is "
                       "more likely the fabric, the configuration or the threshold than one node)")
    if not o.slow and not o.undetermined:
        lines.append("no slow node found")
    if report.chart:
        lines.append(f"chart: {report.chart}")
    return "\n".join(lines) + "\n"


def bisect_json(report: BisectReport) -> dict[str, Any]:
    o = report.outcome
    return {"schema": 1, "bisection": True, "ok": report.ok, "metric": report.metric, "rule": o.rule,
            "threshold_gbps": o.threshold, "slow": o.slow, "good": o.good, "undetermined": o.undetermined,
            "pairs": [{**asdict(r), "nodes": list(r.nodes), "directory": report.directories.get(r.nodes)}
                      for r in o.results],
            "chart": report.chart}
