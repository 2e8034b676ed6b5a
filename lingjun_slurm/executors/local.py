"""The local executor: run a rendered chain on this machine, no Slurm.

The stage scripts are the same files sbatch would get (rendered with executor "local":
no container flags, `python3 -m lingjun_slurm.executors.launch` instead of srun). This
runner plays slurmctld's part: it starts each job when its dependencies allow, runs
array tasks in parallel up to the core count, sets the SLURM_* variables a job sees,
writes stdout/stderr to the file the script's `#SBATCH --output` names, and records
every job's state in local-state.json (read by status, logs and cancel).

    python3 -m lingjun_slurm.executors.local RUN_DIR     # what `submit --detach` starts

A failing job stops its dependents (CANCELLED, reason DependencyNeverSatisfied).
SIGTERM or SIGINT (Ctrl-C) cancels the run: running tasks get SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Callable, Optional

from ..runs.logs import array_indices, resolve_pattern, sbatch_option
from ..runs.manifest import Manifest, StageRecord, load_manifest
from ..transport.local import LocalTransport

STATE_FILE = "local-state.json"
STATE_SCHEMA = 1
KILL_GRACE_S = float(os.environ.get("LINGJUN_LOCAL_KILL_GRACE_S", "10"))
DONE = ("COMPLETED", "FAILED", "CANCELLED")


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

    def to_json(self) -> str:
        return json.dumps({"schema": STATE_SCHEMA, **asdict(self)}, indent=1) + "\n"

    @staticmethod
    def from_json(text: str) -> "LocalState":
        data = json.loads(text)
        tasks = [TaskState(**t) for t in data.get("tasks", [])]
        return LocalState(run_id=data["run_id"], runner_pid=data.get("runner_pid"), host=data.get("host", ""),
                          runner_start=data.get("runner_start"), tasks=tasks, finished=bool(data.get("finished")))


def read_state(run_dir: str) -> Optional[LocalState]:
    try:
        return LocalState.from_json(Path(run_dir, STATE_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


class LocalRunner:
    def __init__(self, run_dir: str, echo: Callable[[str], None] = print, max_parallel: Optional[int] = None,
                 keep: frozenset[str] = frozenset()) -> None:
        """keep: stages whose recorded outcome stands (resubmit --from a later stage)."""
        self.keep = keep
        self.run_dir = run_dir
        self.fs = LocalTransport()
        self.manifest: Manifest = load_manifest(self.fs, run_dir)
        # Each stage script is read once: its #SBATCH lines give the log pattern, tasks and CPUs.
        self.scripts = {rec.name: Path(run_dir, rec.script).read_text(encoding="utf-8")
                        for rec in self.manifest.stages}
        self.echo = echo
        self.max_parallel = max_parallel or os.cpu_count() or 1
        self.host = socket.gethostname()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.cancelled = False
        self.state = LocalState(self.manifest.run_id, os.getpid(), self.host, proc_start(os.getpid()), self._tasks())

    # --- setup ------------------------------------------------------------------------------
    def _tasks(self) -> list[TaskState]:
        tasks = []
        previous = read_state(self.run_dir) if self.keep else None
        for rec in self.manifest.stages:
            if previous is not None and rec.name in self.keep:
                tasks += [t for t in previous.tasks if t.stage == rec.name]
                continue
            pattern = sbatch_option(self.scripts[rec.name], "output") or "slurm-%j.out"
            job_id = rec.job_ids[0]
            indices: list[Optional[int]] = list(array_indices(rec.array)) if rec.array else [None]
            for i in indices:
                key = f"{job_id}_{i}" if i is not None else job_id
                tasks.append(TaskState(key=key, stage=rec.name, job_id=job_id, task=i,
                                       log=resolve_pattern(pattern, rec.job_name, job_id, i, self.run_dir)))
        return tasks

    def _save(self) -> None:
        self.fs.write_atomic(f"{self.run_dir}/{STATE_FILE}", self.state.to_json())

    # --- scheduling -------------------------------------------------------------------------
    def _stage_state(self, name: str) -> str:
        states = [t.state for t in self.state.tasks if t.stage == name]
        if all(s == "COMPLETED" for s in states):
            return "COMPLETED"
        if all(s in DONE for s in states):
            return "FAILED" if "FAILED" in states else "CANCELLED"
        return "ACTIVE"

    def _ready(self, rec: StageRecord) -> Optional[bool]:
        """True: may start; False: never can (dependency never satisfied); None: wait."""
        for dep in rec.depends_on:
            up = self._stage_state(dep.stage)
            if up == "ACTIVE":
                return None
            ok = {"afterok": up == "COMPLETED", "afterany": True, "afternotok": up != "COMPLETED"}.get(dep.type, False)
            if not ok:
                return False
        return True

    def _env(self, rec: StageRecord, task: TaskState) -> dict[str, str]:
        text = self.scripts[rec.name]
        ntasks_per_node = sbatch_option(text, "ntasks-per-node") or "1"
        bindir = os.path.dirname(sys.executable)
        # A job sees only the SLURM_* variables of its own (emulated) allocation, never those of
        # an allocation the runner itself may be running in.
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env = {
            **inherited,
            "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
            "LINGJUN_EXECUTOR": "local",
            "LINGJUN_RUN_DIR": self.run_dir,
            "SLURM_JOB_ID": task.job_id, "SLURM_JOBID": task.job_id,
            "SLURM_JOB_NAME": rec.job_name, "SLURM_SUBMIT_DIR": self.run_dir, "SLURM_SUBMIT_HOST": self.host,
            "SLURM_JOB_NODELIST": self.host, "SLURM_NODELIST": self.host,
            "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
            "SLURM_NTASKS": str(rec.ntasks), "SLURM_NPROCS": str(rec.ntasks),
            "SLURM_NTASKS_PER_NODE": ntasks_per_node, "SLURM_RESTART_COUNT": "0",
            "SLURM_CLUSTER_NAME": "local", "SLURM_JOB_PARTITION": "local",
        }
        cpus = sbatch_option(text, "cpus-per-task")
        if cpus:
            env["SLURM_CPUS_PER_TASK"] = cpus
        if task.task is not None and rec.array:
            idx = array_indices(rec.array)
            env.update({"SLURM_ARRAY_JOB_ID": task.job_id, "SLURM_ARRAY_TASK_ID": str(task.task),
                        "SLURM_ARRAY_TASK_COUNT": str(len(idx)), "SLURM_ARRAY_TASK_MIN": str(min(idx)),
                        "SLURM_ARRAY_TASK_MAX": str(max(idx))})
        return env

    def _start(self, rec: StageRecord, task: TaskState) -> None:
        Path(task.log).parent.mkdir(parents=True, exist_ok=True)
        with open(task.log, "ab") as log:
            proc = subprocess.Popen(["bash", f"{self.run_dir}/{rec.script}"], cwd=self.run_dir,
                                    env=self._env(rec, task), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[task.key] = proc
        task.state, task.reason, task.pid, task.start = "RUNNING", None, proc.pid, round(time.time(), 3)
        task.pid_start = proc_start(proc.pid)
        what = f"task {task.task}" if task.task is not None else f"job {task.job_id}"
        self.echo(f"{_clock()} {rec.name:<14} RUNNING    {what} (pid {proc.pid}) -> {task.log}")

    def _finish(self, task: TaskState, rc: int) -> None:
        task.end = round(time.time(), 3)
        task.exit_code = 128 - rc if rc < 0 else rc
        task.pid = None
        if self.cancelled:
            task.state, task.reason = "CANCELLED", "cancelled"
        elif rc == 0:
            task.state = "COMPLETED"
        else:
            task.state, task.reason = "FAILED", "NonZeroExitCode"
        tail = f" (exit {task.exit_code})" if task.state != "COMPLETED" else ""
        what = f"task {task.task}" if task.task is not None else f"job {task.job_id}"
        self.echo(f"{_clock()} {task.stage:<14} {task.state:<10} {what}{tail}")

    def _on_signal(self, signum: int, _frame: Optional[FrameType]) -> None:
        if not self.cancelled:
            self.echo(f"{_clock()} {signal.Signals(signum).name}: cancelling run {self.manifest.run_id}")
        self.cancelled = True

    def _cancel_all(self) -> None:
        """SIGTERM to every running job's process group, SIGKILL after KILL_GRACE_S."""
        for proc in self.procs.values():
            _killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE_S
        while time.monotonic() < deadline and any(group_alive(p.pid) or p.poll() is None for p in self.procs.values()):
            time.sleep(0.05)
        for proc in self.procs.values():
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for key, proc in list(self.procs.items()):
            self._finish(self._task(key), proc.returncode)
            del self.procs[key]
        for t in self.state.tasks:
            if t.state == "PENDING":
                t.state, t.reason = "CANCELLED", "cancelled"

    def _task(self, key: str) -> TaskState:
        return next(t for t in self.state.tasks if t.key == key)

    def run(self) -> int:
        """Run the chain to the end; 0 when every job completed, else 1."""
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._save()
            while not self.cancelled:
                changed = self._reap() | self._schedule()
                if changed:
                    self._save()
                if not self.procs and all(t.state != "PENDING" for t in self.state.tasks):
                    break
                time.sleep(0.05)
            if self.cancelled:
                self._cancel_all()
        except BaseException:
            self.cancelled = True  # never leave jobs running behind a runner that failed
            self._cancel_all()
            raise
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
            self.state.finished = True
            self.state.runner_pid = None
            self._save()
        ok = all(t.state == "COMPLETED" for t in self.state.tasks)
        return 0 if ok else 1

    def _reap(self) -> bool:
        changed = False
        for key, proc in list(self.procs.items()):
            rc = proc.poll()
            if rc is not None:
                # Like Slurm at the end of a job: whatever the script left running in its
                # process group (a task's orphaned children) is stopped.
                _killpg(proc.pid, signal.SIGKILL)
                del self.procs[key]
                self._finish(self._task(key), rc)
                changed = True
        return changed

    def _schedule(self) -> bool:
        changed = False
        for rec in self.manifest.stages:
            pending = [t for t in self.state.tasks if t.stage == rec.name and t.state == "PENDING"]
            if not pending:
                continue
            ready = self._ready(rec)
            if ready is False:
                ups = ", ".join(f"{d.stage} {self._stage_state(d.stage)}" for d in rec.depends_on)
                for t in pending:
                    t.state, t.reason, t.end = "CANCELLED", f"DependencyNeverSatisfied ({ups})", round(time.time(), 3)
                self.echo(f"{_clock()} {rec.name:<14} CANCELLED  dependency never satisfied ({ups})")
                changed = True
                continue
            for t in pending:
                if ready and len(self.procs) < self.max_parallel:
                    self._start(rec, t)
                    changed = True
                elif ready and t.reason != "Resources":
                    t.reason, changed = "Resources", True
        return changed


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _clock() -> str:
    return time.strftime("%H:%M:%S")


def proc_start(pid: Optional[int]) -> Optional[int]:
    """The start time of a process (clock ticks since boot, /proc/PID/stat field 22), or None."""
    if not pid:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19]) if len(fields) > 19 else None


def pid_alive(pid: Optional[int], started: Optional[int]) -> bool:
    """Is pid running, and is it still the process recorded (same start time)?"""
    now = proc_start(pid)
    return now is not None and (started is None or now == started)


def group_alive(pgid: int) -> bool:
    """Does any live (non-zombie) process remain in the process group?"""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def cancel_local(run_dir: str, timeout: float = KILL_GRACE_S + 5) -> list[str]:
    """Stop a local run by its recorded process ids; returns what was signalled."""
    state = read_state(run_dir)
    if state is None:
        return []
    here = socket.gethostname()
    if state.host and state.host != here:
        from ..errors import UsageError

        raise UsageError(f"run {state.run_id} runs on host {state.host}; cancel it there (this is {here})")
    done: list[str] = []
    if pid_alive(state.runner_pid, state.runner_start):
        os.kill(state.runner_pid or 0, signal.SIGTERM)
        done.append(f"runner pid {state.runner_pid}")
        deadline = time.monotonic() + timeout
        while pid_alive(state.runner_pid, state.runner_start) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not pid_alive(state.runner_pid, state.runner_start):
            return done
    # The runner is gone (killed?) or stuck: stop its jobs' process groups directly.
    for task in state.tasks:
        if task.state == "RUNNING" and task.pid and pid_alive(task.pid, task.pid_start):
            _killpg(task.pid, signal.SIGTERM)
            deadline = time.monotonic() + KILL_GRACE_S
            while group_alive(task.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            _killpg(task.pid, signal.SIGKILL)
            done.append(f"{task.stage} pid {task.pid}")
        if task.state in ("RUNNING", "PENDING"):
            task.state, task.reason, task.pid = "CANCELLED", "cancelled", None
    state.runner_pid = None
    state.finished = True
    LocalTransport().write_atomic(f"{run_dir}/{STATE_FILE}", state.to_json())
    return done


def detach(run_dir: str) -> int:
    """Start the runner in its own session, in the background; returns its pid."""
    log = open(f"{run_dir}/local-runner.log", "ab")
    with log:
        proc = subprocess.Popen([sys.executable, "-m", "lingjun_slurm.executors.local", run_dir], cwd=run_dir,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 10
    while read_state(run_dir) is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)  # so a status or cancel right after submit sees the runner
    if proc.poll() is not None and read_state(run_dir) is None:
        from ..errors import LingjunError

        tail = Path(run_dir, "local-runner.log").read_text(errors="replace")[-2000:]
        raise LingjunError(f"the local runner exited at once (status {proc.returncode}):\n{tail}")
    return proc.pid


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python3 -m lingjun_slurm.executors.local RUN_DIR", file=sys.stderr)
        return 2
    return LocalRunner(args[0], echo=lambda line: print(line, flush=True)).run()


if __name__ == "__main__":
    sys.exit(main())
