"""Parsers of Slurm CLI output, tested on recorded outputs (tests/fixtures/slurm/SOURCES.md)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterator

import pytest

from lingjun_slurm.slurm.parse import (
    SACCT_FIELDS,
    JobInfo,
    SlurmParseError,
    decode_wait_status,
    parse_duration,
    parse_jobcomp_filetxt,
    parse_sacct_parsable,
    parse_squeue_json,
    parse_state,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"

# 2026-11-29T21:39:13 UTC, the start of job 1 on the recording cluster (time zone UTC).
T_PROBE = 1795988353.0


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def by_id(jobs: list[JobInfo]) -> dict[str, JobInfo]:
    ids = [j.job_id for j in jobs]
    assert len(ids) == len(set(ids)), ids
    return {j.job_id: j for j in jobs}


def _set_tz(value: str | None) -> None:
    if value is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = value
    time.tzset()


@pytest.fixture
def utc() -> Iterator[None]:
    """The 22.05 recordings' local times are UTC; read them in UTC whatever this host uses."""
    old = os.environ.get("TZ")
    _set_tz("UTC")
    yield
    _set_tz(old)


# ---------------------------------------------------------------------------- helpers


def test_decode_wait_status() -> None:
    """POSIX wait status: exit in bits 8-15, terminating signal in bits 0-6 (jobcomp_filetxt.c)."""
    assert decode_wait_status(0) == (0, 0)
    assert decode_wait_status(1792) == (7, 0)
    assert decode_wait_status(768) == (3, 0)
    assert decode_wait_status(9) == (None, 9)
    assert decode_wait_status(15) == (None, 15)
    assert decode_wait_status(139) == (None, 11)  # SIGSEGV with core dump bit
    assert decode_wait_status(0x137F) == (None, None)  # stopped, not terminated
    assert decode_wait_status(0xFFFFFFFE) == (None, None)  # NO_VAL: not finished
    assert decode_wait_status(-1) == (None, None)


def test_parse_duration() -> None:
    assert parse_duration("1-02:03:04") == 93784
    assert parse_duration("02:03:04") == 7384
    assert parse_duration("03:04") == 184
    assert parse_duration("00:00:00") == 0
    assert parse_duration("12-00:00:00") == 12 * 86400
    for unset in ("", "INVALID", "UNLIMITED", "Partition_Limit"):
        assert parse_duration(unset) is None


def test_parse_state() -> None:
    assert parse_state("CANCELLED by 0") == ("CANCELLED", ())
    assert parse_state("CANCELLED by 30154") == ("CANCELLED", ())
    assert parse_state("CANCELLED+") == ("CANCELLED", ())
    assert parse_state("completed") == ("COMPLETED", ())
    assert parse_state(["PENDING", "REQUEUED"]) == ("PENDING", ("REQUEUED",))
    assert parse_state(["COMPLETING", "FAILED"]) == ("FAILED", ("COMPLETING",))
    assert parse_state(["FROBNICATING", "X"]) == ("FROBNICATING", ("X",))
    assert parse_state("COMPLETING") == ("COMPLETING", ())  # 22.05 prints the flag alone
    assert parse_state(None) == ("UNKNOWN", ())
    assert parse_state([]) == ("UNKNOWN", ())


# ---------------------------------------------------------------------------- squeue --json


def test_squeue_2205_mixed(utc: None) -> None:
    """squeue_22.05_mixed.json: `squeue --json` of Slurm 22.05.8 recorded on this machine.

    Raw wait statuses (1792 -> exit 7, 9 -> SIGKILL), a requeued job running again
    (restart_cnt 1), array tasks and pending array remainders, dependency and hold reasons.
    """
    jobs = by_id(parse_squeue_json(read("squeue_22.05_mixed.json")))
    assert list(jobs) == ["1", "2", "3", "4", "5", "6", "7", "8_0", "9_[1,3,5-7]", "10", "11",
                          "8_1", "8_[2-5]"]
    assert all(j.source == "squeue" and j.elapsed_s is None for j in jobs.values())

    probe = jobs["1"]
    assert (probe.state, probe.exit_code, probe.signal, probe.reason) == ("COMPLETED", 0, 0, None)
    assert (probe.start, probe.end, probe.nodes, probe.name) == (T_PROBE, T_PROBE, "node1", "probe")

    fail7 = jobs["4"]
    assert (fail7.state, fail7.exit_code, fail7.signal, fail7.reason) == ("FAILED", 7, 0, "NonZeroExitCode")
    sigkill = jobs["5"]
    assert (sigkill.state, sigkill.exit_code, sigkill.signal) == ("FAILED", None, 9)
    assert sigkill.reason == "JobLaunchFailure"
    timeout = jobs["2"]
    assert (timeout.state, timeout.exit_code, timeout.signal, timeout.reason) == ("TIMEOUT", None, 15, "TimeLimit")
    assert timeout.end - timeout.start == 81
    cancelled = jobs["7"]
    assert (cancelled.state, cancelled.exit_code, cancelled.signal) == ("CANCELLED", None, 15)

    requeued = jobs["6"]
    assert (requeued.state, requeued.restarts, requeued.nodes) == ("RUNNING", 1, "node2")
    assert requeued.start == 1795988377.0
    assert requeued.end is None and requeued.exit_code is None and requeued.signal is None

    task0 = jobs["8_0"]
    assert (task0.array_job_id, task0.array_task_id, task0.array_tasks_pending) == ("8", 0, None)
    assert (task0.state, task0.nodes, task0.name) == ("RUNNING", "node2", "arr")
    assert jobs["8_1"].array_task_id == 1

    remainder = jobs["8_[2-5]"]  # squeue shows 8_[2-5%2]: the throttle is dropped
    assert (remainder.array_job_id, remainder.array_task_id, remainder.array_tasks_pending) == ("8", None, "2-5")
    assert (remainder.state, remainder.reason) == ("PENDING", "JobArrayTaskLimit")
    assert remainder.start is None and remainder.end is None and remainder.nodes is None
    listed = jobs["9_[1,3,5-7]"]
    assert (listed.array_job_id, listed.array_tasks_pending, listed.reason) == ("9", "1,3,5-7", "Resources")
    assert listed.start is None  # Slurm's expected start time is an estimate, not a start

    assert (jobs["10"].state, jobs["10"].reason) == ("PENDING", "DependencyNeverSatisfied")
    assert (jobs["11"].state, jobs["11"].reason) == ("PENDING", "JobHeldUser")
    assert all(j.exit_code is None for j in jobs.values() if j.state in ("PENDING", "RUNNING"))


def test_squeue_2205_final(utc: None) -> None:
    """squeue_22.05_final.json: the same 22.05.8 cluster after every job ended.

    Cancelled pending array remainders keep their task lists; a name with spaces survives.
    """
    jobs = by_id(parse_squeue_json(read("squeue_22.05_final.json")))
    assert jobs["6"].state == "CANCELLED" and jobs["6"].restarts == 1 and jobs["6"].end == 1795988504.0
    assert (jobs["8_[2-5]"].state, jobs["8_[2-5]"].array_tasks_pending) == ("CANCELLED", "2-5")
    assert (jobs["9_[1,3,5-7]"].state, jobs["9_[1,3,5-7]"].nodes) == ("CANCELLED", None)
    assert (jobs["11"].state, jobs["11"].exit_code) == ("COMPLETED", 0)
    spaced = jobs["14"]
    assert (spaced.name, spaced.state, spaced.exit_code, spaced.signal) == ("spaced name JobState=X", "FAILED", 3, 0)


def test_squeue_2302_number_objects() -> None:
    """squeue_23.02_rivosinc.json: real `squeue --json` of Slurm 23.02.4 (data_parser v0.0.39).

    Source: github.com/rivosinc/prometheus-slurm-exporter fixtures/squeue_dataparser.json.
    Numbers are {"set", "infinite", "number"} objects; job_state is still a string.
    """
    jobs = by_id(parse_squeue_json(read("squeue_23.02_rivosinc.json")))
    assert list(jobs) == ["52173767_1470", "52173767_2000", "52409104_1078"]
    held = jobs["52173767_1470"]
    assert (held.array_job_id, held.array_task_id, held.array_tasks_pending) == ("52173767", 1470, None)
    assert (held.state, held.reason, held.restarts) == ("PENDING", "JobHeldUser", 1)
    assert held.start is None and held.end is None and held.nodes is None
    done = jobs["52173767_2000"]
    assert (done.state, done.exit_code, done.signal, done.reason) == ("COMPLETED", 0, 0, None)
    assert (done.start, done.end, done.nodes) == (1694675238.0, 1694675491.0, "cs66")
    assert done.name == "id_3508:dtu_rng_regress:sim"


def test_squeue_pending_array_object_form() -> None:
    """squeue_mixed_rivosinc_out.json: job 2 is a 23.02+ pending array remainder.

    Source: github.com/rivosinc/prometheus-slurm-exporter exporter/fixtures/squeue_out.json
    (job 1 there is a 21.08.5 record: plain numbers, array_task_id null).
    """
    first, second = parse_squeue_json(read("squeue_mixed_rivosinc_out.json"))
    assert (first.job_id, first.array_job_id, first.state, first.nodes) == ("26515966", None, "RUNNING", "cs75")
    assert first.start == 1684114921.0 and first.end is None
    assert second.job_id == "58948420_[1-10]"
    assert (second.array_job_id, second.array_task_id, second.array_tasks_pending) == ("58948420", None, "1-10")
    assert (second.state, second.reason, second.name) == ("PENDING", "Dependency", "some job name")


def test_squeue_2311_failed_exit_object() -> None:
    """squeue_23.11_slurmweb_failed.json: Slurm 23.11.10, data_parser v0.0.40 (job_state list).

    Source: github.com/rackslab/Slurm-web slurmweb/tests/assets/slurmrestd/23.11/slurm-job-failed.json.
    exit_code is {"status": ["ERROR"], "return_code": {"number": 1}, ...}.
    """
    (job,) = parse_squeue_json(read("squeue_23.11_slurmweb_failed.json"))
    assert (job.job_id, job.array_job_id, job.array_task_id, job.name) == ("1717", None, None, "wrap")
    assert (job.state, job.flags, job.reason) == ("FAILED", (), "NonZeroExitCode")
    assert (job.exit_code, job.signal) == (1, 0)
    assert (job.start, job.end, job.nodes, job.restarts) == (1732137243.0, 1732137603.0, "cn4", 0)


def test_squeue_2311_pending_and_state_flags() -> None:
    """squeue_23.11_slurmweb_pending.json: Slurm 23.11.10 pending job (Slurm-web 23.11/slurm-job-pending.json).

    The same record with job_state ["PENDING", "REQUEUED"] (the 23.11+ flag list) and with an
    unknown state name, to check flags and that unknown names are kept.
    """
    text = read("squeue_23.11_slurmweb_pending.json")
    (job,) = parse_squeue_json(text)
    assert (job.job_id, job.state, job.flags, job.reason) == ("671", "PENDING", (), "Priority")
    assert job.start is None and job.end is None and job.exit_code is None and job.nodes is None

    doc = json.loads(text)
    doc["jobs"][0]["job_state"] = ["PENDING", "REQUEUED"]
    doc["jobs"].append(dict(doc["jobs"][0], job_id=672, job_state=["BRAND_NEW_STATE", "COMPLETING"]))
    requeued, unknown = parse_squeue_json(json.dumps(doc))
    assert (requeued.state, requeued.flags) == ("PENDING", ("REQUEUED",))
    assert (unknown.job_id, unknown.state, unknown.flags) == ("672", "BRAND_NEW_STATE", ("COMPLETING",))


def test_squeue_2405_timeout_signal() -> None:
    """squeue_24.05_slurmweb_timeout.json: Slurm 24.05.3 (data_parser v0.0.40), TIMEOUT by SIGTERM.

    Source: github.com/rackslab/Slurm-web slurmweb/tests/assets/slurmrestd/24.05/slurm-job-timeout.json
    (allocated_nodes shortened to one entry). exit_code status SIGNALED, signal.id 15.
    """
    (job,) = parse_squeue_json(read("squeue_24.05_slurmweb_timeout.json"))
    assert (job.job_id, job.state, job.reason) == ("599930", "TIMEOUT", "TimeLimit")
    assert (job.exit_code, job.signal) == (None, 15)
    assert (job.start, job.end, job.nodes) == (1732195249.0, 1732195871.0, "cn[642-722,765-770]")


def test_squeue_2405_v0039_pending() -> None:
    """squeue_24.05_slurmweb_pending_v0.0.39.json: Slurm 24.05.3 answering with data_parser v0.0.39.

    Source: github.com/rackslab/Slurm-web slurmweb/tests/assets/slurmrestd/24.05/slurm-job-pending.json.
    start_time is the scheduler's estimate (1727362137) and must not become a start.
    """
    (job,) = parse_squeue_json(read("squeue_24.05_slurmweb_pending_v0.0.39.json"))
    assert (job.job_id, job.state, job.reason, job.name) == ("102", "PENDING", "Resources", "wrap")
    assert job.start is None and job.end is None and job.exit_code is None and job.nodes is None


def test_squeue_2411_running() -> None:
    """squeue_24.11_slurminal_running.json: real `squeue --json` of Slurm 24.11.6 (data_parser v0.0.42).

    Source: github.com/ivolabbe/slurminal tests/fixtures/squeue.json (one job kept). job_resources
    is the 24.05+ nested form; the top-level "nodes" is still a string.
    """
    (job,) = parse_squeue_json(read("squeue_24.11_slurminal_running.json"))
    assert (job.job_id, job.name, job.state, job.flags, job.reason) == ("9687331", "lrd_r120", "RUNNING", (), None)
    assert (job.start, job.end, job.exit_code, job.signal) == (1771073145.0, None, None, None)
    assert (job.nodes, job.restarts, job.array_job_id) == ("dave104", 0, None)


def test_squeue_malformed() -> None:
    with pytest.raises(SlurmParseError, match="not valid JSON"):
        parse_squeue_json('{"jobs": [')
    with pytest.raises(SlurmParseError, match="not valid JSON"):
        parse_squeue_json("")
    with pytest.raises(ValueError, match='no "jobs"'):
        parse_squeue_json('{"meta": {}}')
    with pytest.raises(SlurmParseError, match="expected an object"):
        parse_squeue_json("[]")
    with pytest.raises(SlurmParseError, match=r"jobs\[0\] has no job_id"):
        parse_squeue_json('{"jobs": [{"name": "x"}]}')
    with pytest.raises(SlurmParseError, match="Invalid job id specified"):
        parse_squeue_json('{"jobs": [], "errors": [{"description": "Invalid job id specified", "error_number": 2017}]}')
    assert parse_squeue_json('{"jobs": [], "errors": []}') == []


# ---------------------------------------------------------------------------- sacct


def test_sacct_fields_exist_in_2205() -> None:
    """SACCT_FIELDS are all in `sacct --helpformat` of Slurm 22.05.8 (recorded on this machine)."""
    helpformat_2205 = {
        "JobID", "JobIDRaw", "JobName", "State", "ExitCode", "DerivedExitCode", "Elapsed", "ElapsedRaw",
        "Start", "End", "Submit", "NodeList", "Reason", "Partition", "Timelimit",
    }
    assert set(SACCT_FIELDS) <= helpformat_2205
    assert SACCT_FIELDS[-1] == "JobName"


def test_sacct_2205_allocations(utc: None) -> None:
    """sacct_22.05_allocations.txt: `sacct -X -D --parsable2 --noheader` of Slurm 22.05.8 (this machine).

    "CANCELLED by 0", ExitCode 7:0 and 0:9, array tasks and remainders, never-started jobs
    (Start "None", NodeList "None assigned"), and job 6 listed twice (-D): REQUEUED, then CANCELLED.
    """
    jobs = by_id(parse_sacct_parsable(read("sacct_22.05_allocations.txt")))
    assert list(jobs) == ["1", "2", "3", "4", "5", "6", "7", "10", "11", "8_0", "8_1", "8_[2-5]",
                          "9_[1,3,5-7]", "14"]
    assert all(j.source == "sacct" for j in jobs.values())
    probe = jobs["1"]
    assert (probe.state, probe.exit_code, probe.signal, probe.start, probe.end) == ("COMPLETED", 0, 0, T_PROBE, T_PROBE)
    assert (probe.elapsed_s, probe.nodes, probe.reason, probe.name) == (0, "node1", None, "probe")
    assert (jobs["4"].exit_code, jobs["4"].signal) == (7, 0)
    assert (jobs["5"].state, jobs["5"].exit_code, jobs["5"].signal) == ("FAILED", None, 9)
    assert (jobs["2"].state, jobs["2"].elapsed_s) == ("TIMEOUT", 81)
    assert (jobs["7"].state, jobs["7"].flags, jobs["7"].elapsed_s) == ("CANCELLED", (), 15)

    requeued = jobs["6"]  # the last run wins; the earlier REQUEUED record is a restart
    assert (requeued.state, requeued.restarts, requeued.reason, requeued.elapsed_s) == ("CANCELLED", 1, "BeginTime", 127)
    assert requeued.start == 1795988377.0  # 21:39:37, the second run

    assert (jobs["8_0"].array_job_id, jobs["8_0"].array_task_id, jobs["8_0"].elapsed_s) == ("8", 0, 141)
    remainder = jobs["8_[2-5]"]
    assert (remainder.array_job_id, remainder.array_task_id, remainder.array_tasks_pending) == ("8", None, "2-5")
    assert (remainder.state, remainder.reason, remainder.start, remainder.nodes) == ("CANCELLED", "JobArrayTaskLimit", None, None)
    assert remainder.end == 1795988503.0
    assert jobs["9_[1,3,5-7]"].array_tasks_pending == "1,3,5-7"
    assert (jobs["10"].reason, jobs["10"].start) == ("Dependency", None)
    assert (jobs["14"].name, jobs["14"].exit_code) == ("spaced name JobState=X", 3)


def test_sacct_2205_steps_are_skipped(utc: None) -> None:
    """sacct_22.05_steps.txt: the same 22.05.8 query without -X: .batch lines must be ignored."""
    text = read("sacct_22.05_steps.txt")
    assert ".batch|" in text
    jobs = by_id(parse_sacct_parsable(text))
    assert len(jobs) == 14 and not any("." in job_id for job_id in jobs)
    # Without -D only the last run of job 6 is listed: no restart is visible.
    assert (jobs["6"].state, jobs["6"].restarts) == ("CANCELLED", 0)
    assert (jobs["2"].state, jobs["2"].signal) == ("TIMEOUT", 0)  # the job line, not 2.batch's 0:15


def test_sacct_2205_active(utc: None) -> None:
    """sacct_22.05_active.txt: Slurm 22.05.8, a running job, a held job and a held array 17_[0-3]."""
    running, held, array = parse_sacct_parsable(read("sacct_22.05_active.txt"))
    assert (running.job_id, running.state, running.elapsed_s, running.nodes) == ("15", "RUNNING", 4, "node1")
    assert running.start == 1795988552.0 and running.end is None and running.exit_code is None
    assert (held.state, held.start, held.end, held.nodes) == ("PENDING", None, None, None)
    assert (array.job_id, array.array_job_id, array.array_task_id, array.array_tasks_pending) == ("17_[0-3]", "17", None, "0-3")


def test_sacct_edge_cases(utc: None) -> None:
    """Hand-made lines in the recorded format: header, pipes in names, long elapsed, errors."""
    header = "|".join(SACCT_FIELDS)
    text = "\n".join([
        header,
        "123_[0-3%1]|123|PENDING|0:0|00:00:00|Unknown|Unknown|None assigned|Dependency|a|b",
        "124|124|CANCELLED by 1000|0:15|1-02:03:04|2026-11-28T08:00:00|2026-11-29T10:03:04|node[1-2]|None|x",
        "125|125|OUT_OF_MEMORY|0:125|00:10|2026-11-29T10:00:00|2026-11-29T10:00:10|node3|None|oom",
        "126|126|WEIRD_FUTURE_STATE|0:0|00:00:01|2026-11-29T10:00:00|2026-11-29T10:00:01|node3|None|w",
        "",
    ])
    pending, cancelled, oom, weird = parse_sacct_parsable(text)
    assert (pending.job_id, pending.array_tasks_pending, pending.name, pending.reason) == ("123_[0-3]", "0-3", "a|b", "Dependency")
    assert (cancelled.state, cancelled.exit_code, cancelled.signal, cancelled.elapsed_s) == ("CANCELLED", None, 15, 93784)
    assert cancelled.nodes == "node[1-2]" and cancelled.end - cancelled.start == 93784
    assert (oom.state, oom.elapsed_s, oom.signal) == ("OUT_OF_MEMORY", 10, 125)
    assert (weird.state, weird.exit_code, weird.end) == ("WEIRD_FUTURE_STATE", 0, weird.start + 1)

    with pytest.raises(SlurmParseError, match="has 3 fields"):
        parse_sacct_parsable("1|COMPLETED|0:0\n", fields=("JobID", "State", "ExitCode", "Start"))
    with pytest.raises(SlurmParseError, match="SLURM_TIME_FORMAT"):
        parse_sacct_parsable("1|1|COMPLETED|0:0|00:00:01|yesterday|Unknown|n1|None|x\n")
    assert parse_sacct_parsable("") == []


def test_local_time_is_local() -> None:
    """Slurm prints local time: the same string means an earlier instant 8 hours east of UTC."""
    line = "1|1|COMPLETED|0:0|00:00:00|2026-11-29T21:39:13|2026-11-29T21:39:13|node1|None|probe\n"
    old = os.environ.get("TZ")
    try:
        _set_tz("XST-8")  # POSIX form of UTC+8, needs no tz database
        (job,) = parse_sacct_parsable(line)
    finally:
        _set_tz(old)
    assert job.start == T_PROBE - 8 * 3600


# ---------------------------------------------------------------------------- jobcomp/filetxt


def test_jobcomp_2205(utc: None) -> None:
    """jobcomp_22.05_filetxt.log: the jobcomp/filetxt log of the 22.05.8 cluster on this machine.

    Array tasks carry ArrayJobId/ArrayTaskId (JobId is the task's own id 12/13); the requeue of
    job 6 wrote an extra JobState=PENDING line; a name and a WorkDir contain spaces and " JobState=".
    """
    jobs = by_id(parse_jobcomp_filetxt(read("jobcomp_22.05_filetxt.log")))
    assert set(jobs) == {"1", "2", "3", "4", "5", "6", "7", "8", "8_0", "8_1", "9", "10", "11", "14"}
    assert all(j.source == "jobcomp" and j.reason is None and j.elapsed_s is None for j in jobs.values())
    probe = jobs["1"]
    assert (probe.state, probe.exit_code, probe.signal, probe.start, probe.end, probe.nodes) == (
        "COMPLETED", 0, 0, T_PROBE, T_PROBE, "node1")
    assert (jobs["4"].state, jobs["4"].exit_code, jobs["4"].signal) == ("FAILED", 7, 0)
    assert (jobs["5"].exit_code, jobs["5"].signal) == (None, 9)
    assert (jobs["2"].state, jobs["2"].end - jobs["2"].start) == ("TIMEOUT", 81)
    assert (jobs["6"].state, jobs["6"].restarts, jobs["6"].start) == ("CANCELLED", 1, 1795988377.0)
    task = jobs["8_1"]
    assert (task.array_job_id, task.array_task_id, task.nodes, task.name) == ("8", 1, "node1", "arr")
    # The never-started remainder of array 8 is a plain "JobId=8" line: nothing marks it as an array.
    assert (jobs["8"].array_job_id, jobs["8"].state, jobs["8"].nodes) == (None, "CANCELLED", None)
    spaced = jobs["14"]
    assert (spaced.name, spaced.state, spaced.exit_code) == ("spaced name JobState=X", "FAILED", 3)


def test_jobcomp_requeue_line_alone(utc: None) -> None:
    """The first line written for job 6 at its requeue (22.05.8 log): PENDING, not started."""
    line = next(l for l in read("jobcomp_22.05_filetxt.log").splitlines() if l.startswith("JobId=6 "))
    assert "JobState=PENDING" in line
    (job,) = parse_jobcomp_filetxt(line)
    assert (job.state, job.start, job.end, job.exit_code, job.nodes) == ("PENDING", None, None, None, "node1")


def test_jobcomp_other_layouts(utc: None) -> None:
    """Het-job fields, an unknown extra key and a missing one fall back to key splitting."""
    het = ("JobId=30 UserId=u(1) GroupId=g(1) Name=het JobState=COMPLETED Partition=p TimeLimit=5 "
           "StartTime=2026-11-29T10:00:00 EndTime=2026-11-29T10:00:05 NodeList=n1 NodeCnt=1 ProcCnt=1 "
           "WorkDir=/w ReservationName= Tres=cpu=1 Account= QOS=normal WcKey= Cluster=c "
           "SubmitTime=2026-11-29T10:00:00 EligibleTime=2026-11-29T10:00:00 HetJobId=30 HetJobOffset=0 "
           "DerivedExitCode=0:0 ExitCode=0:0 \n")
    newer = ("JobId=31 UserId=u(1) GroupId=g(1) Name=n JobState=NODE_FAIL Partition=p "
             "StartTime=2026-11-29T10:00:00 EndTime=Unknown NodeList=n2 Comment=some text "
             "ExitCode=0:0\n")
    first, second = parse_jobcomp_filetxt(het + newer)
    assert (first.job_id, first.state, first.end - first.start, first.exit_code) == ("30", "COMPLETED", 5, 0)
    assert (second.job_id, second.state, second.nodes, second.end) == ("31", "NODE_FAIL", "n2", None)
    with pytest.raises(SlurmParseError, match="jobcomp line 1"):
        parse_jobcomp_filetxt("this is not a jobcomp record\n")
