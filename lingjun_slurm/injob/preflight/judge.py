"""The judge of the pre-flight: on the batch host, after the node step ended.

    python3 -m lingjun_slurm.stages preflight-judge --plan PLAN.json --out DIR --nodes "n1 n2 ..." [--skew-s S]

Reads DIR/<node>.json of every node, prints one line per bad node
("lingjun-slurm: preflight: node n3: mlx5_2 port 1 DOWN") and per job-wide problem, writes
DIR/verdict.json and removes the shared-directory tokens. Exit status: 0 every node passed;
1 bad nodes that can be blamed (verdict.json's bad_nodes: exclude them); 2 a job-wide problem no
node can be blamed for (the directory is not shared anywhere, a check fails on most nodes: the
spec, the image or the cluster's configuration), whether or not bad nodes were found too.

A check failing on more than half of the nodes (and on at least two) is not the nodes' fault:
excluding them would exclude the cluster. It is a problem of the job, and no node is blamed
for it. A missing report is a bad node ("the task or its container did not start"), unless most
reports are missing (then the image or the step failed: job-wide).

Clocks: see clock_verdict. The bound (default 5 s, settings.preflight.skew_s, --skew-s) is far
above what NTP/chrony keep a LAN to (milliseconds) and far below what breaks Slurm itself
(munge credentials live 300 s, MUNGE_DEFAULT_TTL in munge's src/libcommon/munge_defs.h): a
node that far off is not running its time service, and the run's timestamps across nodes
(logs, the hang watchdog's iteration times, checkpoint mtimes) cannot be compared.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from . import PREFIX, SCHEMA, SKEW_BOUND_S, file_name, knobs, token_dir_name, write_json

SHARED = ("shared-workdir", "shared-checkpoint-dir")
JUDGED_HERE = SHARED + ("clock",)
MTIME_SLACK_S = 0.05  # file systems stamp mtime from a coarse kernel clock (a tick, 1-10 ms) and NFS
                      # servers may round it: a margin added to each node's measurement


def load_report(out: Path, node: str, job: Optional[str], restart: Optional[str]) -> Tuple[Optional[dict], str]:
    path = out / file_name(node, ".json")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"no pre-flight report: the task or its container did not start on {node}; see the job log"
    except (OSError, ValueError) as exc:
        return None, f"pre-flight report {path} unreadable ({type(exc).__name__}); see the job log"
    if not isinstance(doc, dict) or doc.get("node") != node or not isinstance(doc.get("checks"), list):
        return None, f"pre-flight report {path} is not {node}'s; see the job log"
    if job and doc.get("job") != job or restart and doc.get("restart") != restart:
        return None, (f"pre-flight report {path} is from job {doc.get('job')}.{doc.get('restart')}, not this one "
                      f"({job}.{restart}): the task did not run on {node} this time; see the job log")
    return doc, ""


def components(nodes: List[str], linked: Dict[str, Set[str]]) -> List[List[str]]:
    """Groups of nodes connected by LINKED (symmetric: read each other's tokens), largest first."""
    left, groups = list(nodes), []
    while left:
        group, todo = [left[0]], [left[0]]
        left.remove(left[0])
        while todo:
            a = todo.pop()
            for b in list(left):
                if b in linked.get(a, set()) and a in linked.get(b, set()):
                    group.append(b)
                    todo.append(b)
                    left.remove(b)
        groups.append(group)
    return sorted(groups, key=len, reverse=True)


def _number(value: Any) -> Optional[float]:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def missed(entry_a: dict, entry_b: dict) -> bool:
    """Node a did not read node b's token: does that count against their sharing the directory?

    Only when a was still looking a full window (its `timeout_s`, the time a token is given to
    show up, NFS attribute caching included) after b wrote it: b's `written_at` (b's clock) at
    least that long before a's last poll (`waited_until`, a's clock). A node whose task started
    later (its container took longer to start: pyxis/enroot unpack the image per node before the
    task runs) wrote its token after the others had stopped looking; their not reading it proves
    nothing, and it is judged on its own reading of theirs, which were there all along. Of any
    two nodes that both waited out their window, at least one waited a full window after the
    other's write (whichever wrote later), so every pair is judged one way or the other.
    Reports without these fields (an older lingjun_slurm in the image) count every miss."""
    until, written = _number(entry_a.get("waited_until")), _number(entry_b.get("written_at"))
    window = _number(entry_a.get("timeout_s"))
    if until is None or written is None or window is None:
        return True
    return written <= until - window


def shared_verdict(label: str, reports: Dict[str, dict]
                   ) -> Tuple[Dict[str, str], List[str], List[str], Dict[str, float]]:
    """Node failures, job-wide problems, the majority group for one shared directory, and the nodes
    that started late: whose token was written after a node that did not read it had stopped
    looking (seconds after the first node's token)."""
    check = "shared-" + label.replace("_", "-")
    writers, sees, entries, path, fails = [], {}, {}, "", {}
    for node, doc in reports.items():
        entry = (doc.get("shared") or {}).get(label)
        if not isinstance(entry, dict):
            continue
        path = path or str(entry.get("path"))
        if entry.get("error") or not entry.get("written"):
            fails[node] = str(entry.get("error") or f"{check}: no token written")
            continue
        writers.append(node)
        entries[node] = entry
        sees[node] = set(entry.get("seen") or [])
    # a and b share the directory when one read the other's token and neither missed the other's
    # with a full window to read it (missed()).
    linked: Dict[str, Set[str]] = {n: set() for n in writers}
    late: Dict[str, float] = {}
    for a in writers:
        for b in writers:
            if a == b:
                continue
            a_b = b in sees[a] or not missed(entries[a], entries[b])  # not refuted from a's side
            b_a = a in sees[b] or not missed(entries[b], entries[a])
            if a_b and b_a and (b in sees[a] or a in sees[b]):
                linked[a].add(b)
            until, written = _number(entries[a].get("waited_until")), _number(entries[b].get("written_at"))
            if b not in sees[a] and until is not None and written is not None and written > until:
                late.setdefault(b, 0.0)  # b's token came after a had stopped looking
    firsts = [w for w in (_number(entries[n].get("written_at")) for n in writers) if w is not None]
    for node in late:
        written = _number(entries[node].get("written_at"))
        late[node] = round(written - min(firsts), 1) if written is not None and firsts else 0.0
    if len(writers) < 2:
        return fails, [], writers, late
    groups = components(writers, linked)
    if len(groups) == 1:
        return fails, [], writers, late
    big = groups[0]
    if len(big) * 2 <= len(writers) or len(groups[1]) == len(big):
        shown = "; ".join(" ".join(g) for g in groups[:4])
        return fails, [f"{label} {path} is not one shared directory: no majority of the nodes reads each other's "
                       f"tokens (groups that do: {shown}); is it on a shared file system mounted on every node?"
                       ], [], late
    for node in writers:
        if node not in big:
            read = sorted(sees[node] & set(big))
            by = sorted(n for n in big if node in sees[n])
            fails[node] = (f"{label} {path} is not the directory the other {len(big)} nodes share (it read the tokens "
                           f"of {', '.join(read) or 'none of them'}; its own was read by {', '.join(by) or 'none'})")
    return fails, [], big, late


def _mtime_offset(doc: dict, label: str) -> Optional[Tuple[float, float]]:
    w = ((doc.get("clock") or {}).get(label) or {}).get("write") or {}
    try:
        before, after, mtime = float(w["before"]), float(w["after"]), float(w["mtime"])
    except (KeyError, TypeError, ValueError):
        return None
    if after < before:
        return None
    return mtime - (before + after) / 2, (after - before) / 2 + MTIME_SLACK_S


def clock_verdict(reports: Dict[str, dict], label: str, group: List[str], bound: float
                  ) -> Tuple[Dict[str, str], List[str], Dict[str, Any]]:
    """Bound the clocks of GROUP (nodes that share LABEL's directory) with two measurements.

    1. The file server's clock. A node stamps its clock before and after writing its token;
       the file system stamps the file's mtime. On NFS the server sets mtime from its own clock
       when it performs the WRITE, which happens between the two stamps (the token is fsynced
       before the second), so offset = mtime - midpoint, within +- half the write's duration
       (plus MTIME_SLACK_S for the coarse clock file systems stamp with). Every node measures
       against the same server, so the differences of the offsets are the nodes' clock
       differences; the server itself votes in the median (so with two nodes the one far from
       the server is blamed). Limits: a file system whose mtime comes from the writing client
       (Lustre takes the client's time, a local file system is the node's own clock) measures
       offset 0 for everyone and proves nothing; the server's own error does not matter.
    2. The token exchange, which needs no reference: node a read b's token at a's time
       seen_a, after b wrote it at b's time written_b, so o_a - o_b <= seen_a - written_b (o: a
       clock's error). Both directions give an interval for o_a - o_b whose width is the two
       latencies (polling, NFS attribute caching); a skew is only proven when the interval
       excludes +-bound. It catches what (1) cannot see, coarsely.
    A node is blamed when (1) puts it more than the bound (beyond its uncertainty) from the
    median, or (2) proves it skewed against more than half of the others.
    """
    info: Dict[str, Any] = {"method": "mtime", "dir": label, "bound_s": bound, "offsets_s": {}, "proven_pairs": []}
    fails: Dict[str, str] = {}
    problems: List[str] = []
    offsets = {n: o for n in group for o in [_mtime_offset(reports[n], label)] if o is not None}
    info["offsets_s"] = {n: {"offset": round(o, 4), "uncertainty": round(u, 4)} for n, (o, u) in offsets.items()}
    spread = 0.0
    if offsets:
        values = [o for o, _ in offsets.values()]
        spread = max(values) - min(values)
        ref = statistics.median(values + [0.0])
        for node, (o, u) in offsets.items():
            if abs(o - ref) - u > bound:
                fails[node] = (f"clock {o - ref:+.1f} s off the other nodes (its offset to the file server's mtime of "
                               f"its token is {o:+.1f} s, the median {ref:+.1f} s; bound {bound:g} s): is chronyd/ntpd "
                               f"running?")
    # (2) the exchange
    proven: Dict[Tuple[str, str], float] = {}
    for a in group:
        for b in group:
            if a >= b:
                continue
            ua = _latency(reports[a], label, b)  # o_a - o_b <= ua
            ub = _latency(reports[b], label, a)  # o_b - o_a <= ub
            if ua is None or ub is None:
                continue
            least = max(0.0, -ua, -ub)
            if least > bound:
                proven[(a, b)] = least
    info["proven_pairs"] = [{"nodes": [a, b], "at_least_s": round(s, 3)} for (a, b), s in sorted(proven.items())]
    worst = max(proven.values(), default=0.0)
    if proven:
        count = {n: sum(1 for pair in proven if n in pair) for n in group}
        blamed = [n for n in group if count[n] * 2 > len(group) - 1 and len(group) > 2]
        for node in blamed:
            fails.setdefault(node, f"clock at least {max(s for p, s in proven.items() if node in p):.1f} s off "
                                   f"{count[node]} of the other {len(group) - 1} nodes (token exchange; bound "
                                   f"{bound:g} s): is chronyd/ntpd running?")
        if not blamed and not fails:
            (a, b), s = max(proven.items(), key=lambda kv: kv[1])
            problems.append(f"the clocks of {a} and {b} differ by at least {s:.1f} s (bound {bound:g} s) and it "
                            f"cannot be told which is wrong: check chronyd/ntpd on both")
        if worst > spread:
            info["method"] = "token exchange"
    info["skew_s"] = round(max(spread, worst), 3)
    return fails, problems, info


def _latency(doc: dict, label: str, other: str) -> Optional[float]:
    seen = (((doc.get("clock") or {}).get(label) or {}).get("seen") or {}).get(other) or {}
    try:
        return float(seen["seen_at"]) - float(seen["written_at"])
    except (KeyError, TypeError, ValueError):
        return None


def cleanup(plan: dict, reports: Dict[str, dict], job: Optional[str], restart: Optional[str]) -> List[str]:
    """Remove the tokens (<dir>/.preflight-<job>.<restart>/), from the host's view of the dirs."""
    subs = {token_dir_name(str(d.get("job")), str(d.get("restart"))) for d in reports.values()}
    if job:
        subs.add(token_dir_name(job, restart or "0"))
    dirs = [plan.get("workdir"), plan.get("host_checkpoint_dir") or plan.get("checkpoint_dir")]
    removed = []
    for base in [d for d in dirs if d]:
        for sub in subs:
            folder = os.path.join(base, sub)
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                if name.endswith((".token", ".token.tmp")):
                    try:
                        os.unlink(os.path.join(folder, name))
                    except OSError:
                        pass
            try:
                os.rmdir(folder)
                removed.append(folder)
            except OSError:
                pass
    return removed


def judge(plan: dict, out: Path, nodes: List[str], bound: Optional[float] = None,
          env: Optional[Dict[str, str]] = None) -> dict:
    env = dict(os.environ if env is None else env)
    nodes = [n for i, n in enumerate(nodes) if n and n not in nodes[:i]]
    if bound is None:
        bound = float(knobs(plan).get("skew_s") or SKEW_BOUND_S)
    job, restart = env.get("SLURM_JOB_ID"), env.get("SLURM_RESTART_COUNT")
    if job and not restart:
        restart = "0"
    reports: Dict[str, dict] = {}
    reasons: Dict[str, List[Tuple[str, str]]] = {n: [] for n in nodes}  # node -> [(check, reason)]
    for node in nodes:
        doc, why = load_report(out, node, job, restart)
        if doc is None:
            reasons[node].append(("report", why))
        else:
            reports[node] = doc
            for c in doc["checks"]:
                if isinstance(c, dict) and not c.get("ok", False) and c.get("name") not in JUDGED_HERE:
                    reasons[node].append((str(c.get("name")), str(c.get("detail"))))
    problems: List[str] = []
    clock_info: Dict[str, Any] = {}
    groups: Dict[str, List[str]] = {}
    late: Dict[str, float] = {}
    for label, check in (("workdir", "shared-workdir"), ("checkpoint_dir", "shared-checkpoint-dir")):
        fails, probs, group, late_here = shared_verdict(label, reports)
        for node, why in fails.items():
            reasons[node].append((check, why))
        problems += probs
        groups[label] = group
        for node, after in late_here.items():
            late[node] = max(after, late.get(node, 0.0))
    label = "workdir" if len(groups["workdir"]) >= 2 else "checkpoint_dir"
    if len(groups[label]) >= 2:
        fails, probs, clock_info = clock_verdict(reports, label, groups[label], bound)
        for node, why in fails.items():
            reasons[node].append(("clock", why))
        problems += probs
    # A check failing on most nodes is the job's problem, not theirs.
    by_check: Dict[str, List[str]] = {}
    for node, rs in reasons.items():
        for check in dict.fromkeys(c for c, _ in rs):
            by_check.setdefault(check, []).append(node)
    job_wide = {c for c, ns in by_check.items() if len(ns) >= 2 and len(ns) * 2 > len(nodes)}
    for check in sorted(job_wide, key=lambda c: -len(by_check[c])):
        ns = by_check[check]
        example = next(r for c, r in reasons[ns[0]] if c == check)
        if check == "report":
            problems.append(f"no pre-flight report from {len(ns)} of {len(nodes)} nodes ({', '.join(ns[:8])}"
                            f"{' ...' if len(ns) > 8 else ''}): the step or the image failed to start, not the "
                            f"nodes; see the job log")
        else:
            problems.append(f"{check} fails on {len(ns)} of {len(nodes)} nodes ({ns[0]}: {example}): most likely the "
                            f"spec, the image or the cluster's configuration, not bad nodes; no node is excluded for it")
    bad: Dict[str, str] = {}
    detail: Dict[str, List[Dict[str, str]]] = {}
    for node in nodes:
        own = [(c, r) for c, r in reasons[node] if c not in job_wide]
        if own:
            bad[node] = own[0][1] + (f" (+{len(own) - 1} more)" if len(own) > 1 else "")
            detail[node] = [{"check": c, "reason": r} for c, r in own]
    code = 2 if problems else 1 if bad else 0
    return {"schema": SCHEMA, "ok": code == 0, "exit": code, "job": job, "restart": restart, "nodes": nodes,
            "bad_nodes": bad, "reasons": detail, "problems": problems, "late": late,
            "skew_s": clock_info.get("skew_s"), "clock": clock_info, "judged_at": time.time()}


def late_lines(verdict: dict) -> list:
    """One line per node that started late and still passed (verdict["late"]; the judge prints
    them, `lingjun-slurm doctor` shows them)."""
    bad = verdict.get("bad_nodes") or {}
    return [f"{PREFIX} node {node} started {after:g} s after the first node (its container started later), "
            f"after the others had stopped waiting for its token; judged on its own reading of theirs"
            for node, after in sorted((verdict.get("late") or {}).items())
            if node not in bad and isinstance(after, (int, float))]


def failure_note(verdict: dict) -> str:
    """The train stage's note for `status` when the batch script gives up after a failed pre-flight
    (slurm_templates/partials/faults.sh.j2: no node left to exclude, no restart left, or a
    job-wide problem): the first job-wide problem, else the first bad node and its reason."""
    problems = [p for p in verdict.get("problems") or [] if isinstance(p, str)]
    bad = {str(n): str(w) for n, w in (verdict.get("bad_nodes") or {}).items()}
    if problems:
        text = problems[0] + (f" (+{len(problems) - 1} more problems)" if len(problems) > 1 else "")
    elif bad:
        node = sorted(bad)[0]
        text = f"node {node}: {bad[node]}" + (f" (+{len(bad) - 1} more nodes)" if len(bad) > 1 else "")
    else:
        text = "no bad node or problem recorded"
    return f"pre-flight failed, not training: {text}"


def note_main(argv: Optional[List[str]] = None) -> int:
    """`python3 -m lingjun_slurm.injob.preflight.judge note --verdict FILE --run-dir DIR`: write
    failure_note of FILE as the train stage's note (best effort, like every stage note: exit 0
    even when it cannot be written; the job log has the verdict's lines already)."""
    import argparse

    from lingjun_slurm.injob.host import stagenotes

    parser = argparse.ArgumentParser(prog="python3 -m lingjun_slurm.injob.preflight.judge")
    parser.add_argument("action", choices=("note",))
    parser.add_argument("--verdict", required=True, type=Path, help="DIR/verdict.json of the failed pre-flight")
    parser.add_argument("--run-dir", required=True, help="the run directory (the batch script's $RUN_DIR)")
    args = parser.parse_args(argv)
    try:
        verdict = json.loads(args.verdict.read_text(encoding="utf-8"))
        if not isinstance(verdict, dict):
            raise ValueError("not a JSON object")
        text = failure_note(verdict)
    except (OSError, ValueError) as exc:
        text = f"pre-flight failed, not training: cannot read {args.verdict}: {exc}"
    stagenotes.note_failure(args.run_dir, "train", text)
    return 0


def main(plan: dict, out: Path, nodes: List[str], bound: Optional[float] = None) -> int:
    verdict = judge(plan, out, nodes, bound)
    reports = {}
    for node in verdict["nodes"]:
        doc, _ = load_report(out, node, verdict["job"], verdict["restart"])
        if doc is not None:
            reports[node] = doc
    verdict["cleaned"] = cleanup(plan, reports, verdict["job"], verdict["restart"])
    out.mkdir(parents=True, exist_ok=True)
    write_json(str(out / "verdict.json"), verdict)
    for node, why in verdict["bad_nodes"].items():
        print(f"{PREFIX} node {node}: {why}", flush=True)
    for problem in verdict["problems"]:
        print(f"{PREFIX} {problem}", flush=True)
    for line in late_lines(verdict):
        print(line, flush=True)
    if verdict["ok"]:
        skew = verdict["skew_s"]
        print(f"{PREFIX} {len(verdict['nodes'])} nodes passed" + (f" (clocks within {skew:.2f} s)" if skew is not None
                                                                   else ""), flush=True)
    return int(verdict["exit"])


if __name__ == "__main__":
    import sys

    sys.exit(note_main())
