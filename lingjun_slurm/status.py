"""status: where every stage of one or more runs is, and why (schema pinned by STATUS_SCHEMA).

For Slurm runs one `squeue --json` call covers every job shown, plus one `sacct` call
for the jobs that left the queue when the cluster has accounting (or, on this machine, the
same two reads through pyslurm when it passes the guard: slurm/queue.py). Jobs known to neither
are resolved from the jobcomp/filetxt log when it is readable, then from the start/end
markers the stage scripts write in <run_dir>/jobs/. Local runs read local-state.json.

When the queue cannot be read (slurmctld unreachable, SlurmUnavailable), every other run is still
shown and each submitted stage of the Slurm runs on that host is UNKNOWN with Slurm's own message
(`slurm_error` on the run): no marker stands in for the queue then, since a job that wrote an end
marker may have been requeued since. The CLI exits 1 after showing them.

    {"schema": 1, "runs": [{"run_id", "name", "executor", "host", "stages": [{"name",
      "job_ids", "state", "reason", "exit_code", "elapsed_s", "nodes", "restarts"}],
      "slurm_error": "..." (only when Slurm could not be asked),
      "state": "UNKNOWN", "record_error": "..." (only when the run's manifest cannot be read; no stages)}]}

One bad record hurts one run (docs/run-records.md): a local-state.json that is not a record makes
its run's stages UNKNOWN with what is wrong and the fix; a deleted one leaves each stage as its
markers say (_without_state); a garbled marker line is skipped.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from .common.errors import CommandError, LingjunError, SlurmUnavailable
from .runs.manifest import Manifest, StageRecord
from .slurm.parse import JobInfo, SlurmParseError, parse_jobcomp_filetxt
from .slurm.queue import Choice, QueueReader, choose_reader
from .injob.host.stagenotes import NOTES_DIR
from .transport.base import Transport

STATUS_SCHEMA = 1
JOBCOMP_TAIL = 16 << 20
ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "CONFIGURING", "COMPLETING", "RESIZING", "SIGNALING",
          "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "STOPPED")
FAILED = ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED", "CANCELLED")


@dataclass
class StageStatus:
    name: str
    job_ids: list[str]
    state: str
    reason: Optional[str]
    exit_code: Optional[int]
    elapsed_s: Optional[int]
    nodes: Optional[str]
    restarts: int


@dataclass
class RunStatus:
    run_id: str
    name: str
    executor: str
    host: str
    stages: list[StageStatus] = field(default_factory=list)
    run_dir: str = ""
    stale_as_of: Optional[float] = None  # set when shown from the local copy: the host was unreachable
    slurm_error: Optional[str] = None    # Slurm's message when its queue could not be read
    record_error: Optional[str] = None   # the run's own record cannot be read: what, and the fix (no stages)
    dir_gone: Optional[str] = None       # a local run's directory is gone: shown from the last status kept here

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"run_id": self.run_id, "name": self.name, "executor": self.executor,
                               "host": self.host, "stages": [asdict(s) for s in self.stages]}
        if self.stale_as_of is not None:
            doc["stale"] = True
            doc["as_of"] = self.stale_as_of
        if self.slurm_error is not None:
            doc["slurm_error"] = self.slurm_error
        if self.dir_gone is not None:
            doc["dir_gone"] = self.dir_gone
        if self.record_error is not None:
            doc["state"] = "UNKNOWN"
            doc["record_error"] = self.record_error
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any], run_dir: str = "") -> "RunStatus":
        """A run's status document (the mirror's status.json); ValueError when it is not one."""
        fields = StageStatus.__dataclass_fields__
        rows = doc.get("stages", [])
        if not isinstance(rows, list) or not all(isinstance(r, dict) and set(fields) <= set(r) for r in rows):
            raise ValueError("stages is not a list of stage records")
        stages = [StageStatus(**{k: v for k, v in s.items() if k in fields}) for s in rows]
        return cls(str(doc["run_id"]), str(doc.get("name", "")), str(doc.get("executor", "")),
                   str(doc.get("host", "")), stages, run_dir)


def document(runs: list[RunStatus]) -> dict[str, Any]:
    return {"schema": STATUS_SCHEMA, "runs": [r.to_json() for r in runs]}


def _belongs(info: JobInfo, job_id: str, job_name: str) -> bool:
    """The record is this stage's job: same id, and (when the source gives one) the same name,
    so a reused job id or another cluster's job is never taken for ours."""
    same_id = info.job_id == job_id or info.array_job_id == job_id
    return same_id and (not info.name or info.name == job_name)


def read_marker(t: Transport, run_dir: str, key: str) -> Optional[JobInfo]:
    """<run_dir>/jobs/<key>: lines "start EPOCH RESTARTS NODES" / "end EPOCH RC" (last attempt wins)."""
    try:
        text = t.read_text(f"{run_dir}/jobs/{key}")
    except (FileNotFoundError, OSError):
        return None
    return parse_marker(key, text)


def parse_marker(key: str, text: str) -> Optional[JobInfo]:
    """A marker's text (read_marker; or many at once through Transport.read_dir_files) -> its JobInfo."""
    lines = text.splitlines()
    start = end = None
    rc = None
    restarts = 0
    nodes = None
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("start", "end") and not _is_number(parts[1]):
            continue  # a line cut short or garbled: the others still count
        if len(parts) >= 2 and parts[0] == "start":
            start, end, rc = float(parts[1]), None, None
            restarts = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else restarts
            nodes = parts[3] if len(parts) > 3 else nodes
        elif len(parts) >= 3 and parts[0] == "end" and parts[2].lstrip("-").isdigit():
            end, rc = float(parts[1]), int(parts[2])
    if start is None:
        return None
    job_id, _, task = key.partition("_")
    if end is None:
        state, reason = "UNKNOWN", "left the queue without an end marker (killed, or node lost?)"
    elif rc is not None and rc > 128:
        state, reason, rc = "CANCELLED", f"ended by signal {rc - 128} (scancel, time limit or preemption)", None
    else:
        state, reason = ("COMPLETED", None) if rc == 0 else ("FAILED", "NonZeroExitCode")
    return JobInfo(job_id=key, array_job_id=job_id if task else None, array_task_id=int(task) if task else None,
                   array_tasks_pending=None, name="", state=state, flags=(), reason=reason, exit_code=rc, signal=None,
                   start=start, end=end, elapsed_s=int(end - start) if end is not None else None, nodes=nodes,
                   restarts=restarts, source="marker")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.lower() not in ("nan", "inf", "-inf", "infinity", "-infinity", "+inf")


def aggregate(infos: list[JobInfo], now: float) -> tuple[str, Optional[str], Optional[int], Optional[int],
                                                         Optional[str], int]:
    """One stage from its job records (array tasks included): state, reason, exit, elapsed, nodes, restarts."""
    if not infos:
        return "UNKNOWN", "no record of the job (purged from squeue, no accounting or marker)", None, None, None, 0
    states = [i.state for i in infos]
    if "RUNNING" in states or ("PENDING" in states and "COMPLETED" in states):
        state = "RUNNING"
    elif any(s in ACTIVE for s in states):
        state = next(s for s in states if s in ACTIVE)
    elif all(s == "COMPLETED" for s in states):
        state = "COMPLETED"
    else:
        state = next((s for s in FAILED if s in states), next(s for s in states if s != "COMPLETED"))
    lead = next((i for i in infos if i.state == state), infos[0])
    reason = lead.reason
    codes = [i.exit_code for i in infos if i.exit_code is not None]
    exit_code = next((c for c in codes if c != 0), codes[0] if codes else None)
    if state in ACTIVE and state != "COMPLETING":
        exit_code = None
    elapsed = []
    for i in infos:
        if i.elapsed_s is not None and i.state not in ("RUNNING",):
            elapsed.append(i.elapsed_s)
        elif i.start:
            # The time the job has used, as squeue counts it (src/squeue/print.c job_time_used,
            # slurm-22-05-8-1:925; the same in slurm-23-02-7-1:935): up to its end, or up to now
            # while it runs. An end_time still ahead is not an end but the limit slurmctld expects it
            # to end by: a job just requeued (`scontrol requeue`: PENDING|COMPLETING, shown
            # COMPLETING, with the old start and end_time = start + time limit, seen on the test
            # cluster, Slurm 22.05.8) would otherwise show its whole time limit.
            elapsed.append(max(0, int(min(i.end or now, now) - i.start)))
    nodes = sorted({i.nodes for i in infos if i.nodes})
    restarts = max((i.restarts for i in infos), default=0)
    return state, reason, exit_code, (max(elapsed) if elapsed else None), (",".join(nodes) or None), restarts


# <run_dir>/stage-notes/<stage>.txt: one JSON line a stage leaves for status, {"time", "job",
# "note"} (lingjun_slurm/injob/host/stagenotes.py: the train stage's checkpoint fallback, the requeue
# decision's stop), shown in the stage's REASON while "job" is the stage's current job.
STAGE_NOTES = NOTES_DIR
NOTED_STAGES = ("train",)
EXCLUDED = "nodes/excluded.json"  # lingjun_slurm/injob/host/exclusion.py RECORD
# Notes of stages that have ended, by (path, job, restarts): they cannot change any more, so
# `status --watch` reads each once (over SSH one SFTP read), not on every refresh. A requeue keeps
# the job id and counts a restart: its next end is read afresh.
_ENDED_NOTES: dict[tuple[str, str, int], Optional[str]] = {}


def _read_note(t: Optional[Transport], path: str, job_ids: list[str]) -> Optional[str]:
    from .injob.host.stagenotes import note_of
    from .transport.local import LocalTransport

    try:
        text = (t or LocalTransport()).read_text(path)
    except (OSError, LingjunError):  # the note is extra: never what makes status fail
        return None
    return note_of(text, job_ids)


def _read_excluded(t: Optional[Transport], path: str, job_ids: list[str]) -> Optional[str]:
    """The train job's excluded nodes and why (<run_dir>/nodes/excluded.json, lingjun_slurm/injob/host/exclusion.py)."""
    import json

    from .injob.host.exclusion import describe
    from .transport.local import LocalTransport

    try:
        doc = json.loads((t or LocalTransport()).read_text(path))
    except (OSError, ValueError, LingjunError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        return None
    doc["nodes"] = [n for n in doc["nodes"] if isinstance(n, dict) and isinstance(n.get("node"), str)]
    return describe(doc, job_ids)


def _add_note(st: StageStatus, t: Optional[Transport], run_dir: str) -> None:
    if not run_dir or not st.job_ids or st.state in ("NOT_SUBMITTED",):
        return
    # The other stages leave a note only when they fail (stagenotes.note_failure): read it then.
    if st.name not in NOTED_STAGES and st.state not in FAILED:
        return
    root = run_dir.rstrip('/')
    ended = st.state not in ACTIVE and st.state != "UNKNOWN"
    # A pending job can still carry an exclusion (a requeue away from a bad node); notes need a start.
    sources = [(f"{root}/{EXCLUDED}", _read_excluded)] if st.name in NOTED_STAGES else []
    if st.state != "PENDING":
        sources.insert(0, (f"{root}/{STAGE_NOTES}/{st.name}.txt", _read_note))
    for path, read in sources:
        key = (path, st.job_ids[-1], st.restarts)
        if ended and key in _ENDED_NOTES:
            note = _ENDED_NOTES[key]
        else:
            note = read(t, path, st.job_ids)
            if ended:
                _ENDED_NOTES[key] = note
        if note and note not in (st.reason or ""):
            # The known cause replaces Slurm's generic word; the local executor's reason may begin with it.
            generic = st.reason in (None, "None", "NonZeroExitCode") or note.startswith(st.reason or "")
            st.reason = note if generic else f"{st.reason}; {note}"


def _explain_dependencies(run: RunStatus, manifest: Manifest) -> None:
    """A stage cancelled or stuck because an upstream failed gets the upstream in its reason."""
    by_name = {s.name: s for s in run.stages}
    for rec in manifest.stages:
        st = by_name[rec.name]
        upstream_bad = [f"{d.stage} {by_name[d.stage].state}" for d in rec.depends_on
                        if d.stage in by_name and d.type == "afterok" and by_name[d.stage].state in FAILED]
        stuck = st.state == "PENDING" and (st.reason or "").startswith("DependencyNeverSatisfied")
        orphan = st.state == "CANCELLED" and (upstream_bad or "Dependency" in (st.reason or ""))
        if upstream_bad and (stuck or orphan or st.state in ("CANCELLED", "PENDING", "UNKNOWN")):
            st.reason = f"DependencyNeverSatisfied ({', '.join(upstream_bad)})"
            if st.state == "UNKNOWN":
                st.state = "CANCELLED"


class StatusCollector:
    """Status of several runs with a bounded number of Slurm calls per transport.

    reader: the queue reader to use; by default choose_reader picks squeue/sacct or pyslurm
    on the first refresh (from the newest run's Slurm version) and keeps it.
    """

    def __init__(self, transport: Transport, reader: Optional[QueueReader] = None) -> None:
        self.t = transport
        self.choice: Optional[Choice] = Choice(reader, "given") if reader is not None else None
        # Set by collect when Slurm could not be asked: what it said (the runs show UNKNOWN stages).
        self.unavailable: Optional[SlurmUnavailable] = None
        # Sources that failed without hiding the queue (sacct): said by status --verbose.
        self.notes: list[str] = []

    def reader_for(self, runs: list[Manifest]) -> QueueReader:
        if self.choice is None:
            newest = max(runs, key=lambda m: m.created_at, default=None)
            self.choice = choose_reader(self.t, newest.cluster.slurm_version if newest else "")
        return self.choice.reader

    @property
    def backend(self) -> str:
        """Which reader served the queue, and why (for status --verbose)."""
        if self.choice is None:
            return "no queue read (no Slurm jobs shown)"
        failed = getattr(self.choice.reader, "failed", None)
        return failed or self.choice.reason

    def collect(self, manifests: list[Manifest]) -> list[RunStatus]:
        now = time.time()
        slurm_runs = [m for m in manifests if m.executor == "slurm"]
        records: list[JobInfo] = []
        self.unavailable = None
        if any(st.job_ids for m in slurm_runs for st in m.stages):
            try:
                records = self._records(slurm_runs)
            except SlurmUnavailable as exc:
                self.unavailable = exc
            except SlurmParseError as exc:
                self.unavailable = SlurmUnavailable(self.t.host, f"squeue printed what cannot be read: {exc}")
        by_id: dict[str, list[JobInfo]] = {}
        for i in records:
            by_id.setdefault(i.job_id, []).append(i)
            if i.array_job_id and i.array_job_id != i.job_id:
                by_id.setdefault(i.array_job_id, []).append(i)
        out = []
        for m in manifests:
            if m.executor == "local":
                try:
                    out.append(local_status(m, self.t))
                except (OSError, LingjunError) as exc:  # one run's records: never every run's status
                    run = RunStatus(m.run_id, m.name, m.executor, m.transport.host, run_dir=m.run_dir)
                    run.stages = [StageStatus(rec.name, list(rec.job_ids), "UNKNOWN",
                                              f"cannot read the run's records: {exc}", None, None, None, 0)
                                  for rec in m.stages]
                    out.append(run)
                continue
            run = RunStatus(m.run_id, m.name, m.executor, m.transport.host, run_dir=m.run_dir)
            if self.unavailable is not None:
                run.slurm_error = self.unavailable.message
            for rec in m.stages:
                # By id, not a scan of every record per stage (that was O(stages x records): 2.6 M
                # comparisons for 1,600 jobs, issue 31); an array's tasks all sit under its job id.
                infos = [i for j in rec.job_ids for i in by_id.get(j, ()) if _belongs(i, j, rec.job_name)]
                infos = _dedupe(infos)
                if not rec.job_ids:
                    state, reason = ("NOT_SUBMITTED", "submission failed" if m.state == "failed" else None)
                    run.stages.append(StageStatus(rec.name, [], state, reason, None, None, None, 0))
                    continue
                if self.unavailable is not None:
                    run.stages.append(StageStatus(rec.name, list(rec.job_ids), "UNKNOWN",
                                                  f"Slurm did not answer: {self.unavailable.message}",
                                                  None, None, None, 0))
                    continue
                if not infos or any(i.state == "UNKNOWN" for i in infos):
                    infos = self._markers(m, rec, infos)
                state, reason, code, elapsed, nodes, restarts = aggregate(infos, now)
                run.stages.append(StageStatus(rec.name, list(rec.job_ids), state, reason, code, elapsed, nodes,
                                              restarts))
                _add_note(run.stages[-1], self.t, m.run_dir)
            _explain_dependencies(run, m)
            out.append(run)
        return out

    def _records(self, runs: list[Manifest]) -> list[JobInfo]:
        wanted = {j for m in runs for st in m.stages for j in st.job_ids}
        reader = self.reader_for(runs)
        queue = [i for i in reader.queue() if (i.array_job_id or i.job_id.split("_")[0]) in wanted]
        live_ids = {i.array_job_id or i.job_id for i in queue}
        gone = wanted - live_ids
        # A finished array keeps some tasks in squeue while others aged out: ask sacct for those too.
        finished_arrays = {i.array_job_id for i in queue if i.array_job_id and i.state not in ACTIVE}
        ask = gone | finished_arrays
        extra: list[JobInfo] = []
        if ask and any(m.cluster.accounting for m in runs):
            try:
                acct = reader.accounting(sorted(ask))
            except (CommandError, SlurmParseError) as exc:
                # The queue answered: the jobs sacct should have told about fall back to jobcomp and markers.
                self.notes.append(f"sacct failed, reading jobcomp and markers instead: {exc}")
                acct = None
            if acct is not None:
                extra = [i for i in acct if (i.array_job_id or i.job_id) in ask]
        known = {i.array_job_id or i.job_id for i in extra}
        still = gone - known
        if still:
            for m in runs:
                if m.cluster.jobcomp_type == "filetxt" and m.cluster.jobcomp_loc:
                    size = self.t.size(m.cluster.jobcomp_loc)
                    if size is None:
                        continue
                    # Only the tail: the log grows for ever, and our jobs ended recently.
                    start = max(0, size - JOBCOMP_TAIL)
                    raw = self.t.read_range(m.cluster.jobcomp_loc, start, size - start)
                    text = raw.decode("utf-8", errors="replace")
                    if start:
                        text = text.split("\n", 1)[-1]
                    extra += [i for i in parse_jobcomp_filetxt(text) if (i.array_job_id or i.job_id) in still]
                    break
        return queue + extra

    def _markers(self, m: Manifest, rec: StageRecord, infos: list[JobInfo]) -> list[JobInfo]:
        """The stage's start/end markers: <run_dir>/jobs/<job id> and, for an array, <job id>_<task>
        each, all read in one Transport.read_dir_files call (over SSH one remote command), never one
        read per task: a 1,024-task array has 1,024 of them (issue 31)."""
        job_id = rec.job_ids[0]
        try:
            files = self.t.read_dir_files(f"{m.run_dir}/jobs", prefix=job_id)
        except (OSError, LingjunError):
            return infos
        found = [parse_marker(k, raw.decode("utf-8", errors="replace")) for k, raw in sorted(files.items())
                 if k == job_id or k.startswith(f"{job_id}_")]
        return [x for x in found if x is not None] or infos


def _dedupe(infos: list[JobInfo]) -> list[JobInfo]:
    """squeue beats sacct beats jobcomp for the same job id; pending array records stay."""
    rank = {"squeue": 0, "pyslurm": 0, "sacct": 1, "pyslurm-db": 1, "jobcomp": 2, "marker": 3}
    best: dict[str, JobInfo] = {}
    for i in infos:
        cur = best.get(i.job_id)
        if cur is None or rank.get(i.source, 9) < rank.get(cur.source, 9):
            best[i.job_id] = i
    return list(best.values())


def local_status(m: Manifest, transport: Optional[Transport] = None) -> RunStatus:
    """A local-executor run from its local-state.json; read over the transport when the run lives on another host
    (a run directory adopted with `status DIR --host H`), where its process ids mean nothing here.

    On the host that ran it, the record is checked against the processes: while the runner (its
    pid with the recorded start time and boot id) lives, the record stands. Once it is gone, a job
    recorded RUNNING whose process group still runs is RUNNING (orphaned); one that is gone too is
    FAILED (or what its own end marker in <run_dir>/jobs/ says), never CANCELLED: nobody cancelled
    it. Jobs that never started are CANCELLED ("not started: the local runner is gone")."""
    from .executors.localstate import (ORPHANED, STATE_FILE, BadState, LocalState, job_alive, parse_state,
                                       read_state, runner_alive)

    run = RunStatus(m.run_id, m.name, m.executor, m.transport.host, run_dir=m.run_dir)
    remote = transport is not None and transport.kind != "local"
    try:
        if transport is not None and remote:
            path = f"{m.run_dir.rstrip('/')}/{STATE_FILE}"
            try:
                state: Optional[LocalState] = parse_state(transport.read_text(path), path, m.run_dir)
            except FileNotFoundError:
                state = None
        else:
            state = read_state(m.run_dir)
    except (BadState, UnicodeDecodeError) as exc:
        # One record that is not a record hurts its own run only: UNKNOWN, with what and the fix.
        reason = str(exc) if isinstance(exc, BadState) else f"{STATE_FILE} is not UTF-8 text ({exc})"
        run.stages = [StageStatus(rec.name, list(rec.job_ids), "UNKNOWN", reason, None, None, None, 0)
                      for rec in m.stages]
        return run
    if state is None and m.state != "failed":
        return _without_state(m, run, transport)
    import socket

    # Process ids only mean something on the host that ran the chain; elsewhere trust the record.
    elsewhere = state is not None and (remote or state.host != socket.gethostname())
    alive = state is not None and (elsewhere or runner_alive(state))
    now = time.time()
    files = transport if transport is not None else None
    for rec in m.stages:
        tasks = [t for t in (state.tasks if state else []) if t.stage == rec.name]
        infos = []
        for t in tasks:
            st_name, reason, code, end = t.state, t.reason, t.exit_code, t.end
            if state is not None and st_name in ("RUNNING", "PENDING") and not alive:
                if st_name == "PENDING":
                    st_name, reason = "CANCELLED", "not started: the local runner is gone (killed?)"
                elif job_alive(t, state):
                    reason = ORPHANED.format(run=m.run_id)
                else:
                    st_name, reason, code, end = _gone_job(files, m.run_dir, t.key)
            infos.append(JobInfo(job_id=t.key, array_job_id=t.job_id if t.task is not None else None,
                                 array_task_id=t.task, array_tasks_pending=None, name=rec.job_name, state=st_name,
                                 flags=(), reason=reason, exit_code=code, signal=None, start=t.start,
                                 end=end, elapsed_s=int(end - t.start) if end and t.start else None,
                                 nodes=state.host if (state and t.start) else None, restarts=0, source="local"))
        if not infos:
            if m.state == "failed" and state is None:  # the submission itself failed: nothing will start
                run.stages.append(StageStatus(rec.name, list(rec.job_ids), "NOT_SUBMITTED", "submission failed",
                                              None, None, None, 0))
            else:
                run.stages.append(StageStatus(rec.name, list(rec.job_ids), "PENDING", "not started", None, None,
                                              None, 0))
            continue
        s, reason, code, elapsed, nodes, restarts = aggregate(infos, now)
        run.stages.append(StageStatus(rec.name, list(rec.job_ids), s, reason, code, elapsed, nodes, restarts))
        _add_note(run.stages[-1], transport, m.run_dir)
    _explain_dependencies(run, m)
    return run


LOST_STATE = "local-state.json is missing"


def _without_state(m: Manifest, run: RunStatus, transport: Optional[Transport]) -> RunStatus:
    """A local run whose local-state.json is gone (deleted by hand, or the runner has not written its
    first record yet): each stage from the start/end markers its jobs wrote in <run_dir>/jobs/ (the
    same lines the Slurm path falls back to), so a run that completed still shows COMPLETED, never
    PENDING. A stage without a marker is PENDING only while this run's runner holds the workdir lock
    (it is about to write its record); otherwise UNKNOWN, saying the record is gone."""
    from .transport.local import LocalTransport

    t = transport or LocalTransport()
    try:
        names = t.listdir(f"{m.run_dir.rstrip('/')}/jobs")
    except (OSError, LingjunError):
        names = []
    starting: Optional[bool] = None
    now = time.time()
    for rec in m.stages:
        infos = []
        for job in rec.job_ids:
            for key in sorted(n for n in names if n == job or n.startswith(f"{job}_")):
                info = read_marker(t, m.run_dir, key)
                if info is not None:
                    if info.end is None:
                        info = dataclasses.replace(info, state="UNKNOWN",
                                                   reason=f"{LOST_STATE}; the job started and recorded no end")
                    infos.append(info)
        if infos:
            st, reason, code, elapsed, nodes, restarts = aggregate(infos, now)
            run.stages.append(StageStatus(rec.name, list(rec.job_ids), st, reason, code, elapsed, nodes, restarts))
            continue
        if starting is None:
            starting = transport is None or transport.kind == "local"
            starting = starting and _runner_starting(m)
        if starting:
            run.stages.append(StageStatus(rec.name, list(rec.job_ids), "PENDING", "not started", None, None, None, 0))
        else:
            run.stages.append(StageStatus(rec.name, list(rec.job_ids), "UNKNOWN",
                                          f"{LOST_STATE} and the stage left no marker (never started?)",
                                          None, None, None, 0))
    _explain_dependencies(run, m)
    return run


def _runner_starting(m: Manifest) -> bool:
    """This run's local runner holds its workdir lock and lives: its first record is on its way."""
    from .common.holderlock import judge, read_holder
    from .runs.workdir_lock import lock_path, workdir_of

    holder = read_holder(lock_path(workdir_of(m.run_dir)))
    return holder is not None and holder.run_id == m.run_id and judge(holder).state == "alive"


def _gone_job(t: Optional[Transport], run_dir: str, key: str) -> tuple[str, Optional[str], Optional[int],
                                                                         Optional[float]]:
    """A job recorded RUNNING whose runner and processes are both gone: what its own end marker
    says, else FAILED without an exit code."""
    from .transport.local import LocalTransport

    marker = read_marker(t or LocalTransport(), run_dir, key)
    gone = "the local runner died (killed?)"
    if marker is None or marker.end is None:
        return "FAILED", f"{gone} and the job is gone too; it recorded no end", None, None
    if marker.state == "COMPLETED":
        return "COMPLETED", None, 0, marker.end
    if marker.state == "CANCELLED":  # ended by a signal: the supervisor stops a job whose runner died
        sig = (marker.reason or "").split(" (")[0].replace("ended by ", "") or "a signal"
        return "FAILED", f"{gone}; the job was stopped by {sig}", None, marker.end
    return "FAILED", f"NonZeroExitCode, after {gone}", marker.exit_code, marker.end


def run_banner(run: RunStatus) -> str:
    """What the run's header line says after its name: why its stages' states may be old or
    unknown (STALE: the host is unreachable; UNKNOWN: Slurm did not answer); "" otherwise."""
    if run.stale_as_of is not None:
        seen = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.stale_as_of)) if run.stale_as_of else "never"
        return f"STALE: {run.host} is unreachable; last status seen here at {seen}"
    if run.record_error is not None:
        return f"UNKNOWN: {run.record_error}"
    if run.dir_gone is not None:
        return f"GONE: {run.dir_gone}"
    if run.slurm_error is not None:
        return f"UNKNOWN: Slurm did not answer: {run.slurm_error}"
    return ""


def stage_cells(run: RunStatus, s: StageStatus) -> tuple[str, str, str]:
    """(ELAPSED, EXIT, REASON) of a stage's row, as the plain and the rich table show them; a
    reason that repeats the run's banner points to it."""
    from .common.timefmt import format_time

    elapsed = format_time(s.elapsed_s) if s.elapsed_s is not None else "-"
    code = "-" if s.exit_code is None else str(s.exit_code)
    reason = s.reason or ""
    if run.slurm_error is not None and reason == f"Slurm did not answer: {run.slurm_error}":
        reason = "Slurm did not answer (above)"
    return elapsed, code, reason


def format_table(runs: list[RunStatus]) -> str:
    lines = []
    for run in runs:
        banner = run_banner(run)
        lines.append(f"run {run.run_id}  ({run.executor} on {run.host})" + (f"  {banner}" if banner else ""))
        if not run.stages:  # its record cannot be read (the banner says why): no stage to show
            lines.append("")
            continue
        lines.append(f"  {'STAGE':<16} {'JOB':<12} {'STATE':<12} {'ELAPSED':>10} {'EXIT':>4} {'RESTARTS':>8}  "
                     f"{'NODES':<14} REASON")
        for s in run.stages:
            elapsed, code, reason = stage_cells(run, s)
            lines.append(f"  {s.name:<16} {','.join(s.job_ids) or '-':<12} {s.state:<12} {elapsed:>10} {code:>4} "
                         f"{s.restarts:>8}  {s.nodes or '-':<14} {reason}".rstrip())
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n" if lines else "no runs\n"


def goodput(t: Transport, m: Manifest, now: Optional[float] = None) -> dict[str, Any]:
    """The run's goodput ledger (lingjun_slurm/injob/host/ledger.py build; docs/report.md "Goodput ledger").

    Slurm runs: one batched sacct (ledger.sacct_argv: AllocTRES, ElapsedRaw, Submit, Eligible, Start,
    End of every run of every job of the run, requeues and the jobs a resubmit replaced included)
    when the cluster has accounting; without it (or when sacct fails) the markers, with a note.
    Local runs: the runner's local-state.json. Raises CommandError only when sacct's output cannot be read."""
    import json

    from .injob.host import ledger
    from .transport.local import LocalTransport

    files = t or LocalTransport()
    root = m.run_dir.rstrip("/")
    # Every marker at once (<run_dir>/jobs/<job>[_<task>]): one call whatever the array's size, not
    # one SFTP read per task (Transport.read_dir_files).
    try:
        markers: Optional[dict[str, bytes]] = files.read_dir_files(f"{root}/jobs")
    except (OSError, LingjunError):
        markers = None

    def read(rel: str) -> Optional[str]:
        head, _, name = rel.partition("/")
        if markers is not None and head == "jobs" and name and "/" not in name:
            data = markers.get(name)
            return None if data is None else data.decode("utf-8", errors="replace")
        try:
            return files.read_text(f"{root}/{rel}")
        except (OSError, LingjunError, UnicodeDecodeError):
            return None

    def listdir(rel: str) -> list[str]:
        if markers is not None and rel == "jobs":
            return sorted(markers)
        try:
            return sorted(files.listdir(f"{root}/{rel}"))
        except (OSError, LingjunError):
            return []

    def load(rel: str) -> dict[str, Any]:
        try:
            doc = json.loads(read(rel) or "{}")
        except ValueError:
            return {}
        return doc if isinstance(doc, dict) else {}

    manifest = load("manifest.json") or {"run_id": m.run_id, "executor": m.executor,
                                         "stages": [asdict(s) for s in m.stages]}
    plan = load("plan.json")
    sacct = None
    note = None
    if m.executor == "slurm":
        ids = sorted({j for st in m.stages for j in st.job_ids} |
                     {j for st in m.stages for p in st.previous for j in p.job_ids}, key=lambda j: (len(j), j))
        if ids and m.cluster.accounting:
            from .slurm.client import SACCT_JOBS_BYTES, id_chunks

            rows: Optional[list[dict[str, Any]]] = []
            for chunk in id_chunks(ids, SACCT_JOBS_BYTES):  # one call unless the ids pass the kernel's limit
                result = t.run(ledger.sacct_argv(chunk.split(",")))
                if result.returncode != 0:
                    note = f"sacct failed ({result.stderr.strip()[:200]}): the allocation from the jobs' markers"
                    rows = None
                    break
                try:
                    rows = (rows or []) + ledger.parse_sacct(result.stdout)
                except ledger.LedgerError as exc:
                    note = f"sacct printed what cannot be read ({exc}): the allocation from the jobs' markers"
                    rows = None
                    break
            sacct = rows
        elif ids:
            note = "the cluster has no accounting: the allocation from the jobs' markers and the plan's resources"
    local_state = load("local-state.json") if m.executor == "local" else None
    doc = ledger.build(read, listdir, manifest, plan, sacct, now, local_state)
    if note:
        doc["note"] = f"{note}; {doc['note']}" if doc.get("note") else note
    return doc
