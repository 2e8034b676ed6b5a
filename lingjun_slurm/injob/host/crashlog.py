"""Which node to blame for a crashed training step, from the job's output log.

    python3 -m lingjun_slurm.injob.host.crashlog --log FILE --offset N [--nodes "n1 n2 ..."] [--sku NAME | --xid-policy NAME]

reads FILE from byte N (its size when this attempt's srun started) and prints one JSON object:

    {"schema": 1, "found": [{"node", "reason", "source": "crash"|"node-failure"}, ...],
     "evidence": [...], "tasks": [...], "first_failure": {...}|null, "not_blamed": [...],
     "known_nodes": [...], "read": {...}}

`found` is exactly what lingjun_slurm.injob.host.exclusion.add() takes (its `found` argument), so an
`exclusion crashed` subcommand only has to pass it on; the rest says why. Exit status 0 whether
or not anyone is blamed; 2 for bad arguments or an unreadable log.

What is attributed (docs: /tmp/crashlog-docs.md, pasted into docs/fault-tolerance.md):

* srun's own task-exit lines name the node of the tasks that ended. Their formats, identical
  in Slurm 22.05 to 25.11 (error() adds "srun: error: "):
    "%s: %s %s: Exited with exit code %d"  hosts, "task"/"tasks", task list (bit_fmt: "4-7", "0,2-3")
    "%s: %s %s: %s%s"                       ... strsignal() ("Killed", "Terminated", "Aborted") + " (core dumped)"
    "%s: %s %s: Out Of Memory"
  (src/plugins/launch/slurm/launch_slurm.c:415/429/451 in 22.05; src/srun/launch.c:416/430/452
  in 23.02, 418/432/454 in 23.11-24.11, 415/429/451 in 25.11), and
    "Node failure on %s"  (src/api/step_launch.c:1267 in 22.05 ... :1197 in 25.11).
  With --kill-on-bad-exit (the train launcher's) the first abnormal exit makes srun kill the
  step (_task_finish -> _step_signal(SIG_TERM_KILL)), so the others then end "Terminated"/"Killed".
* Device errors that implicate the GPU or node (uncorrectable ECC/NVLink, fallen off the bus,
  NVML "Unable to determine the device handle", CUDA "unknown error", devices unavailable,
  system not ready, and the Xids lingjun-health drains for) are tied to a node by the line's own prefix (NCCL's
  "host:pid:tid [dev]", a syslog "Mon dd hh:mm:ss host kernel:", srun --label "R: " or torch's
  "[rankR]:" with R mapped to a node through srun's task lines) or, for a line without one, to
  the one node whose task failed first while every other node's tasks were only killed.
* Xids are judged by lingjun-health's own XID table and SKU family (lingjun_slurm/nodes/health/xid.py,
  thresholds/xid.tsv): on an Azure SKU (GPU_XID_POLICY=azure) Azure's 18 fatal codes
  (azure_gpu_xid.nhc), elsewhere NVIDIA's catalog actions (GPU_XID_ACTIONS). The SKU is this
  node's (the batch host's health.conf, as lingjun-health reads it), or --sku / --xid-policy; an
  Xid the health check would let pass (63, 92, 94 outside Azure; 94 on Azure) blames nobody, so
  every node drained for an Xid is one the health check judges the same way.
* Never blamed: errors of the program (illegal memory access, out of memory, device-side
  asserts), NCCL timeouts and remote/network errors (every rank sees them), errors on every
  node of the job (or on more than half of them), nodes that are not the job's (with --nodes),
  names that are not plain host names.

Standard library only: it runs on the batch host with plain python3 (>= 3.8).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Dict, List, Optional, Tuple

from lingjun_slurm.nodes.health import xid as xid_table

SCHEMA = 1
MAX_BYTES = 64 * 1024 * 1024  # read at most the last 64 MiB after the offset: a crash is at the end
MAX_EVIDENCE = 40
EXCERPT = 240

HOST = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"
HOST_RE = re.compile(rf"^{HOST}$")

# srun: error: <hosts>: task(s) <list>: <status>
SRUN_TASK = re.compile(rf"srun: error: (?P<hosts>{HOST}|{HOST}\[[0-9,\-]+\][A-Za-z0-9._-]*|Unknown): "
                       r"(?P<word>tasks?) (?P<tasks>[0-9][0-9,\-]*): (?P<status>Exited with exit code \d+|"
                       r"Out Of Memory|Completed|(?:Hangup|Interrupt|Quit|Illegal instruction|Trace/breakpoint trap|"
                       r"Aborted|Bus error|Floating point exception|Killed|User defined signal [12]|"
                       r"Segmentation fault|Broken pipe|Alarm clock|Terminated|Stack fault|Child exited|Continued|"
                       r"Stopped(?: \(signal\))?|CPU time limit exceeded|File size limit exceeded|"
                       r"Virtual timer expired|Profiling timer expired|Power failure|Bad system call|"
                       r"(?:Real-time|Unknown) signal \d+)(?: \(core dumped\))?)\s*$")
SRUN_NODE_FAIL = re.compile(r"srun: error: Node failure on (?P<nodes>\S+)\s*$")
# A step whose tasks never started (src/api/step_launch.c:1157 and 1658 in 22.05, 1071 and 1590 in
# 25.11; "Application launch failed": launch_slurm.c:844 in 22.05, src/srun/launch.c:1510 in 25.11).
# A SPANK plugin failing in slurmstepd (pyxis importing or starting the container) shows as
# "task N launch failed: Slurmd could not execve job", and srun then exits 0 when every task
# failed so (no task exit, no exit code: seen on 22.05.8); slurmstepd's own lines name the node.
SRUN_LAUNCH_TASK = re.compile(r"srun: error: task (?P<task>\d+) launch failed: (?P<why>.+?)\s*$")
SRUN_LAUNCH_NODE = re.compile(rf"srun: error: Task launch for \S+ failed on node (?P<node>{HOST}): (?P<why>.+?)\s*$")
SRUN_APP_LAUNCH = re.compile(r"srun: error: Application launch failed: (?P<why>.+?)\s*$")
# What pyxis/enroot say when the image or its reference is wrong: the same on every node, so never a
# node's fault, even when srun killed the other nodes' tasks before they said it too.
# (A mount source missing on one node is that node's: a shared file system not mounted there.)
IMAGE_PROBLEM = re.compile(r"Invalid image reference|returned error code: 4\d\d|manifest unknown|unauthorized|"
                           r"authentication|Could not retrieve digest|couldn't chdir to|"
                           r"flag was passed to --container-name|and --container-image is not set", re.I)
PLUGIN_NOISE = re.compile(r"^pyxis: (?:child \d+ failed with error code|printing enroot log file)|^pyxis:\s*$|^spank")
STEPD_PLUGIN = re.compile(rf"^(?:\d{{1,7}}: )?slurmstepd-(?P<node>{HOST}): error: (?P<why>(?:pyxis|spank|\[pyxis\]).*?)\s*$")
KILL_STATUSES = ("Killed", "Terminated")

# Line prefixes that name where a line came from.
SRUN_LABEL = re.compile(r"^\s*(?P<rank>\d{1,7}): ")
TORCH_RANK = re.compile(r"(?:^|[\s:])\[rank(?P<rank>\d{1,7})\]:")
NCCL_HOST = re.compile(rf"(?:^|[\s\]:])(?P<host>(?=[A-Za-z0-9._-]*[A-Za-z]){HOST}):(?P<pid>\d+):(?P<tid>\d+) \[[-0-9]+\] ")
SYSLOG_HOST = re.compile(rf"^(?:\d{{1,7}}: )?[A-Z][a-z]{{2}} [ 0-3]\d \d\d:\d\d:\d\d (?P<host>{HOST}) kernel: ")

# Device errors that implicate the GPU or the node (class, description, pattern).
DEVICE = [
    ("ecc", "uncorrectable ECC error",
     re.compile(r"uncorrectable ECC error encountered|CUDA_ERROR_ECC_UNCORRECTABLE|cudaErrorECCUncorrectable", re.I)),
    ("nvlink", "uncorrectable NVLink error",
     re.compile(r"uncorrectable NVLink error|cudaErrorNvlinkUncorrectable|CUDA_ERROR_NVLINK_UNCORRECTABLE", re.I)),
    ("fell-off-bus", "GPU has fallen off the bus", re.compile(r"fallen off the bus", re.I)),
    ("no-device-handle", "NVML cannot reach a GPU",
     re.compile(r"Unable to determine the device handle for GPU", re.I)),
    ("devices-unavailable", "CUDA devices busy or unavailable",
     re.compile(r"cudaErrorDevicesUnavailable|CUDA_ERROR_DEVICE_UNAVAILABLE|all CUDA-capable devices are busy "
                r"or unavailable|CUDA-capable device\(s\) is/are busy or unavailable", re.I)),
    ("system-not-ready", "CUDA system not ready (fabric manager?)",
     re.compile(r"cudaErrorSystemNotReady|CUDA_ERROR_SYSTEM_NOT_READY|system not yet initialized", re.I)),
    ("unknown-error", "CUDA unknown error (driver/device)",
     re.compile(r"CUDA error: unknown error|Cuda failure (?:999 )?'unknown error'|CUDA_ERROR_UNKNOWN|"
                r"cudaErrorUnknown|CUDA error 999", re.I)),
]
# The driver's Xid line; which codes implicate the node is the XID table's verdict under the
# SKU's family (lingjun_slurm/nodes/health/xid.py), the one lingjun-health's gpu-xid check gives. An
# NVLink5 Xid (144-150) whose line says "Nonfatal" never does (as in lingjun-health).
XID = re.compile(r"NVRM: Xid \((?:PCI:)?[^)]*\): (?P<code>\d+)")
XID_NONFATAL = re.compile(r" Nonfatal ")

# Errors of the program or of everyone: recorded as seen, never blamed on a node.
PROGRAM = [
    ("illegal-address", "illegal memory access (usually a bug)",
     re.compile(r"an illegal memory access was encountered|cudaErrorIllegalAddress|CUDA_ERROR_ILLEGAL_ADDRESS", re.I)),
    ("out-of-memory", "out of memory",
     re.compile(r"CUDA out of memory|OutOfMemoryError|: Out Of Memory\s*$|oom[-_]kill|Cuda failure (?:2 )?'out of memory'",
                re.I)),
    ("device-assert", "device-side assert (a bug)", re.compile(r"device-side assert triggered", re.I)),
    ("nccl-timeout", "NCCL/collective timeout (every rank sees it)",
     re.compile(r"Watchdog caught collective operation timeout|collective operation timeout|"
                r"NCCL communicator was aborted|ProcessGroupNCCL.*time(?:d )?out", re.I)),
    ("nccl-remote", "NCCL remote/network error (the peer, not this node)",
     re.compile(r"ncclRemoteError|remote process exited|Connection closed by remote peer|"
                r"Got completion from peer", re.I)),
    ("other-cuda", "other CUDA error (not tied to hardware)",
     re.compile(r"CUDA error: |Cuda failure |CUDA_ERROR_|cudaError[A-Z]", re.I)),
]
KEYWORDS = re.compile(r"srun: error|slurmstepd-|ECC|NVLink|fallen off|device handle|CUDA|Cuda|cuda|Xid|NCCL|nccl|"
                      r"out of memory|Out Of Memory|oom|assert|rank|Got completion|remote peer|not yet initialized")


def expand_hosts(text: str) -> List[str]:
    """A Slurm host list of one bracket group ("gpu[01-03,7]") or a plain name; [] if neither."""
    m = re.match(r"^(?P<pre>[A-Za-z0-9._-]*)\[(?P<body>[0-9,\-]+)\](?P<post>[A-Za-z0-9._-]*)$", text)
    if not m:
        return [text] if HOST_RE.match(text) else []
    out: List[str] = []
    for part in m["body"].split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return []
        hi = hi or lo
        if int(hi) - int(lo) > 4096 or int(hi) < int(lo):
            return []
        for i in range(int(lo), int(hi) + 1):
            name = f"{m['pre']}{str(i).zfill(len(lo))}{m['post']}"
            if not HOST_RE.match(name):
                return []
            out.append(name)
    return out


def expand_tasks(text: str) -> List[int]:
    """bit_fmt's task list ("0-57,59-63") as ranks; [] if malformed."""
    out: List[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return []
        a, b = int(lo), int(hi or lo)
        if b < a or b - a > 1_000_000:
            return []
        out.extend(range(a, b + 1))
    return out


def _clean(text: str, limit: int = EXCERPT) -> str:
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_region(path: str, offset: int, max_bytes: int = MAX_BYTES) -> Tuple[List[Tuple[int, str]], dict]:
    """(lines with their byte offsets, facts about the read) from `offset` on.

    A first line that starts before the offset (the offset in the middle of a line) is dropped;
    a log shorter than the offset (truncated or replaced since the attempt started) is read from
    its start; a last line without its newline is kept."""
    info: Dict[str, object] = {"offset": offset}
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        info["size"] = size
        start = offset
        if offset > size:
            info["log_shorter_than_offset"] = True
            start = 0
        if size - start > max_bytes:
            info["skipped_bytes"] = size - max_bytes - start
            start = size - max_bytes
        drop_first = False
        if start > 0:
            fh.seek(start - 1)
            drop_first = fh.read(1) != b"\n"
        fh.seek(start)
        data = fh.read(size - start)
    pos = start
    lines: List[Tuple[int, str]] = []
    chunks = data.split(b"\n")
    if data.endswith(b"\n"):
        chunks.pop()
    elif chunks and chunks[-1]:
        info["last_line_unterminated"] = True
    for i, raw in enumerate(chunks):
        if i == 0 and drop_first:
            info["dropped_partial_line_bytes"] = len(raw)
        else:
            lines.append((pos, raw.decode("utf-8", errors="replace").rstrip("\r")))
        pos += len(raw) + 1
    info["read_from"] = start
    info["lines"] = len(lines)
    return lines, info


def _device_class(line: str, judge: "xid_table.Judge") -> Optional[Tuple[str, str, bool]]:
    """(class, description, implicates the node) of a line, or None."""
    m = XID.search(line)
    if m:
        code = int(m["code"])
        verdict = judge.verdict(code, 144 <= code <= 150 and bool(XID_NONFATAL.search(line)))
        if verdict:
            return "xid", f"Xid {code} {judge.describe(code)} ({verdict})", True
        return "xid-app", f"Xid {code} (lingjun-health does not drain for it: {judge.policy.name} policy)", False
    for cls, desc, pat in DEVICE:
        if pat.search(line):
            return cls, desc, True
    for cls, desc, pat in PROGRAM:
        if pat.search(line):
            return cls, desc, False
    return None


def analyse(lines: List[Tuple[int, str]], nodes: Optional[List[str]] = None,
            judge: Optional["xid_table.Judge"] = None) -> dict:
    """The blame for one attempt's lines (see the module doc); `judge`: the Xid verdicts (default:
    NVIDIA's catalog, the program's default policy)."""
    if judge is None:
        judge = xid_table.Judge(xid_table.load())
    job_nodes = [n for n in (nodes or []) if HOST_RE.match(n)]
    tasks: List[dict] = []
    rank_node: Dict[int, str] = {}
    seen_hosts: List[str] = []
    node_failures: List[Tuple[str, int]] = []
    hits: List[dict] = []
    ignored: Dict[str, dict] = {}
    launch_tasks: List[int] = []
    launch_nodes: Dict[str, str] = {}
    launch_why: Optional[str] = None
    launch_whole = False

    def saw(host: str) -> None:
        if host not in seen_hosts:
            seen_hosts.append(host)

    for at, line in lines:
        if not KEYWORDS.search(line):
            continue
        lm = (SRUN_LAUNCH_TASK.search(line) or SRUN_LAUNCH_NODE.search(line) or SRUN_APP_LAUNCH.search(line)
              or STEPD_PLUGIN.search(line))
        if lm:
            why = _clean(lm["why"], 200)
            if lm.re is SRUN_LAUNCH_TASK:
                launch_tasks.append(int(lm["task"]))
            elif lm.re is SRUN_APP_LAUNCH:
                launch_whole = True
            elif lm.re is SRUN_LAUNCH_NODE:
                launch_nodes.setdefault(lm["node"], why)
            else:
                # pyxis's own words, then enroot's "[ERROR] ..." that pyxis prints, say more than
                # srun's "could not execve"; "child N failed", headers and spank's lines say nothing.
                node, said = lm["node"], launch_nodes.get(lm["node"], "")
                if "[ERROR]" in why:
                    err = why.split("[ERROR]", 1)[1].strip()
                    if "[ERROR]" not in said:
                        launch_nodes[node] = f"{said or 'pyxis'} ([ERROR] {err})"
                elif PLUGIN_NOISE.search(why):
                    launch_nodes.setdefault(node, "")
                elif not said:
                    launch_nodes[node] = why
            if lm.re is not STEPD_PLUGIN and launch_why is None:
                launch_why = why
            continue
        m = SRUN_TASK.search(line)
        if m:
            status = m["status"]
            hosts = expand_hosts(m["hosts"]) if m["hosts"] != "Unknown" else []
            ranks = expand_tasks(m["tasks"])
            if len(hosts) == 1 and ranks:
                tasks.append({"node": hosts[0], "tasks": m["tasks"], "status": _clean(status, 80), "at": at,
                              "abnormal": not status.startswith("Completed")})
                for r in ranks:
                    rank_node.setdefault(r, hosts[0])
                saw(hosts[0])
            if not status.endswith("Out Of Memory"):
                continue
        m = SRUN_NODE_FAIL.search(line)
        if m:
            for host in expand_hosts(m["nodes"]) if "," not in m["nodes"] else []:
                node_failures.append((host, at))
            continue
        host_m = NCCL_HOST.search(line) or SYSLOG_HOST.search(line)
        if host_m:
            saw(host_m["host"])
        cls = _device_class(line, judge)
        if cls is None:
            continue
        name, desc, implicates = cls
        if not implicates:
            entry = ignored.setdefault(name, {"class": name, "what": desc, "count": 0, "first_at": at,
                                              "line": _clean(line)})
            entry["count"] += 1
            continue
        rank: Optional[int] = None
        how = None
        host = None
        if host_m:
            host, how = host_m["host"], ("nccl host prefix" if host_m.re is NCCL_HOST else "syslog host")
        else:
            lm = SRUN_LABEL.match(line) or TORCH_RANK.search(line[:200])
            if lm:
                rank = int(lm["rank"])
                how = f"rank {rank} ({'srun label' if lm.re is SRUN_LABEL else 'torch [rankN] prefix'})"
        hits.append({"class": name, "what": desc, "at": at, "line": _clean(line), "host": host, "rank": rank,
                     "via": how})

    # The first abnormal task exit, when it is the only node that did more than get killed.
    first = next((t for t in tasks if t["abnormal"]), None)
    first_failure = None
    if first is not None:
        first_failure = {"node": first["node"], "tasks": first["tasks"], "status": first["status"],
                         "at": first["at"], "unique": False}
        if not first["status"].startswith(KILL_STATUSES):
            others = [t for t in tasks if t["abnormal"] and t["node"] != first["node"]]
            first_failure["unique"] = all(t["status"].startswith(KILL_STATUSES) for t in others)

    evidence: List[dict] = []
    not_blamed: List[dict] = []
    for h in hits:
        node, via = h["host"], h["via"]
        if node is None and h["rank"] is not None:
            node = rank_node.get(h["rank"])
            if node is None:
                via = f"{via}, but no srun line maps that rank to a node"
        if node is None and h["rank"] is None and first_failure and first_failure["unique"] \
                and first_failure["at"] >= 0:
            node, via = first_failure["node"], (f"no prefix; the only node whose task failed first "
                                                f"({first_failure['status']}) while the others were killed")
        evidence.append({"node": node, "class": h["class"], "what": h["what"], "via": via or "no prefix",
                         "at": h["at"], "line": h["line"]})

    known = list(job_nodes) or list(seen_hosts)
    for n in seen_hosts:
        if job_nodes and n not in job_nodes:
            continue
        if n not in known:
            known.append(n)
    implicated: Dict[str, List[dict]] = {}
    for e in evidence:
        if e["node"] is None:
            continue
        if job_nodes and e["node"] not in job_nodes:
            not_blamed.append({"node": e["node"], "why": "not a node of this job", "class": e["class"]})
            continue
        implicated.setdefault(e["node"], []).append(e)
    unattributed = [e for e in evidence if e["node"] is None]
    if unattributed:
        not_blamed.append({"node": None, "why": "device error with no line prefix or srun line tying it to "
                                                "one node", "class": unattributed[0]["class"],
                           "count": len(unattributed)})
    found: List[Dict[str, str]] = []
    if implicated:
        if len(known) < 2 or len(implicated) >= len(known):
            not_blamed.append({"node": None, "why": f"every node of the job ({len(known)}) shows it: the job, "
                                                    f"not a node", "nodes": sorted(implicated)})
        elif len(implicated) * 2 > len(known):
            not_blamed.append({"node": None, "why": f"{len(implicated)} of {len(known)} nodes show it: more "
                                                    f"than half, not a node", "nodes": sorted(implicated)})
        else:
            for node in sorted(implicated):
                e = implicated[node][0]
                more = f" (+{len(implicated[node]) - 1} more)" if len(implicated[node]) > 1 else ""
                found.append({"node": node, "source": "crash",
                              "reason": _clean(f"{e['what']}: {e['line']} [{e['via']}; log byte {e['at']}]{more}",
                                               300)})
    # Nodes where the step could not start while it started elsewhere: those nodes (at most half of
    # them, as above; a launch failing everywhere is the image's, the spec's or the cluster's).
    failed_to_start = [n for n in launch_nodes if (not job_nodes or n in job_nodes)
                       and not IMAGE_PROBLEM.search(launch_nodes[n] or launch_why or "")]
    if failed_to_start and len(known) >= 2 and len(failed_to_start) * 2 <= len(known):
        for node in sorted(failed_to_start):
            if not any(f["node"] == node for f in found):
                found.append({"node": node, "source": "launch",
                              "reason": _clean(f"the step could not start there: "
                                               f"{launch_nodes[node] or launch_why or 'no reason printed'}", 300)})
    for host, at in node_failures:
        if (job_nodes and host not in job_nodes) or any(f["node"] == host for f in found):
            continue
        found.append({"node": host, "source": "node-failure",
                      "reason": f"srun: Node failure on {host} (log byte {at})"})
    for cls in ignored.values():
        not_blamed.append({"node": None, "why": f"{cls['what']}: not a node fault", "class": cls["class"],
                           "count": cls["count"], "line": cls["line"]})
    return {"schema": SCHEMA, "found": found, "evidence": evidence[:MAX_EVIDENCE],
            "evidence_total": len(evidence), "tasks": [{k: v for k, v in t.items()} for t in tasks[:200]],
            "first_failure": first_failure, "not_blamed": not_blamed, "known_nodes": known,
            "node_failures": [h for h, _ in node_failures], "xid_policy": judge.as_dict(),
            "launch_failure": ({"tasks": sorted(set(launch_tasks)), "nodes": sorted(launch_nodes),
                                "why": next((w for w in launch_nodes.values() if w), None) or launch_why,
                                "whole_step": launch_whole}
                               if launch_tasks or launch_nodes or launch_whole else None)}


def node_judge(sku: Optional[str] = None, policy: Optional[str] = None) -> "xid_table.Judge":
    """The Xid verdicts lingjun-health applies on this node (its health.conf and SKU), or for
    `sku`/`policy`. Given neither, a node configuration that cannot be read falls back to the
    program's default policy (the reason is kept in "xid_policy"); given one, its errors raise
    xid_table.XidTableError."""
    if sku or policy:
        return xid_table.node_judge(sku=sku, policy=policy)
    try:
        return xid_table.node_judge()
    except xid_table.XidTableError as exc:
        return xid_table.Judge(xid_table.load(), source=f"default: the node's configuration: {exc}")


def blame(log: str, offset: int, nodes: Optional[List[str]] = None, max_bytes: int = MAX_BYTES,
          sku: Optional[str] = None, xid_policy: Optional[str] = None) -> dict:
    """Read `log` from `offset` and return the analysis, with "read" (what was read)."""
    judge = node_judge(sku, xid_policy)
    lines, info = read_region(log, max(0, offset), max_bytes)
    out = analyse(lines, nodes, judge)
    out["read"] = info
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m lingjun_slurm.injob.host.crashlog",
                                 description="Which node to blame for a crashed step, from its output log.")
    ap.add_argument("--log", required=True, help="the train job's output log")
    ap.add_argument("--offset", type=int, required=True, help="its size in bytes when this attempt's srun started")
    ap.add_argument("--nodes", default="", help="the job's nodes, space- or comma-separated (scontrol show "
                                                "hostnames): others are never blamed")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--sku", help="judge Xids as lingjun-health does for this SKU (instance type or thresholds "
                                     "name); default: this node's health.conf")
    which.add_argument("--xid-policy", help="judge Xids under this family of the XID table (nvidia, azure)")
    args = ap.parse_args(argv)
    if args.offset < 0:
        ap.error("--offset must be >= 0")
    try:
        out = blame(args.log, args.offset, args.nodes.replace(",", " ").split(), sku=args.sku,
                    xid_policy=args.xid_policy)
    except xid_table.XidTableError as exc:
        print(f"lingjun-slurm: crashlog: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"lingjun-slurm: crashlog: cannot read {args.log}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
