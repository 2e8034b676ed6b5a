"""A lock that holds on Lustre, NFS and CPFS, where flock may be missing: a holder file.

The lock is a file created with O_CREAT|O_EXCL (atomic on local filesystems, Lustre, and NFSv3+
on Linux >= 2.6: open(2), "O_EXCL"), holding one JSON line that says who holds it: host, pid,
the process's start time (field 22 of /proc/PID/stat, with the boot id, so a reused pid after a
reboot or wrap-around is not taken for the holder), the Slurm job id when it runs in a job, the
time and what it is for. The holder removes it on release.

A lock can also be held by a chain of Slurm jobs (`jobs`): the process that queued them writes
their ids into the holder file as each sbatch returns and may then exit; the lock stays held for
as long as Slurm says any of those jobs is pending or running (the workdir lock of a Slurm run,
runs/workdir_lock.py).

A holder that died without releasing leaves the file behind. judge() says what it is:
- held by jobs: stale when one squeue says none of them is pending or running (the
  `jobs_alive` callback, one call for all ids); "cannot tell" (slurmctld unreachable) keeps it;
- taken on this host by a process: stale when that process is gone (no such pid, or another
  start time);
- taken on another host in a Slurm job: stale when that job has ended (`job_alive`, one squeue);
- taken on another host outside any job: it cannot be judged from here and is never broken
  (a caller may offer a --force for exactly this case: break_held()).

Breaking a stale file renames it to a unique name first and checks that what was moved is the
holder judged stale; a fresh holder's file that took its place in between is put back with
link(2), which never overwrites. In the rare race where a third process creates the lock in that
gap, the fresh holder loses its file and two processes may hold the lock at once: for the image
cache that costs a second import, never a partial file (each import ends in its own rename).

Where the file lives is a `Files` object: this machine's filesystem (LocalFiles, the default), or
another host reached through a transport (runs/workdir_lock.py). Standard library only: stages on
cluster hosts import it without the project's dependencies. The image cache (images/cache.py) and
the workdir lock use it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

from .atomicfile import atomic_write

JobAlive = Callable[[str], Optional[bool]]
JobsAlive = Callable[[Sequence[str]], Optional[bool]]
# A holder file is written right after it is created; one that stays empty or unreadable for
# this long was left by a process that died between the two.
UNREADABLE_GRACE_S = 30.0
# Slurm job states after which a job never runs again (squeue -o %T prints the base state, or
# COMPLETING while the job's processes are still being cleaned up: not ended yet).
ENDED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                          "BOOT_FAIL", "DEADLINE"})
# squeue reads these as filters when the matching option is not given (src/squeue/opts.c, 22.05.8:
# SQUEUE_ACCOUNT .. SQUEUE_USERS at lines 409-446; SLURM_CLUSTERS at 159 points it at other clusters):
# any of them could hide a live job from the liveness query.
SQUEUE_FILTER_VARS = ("SQUEUE_ACCOUNT", "SQUEUE_NAMES", "SQUEUE_LICENSES", "SQUEUE_PARTITION", "SQUEUE_QOS",
                      "SQUEUE_STATES", "SQUEUE_USERS", "SLURM_CLUSTERS")


class LockHeld(Exception):
    """The lock is held by a live holder (or one that cannot be judged) past the timeout."""

    def __init__(self, path: str, holder: Optional["Holder"], verdict: Optional["Verdict"] = None) -> None:
        self.path = path
        self.holder = holder
        self.verdict = verdict
        who = holder.describe() if holder else "a holder whose file cannot be read"
        why = f" ({verdict.why})" if verdict is not None and verdict.why else ""
        super().__init__(f"{path} is held by {who}{why}")


class LockLost(Exception):
    """The holder file is no longer the one this lock wrote (broken by someone with --force?)."""


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    start: str
    job_id: str
    since: float
    purpose: str
    jobs: tuple[str, ...] = ()   # held by these Slurm jobs (a chain), whatever became of pid
    run_id: str = ""
    run_dir: str = ""            # the holding run's directory (a lock outside its workdir: checkpoint.dir)

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        what = f" ({self.purpose})" if self.purpose else ""
        if self.jobs:
            plural = "s" if len(self.jobs) > 1 else ""
            return (f"Slurm job{plural} {', '.join(self.jobs)}{what}, queued from {self.host} (pid {self.pid}) "
                    f"since {when}")
        job = f", Slurm job {self.job_id}" if self.job_id else ""
        return f"pid {self.pid} on {self.host}{job} since {when}{what}"

    def to_json(self) -> str:
        doc = asdict(self)
        doc["jobs"] = list(self.jobs)
        if not self.run_dir:
            del doc["run_dir"]  # as holder files were before the field
        return json.dumps(doc, sort_keys=True)


@dataclass(frozen=True)
class Verdict:
    """judge()'s answer: "stale" (surely gone), "alive", or "unknown" (cannot be checked from here)."""

    state: str
    why: str


class Files(Protocol):
    """The few filesystem operations a holder file needs, on whichever host holds it."""

    def create_exclusive(self, path: str, text: str) -> bool:
        """Create path with O_CREAT|O_EXCL holding text; False when it already exists."""
        ...

    def read(self, path: str) -> Optional[str]:
        """The file's text; None when missing or unreadable."""
        ...

    def age_s(self, path: str) -> Optional[float]:
        """Seconds since the file was last modified; None when missing."""
        ...

    def rename(self, src: str, dst: str) -> bool:
        """rename(2); False when src is missing."""
        ...

    def link(self, src: str, dst: str) -> bool:
        """link(2), which never overwrites; False when dst exists."""
        ...

    def unlink(self, path: str) -> None:
        """Remove; a missing file is fine."""
        ...

    def replace(self, path: str, text: str) -> None:
        """Write a temporary file beside path and rename it over path."""
        ...


class LocalFiles:
    """Files on this machine."""

    def create_exclusive(self, path: str, text: str) -> bool:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        return True

    def read(self, path: str) -> Optional[str]:
        try:
            return Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def age_s(self, path: str) -> Optional[float]:
        try:
            return time.time() - os.stat(path).st_mtime
        except FileNotFoundError:
            return None

    def rename(self, src: str, dst: str) -> bool:
        try:
            os.rename(src, dst)
        except FileNotFoundError:
            return False
        return True

    def link(self, src: str, dst: str) -> bool:
        try:
            os.link(src, dst)
        except FileExistsError:
            return False
        return True

    def unlink(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def replace(self, path: str, text: str) -> None:
        atomic_write(path, text.encode("utf-8"))


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> Optional[str]:
    """"BOOT_ID:STARTTIME" of a live process, None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return ""
    # comm (field 2) may hold spaces and parentheses: fields after the last ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    if fields and fields[0] in ("Z", "X"):
        return None  # a zombie has exited: only its exit status waits to be collected
    return f"{_boot_id()}:{fields[19]}" if len(fields) > 19 else ""


def this_host() -> str:
    return socket.gethostname()


def me(purpose: str = "", job_id: Optional[str] = None, run_id: str = "", run_dir: str = "") -> Holder:
    pid = os.getpid()
    return Holder(host=this_host(), pid=pid, start=process_start(pid) or "",
                  job_id=job_id if job_id is not None else os.environ.get("SLURM_JOB_ID", ""),
                  since=time.time(), purpose=purpose, run_id=run_id, run_dir=run_dir)


def parse_holder(text: Optional[str]) -> Optional[Holder]:
    if text is None:
        return None
    try:
        data = json.loads(text)
        return Holder(host=str(data["host"]), pid=int(data["pid"]), start=str(data["start"]),
                      job_id=str(data.get("job_id") or ""), since=float(data["since"]),
                      purpose=str(data.get("purpose") or ""),
                      jobs=tuple(str(j) for j in (data.get("jobs") or ())),
                      run_id=str(data.get("run_id") or ""), run_dir=str(data.get("run_dir") or ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def read_holder(path: str | Path, files: Optional[Files] = None) -> Optional[Holder]:
    return parse_holder((files or LocalFiles()).read(str(path)))


def judge(holder: Holder, job_alive: Optional[JobAlive] = None,
          jobs_alive: Optional[JobsAlive] = None) -> Verdict:
    """Whether a holder is surely gone (see the module docstring)."""
    if holder.jobs:
        ids = ", ".join(holder.jobs)
        alive = jobs_alive(holder.jobs) if jobs_alive is not None else None
        if alive is False:
            return Verdict("stale", f"Slurm says none of jobs {ids} is pending or running")
        if alive:
            return Verdict("alive", f"Slurm says job(s) of {ids} are still pending or running")
        return Verdict("unknown", f"Slurm could not be asked about jobs {ids}")
    if holder.host == this_host():
        start = process_start(holder.pid)
        if start is None:
            return Verdict("stale", f"pid {holder.pid} is gone")
        if holder.start and start and start != holder.start:
            return Verdict("stale", f"pid {holder.pid} is another process now (other start time)")
        return Verdict("alive", f"pid {holder.pid} is running on {holder.host}")
    if holder.job_id:
        alive = job_alive(holder.job_id) if job_alive is not None else None
        if alive is False:
            return Verdict("stale", f"Slurm job {holder.job_id} has ended")
        if alive:
            return Verdict("alive", f"Slurm job {holder.job_id} is still running")
        return Verdict("unknown", f"Slurm could not be asked about job {holder.job_id}")
    return Verdict("unknown", f"taken on {holder.host} outside any Slurm job, which cannot be checked from "
                              f"{this_host()}")


def is_stale(holder: Holder, job_alive: Optional[JobAlive] = None, jobs_alive: Optional[JobsAlive] = None) -> bool:
    """True only when the holder is surely gone (see the module docstring)."""
    return judge(holder, job_alive, jobs_alive).state == "stale"


class HolderLock:
    """with HolderLock(path, purpose=...).acquire(timeout=...): ...

    still_alive(holder): asked when judge() finds a holder stale; a reason string keeps it
    (the workdir lock asks whether a dead runner's stages still run)."""

    def __init__(self, path: str | Path, *, purpose: str = "", job_alive: Optional[JobAlive] = None,
                 job_id: Optional[str] = None, jobs_alive: Optional[JobsAlive] = None,
                 files: Optional[Files] = None, run_id: str = "",
                 still_alive: Optional[Callable[[Holder], Optional[str]]] = None, run_dir: str = "") -> None:
        self.path = Path(path) if files is None else path  # type: ignore[assignment]
        self.purpose = purpose
        self.job_alive = job_alive
        self.jobs_alive = jobs_alive
        self.job_id = job_id
        self.run_id = run_id
        self.run_dir = run_dir
        self.files: Files = files or LocalFiles()
        self.still_alive = still_alive
        self.held: Optional[Holder] = None
        # What the last failed try_acquire found in the file, and judged.
        self.last_holder: Optional[Holder] = None
        self.last_verdict: Optional[Verdict] = None

    @property
    def _p(self) -> str:
        return str(self.path)

    def try_acquire(self) -> bool:
        """Take the lock if it is free or stale; False when someone live holds it."""
        for _ in range(3):
            holder = me(self.purpose, self.job_id, self.run_id, self.run_dir)
            if not self.files.create_exclusive(self._p, holder.to_json() + "\n"):
                if not self._break_if_stale():
                    return False
                continue
            self.held = holder
            self.last_verdict = None
            return True
        return False

    def acquire(self, timeout: float = 0.0, poll_s: float = 1.0,
                on_wait: Optional[Callable[[Optional[Holder]], None]] = None) -> "HolderLock":
        """Wait up to timeout seconds (0: one try); LockHeld names the holder when it stays held."""
        deadline = time.monotonic() + timeout
        told = False
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                raise LockHeld(self._p, read_holder(self._p, self.files), self.last_verdict)
            if on_wait is not None and not told:
                on_wait(read_holder(self._p, self.files))
                told = True
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        return self

    def update(self, **changes: object) -> Holder:
        """Rewrite the held holder file with some fields changed (jobs=..., pid=..., start=...),
        atomically; LockLost when the file is no longer ours."""
        if self.held is None:
            raise LockLost(f"{self._p} is not held")
        current = read_holder(self._p, self.files)
        if current != self.held:
            self.held = None
            raise LockLost(f"{self._p} was taken over by "
                           f"{current.describe() if current else 'someone else (or removed)'}")
        new = replace(self.held, **changes)  # type: ignore[arg-type]
        self.files.replace(self._p, new.to_json() + "\n")
        self.held = new
        return new

    def adopt(self, holder: Holder) -> None:
        """Hold the lock as `holder` (read from the file): a process that takes over a lock another
        one took for it (the detached local runner, a resubmit of the run whose jobs hold it)."""
        self.held = holder

    def release(self) -> None:
        if self.held is None:
            return
        current = read_holder(self._p, self.files)
        if current == self.held:
            self.files.unlink(self._p)
        self.held = None

    def __enter__(self) -> "HolderLock":
        if self.held is None:
            self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def judge_current(self) -> tuple[Optional[Holder], Verdict]:
        """The holder in the file now and what judge() (plus still_alive) says about it."""
        holder = read_holder(self._p, self.files)
        if holder is None:
            age = self.files.age_s(self._p)
            if age is None:
                return None, Verdict("stale", "released meanwhile")
            if age < UNREADABLE_GRACE_S:
                return None, Verdict("unknown", f"the holder file is being written (or unreadable; {age:.0f} s old)")
            return None, Verdict("stale", f"the holder file has been unreadable for {age:.0f} s")
        verdict = judge(holder, self.job_alive, self.jobs_alive)
        if verdict.state == "stale" and self.still_alive is not None:
            why = self.still_alive(holder)
            if why:
                verdict = Verdict("alive", why)
        return holder, verdict

    def _break_if_stale(self) -> bool:
        holder, verdict = self.judge_current()
        self.last_holder, self.last_verdict = holder, verdict
        if verdict.state != "stale":
            return False
        return self.break_held(holder)

    def break_held(self, holder: Optional[Holder]) -> bool:
        """Remove the holder file if it still holds `holder` (None: an unreadable file); False when
        another holder's file took its place (that one is put back)."""
        moved = f"{self._p}.stale.{this_host()}.{os.getpid()}.{time.monotonic_ns()}"
        if not self.files.rename(self._p, moved):
            return True
        fresh = holder is None and (self.files.age_s(moved) or 0.0) < UNREADABLE_GRACE_S
        if read_holder(moved, self.files) != holder or fresh:
            # A fresh holder's file took the stale one's place between our read and the rename.
            # An unreadable one that is young is a holder that has created its file and not yet
            # written it (the stale file was released or broken meanwhile): never removed.
            self.files.link(moved, self._p)
            self.files.unlink(moved)
            return False
        self.files.unlink(moved)
        return True


def slurm_jobs_alive(job_ids: Sequence[str], run: Callable[[list[str]], tuple[int, str]]) -> Optional[bool]:
    """Whether any of these Slurm jobs is still pending or running, from ONE squeue call.

    `run(argv) -> (returncode, stdout and stderr together)`, run without the SQUEUE_FILTER_VARS
    in its environment (filters that could hide a live job). With `-t all` squeue shows a job in
    any state while slurmctld remembers it (MinJobAge after its end); only terminal states, no
    line, or "Invalid job id specified" mean gone. squeue asks slurmctld for that one job when -j
    names one id, and for every job, filtered here, when it names several (src/squeue/opts.c
    22.05.8:463, squeue.c _print_job): several forgotten ids give no line and exit 0, one gives
    "Invalid job id specified" and exit 1. Any other failure (slurmctld unreachable) is "cannot tell".
    """
    ids = [str(j) for j in job_ids if str(j)]
    if not ids:
        return False
    rc, out = run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%T"])
    states = {line.strip() for line in out.splitlines() if line.strip()}
    if rc == 0:
        return bool(states - ENDED_STATES)
    if "invalid job id" in out.lower():
        return False
    return None


def run_squeue(argv: list[str]) -> tuple[int, str]:
    """The `run` of slurm_jobs_alive for in-job code: squeue without the SQUEUE_* variables (a
    SQUEUE_FORMAT or a filter from the job's environment changes its output), 60 s at most; a
    squeue that cannot start or does not answer is (1, the reason): "cannot tell"."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("SQUEUE_")}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return proc.returncode, proc.stdout + proc.stderr


def slurm_job_alive(job_id: str, run: Callable[[list[str]], tuple[int, str]]) -> Optional[bool]:
    """Whether one Slurm job is still pending or running (slurm_jobs_alive for one id)."""
    return slurm_jobs_alive([job_id], run)
