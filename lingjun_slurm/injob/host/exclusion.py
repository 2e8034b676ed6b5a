"""Bad-node exclusion for the train job's requeues: which nodes, why, and how far it may go.

    python3 -m lingjun_slurm.injob.host.exclusion add --run-dir D --job ID --need N --max M
            [--drain] (--node NODE --reason WHY --source KIND)... | --verdict preflight/verdict.json
    python3 -m lingjun_slurm.injob.host.exclusion gone --run-dir D --job ID --nodes "n1 n2"
    python3 -m lingjun_slurm.injob.host.exclusion hung --run-dir D --job ID --record HANG.json [--stacks DIR]
    python3 -m lingjun_slurm.injob.host.exclusion crashed --run-dir D --job ID --log JOB.out --offset N --nodes "n1 n2"

`add` records each node in D/nodes/excluded.json and prints, on one line, the ExcNodeList the
batch script then sets on its own job: the job's own ExcNodeList (the spec's `exclude`) plus every
node excluded for it so far, since an update replaces the list; nothing when no node is newly
excluded (the list set before stays: Slurm keeps ExcNodeList across requeues, batch_requeue_fini
never clears it). The bound: at most M nodes per job, never a node the job requires (ReqNodeList,
the spec's `nodelist`), and never so many that the nodes the job could run on (its partition's
usable nodes, with its constraint's features, in its reservation) drop below N, so a requeued job
can still start; where that cannot be counted (a constraint with counts or brackets, an
unreadable reservation) nothing is excluded. A node left out by the bound is recorded with
`"excluded": false` and the reason, so `status` says why it still runs there. `--drain` also
drains the node with the reason (`scontrol update NodeName=... State=DRAIN Reason=...`, which
needs Slurm operator rights: the admin grants them; without them the drain fails, is recorded,
and the exclusion still holds).

`gone` is the node-failure case: run at the start of a requeued attempt with the node list of
the attempt before (the jobs/<id> markers), it excludes the nodes Slurm now has down or not
responding (a NODE_FAIL requeue: Slurm itself never allocates a DOWN node, but one that comes
back flapping would be chosen again). `hung` takes the watchdog's record, `crashed` the job log
(lingjun_slurm/injob/host/crashlog.py).

How the batch script applies the list (slurm_templates/partials/faults.sh.j2, requeue_excluding):
`scontrol requeue` of its own job, then `scontrol update JobId=... ExcNodeList=...`. Slurm takes a
new ExcNodeList only on a pending job (`_update_job`, the exc_nodes branch: "Job is no longer
pending execution", ESLURM_JOB_NOT_PENDING, SchedMD/slurm src/slurmctld/job_mgr.c), and a
requeued job is pending at once, still completing while this script runs
(`_set_requeued_job_pending_completing`; it cannot start before the script ends and then waits
`_requeue_delay()`), so the update lands before it can be scheduled again; verified on the test
cluster (slurm 22.05). No hold is needed: a held requeue (`requeuehold`) that the script failed to
release would leave the job held for good. The requeue signals the batch script (TERM, then KILL
after KillWait): the script ignores TERM meanwhile, since the update's scontrol was killed
mid-call (exit 143) without it.

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
    from lingjun_slurm.common.atomicfile import atomic_write

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


def job_fields(job: str) -> Dict[str, str]:
    """The job's Partition, ExcNodeList, ReqNodeList, Reservation and Features (`scontrol show job -o`;
    "(null)" as "")."""
    proc = _run(["scontrol", "show", "job", "-o", job])
    out: Dict[str, str] = {}
    if proc.returncode != 0:
        return out
    for word in proc.stdout.split():
        key, sep, value = word.partition("=")
        if sep and key in ("Partition", "ExcNodeList", "ReqNodeList", "Reservation", "Features"):
            out[key] = "" if value == "(null)" else value
    return out


def hostnames(hostlist: str) -> List[str]:
    """A Slurm hostlist expression expanded (`scontrol show hostnames`); [] for none."""
    if not hostlist:
        return []
    proc = _run(["scontrol", "show", "hostnames", hostlist])
    return proc.stdout.split() if proc.returncode == 0 else hostlist.split(",")


def reservation_nodes(name: str) -> Optional[List[str]]:
    proc = _run(["scontrol", "show", "reservation", "-o", name])
    if proc.returncode != 0:
        return None
    for word in proc.stdout.split():
        if word.startswith("Nodes="):
            return hostnames(word[6:] if word[6:] != "(null)" else "")
    return None


def _constraint_alternatives(features: str) -> Optional[List[set]]:
    """A --constraint of plain names joined by & and | as alternatives of required feature sets;
    None for what this cannot count (counts, brackets, node-level operators)."""
    if not features:
        return [set()]
    if any(c in features for c in "[]()*,:"):
        return None
    return [set(filter(None, alt.split("&"))) for alt in features.split("|")]


def usable_nodes(fields: Dict[str, str]) -> Optional[List[str]]:
    """The nodes the job could run on now: its partition's nodes Slurm allocates (sinfo %T: not down,
    drained, failing, in maintenance, reserved, blocked, powering down or not responding), with its
    constraint's features, in its reservation. None: not countable (sinfo failed, a constraint
    this cannot evaluate, an unreadable reservation)."""
    alternatives = _constraint_alternatives(fields.get("Features", ""))
    if alternatives is None:
        return None
    partition = fields.get("Partition")
    argv = ["sinfo", "-h", "-N", "-o", "%N %T %f"] + (["-p", partition] if partition else [])
    proc = _run(argv)
    if proc.returncode != 0:
        return None
    inside = reservation_nodes(fields["Reservation"]) if fields.get("Reservation") else None
    if fields.get("Reservation") and inside is None:
        return None
    nodes: List[str] = []
    seen = set()  # sinfo -N prints a node once per partition: O(nodes), not O(nodes^2), at 1,000 nodes
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, state = parts[0], parts[1].lower()
        have = set(parts[2].split(",")) if len(parts) > 2 and parts[2] != "(null)" else set()
        # node_state_string's suffixes: * not responding, $ maintenance reservation, ! / % power
        # down pending / in progress, @ reboot pending, # powering up / being configured, ^ reboot
        # issued: all unusable now; ~ (powered down, resumed on demand), + and - (completing, planned)
        # are usable.
        if any(c in state for c in "*$!%@#^"):
            continue
        base = state.rstrip("~+-")
        if any(base.startswith(u) for u in UNUSABLE) or base.startswith("blocked"):
            continue
        if base.startswith(("reserved", "resv")) and inside is None:  # another reservation's, not the job's
            continue
        if not any(alt <= have for alt in alternatives):
            continue
        if inside is not None and name not in inside:
            continue
        if name not in seen:
            seen.add(name)
            nodes.append(name)
    return nodes


def add(run_dir: str, job: str, need: int, max_nodes: int, found: List[Dict[str, str]], drain: bool,
        now: Optional[float] = None) -> List[str]:
    """Record `found` ({node, reason, source}) for `job`; return the ExcNodeList to set, [] when
    nothing new is excluded. The list is the job's own ExcNodeList (the spec's `exclude` included)
    plus every node excluded for it so far: an update replaces the list, it does not add."""
    now = time.time() if now is None else now
    doc = read_record(run_dir)
    already = excluded_for(doc, job)
    fields: Optional[Dict[str, str]] = None
    usable: Optional[List[str]] = None
    current: List[str] = []
    required: set = set()
    new = False
    changed = False
    for item in found:
        node, reason, source = item["node"], " ".join(item["reason"].split()), item.get("source", "")
        if node in already:
            continue
        if fields is None:
            fields = job_fields(job)
            current = hostnames(fields.get("ExcNodeList", ""))
            # Expanded once per call, not once per node found: a 64-node verdict made 64 scontrol calls.
            required = set(hostnames(fields.get("ReqNodeList", "")))
            usable = usable_nodes(fields)
        entry = {"node": node, "reason": reason, "source": source, "job": job, "time": round(now, 3),
                 "excluded": False}
        if len(already) >= max_nodes:
            entry["not_excluded"] = f"training.exclude_bad_nodes ({max_nodes}) already excluded for this job"
        elif node in required:
            entry["not_excluded"] = "the job requires this node (its nodelist)"
        elif usable is None:
            entry["not_excluded"] = ("the nodes the job could use cannot be counted (sinfo, its reservation or "
                                     f"its constraint {fields.get('Features') or ''!r})")
        else:
            gone_ = set(already) | set(current) | {node}
            left = [n for n in usable if n not in gone_]
            if len(left) < need:
                where = f"its partition{' and reservation' if fields.get('Reservation') else ''}"
                entry["not_excluded"] = f"the job needs {need} nodes and {where} would keep {len(left)} usable"
            else:
                entry["excluded"] = True
                already.append(node)
                new = True
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
    if not new:
        return []
    return current + [n for n in already if n not in current]


def from_verdict(path: str) -> List[Dict[str, str]]:
    """The bad nodes of a pre-flight verdict ({"bad_nodes": {node: reason}, "source": ...}): the
    node judge's verdict.json has no source ("preflight"); the collective smoke test's
    collective-verdict.json says "preflight-collective" (lingjun_slurm/injob/preflight/collective.py)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"lingjun-slurm: exclusion: cannot read {path}: {exc}") from None
    bad = doc.get("bad_nodes") if isinstance(doc, dict) else None
    if not isinstance(bad, dict):
        return []
    source = doc.get("source")
    source = source if isinstance(source, str) and source.strip() else "preflight"
    return [{"node": str(k), "reason": str(v), "source": source} for k, v in sorted(bad.items())]


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
    gone before it signalled anything (lingjun_slurm/injob/host/watchdog.py Actions.probe), when others ran."""
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

    Every rank opens its file at start (lingjun_slurm/injob/stacks.py: <node>-rank<R>-pid<P>.txt) and
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
        return []
    if not isinstance(doc, dict):
        return []
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
    return add(run_dir, job, need, max_nodes, found, drain) if found else []


def crashed(run_dir: str, job: str, log: str, offset: int, nodes: List[str], need: int, max_nodes: int,
            drain: bool) -> List[str]:
    """After the step failed: the nodes lingjun_slurm.injob.host.crashlog ties a device error (or srun's "Node
    failure on") to in this attempt's part of the job log."""
    from .crashlog import blame

    try:
        found = blame(log, offset, nodes or None)["found"]
    except OSError:
        found = []
    except ValueError as exc:  # a malformed XID table (health/xid.py XidTableError): no blame, said
        print(f"lingjun-slurm: warning: crash attribution skipped: {exc}", file=sys.stderr)
        found = []
    return add(run_dir, job, need, max_nodes, found, drain) if found else []


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m lingjun_slurm.injob.host.exclusion")
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

