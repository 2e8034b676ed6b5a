"""Bad-node exclusion for the train job's requeues: which nodes, why, and how far it may go.

    python3 -m lingjun_slurm.exclusion add --run-dir D --job ID --need N --max M
            [--drain] (--node NODE --reason WHY --source KIND)... | --verdict preflight/verdict.json
    python3 -m lingjun_slurm.exclusion gone --run-dir D --job ID --nodes "n1 n2"
    python3 -m lingjun_slurm.exclusion hung --run-dir D --job ID --record HANG.json [--stacks DIR]
    python3 -m lingjun_slurm.exclusion crashed --run-dir D --job ID --log JOB.out --offset N --nodes "n1 n2"

`add` records each node in D/nodes/excluded.json and prints, on one line, the ExcNodeList the
batch script then sets on its own job (every node excluded so far, this job's earlier
exclusions included); nothing when no node may be excluded. The bound: at most M nodes per job,
and never so many that the job's partition keeps fewer than N usable nodes (`sinfo`: nodes not
down, drained, failed or in maintenance), so a requeued job can still start. A node left out by
the bound is recorded with `"excluded": false` and the reason, so `status` says why it still runs
there. `--drain` also drains the node with the reason (`scontrol update NodeName=... State=DRAIN
Reason=...`, which needs Slurm operator rights: the admin grants them; without them the drain
fails, is recorded, and the exclusion still holds).

`gone` is the node-failure case: run at the start of a requeued attempt with the node list of
the attempt before (the jobs/<id> markers), it excludes the nodes Slurm now has down or not
responding (a NODE_FAIL requeue: Slurm itself never allocates a DOWN node, but one that comes
back flapping would be chosen again).

Why the batch script applies the list itself, and how (slurm_templates/train.sbatch.j2,
requeue_excluding): Slurm takes a new ExcNodeList only on a pending job. `_update_job` refuses
it otherwise (SchedMD/slurm src/slurmctld/job_mgr.c, the `exc_nodes` branch of _update_job:
"Job is no longer pending execution", ESLURM_JOB_NOT_PENDING; reproduced on the test cluster
with slurm 22.05), so the script holds its own requeue (`scontrol requeuehold`), which makes the
job pending (completing) at once, sets ExcNodeList, and releases it. The requeue also signals
the batch script (TERM, then KILL after KillWait), so the script ignores TERM for those three
calls: without it the update's scontrol was killed mid-call (exit 143) on the test cluster.

Standard library only: it runs on the batch host with plain python3 (>= 3.8).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

RECORD = "nodes/excluded.json"
SCHEMA = 1
# Node states (sinfo %T, lower case; a trailing '*' = not responding, '~' power saving, '#'/'%'
# powering) that Slurm does not allocate: these nodes do not count toward the job still fitting.
UNUSABLE = ("down", "drain", "drained", "draining", "fail", "failing", "maint", "inval", "future", "unknown",
            "not_responding", "no_respond", "power_down", "powered_down", "reboot")
CMD_TIMEOUT = 30


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=CMD_TIMEOUT)


def read_record(run_dir: str) -> dict:
    """The run's exclusion record ({"schema", "nodes": [...]}), empty when absent or unreadable."""
    try:
        doc = json.loads(Path(run_dir, RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"schema": SCHEMA, "nodes": []}
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        return {"schema": SCHEMA, "nodes": []}
    doc["nodes"] = [n for n in doc["nodes"] if isinstance(n, dict) and isinstance(n.get("node"), str)]
    return doc


def _write_record(run_dir: str, doc: dict) -> None:
    from .atomicfile import atomic_write

    path = Path(run_dir, RECORD)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


def excluded_for(doc: dict, job: str) -> List[str]:
    """The nodes excluded for `job` so far, in the order they were excluded."""
    out: List[str] = []
    for n in doc["nodes"]:
        if str(n.get("job")) == job and n.get("excluded") and n["node"] not in out:
            out.append(n["node"])
    return out


def job_partition(job: str) -> Optional[str]:
    proc = _run(["scontrol", "show", "job", "-o", job])
    if proc.returncode != 0:
        return None
    for word in proc.stdout.split():
        if word.startswith("Partition="):
            return word.split("=", 1)[1] or None
    return None


def usable_nodes(partition: Optional[str]) -> Optional[List[str]]:
    """The nodes of the partition(s) that Slurm would allocate now (None: sinfo failed)."""
    argv = ["sinfo", "-h", "-N", "-o", "%N %T"] + (["-p", partition] if partition else [])
    proc = _run(argv)
    if proc.returncode != 0:
        return None
    nodes: List[str] = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        name, state = parts
        base = state.lower().rstrip("*~#%!$@^-")
        if state.endswith("*") or any(base.startswith(u) for u in UNUSABLE):
            continue
        if name not in nodes:
            nodes.append(name)
    return nodes


def add(run_dir: str, job: str, need: int, max_nodes: int, found: List[Dict[str, str]], drain: bool,
        now: Optional[float] = None) -> List[str]:
    """Record `found` ({node, reason, source}) for `job`; return the ExcNodeList to apply ([] = none)."""
    now = time.time() if now is None else now
    doc = read_record(run_dir)
    already = excluded_for(doc, job)
    usable: Optional[List[str]] = None
    changed = False
    for item in found:
        node, reason, source = item["node"], " ".join(item["reason"].split()), item.get("source", "")
        if node in already:
            continue
        entry = {"node": node, "reason": reason, "source": source, "job": job, "time": round(now, 3),
                 "excluded": False}
        if len(already) >= max_nodes:
            entry["not_excluded"] = f"training.exclude_bad_nodes ({max_nodes}) already excluded for this job"
        else:
            if usable is None:
                usable = usable_nodes(job_partition(job)) or []
            left = [n for n in usable if n not in already and n != node]
            if len(left) < need:
                entry["not_excluded"] = (f"the job needs {need} nodes and its partition would keep "
                                         f"{len(left)} usable")
            else:
                entry["excluded"] = True
                already.append(node)
        if drain and entry["excluded"]:
            proc = _run(["scontrol", "update", f"NodeName={node}", "State=DRAIN",
                         f"Reason=lingjun-slurm: {reason}"[:250]])
            entry["drained"] = proc.returncode == 0
            if proc.returncode != 0:
                entry["drain_error"] = (proc.stderr or proc.stdout).strip()[-300:]
        doc["nodes"].append(entry)
        changed = True
        verdict = "excluding it from the requeue" if entry["excluded"] else f"not excluded: {entry['not_excluded']}"
        print(f"lingjun-slurm: node {node}: {reason} ({source}): {verdict}", file=sys.stderr, flush=True)
    if changed:
        doc["schema"] = SCHEMA
        _write_record(run_dir, doc)
    return already if changed or already else []


def from_verdict(path: str) -> List[Dict[str, str]]:
    """The bad nodes of a pre-flight verdict.json ({"bad_nodes": {node: reason}})."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"lingjun-slurm: exclusion: cannot read {path}: {exc}") from None
    bad = doc.get("bad_nodes") if isinstance(doc, dict) else None
    if not isinstance(bad, dict):
        return []
    return [{"node": str(k), "reason": str(v), "source": "preflight"} for k, v in sorted(bad.items())]


def gone(run_dir: str, job: str, nodes: List[str], need: int, max_nodes: int, drain: bool) -> List[str]:
    """Nodes of the previous attempt that Slurm has down or not responding now: excluded as node failures."""
    if not nodes:
        return []
    proc = _run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %T"])
    if proc.returncode != 0:
        return []
    found = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) != 2 or parts[0] not in nodes:
            continue
        state = parts[1].lower()
        if state.endswith("*") or state.startswith(("down", "fail", "not_responding")):
            found.append({"node": parts[0], "reason": f"node failure (Slurm state {parts[1]} after the last attempt)",
                          "source": "node-failure"})
    return add(run_dir, job, need, max_nodes, found, drain) if found else []


STACK_FILE = re.compile(r"^(?P<node>.+)-rank(?P<rank>\d+)-pid(?P<pid>\d+)\.txt$")
DUMPED = "most recent call first"  # every faulthandler traceback header (Python's faulthandler.c)


STUCK_STATES = {"T": "stopped", "t": "stopped (traced)", "D": "in uninterruptible sleep", "Z": "a zombie",
                "gone": "gone"}


def stuck_by_state(states: List[dict]) -> Dict[str, List[tuple]]:
    """{node: [(rank, why)]} for the ranks the watchdog found stopped, in uninterruptible sleep or
    gone before it signalled anything (lingjun_slurm/watchdog.py Actions.probe), when others ran."""
    known = [s for s in states if isinstance(s, dict) and s.get("state") and s.get("node")]
    bad = [s for s in known if s["state"] in STUCK_STATES]
    if not bad or len(bad) == len(known):  # all alike: the job, not a node
        return {}
    out: Dict[str, List[tuple]] = {}
    for s in bad:
        out.setdefault(str(s["node"]), []).append((s.get("rank"), STUCK_STATES[s["state"]]))
    return out


def stuck_nodes(stacks_dir: str) -> Dict[str, List[int]]:
    """Nodes whose ranks never answered the watchdog's stack request, when others did: {node: ranks}.

    Every rank opens its file at start (lingjun_slurm/stacks.py: <node>-rank<R>-pid<P>.txt) and
    faulthandler writes a traceback into it on SIGUSR2. A rank that cannot run its handler (in
    uninterruptible sleep on a dead device or file system) leaves its file without one; ranks
    blocked in a collective do answer. No answer anywhere (stacks not installed) blames no one."""
    answered: Dict[str, bool] = {}
    silent: Dict[str, List[int]] = {}
    try:
        names = sorted(os.listdir(stacks_dir))
    except OSError:
        return {}
    for name in names:
        m = STACK_FILE.match(name)
        if not m:
            continue
        try:
            with open(os.path.join(stacks_dir, name), encoding="utf-8", errors="replace") as fh:
                dumped = DUMPED in fh.read()
        except OSError:
            continue
        if dumped:
            answered[m["node"]] = True
        else:
            silent.setdefault(m["node"], []).append(int(m["rank"]))
    if not answered:
        return {}
    return {node: sorted(ranks) for node, ranks in silent.items()}


def hung(run_dir: str, job: str, record: str, stacks_dir: Optional[str], need: int, max_nodes: int,
         drain: bool) -> List[str]:
    """After a hang the watchdog ended: exclude the nodes of the ranks that did not answer."""
    try:
        doc = json.loads(Path(record).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return excluded_for(read_record(run_dir), job)
    if not isinstance(doc, dict):
        return excluded_for(read_record(run_dir), job)
    stacks = stacks_dir or doc.get("stacks_dir")
    last = doc.get("last_iteration")
    found = []
    by_state = stuck_by_state(doc.get("states") or [])
    for node, items in sorted(by_state.items()):
        what = "; ".join(f"rank {r} {why}" for r, why in items)
        found.append({"node": node, "source": "watchdog",
                      "reason": f"hang at iteration {last}: {what} while the others waited"})
    if not by_state:
        for node, ranks in sorted(stuck_nodes(str(stacks)).items() if stacks else []):
            found.append({"node": node, "source": "watchdog",
                          "reason": f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} hung "
                                    f"(no stack dump on request; last iteration {last})"})
    return add(run_dir, job, need, max_nodes, found, drain) if found else excluded_for(read_record(run_dir), job)


def crashed(run_dir: str, job: str, log: str, offset: int, nodes: List[str], need: int, max_nodes: int,
            drain: bool) -> List[str]:
    """After the step failed: the nodes lingjun_slurm.crashlog ties a device error (or srun's "Node
    failure on") to in this attempt's part of the job log."""
    from .crashlog import blame

    try:
        found = blame(log, offset, nodes or None)["found"]
    except OSError:
        found = []
    return add(run_dir, job, need, max_nodes, found, drain) if found else excluded_for(read_record(run_dir), job)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m lingjun_slurm.exclusion")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add")
    g = sub.add_parser("gone")
    for p in (a, g):
        p.add_argument("--run-dir", required=True)
        p.add_argument("--job", required=True)
        p.add_argument("--need", type=int, required=True, help="nodes the job needs")
        p.add_argument("--max", type=int, required=True, help="training.exclude_bad_nodes")
        p.add_argument("--drain", action="store_true")
    a.add_argument("--node", action="append", default=[])
    a.add_argument("--reason", action="append", default=[])
    a.add_argument("--source", action="append", default=[])
    a.add_argument("--verdict")
    h = sub.add_parser("hung")
    h.add_argument("--run-dir", required=True)
    h.add_argument("--job", required=True)
    h.add_argument("--need", type=int, required=True)
    h.add_argument("--max", type=int, required=True)
    h.add_argument("--drain", action="store_true")
    h.add_argument("--record", required=True, help="the watchdog's hang record")
    h.add_argument("--stacks", help="the stacks directory (default: the record's stacks_dir)")
    c = sub.add_parser("crashed")
    c.add_argument("--run-dir", required=True)
    c.add_argument("--job", required=True)
    c.add_argument("--need", type=int, required=True)
    c.add_argument("--max", type=int, required=True)
    c.add_argument("--drain", action="store_true")
    c.add_argument("--log", required=True, help="the train job's output log")
    c.add_argument("--offset", type=int, default=0, help="its size when this attempt's srun started")
    c.add_argument("--nodes", default="", help="the job's nodes, space-separated")
    g.add_argument("--nodes", default="", help="space-separated node names of the attempt before")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "crashed":
            out = crashed(args.run_dir, args.job, args.log, args.offset, args.nodes.split(), args.need, args.max,
                          args.drain)
        elif args.cmd == "hung":
            out = hung(args.run_dir, args.job, args.record, args.stacks, args.need, args.max, args.drain)
        elif args.cmd == "gone":
            out = gone(args.run_dir, args.job, args.nodes.split(), args.need, args.max, args.drain)
        else:
            found = from_verdict(args.verdict) if args.verdict else []
            if len(args.reason) != len(args.node):
                ap.error("give one --reason per --node")
            sources = args.source + ["watchdog"] * (len(args.node) - len(args.source))
            found += [{"node": n, "reason": r, "source": s} for n, r, s in zip(args.node, args.reason, sources)]
            out = add(args.run_dir, args.job, args.need, args.max, found, args.drain)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"lingjun-slurm: exclusion: {exc}", file=sys.stderr)
        return 1
    if out:
        print(",".join(out))
    return 0


def describe(doc: dict, job_ids: Sequence[str]) -> Optional[str]:
    """status's words for the exclusions of the stage's jobs ("excluded node3 (preflight: ...)")."""
    parts = []
    for n in doc["nodes"]:
        if str(n.get("job")) not in job_ids:
            continue
        what = "excluded" if n.get("excluded") else "not excluded"
        why = n.get("reason", "")
        extra = "" if n.get("excluded") else f"; {n.get('not_excluded', '')}"
        parts.append(f"{what} {n['node']} ({n.get('source') or 'fault'}: {why}{extra})")
    return "; ".join(parts) or None


if __name__ == "__main__":
    sys.exit(main())

