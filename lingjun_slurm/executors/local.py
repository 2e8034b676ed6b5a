"""The local executor: run a rendered chain on this machine, no Slurm.

The stage scripts are the same files sbatch would get (rendered with executor "local":
no container flags, `python3 -m lingjun_slurm.executors.launch` instead of srun). This
runner plays slurmctld's part: it starts each job when its dependencies allow, runs
array tasks in parallel up to the core count, sets the SLURM_* variables a job sees,
writes stdout/stderr to the file the script's `#SBATCH --output` names, and records
every job's state in local-state.json (read by status, logs and cancel).

    python3 -m lingjun_slurm.executors.local RUN_DIR     # what `submit --detach` starts

A failing job stops its dependents (CANCELLED, reason DependencyNeverSatisfied).
SIGTERM, SIGINT (Ctrl-C) or SIGHUP (a closed terminal) cancels the run: running tasks get SIGTERM,
then SIGKILL. Every job runs under a supervisor (supervise.py) in its own process group, and that
group is stopped when the runner dies, even by SIGKILL. A full disk (ENOSPC, EDQUOT) ends a job, or
the runner itself when it cannot write its state, as FAILED "no space left on <mount>"; a reserve
file beside the state keeps room for that last record. The runner holds the workdir lock
(runs/workdir_lock.py) while the chain runs.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Callable, Optional

from ..common.atomicfile import atomic_write
from ..common.diskspace import NO_SPACE, full_filesystem, mount_point, no_space_in_log, no_space_reason
from ..runs.logs import array_indices, array_limit, resolve_pattern, sbatch_option
from ..runs.manifest import Manifest, StageRecord, load_manifest
from ..transport.local import LocalTransport
from .childwait import wait_any
from .localstate import (STATE_FILE, LocalState, TaskState, boot_id, group_alive, job_alive,  # noqa: F401
                         proc_start, read_state, runner_alive)

# Room kept on the run directory's filesystem for the runner's last record when the disk fills up.
RESERVE_FILE = ".local-state.reserve"
RESERVE_BYTES = 256 << 10
KILL_GRACE_S = float(os.environ.get("LINGJUN_LOCAL_KILL_GRACE_S", "10"))
DONE = ("COMPLETED", "FAILED", "CANCELLED")
# The most processes one job may start here: nodes x tasks_per_node tasks all run on this machine
# (executors/launch.py starts one process per task), so more than a few per CPU only time-slices
# (and gloo's collectives time out); 128,000 of them would exhaust the process table. `submit
# --force` runs a larger job anyway.
TASKS_PER_CPU = 4
# What the runner sets in each job's environment over the user's own (less any SLURM_*): see _env.
JOB_ENV = ("PATH", "LINGJUN_EXECUTOR", "LINGJUN_RUN_DIR", "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME",
           "SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NUM_NODES",
           "SLURM_NNODES", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_RESTART_COUNT",
           "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION", "SLURM_CPUS_PER_TASK", "SLURM_ARRAY_JOB_ID",
           "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX")


def max_tasks() -> int:
    """The most tasks one local job may run: TASKS_PER_CPU per CPU of this machine."""
    return TASKS_PER_CPU * (os.cpu_count() or 1)


def describe(run_dir: str, stages: list[tuple[str, str, list[str], int, Optional[str]]]) -> list[str]:
    """What the runner will do for stages (name, script, after, tasks, array), in order: the lines
    `submit --executor local --dry-run` prints."""
    bindir = os.path.dirname(sys.executable)
    lines = [f"  each job: {sys.executable} -m lingjun_slurm.executors.supervise -- bash {run_dir}/SCRIPT "
             f"(cwd {run_dir}, its own process group; output to the script's #SBATCH --output file)",
             f"  environment: yours without SLURM_*, plus PATH={bindir}:$PATH, LINGJUN_EXECUTOR=local, "
             f"LINGJUN_RUN_DIR={run_dir} and the SLURM_* a job of one node on {socket.gethostname()} sees "
             "(SLURM_JOB_ID, SLURM_NTASKS, SLURM_ARRAY_TASK_ID, ...)",
             f"  jobs start when their dependencies completed; array tasks run {os.cpu_count() or 1} at a time "
             "(the CPU count), or fewer where the array's %M (data.max_running) says so; a failed job cancels "
             "the jobs after it"]
    for i, (name, script, after, tasks, array) in enumerate(stages, start=1):
        deps = f"after {', '.join(after)}" if after else "first"
        how = f"{tasks} tasks (python3 -m lingjun_slurm.executors.launch)" if tasks > 1 else "1 task"
        lines.append(f"  {i}. {name:<16} bash {script}   # {deps}; {how}{', array ' + array if array else ''}")
    return lines





class LocalRunner:
    def __init__(self, run_dir: str, echo: Callable[[str], None] = print, max_parallel: Optional[int] = None,
                 keep: frozenset[str] = frozenset(), lock: bool = True) -> None:
        """keep: stages whose recorded outcome stands (resubmit --from a later stage).
        lock: hold the workdir lock while the chain runs (runs/workdir_lock.py)."""
        self.keep = keep
        self.run_dir = run_dir
        self.fs = LocalTransport()
        self.manifest: Manifest = load_manifest(self.fs, run_dir)
        # Each stage script is read once: its #SBATCH lines give the log pattern, tasks and CPUs.
        self.scripts = {rec.name: Path(run_dir, rec.script).read_text(encoding="utf-8")
                        for rec in self.manifest.stages}
        self._echo = echo
        self.max_parallel = max_parallel or os.cpu_count() or 1
        self.host = socket.gethostname()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.cancelled = False
        self.stopped_by: Optional[int] = None  # the first signal that cancelled the run (SIGINT: exit 130)
        self.failure: Optional[str] = None  # the run stopped itself: why (a full disk, a vanished workdir)
        self.vanished: Optional[str] = None  # the run directory was deleted mid-run: why the run stopped
        self.use_lock = lock
        self.state = LocalState(self.manifest.run_id, os.getpid(), self.host, proc_start(os.getpid()), self._tasks(),
                                boot_id=boot_id())

    def echo(self, line: str) -> None:
        """Print a state change; a terminal that went away (SIGHUP) never stops the runner."""
        try:
            self._echo(line)
        except (OSError, ValueError):
            self._echo = _silent

    # --- setup ------------------------------------------------------------------------------
    def _tasks(self) -> list[TaskState]:
        tasks = []
        previous = read_state(self.run_dir) if self.keep else None
        for rec in self.manifest.stages:
            if previous is not None and rec.name in self.keep:
                tasks += [t for t in previous.tasks if t.stage == rec.name]
                continue
            if rec.name in self.keep:  # its record is gone (local-state.json deleted): as its markers say
                tasks += _kept_from_markers(self.run_dir, rec)
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
        """Write local-state.json (temporary file, fsync, rename); OSError as it comes."""
        write_state(self.run_dir, self.state.to_json())

    def _reserve(self) -> None:
        """Keep RESERVE_BYTES on the run directory's filesystem for the last record (see _disk_full)."""
        path = os.path.join(self.run_dir, RESERVE_FILE)
        if os.path.exists(path) and os.path.getsize(path) >= RESERVE_BYTES:
            return
        with open(path, "wb") as f:
            f.write(b"\0" * RESERVE_BYTES)
            f.flush()
            os.fsync(f.fileno())

    def _free_reserve(self) -> None:
        try:
            os.unlink(os.path.join(self.run_dir, RESERVE_FILE))
        except OSError:
            pass

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
        """Start a job under its supervisor, which leads the job's own session and process group.

        Called only from the thread that runs run(): PR_SET_PDEATHSIG fires when the thread that
        forked the supervisor ends (prctl(2)), and that thread lives until every job has ended."""
        what = f"task {task.task}" if task.task is not None else f"job {task.job_id}"
        argv = [sys.executable, "-m", "lingjun_slurm.executors.supervise", "--parent", str(os.getpid()),
                "--grace", f"{KILL_GRACE_S:g}", "--", "bash", f"{self.run_dir}/{rec.script}"]
        try:
            Path(task.log).parent.mkdir(parents=True, exist_ok=True)
            with open(task.log, "ab") as log:
                proc = subprocess.Popen(argv, cwd=self.run_dir, env=self._env(rec, task), stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            task.state, task.end, task.start = "FAILED", round(time.time(), 3), round(time.time(), 3)
            task.reason = no_space_reason(exc.filename or task.log, exc.errno) or f"could not start: {exc}"
            self.echo(f"{_clock()} {rec.name:<14} FAILED     {what} ({task.reason})")
            return
        self.procs[task.key] = proc
        task.state, task.reason, task.pid, task.start = "RUNNING", None, proc.pid, round(time.time(), 3)
        task.pid_start = proc_start(proc.pid)
        self.echo(f"{_clock()} {rec.name:<14} RUNNING    {what} (pid {proc.pid}) -> {task.log}")

    def _finish(self, task: TaskState, rc: int, failed: Optional[str] = None) -> None:
        """failed: the run stopped itself for this reason (the job is FAILED, not CANCELLED)."""
        task.end = round(time.time(), 3)
        task.exit_code = 128 - rc if rc < 0 else rc
        task.pid = None
        if failed is not None:
            task.state, task.reason = "FAILED", failed
        elif self.cancelled:
            task.state, task.reason = "CANCELLED", "cancelled"
        elif rc == 0:
            task.state = "COMPLETED"
        else:
            task.state = "FAILED"
            task.reason = self._why_failed(task) or "NonZeroExitCode"
        tail = f" (exit {task.exit_code})" if task.state != "COMPLETED" else ""
        if task.state == "FAILED" and task.reason != "NonZeroExitCode":
            tail += f": {task.reason}"
        what = f"task {task.task}" if task.task is not None else f"job {task.job_id}"
        self.echo(f"{_clock()} {task.stage:<14} {task.state:<10} {what}{tail}")

    def _why_failed(self, task: TaskState) -> Optional[str]:
        """Why a job failed, when known. First the cause the stage itself left for this job in
        <run_dir>/stage-notes/<stage>.txt (stagenotes.py: a missing input or tokenizer file, the hang
        watchdog's kill, a full disk, a refused lock, a checkpoint of a newer megatron-core), so a
        known cause wins over "NonZeroExitCode" (status.py _add_note does not add it twice). Then a
        full disk: the job's log says so (with the path,
        where the program gave one: cp does, `head > file` and Python's write() do not), or one of
        the filesystems the job writes to is full now."""
        from ..injob.host import stagenotes

        note = stagenotes.read_note(self.run_dir, task.stage, [task.job_id])
        if note:
            return note
        found = no_space_in_log(task.log)
        if found is not None and found[1]:
            return no_space_reason(found[1], found[0])
        full = self._full_filesystems(task.stage)
        if found is not None:
            what = "no space left on" if found[0] == errno.ENOSPC else "disk quota exceeded on"
            return f"{what} {full[0]}" if full else f"{what} device (see {task.log})"
        if full:
            return f"no space left on {full[0]} (full when the job failed)"
        return None

    def _full_filesystems(self, stage: str) -> list[str]:
        """Mount points, among the filesystems of the run directory, the job's log and the paths its
        script and plan.json name, that have no block left."""
        try:
            plan = Path(self.run_dir, "plan.json").read_text(encoding="utf-8")
        except OSError:
            plan = ""
        log = next((t.log for t in self.state.tasks if t.stage == stage), "")
        paths = [self.run_dir, os.path.dirname(log) if log else self.run_dir]
        paths += _PATH_RE.findall(self.scripts.get(stage, "") + "\n" + plan)
        mounts: list[str] = []
        for path in paths:
            if path.startswith(("/dev", "/proc", "/sys")):
                continue
            mount = mount_point(path)
            if mount not in mounts:
                mounts.append(mount)
        return [m for m in mounts if full_filesystem(m)]

    def _on_signal(self, signum: int, _frame: Optional[FrameType]) -> None:
        if not self.cancelled:
            self.stopped_by = signum
            self.echo(f"{_clock()} {signal.Signals(signum).name}: cancelling run {self.manifest.run_id}")
        self.cancelled = True

    def _cancel_all(self, failed: Optional[str] = None) -> None:
        """SIGTERM to every running job's process group, SIGKILL after KILL_GRACE_S.
        failed: the run is stopping itself for this reason; running jobs end FAILED with it."""
        for proc in self.procs.values():
            _killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE_S
        while time.monotonic() < deadline and any(group_alive(p.pid) or p.poll() is None for p in self.procs.values()):
            time.sleep(0.05)
        for proc in self.procs.values():
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for key, proc in list(self.procs.items()):
            self._finish(self._task(key), proc.returncode, failed)
            del self.procs[key]
        for t in self.state.tasks:
            if t.state == "PENDING":
                t.state, t.reason = "CANCELLED", (f"not started: {failed}" if failed else "cancelled")

    def _task(self, key: str) -> TaskState:
        return next(t for t in self.state.tasks if t.key == key)

    def _disk_full(self, exc: OSError) -> None:
        """The runner cannot write its own state: stop every job (they could not be followed), then
        record FAILED in the room the reserve file kept."""
        where = exc.filename if isinstance(exc.filename, str) else self.run_dir
        self.failure = (no_space_reason(where, exc.errno) or f"no space left on {mount_point(self.run_dir)}")
        self.failure += f" (the local runner could not write {STATE_FILE})"
        self.echo(f"{_clock()} {self.failure}: stopping run {self.manifest.run_id}")
        self.state.error = self.failure
        self._cancel_all(self.failure)

    def _gone(self, suspect: bool = False) -> Optional[str]:
        """Why the run cannot go on when its run directory is gone (deleted mid-run), else None.
        suspect: something in it went missing (a job's log, a write failed with ENOENT): an `rm -rf`
        may be under way, so wait up to 2 s for the directory itself to go."""
        deadline = time.monotonic() + (2.0 if suspect else 0.0)
        while os.path.isdir(self.run_dir):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        time.sleep(0.2)  # an `rm -rf WORKDIR` under way takes the run directory first: let it finish
        workdir = os.path.dirname(os.path.dirname(self.run_dir.rstrip("/")))
        what = f"workdir {workdir} vanished" if not os.path.isdir(workdir) else "run directory vanished"
        return f"{what} ({self.run_dir} was deleted while the run was going)"

    def _vanished(self, exc: Optional[OSError] = None) -> bool:
        """The run directory is gone: stop every job (FAILED with the reason), once; True then.
        exc: a write of the runner's that failed (ENOENT there: the directory may be going)."""
        if self.vanished is not None:
            return True
        reason = self._gone(suspect=exc is not None and exc.errno in (errno.ENOENT, errno.ENOTDIR))
        if reason is None:
            return False
        self.vanished = self.failure = reason
        self.state.error = reason
        self.echo(f"{_clock()} {reason}: stopping run {self.manifest.run_id}")
        self._cancel_all(reason)
        return True

    def _record_vanished(self) -> None:
        """The last record of a run whose directory is gone: in this machine's copy of runs
        (runs/mirror.py: <state dir>/runs/<run-id>/manifest.json and status.json), never by making
        the deleted directory again."""
        from ..runs import mirror
        from ..status import RunStatus, StageStatus

        run = RunStatus(self.manifest.run_id, self.manifest.name, "local", self.host, run_dir=self.run_dir)
        for rec in self.manifest.stages:
            tasks = [t for t in self.state.tasks if t.stage == rec.name]
            states = [t.state for t in tasks]
            state = ("COMPLETED" if states and all(x == "COMPLETED" for x in states)
                     else "FAILED" if "FAILED" in states else "CANCELLED")
            reason = next((t.reason for t in tasks if t.state == state and t.reason), None)
            code = next((t.exit_code for t in tasks if t.exit_code), None)
            starts = [t.start for t in tasks if t.start]
            ends = [t.end for t in tasks if t.end]
            elapsed = int(max(ends) - min(starts)) if starts and ends else None
            run.stages.append(StageStatus(rec.name, list(rec.job_ids), state, reason, code, elapsed,
                                          self.host if starts else None, 0))
        mirror.save_manifest(self.manifest)
        mirror.save_status(self.manifest.run_id, run.to_json())

    def _final_save(self) -> None:
        """The last record, whatever the disk: without the reserve, in place as a last resort."""
        if self.vanished is not None or self._gone():
            self._record_vanished()
            return
        try:
            self._save()
            return
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
        self._free_reserve()
        try:
            self._save()
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            with open(os.path.join(self.run_dir, STATE_FILE), "r+", encoding="utf-8") as f:
                f.truncate(0)  # frees the old blocks for the new text, which is about as long
                f.write(self.state.to_json())

    def run(self) -> int:
        """Run the chain to the end; 0 when every job completed, else 1."""
        lock = None
        if self.use_lock:
            from ..runs.workdir_lock import runner_lock

            lock = runner_lock(self.run_dir, self.manifest.run_id)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        try:
            try:
                self._reserve()
                self._save()
            except OSError as exc:
                if not self._vanished(exc):
                    if exc.errno not in NO_SPACE:
                        raise
                    self._disk_full(exc)
            while not self.cancelled and self.failure is None:
                if self._vanished():  # before _schedule, whose log mkdir would make part of it again
                    break
                changed = self._reap()
                if self._vanished():  # a job just failed because of it: its dependents are not "never satisfied"
                    break
                changed |= self._schedule()
                if changed:
                    try:
                        self._save()
                    except OSError as exc:
                        if self._vanished(exc):
                            break
                        if exc.errno not in NO_SPACE:
                            raise
                        self._disk_full(exc)
                        break
                if not self.procs and all(t.state != "PENDING" for t in self.state.tasks):
                    break
                wait_any([p.pid for p in self.procs.values()], 0.05)  # returns at a job's exit
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
            try:
                self._final_save()
            finally:
                self._free_reserve()
                if lock is not None:
                    lock.release()
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
                task = self._task(key)
                # a job whose log or the runner's record went missing: is the run directory going?
                suspect = not (os.path.exists(task.log) and os.path.exists(os.path.join(self.run_dir, STATE_FILE)))
                self._finish(task, rc, self._gone(suspect) if rc else None)
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
            # An array's `%M` (data.max_running): at most M of its tasks run at once, the others
            # wait with Slurm's reason for it, JobArrayTaskLimit (job_mgr.c job_array_start_test,
            # slurm-22-05-8-1 lines 16200-16216; slurm_protocol_defs.c:1888-1889).
            limit = array_limit(rec.array) if rec.array else None
            running = sum(1 for t in self.state.tasks if t.stage == rec.name and t.state == "RUNNING")
            for t in pending:
                if ready and limit is not None and running >= limit:
                    if t.reason != "JobArrayTaskLimit":
                        t.reason, changed = "JobArrayTaskLimit", True
                elif ready and len(self.procs) < self.max_parallel:
                    self._start(rec, t)
                    running += 1
                    changed = True
                elif ready and t.reason != "Resources":
                    t.reason, changed = "Resources", True
        return changed


def _silent(_line: str) -> None:
    pass


def _kept_from_markers(run_dir: str, rec: StageRecord) -> list[TaskState]:
    """The tasks of a stage that `resubmit --from` a later stage keeps, when local-state.json is gone:
    what each job's marker (jobs/<key>, status.read_marker) says, so the stage is never run again;
    a task without an ended marker is CANCELLED ("no record left"), which a dependent's afterok
    does not accept (resubmit_local has checked the stages it needs are COMPLETED)."""
    from ..status import read_marker

    job_id = rec.job_ids[0]
    indices: list[Optional[int]] = list(array_indices(rec.array)) if rec.array else [None]
    out = []
    for i in indices:
        key = f"{job_id}_{i}" if i is not None else job_id
        marker = read_marker(LocalTransport(), run_dir, key)
        ended = marker is not None and marker.state in DONE
        out.append(TaskState(key=key, stage=rec.name, job_id=job_id, task=i,
                             state=marker.state if ended and marker else "CANCELLED",
                             reason=marker.reason if ended and marker else "no record left (local-state.json missing)",
                             start=marker.start if marker else None, end=marker.end if marker else None,
                             exit_code=marker.exit_code if marker else None))
    return out


def write_state(run_dir: str, text: str) -> None:
    """<run_dir>/local-state.json, written whole (atomicfile.atomic_write); OSError as it comes."""
    atomic_write(os.path.join(run_dir, STATE_FILE), text.encode("utf-8"))


# --- a full disk ----------------------------------------------------------------------------
_PATH_RE = re.compile(r"(?<![\w.$-])/[\w.+-]+(?:/[\w.+-]+)*")


# --- processes --------------------------------------------------------------------------------
def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _clock() -> str:
    return time.strftime("%H:%M:%S")


def cancel_local(run_dir: str, timeout: float = KILL_GRACE_S + 5) -> list[str]:
    """Stop a local run by its recorded process ids; returns what was signalled."""
    state = read_state(run_dir)
    if state is None:
        return []
    here = socket.gethostname()
    if state.host and state.host != here:
        from ..common.errors import UsageError

        raise UsageError(f"run {state.run_id} runs on host {state.host}; cancel it there (this is {here})")
    done: list[str] = []
    if runner_alive(state):
        os.kill(state.runner_pid or 0, signal.SIGTERM)
        done.append(f"runner pid {state.runner_pid}")
        deadline = time.monotonic() + timeout
        while runner_alive(state) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not runner_alive(state):
            return done
    # The runner is gone (killed?) or stuck: stop its jobs' process groups directly.
    for task in state.tasks:
        if task.state == "RUNNING" and job_alive(task, state):
            pgid = task.pid or 0
            _killpg(pgid, signal.SIGTERM)
            deadline = time.monotonic() + KILL_GRACE_S
            while group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
            _killpg(pgid, signal.SIGKILL)
            done.append(f"{task.stage} pid {task.pid}")
        if task.state in ("RUNNING", "PENDING"):
            task.state, task.reason, task.pid = "CANCELLED", "cancelled", None
            task.end = task.end or round(time.time(), 3)
    state.runner_pid = None
    state.finished = True
    try:
        write_state(run_dir, state.to_json())
    except OSError as exc:
        from ..common.errors import TransportError

        raise TransportError(f"stopped {', '.join(done) or 'nothing'}, but cannot record it in "
                             f"{run_dir}/{STATE_FILE}: {no_space_reason(run_dir, exc.errno) or exc.strerror}") from exc
    return done


def detach(run_dir: str) -> int:
    """Start the runner in its own session, in the background; returns its pid. It takes the workdir
    lock over from this process (its parent) before it writes its first state, which this waits for."""
    log = open(f"{run_dir}/local-runner.log", "ab")
    with log:
        proc = subprocess.Popen([sys.executable, "-m", "lingjun_slurm.executors.local", run_dir], cwd=run_dir,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 10
    while read_state(run_dir) is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)  # so a status or cancel right after submit sees the runner
    if proc.poll() is not None and read_state(run_dir) is None:
        from ..common.errors import LingjunError

        tail = Path(run_dir, "local-runner.log").read_text(errors="replace")[-2000:]
        raise LingjunError(f"the local runner exited at once (status {proc.returncode}):\n{tail}")
    return proc.pid


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python3 -m lingjun_slurm.executors.local RUN_DIR", file=sys.stderr)
        return 2
    from ..common.errors import LingjunError

    try:
        return LocalRunner(args[0], echo=lambda line: print(line, flush=True)).run()
    except LingjunError as exc:
        print(f"lingjun-slurm: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
