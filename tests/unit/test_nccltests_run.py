"""Submitting and waiting: all-or-nothing sbatch, one squeue per poll, one sacct for jobs that left."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Sequence

import pytest

from lingjun_slurm.common.errors import CommandError, LingjunError, SubmitError
from lingjun_slurm.nodes.nccltests.run import Job, Waiter, submit_all
from lingjun_slurm.slurm.client import SlurmCLI
from lingjun_slurm.slurm.parse import JobInfo
from lingjun_slurm.transport import LocalTransport


def info(job_id: str, state: str, exit_code: Optional[int] = None, reason: Optional[str] = None,
         source: str = "squeue") -> JobInfo:
    return JobInfo(job_id=job_id, array_job_id=None, array_task_id=None, array_tasks_pending=None, name="nccl",
                   state=state, flags=(), reason=reason, exit_code=exit_code, signal=None, start=None, end=None,
                   elapsed_s=None, nodes="n[1-2]", restarts=0, source=source)


class FakeSlurm(SlurmCLI):
    """Scripted answers: queue() returns the next snapshot; calls are counted."""

    def __init__(self, snapshots: list[list[JobInfo]], acct: Optional[list[JobInfo]] = None,
                 fail_submit_at: Optional[int] = None) -> None:
        super().__init__(LocalTransport())
        self.snapshots = snapshots
        self.acct = acct
        self.calls: list[str] = []
        self.fail_submit_at = fail_submit_at
        self.cancelled: list[str] = []

    def queue(self) -> list[JobInfo]:
        self.calls.append("squeue")
        return self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]

    def accounting(self, job_ids: Iterable[str]) -> Optional[list[JobInfo]]:
        self.calls.append("sacct " + ",".join(job_ids))
        return self.acct

    def submit(self, script: str, *, cwd: str, hold: bool = True, dependency: Optional[str] = None,
               extra: Sequence[str] = ()) -> str:
        self.calls.append(f"sbatch {script}")
        n = sum(1 for c in self.calls if c.startswith("sbatch"))
        if n == self.fail_submit_at:
            raise CommandError(["sbatch", script], 1, "", "sbatch: error: Invalid partition name specified")
        return str(100 + n)

    def cancel(self, job_ids: Iterable[str], *, signal: Optional[str] = None) -> None:
        self.cancelled += list(job_ids)


def test_one_squeue_per_poll_for_any_number_of_jobs(tmp_path: Path) -> None:
    jobs = [Job(str(100 + i), f"pair {i}", str(tmp_path)) for i in range(6)]
    running = [info(j.job_id, "RUNNING") for j in jobs]
    done = [info(j.job_id, "COMPLETED", 0) for j in jobs]
    sched = FakeSlurm([[info(j.job_id, "PENDING", reason="Resources") for j in jobs], running, running, done])
    lines: list[str] = []
    ends = Waiter(LocalTransport(), sched, poll_s=0.0, progress=lines.append).wait(jobs)
    assert sched.calls == ["squeue"] * 4  # four polls, six jobs: never one call per job
    assert all(e.state == "COMPLETED" and e.ok for e in ends.values()) and len(ends) == 6
    assert "job 100 (pair 0): PENDING (Resources)" in lines and lines.count("job 100 (pair 0): RUNNING") == 1


def test_jobs_that_left_the_queue_are_read_with_one_sacct(tmp_path: Path) -> None:
    jobs = [Job("7", "a", str(tmp_path)), Job("8", "b", str(tmp_path))]
    sched = FakeSlurm([[info("7", "RUNNING"), info("8", "RUNNING")], []],
                      acct=[info("7", "COMPLETED", 0, source="sacct"), info("8", "FAILED", 3, source="sacct")])
    ends = Waiter(LocalTransport(), sched, poll_s=0.0).wait(jobs)
    assert sched.calls == ["squeue", "squeue", "sacct 7,8"]
    assert ends["8"].state == "FAILED" and ends["8"].exit_code == 3 and not ends["8"].ok


def test_without_accounting_the_end_markers_are_read(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "9").write_text("start 100 0 n[1-2]\nend 130 2\n")
    jobs = [Job("9", "a", str(tmp_path)), Job("10", "b", str(tmp_path))]
    sched = FakeSlurm([[]], acct=None)
    ends = Waiter(LocalTransport(), sched, poll_s=0.0).wait(jobs)
    assert ends["9"].state == "FAILED" and ends["9"].exit_code == 2
    assert ends["10"].state == "UNKNOWN"  # no record anywhere after 3 polls
    assert sched.calls.count("squeue") == 3 and sched.calls.count("sacct 9,10") == 1  # sacct: asked once


def test_submission_is_all_or_nothing(tmp_path: Path) -> None:
    sched = FakeSlurm([[]], fail_submit_at=3)
    scripts = [("s.sbatch", str(tmp_path), f"pair {i}") for i in range(4)]
    with pytest.raises(SubmitError) as err:
        submit_all(sched, scripts)
    assert "Invalid partition" in str(err.value)
    assert str(err.value).endswith("\ncancelled the 2 job(s) already queued (101, 102)")
    assert sched.cancelled == ["101", "102"]
    ok = FakeSlurm([[]])
    assert [j.job_id for j in submit_all(ok, scripts)] == ["101", "102", "103", "104"]


def test_ctrl_c_while_waiting_cancels_the_jobs(tmp_path: Path) -> None:
    class Interrupting(FakeSlurm):
        def queue(self) -> list[JobInfo]:
            raise KeyboardInterrupt

    sched = Interrupting([[]])
    with pytest.raises(LingjunError, match="interrupted \\(Ctrl-C\\): cancelled job\\(s\\) 5, 6") as info:
        Waiter(LocalTransport(), sched, poll_s=0.0).wait([Job("5", "a", str(tmp_path)), Job("6", "b", str(tmp_path))])
    assert sched.cancelled == ["5", "6"]
    assert info.value.exit_code == 130  # Ctrl-C, as every command (interrupts.py)


def test_a_transient_squeue_failure_is_retried(tmp_path: Path) -> None:
    class Flaky(FakeSlurm):
        def queue(self) -> list[JobInfo]:
            self.calls.append("squeue")
            if len(self.calls) == 1:  # a busy slurmctld: "Socket timed out on send/recv operation"
                raise CommandError(["squeue"], 1, "", "slurm_load_jobs error: Socket timed out")
            return [info("5", "COMPLETED", 0)]

    lines: list[str] = []
    sched = Flaky([[]])
    ends = Waiter(LocalTransport(), sched, poll_s=0.0, progress=lines.append).wait([Job("5", "a", str(tmp_path))])
    assert ends["5"].ok and sched.calls == ["squeue", "squeue"] and not sched.cancelled
    assert any("Socket timed out" in line and "retrying" in line for line in lines)


def test_slurm_unreachable_ends_the_wait_and_cancels_the_jobs(tmp_path: Path) -> None:
    class Down(FakeSlurm):
        def queue(self) -> list[JobInfo]:
            self.calls.append("squeue")
            raise CommandError(["squeue"], 1, "", "slurm_load_jobs error: Unable to contact slurm controller")

    sched = Down([[]])
    with pytest.raises(LingjunError, match="(?s)squeue failed 5 polls in a row.*cancelled job\\(s\\) 5, 6"):
        Waiter(LocalTransport(), sched, poll_s=0.0).wait([Job("5", "a", str(tmp_path)), Job("6", "b", str(tmp_path))])
    assert sched.calls == ["squeue"] * 5 and sched.cancelled == ["5", "6"]


def test_a_failing_sacct_falls_back_to_the_end_markers(tmp_path: Path) -> None:
    class BrokenAcct(FakeSlurm):
        def accounting(self, job_ids: Iterable[str]) -> Optional[list[JobInfo]]:
            self.calls.append("sacct")
            raise CommandError(["sacct"], 1, "", "sacct: error: slurmdbd: Connection refused")

    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "9").write_text("start 100 0 n[1-2]\nend 130 0\n")
    sched = BrokenAcct([[]])
    jobs = [Job("9", "a", str(tmp_path)), Job("10", "b", str(tmp_path))]
    ends = Waiter(LocalTransport(), sched, poll_s=0.0).wait(jobs)
    assert ends["9"].ok and ends["10"].state == "UNKNOWN" and not sched.cancelled  # never an endless loop


def test_sigterm_while_waiting_cancels_the_jobs(tmp_path: Path) -> None:
    import os
    import signal

    class Terminated(FakeSlurm):
        def queue(self) -> list[JobInfo]:
            self.calls.append("squeue")
            if len(self.calls) > 1:
                raise AssertionError("SIGTERM did not end the wait")
            os.kill(os.getpid(), signal.SIGTERM)  # `kill`, or a batch system ending the command
            return [info("5", "RUNNING")]

    got: list[int] = []

    def mine(signum: int, frame: object) -> None:
        got.append(signum)

    before = signal.signal(signal.SIGTERM, mine)  # never kill pytest
    try:
        sched = Terminated([[]])
        with pytest.raises(LingjunError, match="interrupted \\(SIGTERM\\): cancelled job\\(s\\) 5") as info:
            Waiter(LocalTransport(), sched, poll_s=0.0).wait([Job("5", "a", str(tmp_path))])
        assert sched.cancelled == ["5"] and not got and info.value.exit_code == 1
        assert signal.getsignal(signal.SIGTERM) is mine  # restored after the wait
    finally:
        signal.signal(signal.SIGTERM, before)


def test_sigterm_while_submitting_cancels_what_was_queued(tmp_path: Path) -> None:
    import os
    import signal

    class TerminatedAtSecond(FakeSlurm):
        def submit(self, script: str, *, cwd: str, hold: bool = True, dependency: Optional[str] = None,
                   extra: Sequence[str] = ()) -> str:
            if sum(1 for c in self.calls if c.startswith("sbatch")) == 2:  # before the third sbatch
                os.kill(os.getpid(), signal.SIGTERM)
            return super().submit(script, cwd=cwd, hold=hold, dependency=dependency, extra=extra)

    got: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))  # never kill pytest
    try:
        sched = TerminatedAtSecond([[]])
        with pytest.raises(KeyboardInterrupt):  # the CLI ends it: one line, exit 1 (SIGTERM; 130 for Ctrl-C)
            submit_all(sched, [("s.sbatch", str(tmp_path), f"pair {i}") for i in range(4)])
        assert sched.cancelled == ["101", "102"] and not got
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_job_stuck_on_a_drained_node_is_called_out_once(tmp_path: Path) -> None:
    """A pending reason only an admin resolves (ReqNodeNotAvail: a drained node in --nodelist) is
    said once, with what to check; an ordinary wait for resources is not."""
    jobs = [Job("101", "round 1: node1+node2", str(tmp_path)), Job("102", "round 1: node3+node4", str(tmp_path))]
    stuck = [info("101", "PENDING", reason="ReqNodeNotAvail, UnavailableNodes:node2"),
             info("102", "PENDING", reason="Resources")]
    done = [info("101", "COMPLETED", 0), info("102", "COMPLETED", 0)]
    sched = FakeSlurm([stuck, stuck, done])
    lines: list[str] = []
    Waiter(LocalTransport(), sched, poll_s=0, progress=lines.append).wait(jobs)
    hints = [line for line in lines if "may wait until an admin acts" in line]
    assert len(hints) == 1 and hints[0].startswith("job 101") and "sinfo -R" in hints[0]
