"""Pure parsers: Slurm CLI output -> JobInfo records (Slurm 22.05 through 25.11).

Nothing here runs a command; callers hand over the text. Five sources
(docs/slurm-versions.md has the per-version details and how they were checked):

* ``squeue --Format=<SQUEUE_FORMAT>`` text with SLURM_TIME_FORMAT=%s (parse_squeue_text): what
  SlurmCLI.queue reads, the same JobInfo as the JSON at 1/30 of its size (issue 31; the
  field-by-field reading of squeue's source is above SQUEUE_TEXT_FIELDS).

* ``squeue --json``: 22.05 (openapi v0.0.37/38: plain numbers, ``job_state`` a string,
  ``exit_code`` the raw wait status), 23.02 (data_parser v0.0.39: numbers wrapped as
  ``{"set", "infinite", "number"}``, ``job_state`` still a string, ``exit_code`` still the
  raw wait status), 23.11 to 25.11 (v0.0.40 to v0.0.44: ``job_state`` a list of base state +
  flags, ``exit_code`` an object ``{"status", "return_code", "signal"}``, times wrapped too).
  22.05 to 24.05.0 ignore -j/-t/-u with --json (fixed in 24.05.1): filter client-side.
* ``sacct --parsable2 --noheader --allocations --format=<SACCT_FIELDS>``: --allocations
  (-X) keeps one line per job (the job's own State/ExitCode); step lines (``123.batch``,
  ``123.extern``, ``123.0``) are skipped anyway. With --duplicates a requeued job appears
  once per run: the records are merged, the last wins and ``restarts`` counts the rest.
  Query with --jobs=...: without it sacct drops jobs cancelled before they were eligible.
  Times must use the default format (leave SLURM_TIME_FORMAT unset or "standard"). The text
  is the same in every version 22.05 to 25.11; this is what the tool asks for.
* ``sacct --json`` (parse_sacct_json; not used by the client, kept for 23.11+ users and
  tested on each version): one record per job run, ``state.current`` a string (v0.0.39) or a
  list (v0.0.40+). v0.0.39 (23.02) loses the exit code of jobs that exited: it prints
  ``{"status": "SUCCESS", "return_code": 0}`` even for ``exit 7``, so such a record gives
  exit code 0 only when the job COMPLETED and None otherwise.
* jobcomp/filetxt log lines (src/plugins/jobcomp/filetxt/jobcomp_filetxt.c). Array tasks
  carry `` ArrayJobId=N ArrayTaskId=M``; an array's never-started remainder is logged as a
  plain ``JobId=<array id>`` line and cannot be told from a plain job. A requeue writes a
  line too: lines are merged per job like sacct --duplicates.

Conventions: a normal exit gives ``(exit_code, 0)``; death by signal gives ``(None, sig)``.
Jobs not finished (pending, running, ...) have no exit code and no end time; jobs not
started have no start time either (Slurm reports estimates there). Local-time strings
("2026-11-29T10:00:00") are read in the local time zone.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

__all__ = [
    "SACCT_FIELDS",
    "SQUEUE_FORMAT",
    "SQUEUE_TEXT_FIELDS",
    "JobInfo",
    "SlurmParseError",
    "decode_wait_status",
    "parse_duration",
    "parse_jobcomp_filetxt",
    "parse_sacct_json",
    "parse_sacct_parsable",
    "parse_squeue_json",
    "parse_squeue_text",
    "parse_state",
]


class SlurmParseError(ValueError):
    """Slurm output that cannot be read at all (unknown state names are not an error)."""


@dataclass(frozen=True)
class JobInfo:
    job_id: str  # "123", "123_4" (array task) or "123_[0-3]" (pending array remainder)
    array_job_id: str | None
    array_task_id: int | None
    array_tasks_pending: str | None  # "0-3", "2,5-7" (throttle "%N" removed)
    name: str
    state: str  # base state, upper case; unknown names are kept as given
    flags: tuple[str, ...]
    reason: str | None
    exit_code: int | None
    signal: int | None
    start: float | None
    end: float | None
    elapsed_s: int | None
    nodes: str | None
    restarts: int
    source: str  # "squeue" | "sacct" | "jobcomp"


# sacct 22.05 --helpformat has all of these; JobName is last so a "|" in a name survives.
SACCT_FIELDS: tuple[str, ...] = (
    "JobID", "JobIDRaw", "State", "ExitCode", "Elapsed", "Start", "End", "NodeList", "Reason", "JobName",
)

BASE_STATES = frozenset({
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
    "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
})
# States in which a job has not started (Slurm's start/end are estimates) ...
NOT_STARTED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
# ... and in which it has not finished (no exit status, end time is the limit).
UNFINISHED = NOT_STARTED | {"RUNNING", "SUSPENDED", "CONFIGURING", "RESIZING"}

_NO_VAL32 = 0xFFFFFFFE
_EMPTY = frozenset({"", "none", "unknown", "n/a", "(null)", "none assigned", "invalid"})
_ARRAY_ID = re.compile(r"^(?P<job>\d+)_(?:(?P<task>\d+)|\[(?P<pending>[^\]]*)\])$")
_DURATION = re.compile(r"^(?:(?P<d>\d+)-)?(?:(?P<h>\d+):)?(?P<m>\d+):(?P<s>\d+)(?:\.\d+)?$")


def decode_wait_status(raw: int) -> tuple[int | None, int | None]:
    """POSIX wait status -> (exit code, signal): 1792 -> (7, 0), 9 -> (None, 9), 139 -> (None, 11)."""
    if raw is None or isinstance(raw, bool) or raw < 0 or raw >= _NO_VAL32:
        return None, None
    low7 = raw & 0x7F
    if low7 == 0:
        return (raw >> 8) & 0xFF, 0
    if low7 == 0x7F:  # stopped, not terminated
        return None, None
    return None, low7


def parse_state(raw: Any) -> tuple[str, tuple[str, ...]]:
    """State as Slurm prints it -> (primary state, extra flags).

    "CANCELLED by 0" -> ("CANCELLED", ()); ["PENDING", "REQUEUED"] -> ("PENDING", ("REQUEUED",)).
    Unknown names are kept (upper-cased). Lists take their first base state as primary.
    """
    if isinstance(raw, (list, tuple)):
        names = [str(x).strip().upper() for x in raw if str(x).strip()]
    elif isinstance(raw, str):
        word = raw.strip().split(" ")[0].rstrip("+") if raw.strip() else ""
        names = [word.upper()] if word else []
    else:
        names = []
    if not names:
        return "UNKNOWN", ()
    primary = next((n for n in names if n in BASE_STATES), names[0])
    return primary, tuple(n for n in names if n != primary)


def parse_duration(text: str) -> int | None:
    """Slurm elapsed time -> seconds: "1-02:03:04", "02:03:04", "03:04"; None when unset."""
    match = _DURATION.match(text.strip())
    if not match:
        return None
    d, h, m, s = (int(match.group(k) or 0) for k in "dhms")
    return ((d * 24 + h) * 60 + m) * 60 + s


def _local_time(text: str) -> float | None:
    value = text.strip()
    if value.lower() in _EMPTY:
        return None
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        raise SlurmParseError(
            f"unreadable Slurm time {value!r} (expected YYYY-MM-DDTHH:MM:SS; "
            "is SLURM_TIME_FORMAT set?)") from None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return None if text.lower() in _EMPTY else text


def _number(value: Any) -> int | None:
    """A JSON number, or a 23.02+ {"set", "infinite", "number"} object, as an int (or None)."""
    if isinstance(value, dict):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _epoch(value: Any) -> float | None:
    number = _number(value)
    return float(number) if number and 0 < number < _NO_VAL32 else None


def _exit_from_json(value: Any) -> tuple[int | None, int | None]:
    if isinstance(value, dict) and ("status" in value or "return_code" in value):
        status = {str(s).upper() for s in value.get("status") or ()}
        signal_id = _number((value.get("signal") or {}).get("id"))
        if status & {"SIGNALED", "CORE_DUMPED"} or (signal_id and not status & {"SUCCESS", "ERROR"}):
            return None, signal_id
        if "PENDING" in status or "INVALID" in status:
            return None, None
        code = _number(value.get("return_code"))
        return (code, 0) if code is not None else (None, None)
    raw = _number(value)  # 22.05 int, 23.02 object: both the raw wait status
    return decode_wait_status(raw) if raw is not None else (None, None)


def _exit_from_text(text: str) -> tuple[int | None, int | None]:
    """sacct/jobcomp "7:0" -> (7, 0); "0:9" -> (None, 9)."""
    code_text, _, sig_text = text.strip().partition(":")
    try:
        code, sig = int(code_text), int(sig_text or 0)
    except ValueError:
        return None, None
    return (code or None, sig) if sig else (code, 0)


def _array_ids(job_id: str) -> tuple[str | None, int | None, str | None]:
    """"8_0" -> ("8", 0, None); "8_[2-5%2]" -> ("8", None, "2-5"); "6" -> (None, None, None)."""
    match = _ARRAY_ID.match(job_id)
    if not match:
        return None, None, None
    if match.group("task") is not None:
        return match.group("job"), int(match.group("task")), None
    return match.group("job"), None, re.sub(r"%\d+$", "", match.group("pending")) or None


def _build(*, job_id: str, array_job_id: str | None, array_task_id: int | None,
           pending: str | None, name: str, state_raw: Any, reason: Any,
           exit_status: tuple[int | None, int | None], start: float | None, end: float | None,
           elapsed_s: int | None, nodes: Any, restarts: int, source: str) -> JobInfo:
    state, flags = parse_state(state_raw)
    if state in UNFINISHED:
        exit_status, end = (None, None), None
    if state in NOT_STARTED:
        start = None
    return JobInfo(
        job_id=job_id, array_job_id=array_job_id, array_task_id=array_task_id,
        array_tasks_pending=pending, name=name, state=state, flags=flags, reason=_text(reason),
        exit_code=exit_status[0], signal=exit_status[1], start=start, end=end, elapsed_s=elapsed_s,
        nodes=_text(nodes), restarts=restarts, source=source)


def _merge_runs(jobs: Iterable[JobInfo]) -> list[JobInfo]:
    """One record per job id, in first-seen order: the last run wins, earlier runs are restarts."""
    merged: dict[str, JobInfo] = {}
    for job in jobs:
        if job.job_id in merged:
            job = replace(job, restarts=max(job.restarts, merged[job.job_id].restarts + 1))
        merged[job.job_id] = job
    return list(merged.values())


# ---------------------------------------------------------------------------- squeue --json


def _json_jobs(text: str, what: str) -> list[Any]:
    """The "jobs" list of a `squeue --json` / `sacct --json` document (errors raised)."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, TypeError) as exc:
        raise SlurmParseError(f"{what} output is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise SlurmParseError(f"{what} output is a {type(doc).__name__}, expected an object")
    jobs = doc.get("jobs")
    errors = doc.get("errors") or []
    if errors and not jobs:
        messages = "; ".join(
            str(e.get("description") or e.get("error") or e) if isinstance(e, dict) else str(e)
            for e in errors)
        raise SlurmParseError(f"{what} reported errors: {messages}")
    if jobs is None:
        raise SlurmParseError(f'{what} output has no "jobs" list')
    if not isinstance(jobs, list):
        raise SlurmParseError(f'{what} "jobs" is a {type(jobs).__name__}, expected a list')
    return jobs


def parse_squeue_json(text: str) -> list[JobInfo]:
    """`squeue --json` (22.05 to 25.11) -> one JobInfo per job record."""
    jobs = _json_jobs(text, "squeue --json")
    return [_squeue_job(record, index) for index, record in enumerate(jobs)]


def _json_array_ids(raw_id: int, array_job: int | None, task: int | None,
                    task_string: str) -> tuple[str, int | None, str | None]:
    """(job id, array task, pending task list) of a JSON job record: "A_T" for one array task,
    "A_[list]" for the still-pending rest of an array, Slurm's own id otherwise."""
    task = task if task is not None and task < _NO_VAL32 else None
    task_string = re.sub(r"%\d+$", "", task_string.strip())
    if array_job is None:
        return str(raw_id), None, None
    if task is not None:
        return f"{array_job}_{task}", task, None
    if task_string.isdigit():
        return f"{array_job}_{int(task_string)}", int(task_string), None
    if task_string:
        return f"{array_job}_[{task_string}]", None, task_string
    return str(raw_id), None, None  # an array record with neither task id nor task list


def _squeue_job(record: Any, index: int) -> JobInfo:
    if not isinstance(record, dict):
        raise SlurmParseError(f"squeue --json jobs[{index}] is a {type(record).__name__}, expected an object")
    raw_id = _number(record.get("job_id"))
    if raw_id is None:
        raise SlurmParseError(f"squeue --json jobs[{index}] has no job_id")
    array_job = _number(record.get("array_job_id")) or None
    job_id, task, pending = _json_array_ids(raw_id, array_job, _number(record.get("array_task_id")),
                                            str(record.get("array_task_string") or ""))
    nodes = record.get("nodes")
    if isinstance(nodes, dict):  # defensive: job_resources-style node object
        nodes = nodes.get("list")
    return _build(
        job_id=job_id, array_job_id=str(array_job) if array_job else None, array_task_id=task,
        pending=pending, name=str(record.get("name") or ""), state_raw=record.get("job_state"),
        reason=record.get("state_reason"), exit_status=_exit_from_json(record.get("exit_code")),
        start=_epoch(record.get("start_time")), end=_epoch(record.get("end_time")), elapsed_s=None,
        nodes=nodes, restarts=_number(record.get("restart_cnt")) or 0, source="squeue")


# ---------------------------------------------------------------------------- squeue text

# `squeue --me --states=all --noheader --Format=<SQUEUE_FORMAT>` with SLURM_TIME_FORMAT=%s: the
# same job records `squeue --json` prints (one line per record slurmctld keeps; without --array a
# pending array remainder stays one record, "A_[list]", as in the JSON), 31 MB -> 0.9 MB at
# 10,000 jobs (issue 31). Read from src/squeue/opts.c and print.c, slurm-22-05-8-1 (the -O names:
# parse_long_format, opts.c:942-1737; 24.05+ the table fmt_data_job, slurm-24-05-8-1 opts.c:621-712,
# the same names, matched case-blind by both):
#  * "Field:|" (_parse_long_token, opts.c:1798): width 0 and suffix "|"; width 0 prints the whole
#    value (_print_str, print.c:306: "%s", no cut). Name is last, width 0 and no suffix, so a "|"
#    in a name survives (split with maxsplit); the fixed fields before it never hold a "|".
#  * ArrayJobID (print.c:483): the array's id for a task or a remainder, else the job's own id.
#    ArrayTaskID (print.c:503): the remainder's task list whole (array_task_str, with "%N"
#    throttle), else the task id, else "N/A". (JobArrayID, print.c:616, cuts the list at
#    FORMAT_STRING_SIZE, 32 bytes, print.h:47, unless SLURM_BITSTR_LEN is set: not used.)
#  * State (print.c:793): job_state_string(), as the 22.05/23.02 JSON's job_state.
#  * exit_code (print.c:1722): 22.05 the raw wait status as %d (NO_VAL prints -2); 23.02+
#    "<exit>:<signal>" and nothing for NO_VAL (slurm-23-02-7-1 print.c:1725-1747).
#  * StartTime/EndTime (print.c:391 _print_time): 0 -> "N/A", else slurm_make_time_str
#    (src/common/parse_time.c:662: 0 or INFINITE -> "Unknown", NO_VAL -> "None", else
#    SLURM_TIME_FORMAT, here "%s": epoch seconds); EndTime "NONE" for an unlimited job still
#    running (print.c:1005).
#  * NodeList (print.c:1045): the job's nodes, hostlist-sorted (slurm_sort_node_list_str).
#  * Reason (print.c:687): state_desc when slurmctld set one, else job_reason_string(); the JSON
#    gives job_reason_string() only (openapi v0.0.38 jobs.c:1002). It goes last but one: the
#    line is split at the first "|" after the fixed fields, so a reason must not hold a "|"
#    (Slurm's reason names never do; a state_desc with "|" would be cut there).
#  * RestartCnt (print.c:2055): restart_cnt as %d.
# --states=all: without it squeue drops jobs that ended (print.c:2953 _filter_job); the 22.05
# JSON ignores the state filter and lists them.
SQUEUE_TEXT_FIELDS: tuple[str, ...] = (
    "ArrayJobID", "ArrayTaskID", "State", "exit_code", "StartTime", "EndTime", "NodeList", "RestartCnt",
    "Reason", "Name",
)
SQUEUE_FORMAT = ",".join(f"{f}:|" for f in SQUEUE_TEXT_FIELDS[:-1]) + f",{SQUEUE_TEXT_FIELDS[-1]}:0"
_FIXED = len(SQUEUE_TEXT_FIELDS) - 2  # the fields before Reason and Name


def _text_epoch(text: str, line: int, field: str) -> float | None:
    value = text.strip()
    if value.isdigit():
        number = int(value)
        return float(number) if 0 < number < _NO_VAL32 else None
    if value.lower() in _EMPTY:
        return None
    raise SlurmParseError(f"squeue line {line} {field}: {value!r} is not epoch seconds "
                          "(SLURM_TIME_FORMAT=%s expected)")


def _text_exit(text: str) -> tuple[int | None, int | None]:
    """22.05 "1792" (raw wait status) or 23.02+ "7:0" -> (exit code, signal)."""
    value = text.strip()
    if ":" in value:
        return _exit_from_text(value)
    try:
        return decode_wait_status(int(value))
    except ValueError:
        return None, None


def parse_squeue_text(text: str) -> list[JobInfo]:
    """`squeue --noheader --Format=<SQUEUE_FORMAT>` (SLURM_TIME_FORMAT=%s) -> one JobInfo per
    record, as parse_squeue_json gives for the same jobs (reason: see the notes above)."""
    jobs: list[JobInfo] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        values = line.split("|", _FIXED)
        if len(values) != _FIXED + 1 or "|" not in values[-1]:
            raise SlurmParseError(
                f"squeue line {number} has {len(values) + (1 if '|' in values[-1] else 0)} fields, expected "
                f"{len(SQUEUE_TEXT_FIELDS)} ({','.join(SQUEUE_TEXT_FIELDS)}): {line[:200]!r}")
        array_job, task_text, state, exit_text, start, end, nodes, restarts = values[:_FIXED]
        reason, name = values[-1].split("|", 1)
        array_job = array_job.strip()
        if not array_job.isdigit():
            raise SlurmParseError(f"squeue line {number} ArrayJobID: {array_job!r} is not a job id")
        task_text = re.sub(r"%\d+$", "", task_text.strip())
        if task_text.isdigit():
            job_id, array_id, task, pending = f"{array_job}_{int(task_text)}", array_job, int(task_text), None
        elif task_text and task_text.lower() not in _EMPTY:
            job_id, array_id, task, pending = f"{array_job}_[{task_text}]", array_job, None, task_text
        else:
            job_id, array_id, task, pending = array_job, None, None, None
        try:
            restart_cnt = int(restarts)
        except ValueError:
            raise SlurmParseError(f"squeue line {number} RestartCnt: {restarts!r} is not a number") from None
        jobs.append(_build(
            job_id=job_id, array_job_id=array_id, array_task_id=task, pending=pending, name=name,
            state_raw=state, reason=reason, exit_status=_text_exit(exit_text),
            start=_text_epoch(start, number, "StartTime"), end=_text_epoch(end, number, "EndTime"),
            elapsed_s=None, nodes=nodes, restarts=max(restart_cnt, 0), source="squeue"))
    return jobs


# ---------------------------------------------------------------------------- sacct


def parse_sacct_parsable(text: str, *, fields: Sequence[str] = SACCT_FIELDS) -> list[JobInfo]:
    """`sacct --parsable2 --noheader --allocations --format=<fields>` -> one JobInfo per job.

    A header line (when --noheader was left out) replaces ``fields``. Step lines are skipped.
    """
    columns = list(fields)
    jobs: list[JobInfo] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if line.split("|")[0] == "JobID" and not jobs:
            columns = line.split("|")
            continue
        last_is_name = columns[-1] == "JobName"
        values = line.split("|", len(columns) - 1) if last_is_name else line.split("|")
        if len(values) != len(columns):
            raise SlurmParseError(
                f"sacct line {number} has {len(values)} fields, expected {len(columns)} "
                f"({','.join(columns)}): {line!r}")
        row = dict(zip(columns, values))
        if "JobID" not in row:
            raise SlurmParseError(f"sacct fields lack JobID: {','.join(columns)}")
        job_id = row["JobID"].strip()
        if "." in job_id or "." in row.get("JobIDRaw", ""):
            continue  # a step: 123.batch, 123.extern, 123.0, 8_1.batch
        array_job, task, pending = _array_ids(job_id)
        jobs.append(_build(
            job_id=job_id if pending is None else f"{array_job}_[{pending}]", array_job_id=array_job,
            array_task_id=task, pending=pending, name=row.get("JobName", ""), state_raw=row.get("State", ""),
            reason=row.get("Reason"), exit_status=_exit_from_text(row.get("ExitCode", "")),
            start=_local_time(row.get("Start", "")), end=_local_time(row.get("End", "")),
            elapsed_s=parse_duration(row.get("Elapsed", "")), nodes=row.get("NodeList"),
            restarts=0, source="sacct"))
    return _merge_runs(jobs)


def _sacct_json_exit(value: Any, state: str) -> tuple[int | None, int | None]:
    """sacct --json exit_code: v0.0.40+ objects as squeue's; v0.0.39's {"status": "SUCCESS", ...}
    string form says only "exited" (return_code is always 0), signals are under signal.signal_id."""
    if isinstance(value, dict) and isinstance(value.get("status"), str):
        status = value["status"].upper()
        if status in ("SIGNALED", "CORE_DUMPED"):
            return None, _number((value.get("signal") or {}).get("signal_id"))
        if status == "SUCCESS":
            return (0, 0) if state == "COMPLETED" else (None, None)
        return None, None
    return _exit_from_json(value)


def parse_sacct_json(text: str) -> list[JobInfo]:
    """`sacct --json` (23.02 to 25.11) -> one JobInfo per job (runs merged as with --duplicates).

    The job record's own state and exit code are used; its steps are ignored.
    """
    jobs: list[JobInfo] = []
    for index, record in enumerate(_json_jobs(text, "sacct --json")):
        if not isinstance(record, dict):
            raise SlurmParseError(f"sacct --json jobs[{index}] is a {type(record).__name__}, expected an object")
        raw_id = _number(record.get("job_id"))
        if raw_id is None:
            raise SlurmParseError(f"sacct --json jobs[{index}] has no job_id")
        array = record.get("array") if isinstance(record.get("array"), dict) else {}
        array_job = _number(array.get("job_id")) or None
        job_id, task, pending = _json_array_ids(raw_id, array_job, _number(array.get("task_id")),
                                                str(array.get("task") or ""))
        state_obj = record.get("state") if isinstance(record.get("state"), dict) else {}
        state_raw = state_obj.get("current")
        times = record.get("time") if isinstance(record.get("time"), dict) else {}
        elapsed = _number(times.get("elapsed"))
        jobs.append(_build(
            job_id=job_id, array_job_id=str(array_job) if array_job else None, array_task_id=task,
            pending=pending, name=str(record.get("name") or ""), state_raw=state_raw,
            reason=state_obj.get("reason"),
            exit_status=_sacct_json_exit(record.get("exit_code"), parse_state(state_raw)[0]),
            start=_epoch(times.get("start")), end=_epoch(times.get("end")), elapsed_s=elapsed,
            nodes=record.get("nodes"), restarts=_number(record.get("restart_cnt")) or 0, source="sacct"))
    return _merge_runs(jobs)


# ---------------------------------------------------------------------------- jobcomp/filetxt

# JOB_FORMAT of jobcomp_filetxt.c: fixed order; Name and WorkDir may hold spaces (and even
# " Key=" text), so they are matched greedily up to the key that must follow them.
_JOBCOMP_LINE = re.compile(
    r"^JobId=(?P<JobId>\d+) UserId=(?P<UserId>.*?) GroupId=(?P<GroupId>.*?) Name=(?P<Name>.*)"
    r" JobState=(?P<JobState>\S+) Partition=(?P<Partition>.*?) TimeLimit=(?P<TimeLimit>\S*)"
    r" StartTime=(?P<StartTime>\S*) EndTime=(?P<EndTime>\S*) NodeList=(?P<NodeList>\S*)"
    r" NodeCnt=(?P<NodeCnt>\d*) ProcCnt=(?P<ProcCnt>\d*) WorkDir=(?P<WorkDir>.*)"
    r" ReservationName=(?P<ReservationName>.*?) Tres=(?P<Tres>.*?) Account=(?P<Account>.*?)"
    r" QOS=(?P<QOS>.*?) WcKey=(?P<WcKey>.*?) Cluster=(?P<Cluster>.*?) SubmitTime=(?P<SubmitTime>\S*)"
    r" EligibleTime=(?P<EligibleTime>\S*)(?: ArrayJobId=(?P<ArrayJobId>\d+) ArrayTaskId=(?P<ArrayTaskId>\d+))?"
    r"(?: HetJobId=(?P<HetJobId>\d+) HetJobOffset=(?P<HetJobOffset>\d+))?"
    r" DerivedExitCode=(?P<DerivedExitCode>\S*) ExitCode=(?P<ExitCode>\S*)\s*$")
_JOBCOMP_KEY = re.compile(r"(?:^|\s)([A-Za-z]+)=")


def _jobcomp_fields(line: str) -> dict[str, str]:
    match = _JOBCOMP_LINE.match(line)
    if match:
        return {k: v for k, v in match.groupdict().items() if v is not None}
    # Another version's field list: split at " Key=" boundaries (values without "Key=").
    keys = list(_JOBCOMP_KEY.finditer(line))
    return {m.group(1): line[m.end():(keys[i + 1].start() if i + 1 < len(keys) else len(line))].strip()
            for i, m in enumerate(keys)}


def parse_jobcomp_filetxt(text: str) -> list[JobInfo]:
    """jobcomp/filetxt log lines -> one JobInfo per job (repeated lines merged, see module doc)."""
    jobs: list[JobInfo] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row = _jobcomp_fields(line.rstrip("\n"))
        if not row.get("JobId", "").isdigit() or "JobState" not in row:
            raise SlurmParseError(f"jobcomp line {number} is not a JobId=... JobState=... record: {line[:120]!r}")
        array_job = row.get("ArrayJobId")
        task = int(row["ArrayTaskId"]) if row.get("ArrayTaskId", "").isdigit() else None
        job_id = f"{array_job}_{task}" if array_job and task is not None else row["JobId"]
        jobs.append(_build(
            job_id=job_id, array_job_id=array_job if task is not None else None, array_task_id=task,
            pending=None, name=row.get("Name", ""), state_raw=row["JobState"], reason=None,
            exit_status=_exit_from_text(row.get("ExitCode", "")),
            start=_local_time(row.get("StartTime", "")), end=_local_time(row.get("EndTime", "")),
            elapsed_s=None, nodes=row.get("NodeList"), restarts=0, source="jobcomp"))
    return _merge_runs(jobs)
