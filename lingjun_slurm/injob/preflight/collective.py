"""The collective smoke test's judge and its pure parts (standard library only: the batch host).

    python3 -m lingjun_slurm.stages collective-judge --plan PLAN.json --out DIR --nodes "n1 n2 ..."

DIR is $RUN_DIR/preflight/<attempt>/collective, where the runner (lingjun_slurm/injob/stages/
collective.py, one task per rank inside the container, the train step's layout) wrote
results.json (rank 0) and rank-<N>.json (every rank: started, done, or the phase it was in when
its deadline timer fired). Writes DIR/collective-verdict.json in verdict.json's shape
(bad_nodes, reasons, problems, exit; "source": SOURCE), prints one line per bad node and per
job-wide problem. Exit 0 passed, 1 bad nodes (exclude them), 2 job-wide (nobody to blame).
Exit 0 also when the test did not finish (its deadline fired) or a slow pair was left
undetermined: the verdict then has "warnings" (printed as "warning:" lines), judged on the phases
that finished (results.json's "phases_done"), and the job trains: a hang of this step fails the
step, never the job. What was not judged (no floor that applies, too few nodes for pairs, gloo)
is in verdict["collective"]["not_judged"] and on the final line.

Bus bandwidth as nccl-tests defines it (NVIDIA/nccl-tests doc/PERFORMANCE.md at a0b82b2260cf,
lines 18-20, 63, 83-97, 138-140): algbw = S/t; all_reduce busbw = algbw * 2(n-1)/n; all_gather
busbw = algbw * (n-1)/n, where S is the whole buffer (for all_gather the gathered output,
src/all_gather.cu: recvcount = sendcount * nranks) and n the number of ranks.

How it judges (docs/fault-tolerance.md, "Collective smoke test"):
- per node (the ranks of one node, side by side on every node): only against a published
  single-node floor whose setup matches what was measured (the profile's nccl_tests_reference:
  op, nodes 1, gpus_per_node = the node's ranks, the GPU model, the size); otherwise measured and
  recorded, not judged.
- across nodes: disjoint pairs of nodes side by side, narrowed by the rounds of
  lingjun_slurm/nodes/nccltests/bisect.py (a pair runs at its slower node's pace). A node's figure
  is its best pair's busbw; a node is slow when the bisection finds it slow (in a pair below the
  threshold with a good node) and its figure is below REL x the allocation's median. The whole
  allocation's busbw at the largest size is held to the network's per-port floor (PORT_FLOOR x
  one port's line rate): below it on GPUs is job-wide (a wrong profile, a TCP fallback).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from lingjun_slurm.nodes.nccltests.bisect import Bisection, PairResult

from . import PREFIX, SCHEMA, knobs, write_json

SOURCE = "preflight-collective"  # excluded.json's source for the nodes this judge blames
RESULTS = "results.json"
VERDICT = "collective-verdict.json"
EXIT_DEADLINE = 79  # a rank's deadline timer: os._exit(EXIT_DEADLINE) (distinct from 1, 124, 137, 143)
REL = 0.5  # a node below REL x the allocation's median (and the bisection's threshold) is slow
OPS = ("all_reduce", "all_gather")
# Sizes (bytes per rank's buffer; all_gather: the gathered output). Few and small: the test is a
# smoke test inside a 60 s bound, not a benchmark. gloo on CPUs gets the small set.
SIZES_GPU = (1 << 20, 64 << 20, 256 << 20)
SIZES_CPU = (256 << 10, 4 << 20)
ITERS_GPU, ITERS_CPU = 5, 5
# The per-port floor is this fraction of one port's line rate (settings.preflight.collective
# "port_floor" overrides it). Not the full rate: with one GPU per node all traffic crosses one NIC,
# and NCCL's all_reduce busbw over one 400 Gb/s NDR port (50 GB/s) stays below the line rate
# (protocol and PCIe overheads): 2 nodes x 1 H100 reach 39.9 GB/s at 16 MiB and 41.3 at 32 MiB
# (NVIDIA/nccl-tests issue #232, all_reduce_perf output), about 45-48 at 256 MiB. Half the rate
# still fails what the floor is for, a TCP fallback or a wrong profile, an order of magnitude below.
PORT_FLOOR = 0.5
WARMUP = 1

__all__ = ["EXIT_DEADLINE", "OPS", "PORT_FLOOR", "REL", "RESULTS", "SOURCE", "VERDICT", "busbw", "collective_knobs",
           "judge", "main", "narrow", "node_figures", "parse_size", "parse_slow", "rank_file", "wave"]


def busbw(op: str, size: int, seconds: float, n: int) -> float:
    """Bus bandwidth in GB/s (1e9 bytes/s, as nccl-tests prints) of OP on SIZE bytes in SECONDS."""
    if seconds <= 0 or n < 1:
        raise ValueError(f"busbw of {op}: time {seconds} s over {n} ranks")
    algbw = size / seconds / 1e9
    if op == "all_reduce":
        return algbw * 2 * (n - 1) / n
    if op == "all_gather":
        return algbw * (n - 1) / n
    raise ValueError(f"unknown collective {op!r}")


def parse_slow(text: Optional[str]) -> Dict[str, float]:
    """LINGJUN_PREFLIGHT_SLOW="NODE=FACTOR[,NODE=FACTOR]" (a test hook, 0 < FACTOR <= 1); {} when unset."""
    out: Dict[str, float] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        node, sep, factor = item.rpartition("=")
        try:
            value = float(factor)
        except ValueError:
            value = -1.0
        if not sep or not node or not 0 < value <= 1:
            raise ValueError(f"LINGJUN_PREFLIGHT_SLOW: {item!r} is not NODE=FACTOR with 0 < FACTOR <= 1")
        out[node] = value
    return out


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """nccl-tests' size notation ("16G", "64M", "1024"): bytes."""
    t = str(text).strip().upper().rstrip("B")
    unit = t[-1:] if t[-1:] in _UNITS and t[-1:] else ""
    number = t[:-1] if unit else t
    try:
        value = int(float(number) * _UNITS[unit])
    except ValueError:
        raise ValueError(f"not a size: {text!r}") from None
    if value <= 0:
        raise ValueError(f"not a size: {text!r}")
    return value


def rank_file(rank: int) -> str:
    return f"rank-{int(rank)}.json"


def collective_knobs(plan: dict) -> dict:
    """settings.preflight.collective (plan.settings): timeout_s, rel, sizes, floors, port, network_vars."""
    got = knobs(plan).get("collective") or {}
    return got if isinstance(got, dict) else {}


def wave(pairs: Sequence[Tuple[str, str]]) -> List[List[Tuple[str, str]]]:
    """Split a round's pairs into waves of node-disjoint pairs (each wave runs side by side)."""
    waves: List[List[Tuple[str, str]]] = []
    for pair in pairs:
        for w in waves:
            if not any(set(pair) & set(p) for p in w):
                w.append(pair)
                break
        else:
            waves.append([pair])
    return waves


def _pair_results(results: dict, op: str, size: Optional[int]) -> List[PairResult]:
    out = []
    for r in results.get("pairs") or []:
        if not isinstance(r, dict) or r.get("op") != op or (size is not None and r.get("bytes") != size):
            continue
        nodes = r.get("nodes") or []
        if len(nodes) != 2:
            continue
        bw = r.get("busbw_gbps")
        out.append(PairResult((str(nodes[0]), str(nodes[1])), float(bw) if isinstance(bw, (int, float)) else None,
                              int(r.get("round") or 1)))
    return out


def judged_size(results: dict, op: str = "all_reduce") -> Optional[int]:
    """The size the pairs are judged at: the largest one the pairs measured."""
    sizes = [r.get("bytes") for r in results.get("pairs") or [] if isinstance(r, dict) and r.get("op") == op]
    sizes = [s for s in sizes if isinstance(s, int)]
    return max(sizes) if sizes else None


def narrow(nodes: Sequence[str], pairs: Sequence[PairResult], rel: float = REL):
    """Replay recorded pair results through the bisection (nccltests/bisect.py): its Outcome."""
    bis = Bisection(list(nodes), rel=rel)
    bis.record(list(pairs))
    return bis.outcome()


def node_figures(nodes: Sequence[str], pairs: Sequence[PairResult]) -> Dict[str, float]:
    """Each node's best pair busbw (a pair runs at its slower node's pace: a node is at least that fast)."""
    out: Dict[str, float] = {}
    for r in pairs:
        if r.busbw is None:
            continue
        for n in r.nodes:
            if n in nodes:
                out[n] = max(out.get(n, 0.0), r.busbw)
    return out


def _gb(value: float) -> str:
    return f"{value:.3g}" if value < 10 else f"{value:.0f}"


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def cross_node(results: dict, nodes: List[str], rel: float
               ) -> Tuple[Dict[str, str], List[str], List[str], Dict[str, Any]]:
    """Bad nodes, job-wide problems, warnings and a summary from the pairs (all_reduce at the
    largest size). Slow pairs the bisection left undetermined are a warning, not job-wide: the
    time bound ran out, which says nothing against the job's nodes."""
    info: Dict[str, Any] = {}
    size = judged_size(results)
    if size is None:
        return {}, [], [], info
    pairs = _pair_results(results, "all_reduce", size)
    figures = node_figures(nodes, pairs)
    info.update({"op": "all_reduce", "bytes": size, "node_busbw_gbps": {n: round(v, 4) for n, v in figures.items()}})
    if len(nodes) < 3 or not figures:
        return {}, [], [], info
    median = statistics.median(figures.values())
    outcome = narrow(nodes, pairs, rel)
    info.update({"median_gbps": round(median, 4), "rule": outcome.rule, "slow": outcome.slow,
                 "undetermined": outcome.undetermined})
    bad: Dict[str, str] = {}
    for node in outcome.slow:
        fig = figures.get(node)
        if fig is not None and fig >= rel * median:
            continue
        partners = sorted({m for r in outcome.evidence.get(node, []) for m in r.nodes if m != node})
        shown = fig if fig is not None else 0.0
        ratio = f"{median / shown:.1f}x below" if shown > 0 else "far below"
        bad[node] = (f"all_reduce busbw {_gb(shown)} GB/s at {_size(size)} in pairs with {' and '.join(partners)}, "
                     f"{ratio} the allocation's median {_gb(median)} GB/s (collective smoke test, {rel:g}x the "
                     f"median is the floor)")
    problems: List[str] = []
    if len(bad) * 2 > len(nodes):
        problems.append(f"collective smoke test: {len(bad)} of {len(nodes)} nodes slow in pairs: not one node's fault")
        bad = {}
    warnings: List[str] = []
    suspects = [n for n in outcome.undetermined if n not in bad]
    if suspects and any(r.busbw is None or r.busbw < rel * median for r in pairs):
        warnings.append(f"collective smoke test: slow pairs could not be narrowed to a node within the time bound "
                        f"(undetermined: {', '.join(suspects)}); not excluding anyone, training anyway; see {RESULTS}")
    return bad, problems, warnings, info


def _matches(ref: dict, device: str, ranks: int) -> bool:
    gpu = str(ref.get("gpu") or "")
    return (ref.get("op") == "all_reduce" and int(ref.get("nodes") or 0) == 1
            and int(ref.get("gpus_per_node") or 0) == ranks and bool(gpu) and gpu.lower() in device.lower())


def per_node(results: dict, nodes: List[str], floors: List[dict]) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """Nodes whose single-node all_reduce is below a published floor that applies (same op, size,
    GPU model and GPUs per node as the figure's source measured)."""
    bad: Dict[str, str] = {}
    info: Dict[str, Any] = {"judged_against": None}
    device = str(results.get("device") or "")
    for node in nodes:
        entries = (results.get("per_node") or {}).get(node) or []
        ranks = len((results.get("ranks_per_node") or {}).get(node) or [])
        for ref in floors:
            if not isinstance(ref, dict) or not _matches(ref, device, ranks):
                continue
            try:
                size = parse_size(str(ref.get("size")))
            except ValueError:
                continue
            got = next((e for e in entries if e.get("op") == "all_reduce" and e.get("bytes") == size
                        and isinstance(e.get("busbw_gbps"), (int, float))), None)
            if got is None:
                continue
            info["judged_against"] = ref
            floor = float(ref["busbw_gbps"])
            if got["busbw_gbps"] < floor:
                bad[node] = (f"all_reduce busbw {_gb(got['busbw_gbps'])} GB/s on its {ranks} GPUs at {_size(size)}, "
                             f"below the published single-node floor {_gb(floor)} GB/s ({ref.get('source', '?')})")
    return bad, info


def port_floor_problem(results: dict, knob: dict) -> Optional[str]:
    """The whole allocation's all_reduce at the largest size below one port's line rate (GPU runs only)."""
    port = knob.get("port") or {}
    if results.get("backend") != "nccl" or not isinstance(port, dict) or not port.get("gbps"):
        return None
    whole = [e for e in results.get("whole") or [] if e.get("op") == "all_reduce"
             and isinstance(e.get("busbw_gbps"), (int, float))]
    if not whole or len(results.get("nodes") or []) < 2:
        return None
    top = max(whole, key=lambda e: e.get("bytes") or 0)
    factor = float(knob.get("port_floor") or PORT_FLOOR)
    floor = factor * float(port["gbps"]) / 8  # Gb/s -> GB/s
    if top["busbw_gbps"] >= floor:
        return None
    env = knob.get("network_vars") or {}
    shown = ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "none"
    return (f"collective smoke test: all_reduce across all {len(results['nodes'])} nodes at {_size(top['bytes'])}: "
            f"busbw {_gb(top['busbw_gbps'])} GB/s, below {factor:g} x one network port's rate: {_gb(floor)} GB/s "
            f"({port.get('gbps')} Gb/s, {port.get('source', 'the network profile')}); slow everywhere, so not one "
            f"node: the network profile ({knob.get('profile') or '?'}) may be wrong for these nodes (a TCP "
            f"fallback?). The job set: {shown}")


def _load(path: Path) -> Optional[dict]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def rank_states(out: Path) -> Dict[int, dict]:
    states = {}
    for path in sorted(out.glob("rank-*.json")) if out.is_dir() else []:
        doc = _load(path)
        if doc is not None and isinstance(doc.get("rank"), int):
            states[doc["rank"]] = doc
    return states


def _current(doc: Optional[dict], job: Optional[str], restart: Optional[str]) -> bool:
    return doc is not None and not (job and str(doc.get("job")) != job or restart and str(doc.get("restart")) != restart)


def missing_verdict(out: Path, nodes: List[str], job: Optional[str], restart: Optional[str], timeout: Any,
                    done: Sequence[str] = ()) -> Tuple[Dict[str, str], List[str], List[str]]:
    """The test did not finish (no results.json, or one without "complete_run"): bad nodes,
    job-wide problems, warnings. Nodes none of whose ranks reported are bad when they are a
    minority; none reporting, most nodes silent, or errors without any deadline are job-wide. A
    deadline (the step hung or ran out of time; errors beside it are its peers' lost connections)
    or an end without results is a warning: this step failed, the job trains on the phases DONE."""
    states = {r: d for r, d in rank_states(out).items() if _current(d, job, restart)}
    seen = {str(d.get("node")) for d in states.values()}
    silent = [n for n in nodes if n not in seen]
    late = sorted({f"{d.get('node')} ({d.get('phase')})" for d in states.values() if d.get("state") == "deadline"})
    errors = sorted({f"{d.get('node')}: {d.get('error')}" for d in states.values() if d.get("state") == "error"})
    if silent and len(silent) * 2 < len(nodes):
        why = ("no rank of the collective smoke test reported from this node (its task or container did not start, "
               "or it hung before torch.distributed init); see the job log")
        return {n: why for n in silent}, [], []
    if silent and len(silent) == len(nodes):
        return {}, ["collective smoke test: no rank reported (the step or the image failed to start); "
                    "see the job log"], []
    what = f"its deadline ({timeout} s) fired on {', '.join(late[:6])}" if late else "it ended without results"
    detail = f"; errors: {'; '.join(errors[:3])}" if errors else ""
    if silent:
        detail += f"; no rank reported from {', '.join(silent[:8])}"
    if silent or (errors and not late):
        return {}, [f"collective smoke test failed: {what}{detail}; a failure of this step, not of the job's nodes "
                    f"that can be told apart; see the job log"], []
    judged = [p for p in done if p != "layout"]
    return {}, [], [f"collective smoke test did not finish: {what}{detail}; judged on the phases that finished "
                    f"({', '.join(judged) or 'none'}); a failure of this step, not of the job: training anyway"]


def not_judged(results: Optional[dict], nodes: List[str], knob: dict, summary: Dict[str, Any]) -> List[str]:
    """What this verdict did not judge, and why (printed after "passed": a check that did not run
    must not read as one that passed)."""
    if results is None:
        return ["nothing judged (no results)"]
    done = set(results.get("phases_done") or []) if not results.get("complete_run") else {"per-node", "whole", "pairs"}
    out: List[str] = []
    ranks = sorted({len(r) for r in (results.get("ranks_per_node") or {}).values() if isinstance(r, list)})
    shown = "/".join(str(r) for r in ranks) or "?"
    device = str(results.get("device") or "?")
    if "per-node" not in done:
        out.append("per node: not judged (the phase did not finish)")
    elif not (summary.get("per_node") or {}).get("judged_against"):
        if not any((results.get("per_node") or {}).values()):
            out.append("per node: not judged (one rank per node: nothing to measure side by side)")
        else:
            out.append(f"per node: not judged (no published single-node floor for {device}, {shown} ranks per node)")
    if len(nodes) < 3:
        out.append(f"across nodes: not judged (pairs need >= 3 nodes, {len(nodes)} here)")
    elif "pairs" not in done and not results.get("pairs"):
        out.append("across nodes: not judged (the pairs did not run before the deadline)")
    port = knob.get("port")
    if len(nodes) < 2:
        out.append("per-port floor: not judged (one node)")
    elif results.get("backend") != "nccl":
        out.append(f"per-port floor: not judged ({results.get('backend') or '?'} on CPUs: no RDMA fabric to hold "
                   f"to it)")
    elif not isinstance(port, dict) or not port.get("gbps"):
        out.append(f"per-port floor: not judged (the network profile {knob.get('profile') or '?'} gives no port rate)")
    elif not any(e.get("op") == "all_reduce" for e in results.get("whole") or [] if isinstance(e, dict)):
        out.append("per-port floor: not judged (the whole-allocation phase did not finish)")
    return out


def judge(plan: dict, out: Path, nodes: List[str], env: Optional[Dict[str, str]] = None) -> dict:
    env = dict(os.environ if env is None else env)
    nodes = [n for i, n in enumerate(nodes) if n and n not in nodes[:i]]
    job, restart = env.get("SLURM_JOB_ID"), env.get("SLURM_RESTART_COUNT")
    if job and not restart:
        restart = "0"
    knob = collective_knobs(plan)
    rel = float(knob.get("rel") or REL)
    results = _load(out / RESULTS)
    if results is not None and not _current(results, job, restart):
        results = None
    bad: Dict[str, str] = {}
    problems: List[str] = []
    warnings: List[str] = []
    summary: Dict[str, Any] = {}
    if results is None or not results.get("complete_run"):
        done = list((results or {}).get("phases_done") or [])
        summary["phases_done"] = done
        bad, problems, warnings = missing_verdict(out, nodes, job, restart, knob.get("timeout_s"), done)
    if results is not None:
        node_bad, summary["per_node"] = per_node(results, nodes, list(knob.get("floors") or []))
        if node_bad and len(node_bad) * 2 > len(nodes) and len(node_bad) >= 2:
            problems.append(f"collective smoke test: {len(node_bad)} of {len(nodes)} nodes below the published "
                            f"single-node floor ({next(iter(node_bad.values()))}): the image, the driver or the "
                            f"profile, not bad nodes")
            node_bad = {}
        cross_bad, cross_problems, cross_warnings, summary["cross_node"] = cross_node(results, nodes, rel)
        problem = port_floor_problem(results, knob)
        if problem:
            problems.append(problem)
            cross_bad = {}
        problems += cross_problems
        warnings += cross_warnings
        bad = {**bad, **cross_bad, **{n: w for n, w in node_bad.items() if n not in cross_bad and n not in bad}}
    summary["not_judged"] = not_judged(results, nodes, knob, summary)
    code = 2 if problems else 1 if bad else 0
    return {"schema": SCHEMA, "ok": code == 0, "exit": code, "job": job, "restart": restart, "nodes": nodes,
            "source": SOURCE, "bad_nodes": bad,
            "reasons": {n: [{"check": "collective", "reason": w}] for n, w in bad.items()},
            "problems": problems, "warnings": warnings, "late": {}, "skew_s": None, "clock": {},
            "collective": summary, "judged_at": time.time()}


def main(plan: dict, out: Path, nodes: List[str]) -> int:
    verdict = judge(plan, out, nodes)
    out.mkdir(parents=True, exist_ok=True)
    write_json(str(out / VERDICT), verdict)
    for node, why in verdict["bad_nodes"].items():
        print(f"{PREFIX} node {node}: {why}", flush=True)
    for problem in verdict["problems"]:
        print(f"{PREFIX} {problem}", flush=True)
    for warning in verdict["warnings"]:
        print(f"{PREFIX} warning: {warning}", flush=True)
    if verdict["ok"]:
        summary = verdict["collective"]
        median = (summary.get("cross_node") or {}).get("median_gbps")
        head = ("collective smoke test not conclusive (warning above): no bad node found" if verdict["warnings"]
                else "collective smoke test passed")
        tail = "".join(f"; {item}" for item in summary.get("not_judged") or [])
        print(f"{PREFIX} {head} on {len(verdict['nodes'])} nodes"
              + (f" (all_reduce pairs' median {_gb(median)} GB/s)" if median else "") + tail, flush=True)
    return int(verdict["exit"])
