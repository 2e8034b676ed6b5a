"""What a report shows, as one JSON-able document (embedded in the page as `report-data`).

Sources, all read through the run's Transport (local or SSH):
  - <run_dir>/metrics.jsonl, the builtin trainer's records (train/metrics.py): `train` records
    (a later one for the same iteration, after a restart, supersedes an earlier one), `eval`,
    `save`, and the events `start`, `stop`, `resume_fallback`;
  - <run_dir>/jobs/<job id>, the markers every stage script writes: one "start EPOCH RESTARTS
    NODES" line per attempt (a requeue adds one) and "end EPOCH RC" (lingjun_slurm/status.py
    read_marker); with the manifest's submitted_at they give the queue wait and the run time;
  - the status (StatusCollector, one batched Slurm query) for each stage's state and reason;
  - the checkpoint directory (on this machine only: its size needs a walk of every file);
  - nccl-test reports attached to the run, <run_dir>/nccl-tests/*/report.json;
  - the goodput ledger (status.goodput: lingjun_slurm/injob/host/ledger.py), whose allocation is
    Slurm's own (one batched sacct) or the local runner's record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

SCHEMA = 1
EVENTS = ("start", "stop", "resume_fallback")


def metrics(text: str) -> dict[str, list[dict[str, Any]]]:
    """metrics.jsonl -> {"train": [...], "eval": [...], "save": [...], "events": [...]}, by iteration.
    A line that is not a JSON object (a write cut short by a kill) is skipped."""
    train: dict[int, dict[str, Any]] = {}
    out: dict[str, list[dict[str, Any]]] = {"train": [], "eval": [], "save": [], "events": []}
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        kind = rec.get("type")
        if kind == "train" and isinstance(rec.get("iteration"), int):
            train[rec["iteration"]] = rec  # a restart repeats iterations: the later record wins
        elif kind in ("eval", "save"):
            out[kind].append(rec)
        elif kind in EVENTS:
            out["events"].append(rec)
    out["train"] = [train[k] for k in sorted(train)]
    return out


def attempts(text: str) -> list[dict[str, Any]]:
    """A marker file's attempts: [{"start", "end", "exit_code", "restarts", "nodes"}], oldest first."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "start":
            try:
                start = float(parts[1])
            except ValueError:
                continue
            out.append({"start": start, "end": None, "exit_code": None,
                        "restarts": int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 0,
                        "nodes": parts[3] if len(parts) > 3 else None})
        elif len(parts) >= 3 and parts[0] == "end" and out and out[-1]["end"] is None:
            try:
                out[-1]["end"], out[-1]["exit_code"] = float(parts[1]), int(parts[2])
            except ValueError:
                continue
    return out


def stage_timeline(t: Any, run_dir: str, rec: Any, names: "list[str] | dict[str, bytes]") -> dict[str, Any]:
    """Submit time, attempts and the queue wait / run time of one stage (its current jobs).
    names: the files in <run_dir>/jobs/ with their contents, read once for the run
    (Transport.read_dir_files: one remote command over SSH for a 1,024-task array's markers, not
    one SFTP read each); a list of names (read here one by one) is still taken.

    submitted_at is the clock of the machine that ran submit, the markers the compute node's: the
    wait includes their difference (NTP keeps it well under a second on a managed cluster; a
    laptop's clock over --host may be off by more)."""
    runs: list[dict[str, Any]] = []
    contents = names if isinstance(names, dict) else None
    by_job: dict[str, list[str]] = {}  # one pass over the names, not one per job id
    for n in names:
        by_job.setdefault(n.partition("_")[0], []).append(n)
    for job in rec.job_ids:
        for key in sorted(by_job.get(job, ()), key=_task_order):
            if contents is not None:
                text = contents[key].decode("utf-8", errors="replace")
            else:
                try:
                    text = t.read_text(f"{run_dir}/jobs/{key}")
                except (FileNotFoundError, OSError):
                    continue
            tries = attempts(text)
            for a, after in zip(tries, tries[1:]):
                if a["end"] is None:  # killed without an end line (SIGKILL, a lost node), then requeued
                    a["end"] = after["start"]
            runs += [{"job": key, **a} for a in tries]
    starts = [a["start"] for a in runs]
    ends = [a["end"] for a in runs if a["end"] is not None]
    first = min(starts) if starts else None
    last = max(ends) if ends and len(ends) == len(runs) else None  # None while an attempt runs
    # The markers count whole seconds (date +%s) and submitted_at does not: a wait under a
    # second can come out negative, and is 0.
    return {"submitted_at": rec.submitted_at, "attempts": runs, "started_at": first, "ended_at": last,
            "queue_wait_s": max(0.0, first - rec.submitted_at) if first is not None and rec.submitted_at else None,
            # wall time from the first start to the last end (array tasks overlap; requeues add up)
            "run_s": (last - first) if first is not None and last is not None else None,
            # a requeued job starts again under the same id: every start after its first
            "requeues": sum(max(0, sum(1 for a in runs if a["job"] == key) - 1)
                            for key in {a["job"] for a in runs})}


def _task_order(key: str) -> tuple[int, str]:
    """jobs/<id> before jobs/<id>_0, _1, ..., _10 (numeric), then anything else by name."""
    _, sep, task = key.partition("_")
    return (-1 if not sep else int(task) if task.isdigit() else 1 << 62, key)


def checkpoints(ckpt_dir: Optional[str], here: bool = True) -> dict[str, Any]:
    """The run's checkpoints as this machine sees them: iteration, files, bytes, manifest or not,
    the tracker's iteration. here=False (a remote run), or no such directory: {"dir", "readable": false}."""
    if not here or not ckpt_dir or not os.path.isdir(ckpt_dir):
        return {"dir": ckpt_dir, "readable": False, "tracker": None, "iterations": []}
    from ..injob.checkpoint import read_tracker
    from ..injob.checkpoint.layout import dir_size, iterations

    tracker = read_tracker(Path(ckpt_dir))
    items = []
    for it, path in iterations(Path(ckpt_dir)):
        files, size = dir_size(path)
        items.append({"iteration": it, "name": path.name, "files": files, "bytes": size,
                      "manifest": (path / "lingjun-manifest.json").is_file(),
                      "complete": (path / "metadata.json").is_file(),
                      "latest": tracker.iteration == it})
    damaged = sorted(p.name for p in Path(ckpt_dir).iterdir() if ".damaged-" in p.name)
    return {"dir": ckpt_dir, "readable": True, "tracker": tracker.iteration, "iterations": items,
            "damaged_aside": damaged}


NCCL_DIR = "nccl-tests"  # <run_dir>/nccl-tests/<name>/: `lingjun-slurm nccl-test --outdir` there attaches one


def nccl_tests(t: Any, run_dir: str) -> list[dict[str, Any]]:
    """The nccl-test reports attached to the run: <run_dir>/nccl-tests/*/report.json (schema 2,
    lingjun_slurm/nodes/nccltests/report.py to_json), each summarised per op: ranks, hosts, average
    and peak bus bandwidth (out-of-place, GB/s), the verdict and its reason."""
    try:
        names = sorted(t.listdir(f"{run_dir}/{NCCL_DIR}"))
    except (FileNotFoundError, NotADirectoryError, OSError):
        return []
    out = []
    for name in names:
        try:
            doc = json.loads(t.read_text(f"{run_dir}/{NCCL_DIR}/{name}/report.json"))
        except (FileNotFoundError, NotADirectoryError, OSError, ValueError):
            continue
        if not isinstance(doc, dict) or doc.get("schema") != 2:
            continue
        ops = []
        for op in doc.get("ops") or []:
            if not isinstance(op, dict):
                continue
            peaks = [r.get("busbw_out") for r in op.get("rows") or [] if isinstance(r, dict)]
            peaks = [v for v in peaks if isinstance(v, (int, float))]
            ops.append({"op": op.get("op"), "ranks": op.get("ranks"), "hosts": len(op.get("hosts") or []),
                        "avg_busbw": op.get("avg_busbw"), "peak_busbw": max(peaks) if peaks else None,
                        "verdict": op.get("verdict"), "reason": op.get("reason")})
        out.append({"name": name, "title": doc.get("title"), "ok": doc.get("ok"), "ops": ops})
    return out


def collect(t: Any, manifest: Any, status: Any) -> dict[str, Any]:
    """The report's data for one run: the manifest, its status (a RunStatus) and what the run dir holds."""
    run_dir = manifest.run_dir.rstrip("/")
    try:
        text = t.read_text(f"{run_dir}/metrics.jsonl")
    except (FileNotFoundError, OSError):
        text = ""
    states = {s.name: s for s in status.stages}
    try:
        # every marker of the run in one call (bounded round trips over SSH); a marker is a few
        # lines per attempt: 64 KiB holds thousands of requeues
        names: dict[str, bytes] = t.read_dir_files(f"{run_dir}/jobs")
    except (FileNotFoundError, NotADirectoryError, OSError):
        names = {}
    stages = []
    for rec in manifest.stages:
        st = states.get(rec.name)
        stages.append({"name": rec.name, "kind": rec.kind, "job_ids": list(rec.job_ids),
                       "previous_attempts": len(rec.previous),
                       "state": st.state if st else None, "reason": st.reason if st else None,
                       "exit_code": st.exit_code if st else None, "restarts": st.restarts if st else 0,
                       "nodes": st.nodes if st else None, **stage_timeline(t, run_dir, rec, names)})
    ckpt_dir = _checkpoint_dir(t, run_dir)
    local = getattr(t, "kind", "local") == "local"
    return {"schema": SCHEMA,
            "run": {"run_id": manifest.run_id, "name": manifest.name, "executor": manifest.executor,
                    "host": manifest.transport.host, "run_dir": run_dir, "created_at": manifest.created_at,
                    "slurm_error": getattr(status, "slurm_error", None)},
            "stages": stages,
            "goodput": goodput(t, manifest),
            "metrics": metrics(text),
            "nccl_tests": nccl_tests(t, run_dir),
            "checkpoints": checkpoints(ckpt_dir, here=local)}


def goodput(t: Any, manifest: Any) -> dict[str, Any]:
    """The run's ledger (status --goodput --json's document), or {"error": why} when it cannot be
    made (sacct failing is not such a case: the ledger then says it used the markers)."""
    from ..common.errors import LingjunError
    from ..status import goodput as ledger_of

    try:
        return ledger_of(t, manifest)
    except (LingjunError, OSError) as exc:
        return {"error": str(exc)}


def _checkpoint_dir(t: Any, run_dir: str) -> Optional[str]:
    """The checkpoint directory as the host sees it (plan.json's host_checkpoint_dir)."""
    try:
        plan = json.loads(t.read_text(f"{run_dir}/plan.json"))
    except (FileNotFoundError, OSError, ValueError):
        return None
    return plan.get("host_checkpoint_dir") or plan.get("checkpoint_dir") if isinstance(plan, dict) else None


def finite(value: Any) -> Any:
    """The document with every NaN / Infinity (a diverged loss, its ppl) as null: strict JSON,
    which browsers' JSON.parse and other tools read (metrics.jsonl itself keeps them)."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


EMBED_POINTS = 5000  # train records the page embeds at most; report-data.json keeps every one


def thinned(doc: dict[str, Any]) -> dict[str, Any]:
    """The document the page embeds: for a long run every n-th train record and the last, so a
    run of 500k iterations is not a page of 170 MB ("train_every": n says so)."""
    train = doc["metrics"]["train"]
    if len(train) <= EMBED_POINTS:
        return doc
    every = -(-len(train) // EMBED_POINTS)
    keep = train[::every] + ([train[-1]] if (len(train) - 1) % every else [])
    return {**doc, "metrics": {**doc["metrics"], "train": keep, "train_every": every}}
