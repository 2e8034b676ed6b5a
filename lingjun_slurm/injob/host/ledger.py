"""The goodput ledger: where every allocated GPU-second (and, kept apart, CPU-second) of a run went.

Standard library only: the watchdog imports it on the batch host (job_buckets, for the metrics it
writes for node_exporter), and `status --goodput` / `report` on the user's machine (build).

The allocation is independent of the buckets, so that "the buckets sum to it" means something:
  - Slurm runs with accounting: one batched `sacct --allocations --duplicates` (SACCT_ARGV) for
    every job of the run, one line per run of a job (a requeue adds one). Per run: Start, and
    ElapsedRaw, which sacct computes as End - Start, or now - Start while it runs, less the time
    suspended (src/plugins/accounting_storage/mysql/as_mysql_jobacct_process.c:824-838,
    slurm-22-05-8-1), times the GPUs (else the CPUs) in AllocTRES, the job's tres_alloc_str
    (src/sacct/print.c:1921 PRINT_TRESA; GPUs there only as AccountingStorageTRES allows: tres_counts,
    else the plan's, with a note). The attempt's window is [Start, Start + ElapsedRaw]. A run sacct has
    no line for (a node failure's, before its requeue) from its markers, ending at the next line's Submit
    at the latest (_end_before_next_run).
  - Slurm runs without accounting: the start/end markers each stage script writes in
    <run_dir>/jobs/<key> (slurm_templates/partials/prelude.sh.j2), times the stage's resources
    in plan.json (nodes x gpus_per_node, else nodes x tasks_per_node x cpus_per_task).
  - the local executor: its own record of each task's start and end (local-state.json, written
    by the runner: lingjun_slurm/executors/localstate.py), times the same resources.

Each attempt's window is then cut into BUCKETS, in time order, from the run's own records:
  container_start  window start -> the first pre-flight report's `started_at` (its container
                   runs by then: injob/preflight/node.py), and, when the trainer's `start` record
                   carries `launched_at` (the training process's own start), the pre-flight's
                   end -> launched_at
  preflight        -> the latest `judged_at` of preflight/<job>-<restart>/verdict.json and
                   collective/collective-verdict.json (injob/preflight/judge.py, collective.py)
  startup          -> the first iteration's start (its metrics.jsonl `train` record's time less
                   its step_time_s): the training container, model build, checkpoint load
  productive       each `train` record: from the record before it to its time
  lost_work        the same for iterations that a later attempt trains again (an iteration
                   above the one the next attempt's `start` record resumed from): the time
                   they took the first time
  checkpoint_save  each `save` record: from the record before it to its time (its `seconds`
                   is the save itself; the difference is the step's own logging)
  evaluation       each `eval` record, the same way
  hang_wait        a hang (hangs/<job>-<restart>.json, the watchdog's record): its `since` (the
                   last progress) -> `detected`
  failed_tail      a failed attempt (a hang, a non-zero end, or metrics records without a `stop`
                   record): from its last record (or `detected`) to the window's end; a failed
                   attempt of a stage other than train is failed_tail whole
  image_staging, preprocessing, other_stages
                   a completed attempt of the image, preprocess or any other stage, whole
  unattributed     what no record explains: a completed train attempt's end after its `stop`
                   record (the process exit, container removal, epilog), a record of a type the
                   ledger does not know, and a train attempt that did not fail and left no metrics
                   (Megatron-LM's). Never dropped: it is part of the sum.
The windows' boundaries are clipped into the window in order, so each kind's buckets sum to its
allocation exactly (up to float rounding).

Waits, beside the buckets (no allocation is held): queue (Slurm: each job's first Start less its
Eligible, src/sacct/print.c:760 PRINT_ELIGIBLE is job->eligible, the time it became eligible to run,
dependencies met; while pending: now - Eligible. Markers: the first start less the later of the
manifest's submitted_at and the upstream stages' last end. Local: 0, the runner starts a task as
soon as its dependencies end) and requeue_gap (each further attempt's start less the previous
attempt's end). Holds are in neither: Slurm clears Eligible while a job is held and sets it at the
release (src/slurmctld/job_mgr.c:12042-12053 _hold_job_rec, :16440-16447 job_independent).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

from lingjun_slurm.common.jsonobj import json_object

SCHEMA = 1
# The bucket names are pinned (docs/report.md "Goodput ledger"; Prometheus labels of promfile.py).
BUCKETS = ("container_start", "preflight", "startup", "productive", "checkpoint_save", "evaluation", "lost_work",
           "hang_wait", "failed_tail", "image_staging", "preprocessing", "other_stages", "unattributed")
WAITS = ("queue", "requeue_gap")
KINDS = ("gpu", "cpu")
# Stage kind -> the bucket of a completed attempt of a stage other than train.
STAGE_BUCKET = {"image": "image_staging", "preprocess": "preprocessing"}
TRAIN_KINDS = ("train",)
# sacct's time stamps as epoch seconds: SLURM_TIME_FORMAT is handed to strftime(3)
# (src/common/parse_time.c slurm_make_time_str, slurm-22-05-8-1:674-695); "Unknown" for none.
SACCT_FIELDS = ("JobID", "JobIDRaw", "State", "AllocTRES", "ElapsedRaw", "Submit", "Eligible", "Start", "End")
SACCT_ENV = "SLURM_TIME_FORMAT=%s"
METRICS = "metrics.jsonl"


def sacct_argv(job_ids: list[str]) -> list[str]:
    """One sacct for every job of the run: one line per job run (--duplicates keeps each requeued run)."""
    return ["env", SACCT_ENV, "sacct", "--parsable2", "--noheader", "--allocations", "--duplicates",
            f"--format={','.join(SACCT_FIELDS)}", f"--jobs={','.join(job_ids)}"]


class LedgerError(ValueError):
    """Output that is not what sacct_argv asks for."""


def _epoch(text: str) -> Optional[float]:
    text = text.strip()
    return float(text) if text.isdigit() else None  # "Unknown", "None", "" (not started / not ended)


def tres_counts(tres: str) -> tuple[int, int]:
    """(GPUs, CPUs) of an AllocTRES string such as "billing=2,cpu=2,gres/gpu=1,mem=1000M,node=1".

    Slurm records GPUs in TRES only for the gres AccountingStorageTRES names: by default it tracks
    Billing, CPU, Energy, Memory, Node, FS/Disk, Pages and VMem (doc/man/man5/slurm.conf.5:171-201,
    slurm-22-05-8-1). With `gres/gpu` configured the untyped count is every GPU of the job, and a
    typed entry (gres/gpu:h100=8) configured beside it repeats part of it: the untyped one counts.
    With only typed entries configured ("gres/gpu:tesla,gres/gpu:volta": the job is "accounted for
    as either" type), the typed entries are summed. With neither, 0: the caller takes the plan's."""
    untyped: Optional[int] = None
    typed = cpus = 0
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if not value.isdigit():
            continue
        if key == "gres/gpu":
            untyped = int(value)
        elif key.startswith("gres/gpu:"):
            typed += int(value)
        elif key == "cpu":
            cpus = int(value)
    return (untyped if untyped is not None else typed), cpus


def parse_sacct(text: str) -> list[dict[str, Any]]:
    """sacct_argv's output -> [{"job", "state", "gpus", "cpus", "elapsed", "submit", "eligible", "start",
    "end"}], one per job run in sacct's order (a requeued job's runs oldest first). Step lines are skipped."""
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        values = line.split("|")
        if len(values) != len(SACCT_FIELDS):
            raise LedgerError(f"sacct line {number} has {len(values)} fields, expected {len(SACCT_FIELDS)} "
                              f"({','.join(SACCT_FIELDS)}): {line!r}")
        row = dict(zip(SACCT_FIELDS, values))
        if "." in row["JobID"] or "." in row["JobIDRaw"]:
            continue
        elapsed = row["ElapsedRaw"].strip()
        gpus, cpus = tres_counts(row["AllocTRES"])
        rows.append({"job": row["JobID"].strip(), "state": row["State"].split()[0] if row["State"].strip() else "",
                     "gpus": gpus, "cpus": cpus, "elapsed": int(elapsed) if elapsed.isdigit() else 0,
                     "submit": _epoch(row["Submit"]), "eligible": _epoch(row["Eligible"]),
                     "start": _epoch(row["Start"]), "end": _epoch(row["End"])})
    return rows


def marker_attempts(text: str) -> list[dict[str, Any]]:
    """<run_dir>/jobs/<key>: [{"start", "end", "end_marker", "next_start", "exit_code", "restart"}] per "start"
    line (a cut-short line is skipped). end_marker: its own end line's time, else None; next_start: the
    next attempt's start, else None. end: end_marker, else next_start (an attempt killed without its end
    line ends where the next one starts at the latest: without accounting nothing tells when its
    allocation ended, so the requeue wait is in that window; with accounting _windows ends it earlier,
    at the next run's Submit), else None."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        parts = line.split()
        try:
            if len(parts) >= 2 and parts[0] == "start":
                out.append({"start": float(parts[1]), "end": None, "end_marker": None, "next_start": None,
                            "exit_code": None,
                            "restart": int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else len(out)})
            elif len(parts) >= 3 and parts[0] == "end" and out and out[-1]["end"] is None:
                end, code = float(parts[1]), int(parts[2])
                out[-1].update(end=end, end_marker=end, exit_code=code)
        except ValueError:
            continue
    for a, after in zip(out, out[1:]):
        a["next_start"] = after["start"]
        if a["end"] is None:
            a["end"] = after["start"]
    return out


def metric_records(text: str) -> list[dict[str, Any]]:
    """metrics.jsonl's records that have a numeric time, oldest first (a line cut short is skipped)."""
    out = []
    for line in text.splitlines():
        rec = json_object(line)
        if rec is not None and isinstance(rec.get("time"), (int, float)) and isinstance(rec.get("type"), str):
            out.append(rec)
    out.sort(key=lambda r: r["time"])
    return out


def stage_units(stage: dict[str, Any]) -> tuple[str, int]:
    """("gpu", GPUs) or ("cpu", CPUs) a plan.json stage asks for (the allocation when Slurm cannot say)."""
    res = stage.get("resources") if isinstance(stage.get("resources"), dict) else {}
    nodes = _int(res.get("nodes"), 1)
    gpus = _int(res.get("gpus_per_node"), 0)
    if gpus:
        return "gpu", nodes * gpus
    return "cpu", nodes * _int(res.get("tasks_per_node"), 1) * _int(res.get("cpus_per_task"), 1)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


# ---------------------------------------------------------------------------- one attempt


class _Cut:
    """Cuts [start, end] into buckets: each mark(t, bucket) gives the time since the last mark, clipped
    into the window and never backwards, to bucket; close(bucket) gives the rest."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end, self.at = start, max(start, end), start
        self.seconds = dict.fromkeys(BUCKETS, 0.0)

    def mark(self, t: Optional[float], bucket: str) -> None:
        if t is None:
            return
        t = min(max(t, self.at), self.end)
        self.seconds[bucket] += t - self.at
        self.at = t

    def close(self, bucket: str) -> dict[str, float]:
        self.mark(self.end, bucket)
        return self.seconds


def preflight_times(docs: list[dict[str, Any]]) -> tuple[Optional[float], Optional[float]]:
    """(first started_at, last judged_at) of one attempt's pre-flight files (node reports, verdicts)."""
    started = [d["started_at"] for d in docs if isinstance(d.get("started_at"), (int, float))]
    judged = [d["judged_at"] for d in docs if isinstance(d.get("judged_at"), (int, float))]
    if not judged:  # killed before the judge: the nodes' own ends
        judged = [d["started_at"] + d["timings"]["total"] for d in docs
                  if isinstance(d.get("started_at"), (int, float)) and isinstance(d.get("timings"), dict)
                  and isinstance(d["timings"].get("total"), (int, float))]
    return (min(started) if started else None), (max(judged) if judged else None)


def train_attempt(start: float, end: float, records: list[dict[str, Any]], *, failed: bool, running: bool,
                  resumed_next: Optional[int], preflight: tuple[Optional[float], Optional[float]] = (None, None),
                  hang: Optional[dict[str, Any]] = None) -> dict[str, float]:
    """Wall seconds of one train attempt's window per bucket. records: metrics.jsonl's records inside
    the window; resumed_next: the iteration the next attempt resumed from (None: no later attempt)."""
    cut = _Cut(start, end)
    p0, p1 = preflight
    if p0 is not None:
        cut.mark(p0, "container_start")
        cut.mark(p1, "preflight")
    starts = [r for r in records if r["type"] == "start"]
    launched = starts[0].get("launched_at") if starts else None
    if isinstance(launched, (int, float)):
        cut.mark(launched, "container_start")
    trains = [r for r in records if r["type"] == "train"]
    if trains:
        step = trains[0].get("step_time_s")
        cut.mark(trains[0]["time"] - (step if isinstance(step, (int, float)) and step > 0 else 0.0), "startup")
    stopped = False
    for rec in records:
        kind = rec["type"]
        if kind == "train":
            it = rec.get("iteration")
            lost = resumed_next is not None and isinstance(it, int) and it > resumed_next
            cut.mark(rec["time"], "lost_work" if lost else "productive")
        elif kind == "save":
            cut.mark(rec["time"], "checkpoint_save")
        elif kind == "eval":
            cut.mark(rec["time"], "evaluation")
        elif kind in ("start", "resume_check", "resume_fallback"):
            cut.mark(rec["time"], "startup")
        elif kind == "stop":
            # From the last step to the stop record: the trainer's own end (a final save has its record).
            cut.mark(rec["time"], "productive" if trains else "startup")
            stopped = True
        else:
            cut.mark(rec["time"], "unattributed")
    if isinstance(hang, dict) and isinstance(hang.get("detected"), (int, float)):
        since = hang.get("since")
        # Up to the last progress the watchdog saw: the phase it was in.
        cut.mark(since if isinstance(since, (int, float)) else None, "productive" if trains else "startup")
        cut.mark(hang["detected"], "hang_wait")
        return cut.close("failed_tail")
    if running:  # the step now under way
        return cut.close("productive" if trains else "startup")
    if failed or (records and not stopped):
        return cut.close("failed_tail")
    # A clean end after the stop record; or an attempt that left no metrics at all and did not fail
    # (Megatron-LM writes no metrics.jsonl: its training time is not split).
    return cut.close("unattributed")


def other_attempt(start: float, end: float, stage_kind: str, *, failed: bool) -> dict[str, float]:
    cut = _Cut(start, end)
    return cut.close("failed_tail" if failed else STAGE_BUCKET.get(stage_kind, "other_stages"))


# ---------------------------------------------------------------------------- a run


Reader = Callable[[str], Optional[str]]   # a path relative to the run directory -> its text, None if absent
Lister = Callable[[str], list[str]]       # a directory relative to the run directory -> its names, [] if absent


def _json(read: Reader, path: str) -> Optional[dict[str, Any]]:
    return json_object(read(path))


def _preflight(read: Reader, listdir: Lister, attempt: str) -> tuple[Optional[float], Optional[float]]:
    base = f"preflight/{attempt}"
    docs = [d for d in (_json(read, f"{base}/{n}") for n in listdir(base) if n.endswith(".json")) if d]
    docs += [d for d in (_json(read, f"{base}/collective/{n}") for n in listdir(f"{base}/collective")
                         if n.endswith(".json")) if d]
    return preflight_times(docs)


def _run_units(run: dict[str, Any], kind: str, units: int) -> tuple[str, int, bool]:
    """(kind, units, from the plan?) of one sacct run: its GPUs when AllocTRES has them; else, for a
    stage whose plan asks for GPUs, the plan's (nodes x gpus_per_node: Slurm records GPUs only when
    AccountingStorageTRES names gres/gpu, see tres_counts; the sbatch line asked for them, so they
    were allocated); else its CPUs (the plan's when sacct has none)."""
    if run["gpus"]:
        return "gpu", run["gpus"], False
    if kind == "gpu":
        return "gpu", units, True
    return "cpu", run["cpus"] or units, not run["cpus"]


def _end_before_next_run(attempt: dict[str, Any], runs: list[dict[str, Any]]) -> Optional[float]:
    """The end of an attempt sacct has no line for: the earliest of its own end marker, the next
    attempt's start marker, and the Submit and Start of the job's first sacct run after it (a run
    pending now has a Submit and no Start). None: no bound at all (the attempt runs now)."""
    start = attempt["start"]
    later = [r for r in runs if (r["start"] is not None and r["start"] > start)
             or (r["start"] is None and r["submit"] is not None and r["submit"] > start)]
    bounds = [attempt["end_marker"], attempt["next_start"]]
    if later:
        nxt = min(later, key=lambda r: r["start"] if r["start"] is not None else float("inf"))
        bounds += [t for t in (nxt["submit"], nxt["start"]) if t is not None and t > start]
    bounds = [t for t in bounds if t is not None]
    return min(bounds) if bounds else None


def _windows(stage: dict[str, Any], plan_stage: dict[str, Any], executor: str, sacct: Optional[list[dict[str, Any]]],
             local_tasks: list[dict[str, Any]], read: Reader, names: list[str], now: float) -> list[dict[str, Any]]:
    """A stage's attempts: [{"job", "restart", "start", "end", "running", "failed", "kind", "units", "source",
    "eligible"}], oldest first, for its current jobs and those a resubmit replaced."""
    jobs = [j for prev in _list(stage.get("previous")) if isinstance(prev, dict) for j in _list(prev.get("job_ids"))]
    jobs = [j for j in jobs + _list(stage.get("job_ids")) if isinstance(j, str) and j]
    kind, units = stage_units(plan_stage)
    out: list[dict[str, Any]] = []
    for job in jobs:
        keys = sorted(n for n in names if n == job or n.startswith(f"{job}_"))
        markers = {k: marker_attempts(read(f"jobs/{k}") or "") for k in keys}
        runs = [r for r in sacct or [] if r["job"] == job or r["job"].startswith(f"{job}_")]
        if runs:  # a job sacct does not know (purged, another cluster's database): its markers below
            seen: dict[str, int] = {}
            for r in runs:
                n = seen[r["job"]] = seen.get(r["job"], -1) + 1
                gkind, gunits, from_plan = _run_units(r, kind, units)
                att = {"job": r["job"], "restart": n, "eligible": r["eligible"], "source": "sacct",
                       "kind": gkind, "units": gunits, "state": r["state"], "units_from_plan": from_plan}
                if r["start"] is None:
                    out.append({**att, "start": None, "end": None, "running": False, "failed": False})
                    continue
                running = r["end"] is None or r["state"] in ("RUNNING", "SUSPENDED")
                tries = markers.get(r["job"], [])
                try_ = next((a for a in tries if r["start"] - 2 <= a["start"] <= r["start"] + r["elapsed"] + 2), None)
                failed = r["state"] not in ("COMPLETED", "RUNNING", "REQUEUED", "SUSPENDED", "PENDING")
                if try_ is not None and try_["exit_code"] not in (None, 0):
                    failed = True
                out.append({**att, "start": r["start"], "end": r["start"] + r["elapsed"], "running": running,
                            "failed": failed, "restart": try_["restart"] if try_ else n})
            # An attempt the job's markers show and sacct does not: Slurm 22.05.8 keeps no record of the
            # run a node failure ended before its requeue (one line, the last run's, seen on the test
            # cluster: bench/faults.py node-lost). Its start from the markers, its units from sacct's.
            # Its end: its own end marker, else at the latest the next run's Submit: the requeue sets the
            # record's submit time to the requeue moment (batch_requeue_fini, src/slurmctld/job_mgr.c:
            # 16113-16117, slurm-22-05-8-1) and delays its eligibility (:16102-16109), so from there on
            # the job held no allocation; the wait up to the next Start is requeue_gap, not this attempt.
            covered = [(r["start"] - 2, r["start"] + r["elapsed"] + 2, r) for r in runs if r["start"] is not None]
            for key, tries in markers.items():
                for a in tries:
                    if any(lo <= a["start"] <= hi for lo, hi, r in covered if r["job"] == key):
                        continue
                    like = next((r for r in runs if r["job"] == key), runs[0])
                    gkind, gunits, from_plan = _run_units(like, kind, units)
                    end = _end_before_next_run(a, [r for r in runs if r["job"] == key])
                    out.append({"job": key, "restart": a["restart"], "eligible": None, "source": "markers",
                                "kind": gkind, "units": gunits, "units_from_plan": from_plan,
                                "start": a["start"], "end": end if end is not None else now,
                                "running": end is None and like["state"] in ("RUNNING", "SUSPENDED"),
                                "failed": a["exit_code"] not in (None, 0) or a["end_marker"] is None, "state": None})
            continue
        if executor == "local":
            for t in local_tasks:
                if t.get("job_id") != job or not isinstance(t.get("start"), (int, float)):
                    continue
                end = t.get("end") if isinstance(t.get("end"), (int, float)) else None
                out.append({"job": t.get("key") or job, "restart": 0, "eligible": None, "source": "local",
                            "kind": kind, "units": units, "start": t["start"], "end": end if end is not None else now,
                            "running": end is None, "failed": end is not None and t.get("exit_code") != 0,
                            "state": t.get("state")})
            continue
        for key, tries in markers.items():
            for a in tries:
                # Without accounting, an attempt with no end marker (a node failure) ends at the next one's
                # start: nothing here tells when its allocation ended, so the requeue wait is in it (a note).
                out.append({"job": key, "restart": a["restart"], "eligible": None, "source": "markers", "kind": kind,
                            "units": units, "start": a["start"], "end": a["end"] if a["end"] is not None else now,
                            "running": a["end"] is None, "failed": a["exit_code"] not in (None, 0), "state": None,
                            "end_at_next_start": a["end_marker"] is None and a["next_start"] is not None})
    out.sort(key=lambda a: (a["start"] is None, a["start"] or 0.0))
    return out


def build(read: Reader, listdir: Lister, manifest: dict[str, Any], plan: dict[str, Any],
          sacct: Optional[list[dict[str, Any]]], now: Optional[float] = None,
          local_state: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The run's ledger (the document `status --goodput --json` prints; docs/report.md "Goodput ledger").

    read/listdir: the run directory's files (relative paths); manifest, plan: manifest.json and
    plan.json; sacct: parse_sacct of sacct_argv for the run's jobs, None when Slurm has no accounting
    (the markers then) or for a local run (local_state: local-state.json)."""
    now = time.time() if now is None else now
    executor = str(manifest.get("executor") or "")
    plan_stages = {s.get("name"): s for s in _list(plan.get("stages")) if isinstance(s, dict)}
    names = listdir("jobs")
    records = metric_records(read(METRICS) or "")
    local_tasks = [t for t in (local_state or {}).get("tasks") or [] if isinstance(t, dict)]
    totals = {k: {"allocated_seconds": 0.0, "buckets": dict.fromkeys(BUCKETS, 0.0)} for k in KINDS}
    waits = dict.fromkeys(WAITS, 0.0)
    attempts_out: list[dict[str, Any]] = []
    stage_ends: dict[str, float] = {}
    planned: set[str] = set()      # jobs whose GPUs come from the plan (sacct recorded none)
    guessed_end: list[str] = []    # attempts ended at the next one's start (no end marker, no Slurm record)
    for stage in _list(manifest.get("stages")):
        if not isinstance(stage, dict):
            continue
        name = stage.get("name")
        plan_stage = plan_stages.get(name, {})
        stage_kind = str(stage.get("kind") or plan_stage.get("kind") or "")
        tries = _windows(stage, plan_stage, executor, sacct if executor == "slurm" else None, local_tasks, read,
                         names, now)
        # The iteration each train attempt resumed from (its trainer's start record), for lost work.
        resumed = []
        if stage_kind in TRAIN_KINDS:
            for a in tries:
                rec = next((r for r in records if r["type"] == "start" and a["start"] is not None
                            and a["start"] - 2 <= r["time"] <= (a["end"] or now) + 2), None)
                resumed.append(rec.get("iteration") if rec and isinstance(rec.get("iteration"), int) else None)
        first_by_job: dict[str, dict[str, Any]] = {}
        prev_end: dict[str, float] = {}
        for i, a in enumerate(tries):
            root = a["job"].split("_")[0]
            if a["start"] is None:  # pending: waiting in the queue now (after an attempt: requeued)
                if a["job"] in prev_end:
                    waits["requeue_gap"] += max(0.0, now - prev_end[a["job"]])
                elif a["restart"] == 0 and a["eligible"] is not None:
                    waits["queue"] += max(0.0, now - a["eligible"])
                continue
            if a["job"] in prev_end:
                waits["requeue_gap"] += max(0.0, a["start"] - prev_end[a["job"]])
            elif a["job"] not in first_by_job:
                first_by_job[a["job"]] = a
                if a["source"] == "sacct" and a["eligible"] is not None:
                    waits["queue"] += max(0.0, a["start"] - a["eligible"])
                elif a["source"] == "markers":
                    ups = [stage_ends[d.get("stage")] for d in _list(stage.get("depends_on"))
                           if isinstance(d, dict) and d.get("stage") in stage_ends]
                    ready = max([float(stage.get("submitted_at") or 0.0)] + ups)
                    waits["queue"] += max(0.0, a["start"] - ready) if ready else 0.0
            end = a["end"] if a["end"] is not None else now
            prev_end[a["job"]] = end
            stage_ends[name] = max(stage_ends.get(name, 0.0), end)
            if stage_kind in TRAIN_KINDS:
                # The attempt's name in its records: "${SLURM_JOB_ID}-${SLURM_RESTART_COUNT}" (faults.sh.j2;
                # the local executor sets SLURM_JOB_ID to its job id and SLURM_RESTART_COUNT=0).
                attempt = f"{root}-{a['restart']}"
                window = [r for r in records if a["start"] - 1 <= r["time"] <= end + 1]
                later = [x for x in resumed[i + 1:] if x is not None]
                hang = _json(read, f"hangs/{attempt}.json")
                wall = train_attempt(a["start"], end, window, failed=a["failed"], running=a["running"],
                                     resumed_next=later[0] if later else None,
                                     preflight=_preflight(read, listdir, attempt),
                                     hang=hang if hang and hang.get("type") == "hang" else None)
            else:
                wall = other_attempt(a["start"], end, stage_kind, failed=a["failed"])
            units = a["units"]
            if a.get("units_from_plan") and a["kind"] == "gpu":
                planned.add(a["job"])
            if a.get("end_at_next_start"):
                guessed_end.append(f"{a['job']}-{a['restart']}")
            buckets = {k: v * units for k, v in wall.items()}
            allocated = (end - a["start"]) * units
            total = totals[a["kind"]]
            total["allocated_seconds"] += allocated
            for k, v in buckets.items():
                total["buckets"][k] += v
            attempts_out.append({"stage": name, "stage_kind": stage_kind, "job": a["job"], "restart": a["restart"],
                                 "source": a["source"], "kind": a["kind"], "units": units, "start": a["start"],
                                 "end": end, "running": a["running"], "failed": a["failed"],
                                 "allocated_seconds": allocated, "buckets": buckets})
    notes = []
    if planned:
        notes.append(f"Slurm recorded no GPUs for job {', '.join(sorted(planned))} (AllocTRES has no gres/gpu: "
                     "AccountingStorageTRES lacks gres/gpu): their GPUs are the plan's, nodes x gpus_per_node")
    if guessed_end:
        notes.append(f"attempt {', '.join(guessed_end)} left no end marker and there is no Slurm record of it: it "
                     "ends at the next attempt's start, so the requeue wait is counted in it, not in requeue_gap")
    gpu_alloc = totals["gpu"]["allocated_seconds"]
    of = "gpu" if gpu_alloc > 0 else "cpu"
    alloc = totals[of]["allocated_seconds"]
    monitoring = (plan.get("settings") or {}).get("monitoring") or {}
    price = monitoring.get("gpu_hour_price") if isinstance(monitoring, dict) else None
    price = float(price) if isinstance(price, (int, float)) and not isinstance(price, bool) else None
    return {"schema": SCHEMA, "run": str(manifest.get("run_id") or ""), "executor": executor,
            "source": attempts_out[0]["source"] if attempts_out else None,
            "gpu": totals["gpu"], "cpu": totals["cpu"], "waits": waits,
            "goodput": (totals[of]["buckets"]["productive"] / alloc) if alloc > 0 else 0.0, "goodput_of": of,
            "gpu_hours": gpu_alloc / 3600.0, "gpu_hour_price": price,
            "cost": gpu_alloc / 3600.0 * price if price is not None and gpu_alloc > 0 else None,
            "attempts": attempts_out, **({"note": "; ".join(notes)} if notes else {})}


# ---------------------------------------------------------------------------- the watchdog's view


def _dir_reader(run_dir: str) -> tuple[Reader, Lister]:
    def read(rel: str) -> Optional[str]:
        try:
            with open(os.path.join(run_dir, rel), encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except OSError:
            return None

    def listdir(rel: str) -> list[str]:
        try:
            return sorted(os.listdir(os.path.join(run_dir, rel)))
        except OSError:
            return []

    return read, listdir


def job_buckets(run_dir: str, job_id: str, now: float) -> dict[str, float]:
    """Seconds of job_id's allocation so far per bucket (every name in BUCKETS, 0.0 when none), in
    GPU-seconds when its stage has GPUs, else CPU-seconds, from the job's own records only: its
    markers (jobs/<job_id>; its running attempt up to now), the stage's resources in plan.json, the
    stage named in manifest.json, metrics.jsonl, hangs/ and preflight/. No Slurm query: the markers
    start when the batch script does, a little after Slurm's Start (the prolog, the launch)."""
    read, listdir = _dir_reader(run_dir)
    manifest = _json(read, "manifest.json") or {}
    plan = _json(read, "plan.json") or {}
    stage = next((s for s in _list(manifest.get("stages"))
                  if isinstance(s, dict) and job_id in _list(s.get("job_ids"))), None)
    out = dict.fromkeys(BUCKETS, 0.0)
    if stage is None:
        return out
    one = {**stage, "job_ids": [job_id], "previous": [], "depends_on": []}
    doc = build(read, lambda rel: [n for n in listdir(rel) if rel != "jobs" or n == job_id or
                                   n.startswith(f"{job_id}_")],
                {**manifest, "executor": "markers", "stages": [one]}, plan, None, now)
    for a in doc["attempts"]:
        for k, v in a["buckets"].items():
            out[k] += v
    return out


def format_table(doc: dict[str, Any]) -> str:
    """`status --goodput RUN`: hours per bucket for each kind, the waits, goodput and cost."""
    lines = [f"goodput of run {doc['run']}: {doc['goodput'] * 100:.1f}% "
             f"(productive / allocated {doc['goodput_of'].upper()}-hours; allocation from {doc.get('source') or '-'})"]
    for kind in KINDS:
        part = doc[kind]
        if part["allocated_seconds"] <= 0:
            continue
        alloc = part["allocated_seconds"]
        lines.append(f"  {kind.upper()}-hours allocated {alloc / 3600:.4f}")
        lines.append(f"    {'BUCKET':<16} {'HOURS':>10} {'SHARE':>7}")
        for name in BUCKETS:
            v = part["buckets"][name]
            if v > 0:
                lines.append(f"    {name:<16} {v / 3600:>10.4f} {v / alloc * 100:>6.1f}%")
    lines.append("  waits (no allocation held): " + ", ".join(f"{k} {doc['waits'][k]:.0f} s" for k in WAITS))
    if doc.get("cost") is not None:
        lines.append(f"  cost {doc['cost']:.2f} ({doc['gpu_hours']:.4f} GPU-hours x {doc['gpu_hour_price']:g})")
    return "\n".join(lines) + "\n"
