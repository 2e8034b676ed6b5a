"""The local executor's record of a run (<run_dir>/local-state.json) and whether the processes it
names still live: what the runner (executors/local.py) writes and status, cancel and the workdir
lock (runs/workdir_lock.py) read. Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..common.errors import LingjunError

STATE_FILE = "local-state.json"
STATE_SCHEMA = 1
ORPHANED = "orphaned: the local runner is gone but the job still runs; `lingjun-slurm cancel {run}` stops it"


@dataclass
class TaskState:
    key: str            # "3" or "1_0" (array job 1, task 0)
    stage: str
    job_id: str
    task: Optional[int]
    state: str = "PENDING"
    reason: Optional[str] = "Dependency"
    pid: Optional[int] = None
    pid_start: Optional[int] = None  # /proc start time of pid: a recycled pid never matches
    start: Optional[float] = None
    end: Optional[float] = None
    exit_code: Optional[int] = None
    log: str = ""


@dataclass
class LocalState:
    run_id: str
    runner_pid: Optional[int]
    host: str
    runner_start: Optional[int] = None
    tasks: list[TaskState] = field(default_factory=list)
    finished: bool = False
    boot_id: str = ""             # pids and start times only mean something within this boot
    error: Optional[str] = None   # why the runner stopped the run itself (a full disk)

    def to_json(self) -> str:
        return json.dumps({"schema": STATE_SCHEMA, **asdict(self)}, indent=1) + "\n"

    @staticmethod
    def from_json(text: str) -> "LocalState":
        """The record in text; BadState (what is wrong with it, in words) when it is not one: empty,
        cut short, not JSON, or not of the shape to_json writes (checked field by field, so a
        hand-edited or foreign file never reaches status as a TypeError)."""
        if not text.strip():
            raise BadState("is empty")
        try:
            data = json.loads(text)
        except ValueError as exc:
            # Cut short (a write that never ended: to_json's text ends with its closing brace).
            cut = text.lstrip().startswith(("{", "[")) and not text.rstrip().endswith(("}", "]"))
            raise BadState(f"is {'truncated' if cut else 'not valid JSON'} ({exc})") from None
        if not isinstance(data, dict):
            raise BadState(f"is {_kind(data)}, not a JSON object")
        _need(data, "run_id", str)
        for key in ("runner_pid", "runner_start"):
            _need(data, key, int, optional=True)
        _need(data, "host", str, optional=True)
        _need(data, "boot_id", str, optional=True)
        _need(data, "error", str, optional=True)
        rows = data.get("tasks", [])
        if not isinstance(rows, list):
            raise BadState(f"field tasks is {_kind(rows)}, not a list")
        tasks = []
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise BadState(f"tasks[{i}] is {_kind(row)}, not an object")
            for key in ("key", "stage", "job_id", "state"):
                _need(row, key, str, where=f"tasks[{i}].")
            for key in ("task", "pid", "pid_start", "exit_code"):
                _need(row, key, int, where=f"tasks[{i}].", optional=True)
            for key in ("start", "end"):
                _need(row, key, (int, float), where=f"tasks[{i}].", optional=True)
            for key in ("reason", "log"):
                _need(row, key, str, where=f"tasks[{i}].", optional=True)
            tasks.append(TaskState(**{k: v for k, v in row.items() if k in TaskState.__dataclass_fields__}))
        return LocalState(run_id=data["run_id"], runner_pid=data.get("runner_pid"), host=data.get("host") or "",
                          runner_start=data.get("runner_start"), tasks=tasks, finished=bool(data.get("finished")),
                          boot_id=str(data.get("boot_id") or ""), error=data.get("error"))


class BadState(LingjunError):
    """local-state.json exists but is not a record (read_state names the file and the fix)."""


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "an empty list" if not value else "a list"
    if value is None:
        return "null"
    return {dict: "an object", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__)


def _need(row: dict[str, Any], key: str, kind: Any, where: str = "", optional: bool = False) -> None:
    value = row.get(key)
    if value is None and optional:
        return
    if key not in row:
        raise BadState(f"field {where}{key} is missing")
    if isinstance(value, bool) or not isinstance(value, kind):
        want = {str: "a string", int: "a number"}.get(kind, "a number")  # type: ignore[call-overload]
        raise BadState(f"field {where}{key} is {_kind(value)}, not {want}")


FIX = "remove it (`rm {path}`) to let status judge the run from its markers, or `lingjun-slurm forget {run}`"


def read_state(run_dir: str) -> Optional[LocalState]:
    """The run's record; None when there is none; BadState, naming the file, what is wrong and the
    fix, when it is not a record (status shows that run UNKNOWN with it, every other run as ever)."""
    path = Path(run_dir, STATE_FILE)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise bad_state(str(path), run_dir, f"is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise bad_state(str(path), run_dir, f"cannot be read ({exc.strerror or exc})") from None
    return parse_state(text, str(path), run_dir)


def parse_state(text: str, path: str, run_dir: str) -> LocalState:
    try:
        return LocalState.from_json(text)
    except BadState as exc:
        raise bad_state(path, run_dir, str(exc)) from None


def bad_state(path: str, run_dir: str, what: str) -> BadState:
    run = os.path.basename(run_dir.rstrip("/")) or "RUN"
    return BadState(f"{STATE_FILE} {what}: {FIX.format(path=path, run=run)}")


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def proc_start(pid: Optional[int]) -> Optional[int]:
    """The start time of a live process (clock ticks since boot, /proc/PID/stat field 22), or None
    (no such process, or a zombie: it has exited)."""
    if not pid:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields and fields[0] in ("Z", "X"):
        return None
    return int(fields[19]) if len(fields) > 19 else None


def pid_alive(pid: Optional[int], started: Optional[int]) -> bool:
    """Is pid running, and is it still the process recorded (same start time)?"""
    now = proc_start(pid)
    return now is not None and (started is None or now == started)


def group_members(pgid: int, exclude: int = 0) -> list[int]:
    """Live (non-zombie) processes of a process group, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == exclude:
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def group_alive(pgid: int) -> bool:
    """Does any live (non-zombie) process remain in the process group?"""
    if not Path("/proc").is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    return bool(group_members(pgid))


def same_boot(state: LocalState) -> bool:
    return not state.boot_id or state.boot_id == boot_id()


def runner_alive(state: LocalState) -> bool:
    """The recorded runner process is running (same pid, start time and boot)."""
    return not state.finished and same_boot(state) and pid_alive(state.runner_pid, state.runner_start)


def job_alive(task: TaskState, state: LocalState) -> bool:
    """Does the job's process group still run? Its leader (the supervisor) is the recorded pid with
    its start time; once the leader is gone its pid cannot be reused while members of its group
    live (the kernel keeps a pid that is some group's id), so a group without a process of that
    pid is still the job's own."""
    if not task.pid or not same_boot(state):
        return False
    start = proc_start(task.pid)
    if start is not None:
        return task.pid_start is None or start == task.pid_start
    return group_alive(task.pid)


def live_orphans(run_dir: str) -> list[tuple[str, int]]:
    """(stage, pid) of jobs that run although the run's runner is gone (on this host). A record
    that cannot be read names no process: none is found (the lock then goes by the holder's pid)."""
    try:
        state = read_state(run_dir)
    except BadState:
        return []
    if state is None or state.host != socket.gethostname() or runner_alive(state):
        return []
    return [(t.stage, t.pid) for t in state.tasks if t.state == "RUNNING" and t.pid and job_alive(t, state)]
