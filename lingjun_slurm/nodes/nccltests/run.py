"""Submit nccl-tests jobs and wait for them, gently: one `squeue` per poll for every job.

Jobs that left the queue are looked up with at most one `sacct` per poll (all of them at once,
when the cluster has accounting), then in the start/end markers each script writes to
<dir>/jobs/<job id>. Never one Slurm call per job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from lingjun_slurm.common.errors import CommandError, LingjunError, SubmitError
from lingjun_slurm.common import interrupts
from lingjun_slurm.common.interrupts import signals_interrupt
from lingjun_slurm.slurm.client import SlurmCLI
# The Slurm-without-a-configuration hint and its detection live with the Slurm client (one wording for
# submit, doctor and nccl-test); re-exported here for nccl-test's callers.
from lingjun_slurm.slurm.client import unconfigured_hint
from lingjun_slurm.slurm.parse import JobInfo
from lingjun_slurm.status import ACTIVE
from lingjun_slurm.status import read_marker
from lingjun_slurm.transport.base import Transport

# Pending reasons that only an admin (or a change of the request) resolves: worth saying so,
# since the command would otherwise wait silently (a drained node in --nodelist, typically).
STUCK_REASONS = ("ReqNodeNotAvail", "PartitionNodeLimit", "PartitionConfig", "PartitionDown", "PartitionInactive",
                 "BadConstraints", "InvalidAccount", "InvalidQOS", "AssocGrp", "AssocMax", "QOSMax", "Nodes_required")
GONE_POLLS = 3  # polls a job may be missing everywhere before it is reported UNKNOWN
QUEUE_FAILURES = 5  # consecutive failed squeue polls (a busy slurmctld times out) before giving up


@dataclass(frozen=True)
class Job:
    job_id: str
    label: str  # what the job tests, for messages: "nccl-test", "round 1: node1+node2"
    directory: str  # where sbatch ran: the script's outputs and its jobs/ markers


@dataclass(frozen=True)
class JobEnd:
    job_id: str
    state: str  # COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, ..., UNKNOWN
    exit_code: Optional[int]
    reason: Optional[str]
    nodes: Optional[str]

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED" and not self.exit_code


def submit_all(sched: SlurmCLI, scripts: list[tuple[str, str, str]]) -> list[Job]:
    """sbatch each (script, directory, label); all or nothing: a failure cancels what was queued."""
    jobs: list[Job] = []
    try:
        with signals_interrupt():
            for script, directory, label in scripts:
                jobs.append(Job(sched.submit(script, cwd=directory, hold=False), label, directory))
    except BaseException as exc:
        if jobs:
            try:
                sched.cancel([j.job_id for j in jobs])
            except CommandError:
                pass
        if isinstance(exc, CommandError):
            done = f"\ncancelled the {len(jobs)} job(s) already queued ({', '.join(j.job_id for j in jobs)})" \
                if jobs else ""
            raise SubmitError(f"{exc}{done}{unconfigured_hint(exc)}") from None
        raise
    return jobs


def _end(info: JobInfo) -> JobEnd:
    return JobEnd(info.job_id, info.state, info.exit_code, info.reason, info.nodes)


class Waiter:
    """Polls until every job has ended; `progress` receives one line per state change."""

    def __init__(self, transport: Transport, sched: SlurmCLI, *, poll_s: float = 5.0,
                 progress: Optional[Callable[[str], None]] = None) -> None:
        self.t = transport
        self.sched = sched
        self.poll_s = poll_s
        self.progress = progress or (lambda line: None)
        self.accounting: Optional[bool] = None  # unknown until the first sacct answers

    def wait(self, jobs: list[Job]) -> dict[str, JobEnd]:
        """Until every job has ended. Ctrl-C, SIGTERM or SIGHUP (a closed terminal) cancels them, and
        so does an error that ends the waiting (Slurm unreachable for QUEUE_FAILURES polls): no job
        is left running unwatched."""
        ids = [j.job_id for j in jobs]
        signame = None
        try:
            with signals_interrupt():
                return self._wait(jobs)
        except KeyboardInterrupt as exc:
            signame = interrupts.signal_name(exc)
            why = f"interrupted ({interrupts.describe(signame)})"
        except LingjunError as exc:
            why = str(exc)
        try:
            self.sched.cancel(ids)
        except CommandError as exc:
            message = f"{why}; cancelling job(s) {', '.join(ids)} failed: {exc}"
        else:
            message = f"{why}: cancelled job(s) {', '.join(ids)}"
        if signame is not None:  # Ctrl-C exits 130, SIGTERM/SIGHUP 1 (interrupts.py)
            raise interrupts.Interrupted(message, signame) from None
        raise LingjunError(message) from None

    def _queue(self, failures: list[int]) -> Optional[list[JobInfo]]:
        """One squeue; a failure (a busy slurmctld times out) is retried at the next poll (None now),
        until QUEUE_FAILURES in a row."""
        try:
            result = self.sched.queue()
        except CommandError as exc:
            failures[0] += 1
            if failures[0] >= QUEUE_FAILURES:
                raise LingjunError(f"squeue failed {failures[0]} polls in a row: {exc}") from None
            self.progress(f"{exc} (retrying at the next poll)".replace("\n", " "))
            return None
        failures[0] = 0
        return result

    def _wait(self, jobs: list[Job]) -> dict[str, JobEnd]:
        pending = {j.job_id: j for j in jobs}
        ended: dict[str, JobEnd] = {}
        shown: dict[str, str] = {}
        missing: dict[str, int] = {}
        failures = [0]
        while True:
            snapshot = self._queue(failures)
            if snapshot is None:
                time.sleep(self.poll_s)
                continue
            queue = {i.job_id: i for i in snapshot if i.job_id in pending}
            gone = []
            for job_id, job in list(pending.items()):
                info = queue.get(job_id)
                if info is None:
                    gone.append(job)
                    continue
                state = info.state + (f" ({info.reason})" if info.reason and info.state == "PENDING" else "")
                if shown.get(job_id) != state:
                    shown[job_id] = state
                    self.progress(f"job {job_id} ({job.label}): {state}")
                    if info.state == "PENDING" and info.reason and info.reason.startswith(STUCK_REASONS):
                        self.progress(f"job {job_id} may wait until an admin acts ({info.reason}: a drained or down "
                                      "node, or a request the partition cannot meet); check `sinfo -R`, "
                                      "Ctrl-C cancels the test")
                if info.state not in ACTIVE:
                    ended[job_id] = _end(info)
                    del pending[job_id]
            for end in self._resolve(gone):
                ended[end.job_id] = end
                self.progress(f"job {end.job_id} ({pending[end.job_id].label}): {end.state}")
                del pending[end.job_id]
            for job in gone:
                if job.job_id in pending:
                    missing[job.job_id] = missing.get(job.job_id, 0) + 1
                    if missing[job.job_id] >= GONE_POLLS:
                        ended[job.job_id] = JobEnd(job.job_id, "UNKNOWN", None,
                                                   "left the queue; no accounting record or end marker", None)
                        del pending[job.job_id]
            if not pending:
                return ended
            time.sleep(self.poll_s)

    def _resolve(self, gone: list[Job]) -> list[JobEnd]:
        """Jobs no longer in squeue: one sacct for all of them, then their end markers."""
        if not gone:
            return []
        found: dict[str, JobEnd] = {}
        if self.accounting is not False:
            try:
                records = self.sched.accounting([j.job_id for j in gone])
                self.accounting = records is not None
            except CommandError as exc:  # slurmdbd busy or down: the end markers still answer
                self.progress(f"{exc} (reading the end markers instead)".replace("\n", " "))
                records = None
            for info in records or []:
                if info.state not in ACTIVE and info.job_id in {j.job_id for j in gone}:
                    found[info.job_id] = _end(info)
        for job in gone:
            if job.job_id not in found:
                info = read_marker(self.t, job.directory, job.job_id)
                if info is not None and info.end is not None:
                    found[job.job_id] = _end(info)
        return list(found.values())
