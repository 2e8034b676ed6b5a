"""A lock that holds on Lustre, NFS and CPFS, where flock may be missing: a holder file.

The lock is a file created with O_CREAT|O_EXCL (atomic on local filesystems, Lustre, and NFSv3+
on Linux >= 2.6: open(2), "O_EXCL"), holding one JSON line that says who holds it: host, pid,
the process's start time (field 22 of /proc/PID/stat, with the boot id, so a reused pid after a
reboot or wrap-around is not taken for the holder), the Slurm job id when it runs in a job, the
time and what it is for. The holder removes it on release.

A holder that died without releasing leaves the file behind. It is stale when:
- it was taken on this host and that process is gone (no such pid, or another start time);
- it was taken on another host in a Slurm job, and that job has ended (asked through the
  `job_alive` callback: one squeue for the job; None, for "cannot tell", keeps it).
A holder on another host outside any job cannot be judged from here and is never broken.

Breaking a stale file renames it to a unique name first and checks that what was moved is the
holder judged stale; a fresh holder's file that took its place in between is put back with
link(2), which never overwrites. In the rare race where a third process creates the lock in that
gap, the fresh holder loses its file and two processes may hold the lock at once: for the image
cache that costs a second import, never a partial file (each import ends in its own rename).

Standard library only: stages on cluster hosts import it without the project's dependencies.
The image cache (images/cache.py) and the workdir lock use it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

JobAlive = Callable[[str], Optional[bool]]
# A holder file is written right after it is created; one that stays empty or unreadable for
# this long was left by a process that died between the two.
UNREADABLE_GRACE_S = 30.0


class LockHeld(Exception):
    """The lock is held by a live holder (or one that cannot be judged) past the timeout."""

    def __init__(self, path: str, holder: Optional["Holder"]) -> None:
        self.path = path
        self.holder = holder
        who = holder.describe() if holder else "a holder whose file cannot be read"
        super().__init__(f"{path} is held by {who}")


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    start: str
    job_id: str
    since: float
    purpose: str

    def describe(self) -> str:
        job = f", Slurm job {self.job_id}" if self.job_id else ""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        what = f" ({self.purpose})" if self.purpose else ""
        return f"pid {self.pid} on {self.host}{job} since {when}{what}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


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
    return f"{_boot_id()}:{fields[19]}" if len(fields) > 19 else ""


def this_host() -> str:
    return socket.gethostname()


def me(purpose: str = "", job_id: Optional[str] = None) -> Holder:
    pid = os.getpid()
    return Holder(host=this_host(), pid=pid, start=process_start(pid) or "",
                  job_id=job_id if job_id is not None else os.environ.get("SLURM_JOB_ID", ""),
                  since=time.time(), purpose=purpose)


def read_holder(path: str | Path) -> Optional[Holder]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return Holder(host=str(data["host"]), pid=int(data["pid"]), start=str(data["start"]),
                      job_id=str(data.get("job_id") or ""), since=float(data["since"]),
                      purpose=str(data.get("purpose") or ""))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_stale(holder: Holder, job_alive: Optional[JobAlive] = None) -> bool:
    """True only when the holder is surely gone (see the module docstring)."""
    if holder.host == this_host():
        start = process_start(holder.pid)
        if start is None:
            return True
        return bool(holder.start) and bool(start) and start != holder.start
    if holder.job_id and job_alive is not None:
        return job_alive(holder.job_id) is False
    return False


class HolderLock:
    """with HolderLock(path, purpose=...).acquire(timeout=...): ..."""

    def __init__(self, path: str | Path, *, purpose: str = "", job_alive: Optional[JobAlive] = None,
                 job_id: Optional[str] = None) -> None:
        self.path = Path(path)
        self.purpose = purpose
        self.job_alive = job_alive
        self.job_id = job_id
        self.held: Optional[Holder] = None

    def try_acquire(self) -> bool:
        """Take the lock if it is free or stale; False when someone live holds it."""
        for _ in range(3):
            holder = me(self.purpose, self.job_id)
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if not self._break_if_stale():
                    return False
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(holder.to_json() + "\n")
                f.flush()
                os.fsync(f.fileno())
            self.held = holder
            return True
        return False

    def acquire(self, timeout: float = 0.0, poll_s: float = 1.0,
                on_wait: Optional[Callable[[Optional[Holder]], None]] = None) -> "HolderLock":
        """Wait up to timeout seconds (0: one try); LockHeld names the holder when it stays held."""
        deadline = time.monotonic() + timeout
        told = False
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                raise LockHeld(str(self.path), read_holder(self.path))
            if on_wait is not None and not told:
                on_wait(read_holder(self.path))
                told = True
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        return self

    def release(self) -> None:
        if self.held is None:
            return
        current = read_holder(self.path)
        if current == self.held:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
        self.held = None

    def __enter__(self) -> "HolderLock":
        if self.held is None:
            self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _break_if_stale(self) -> bool:
        holder = read_holder(self.path)
        if holder is None:
            try:
                age = time.time() - self.path.stat().st_mtime
            except FileNotFoundError:
                return True  # released meanwhile: try again
            if age < UNREADABLE_GRACE_S:
                return False
        elif not is_stale(holder, self.job_alive):
            return False
        moved = self.path.with_name(f"{self.path.name}.stale.{this_host()}.{os.getpid()}.{time.monotonic_ns()}")
        try:
            os.rename(self.path, moved)
        except FileNotFoundError:
            return True
        if read_holder(moved) != holder:
            # A fresh holder's file took the stale one's place between our read and the rename.
            try:
                os.link(moved, self.path)
            except FileExistsError:
                pass
            os.unlink(moved)
            return False
        os.unlink(moved)
        return True


def slurm_job_alive(job_id: str, run: Callable[[list[str]], tuple[int, str]]) -> Optional[bool]:
    """Whether a Slurm job is still pending or running, from one squeue call.

    `run(argv) -> (returncode, stdout and stderr together)`, run without SQUEUE_* variables in its
    environment (squeue/opts.c reads SQUEUE_STATES, SQUEUE_USERS, ... as filters that could hide a
    live job). With `-t all` squeue shows the job in any state while slurmctld remembers it; only
    terminal states, no line, or "Invalid job id specified" (a job it has forgotten) mean gone.
    Any other failure (slurmctld unreachable) is "cannot tell".
    """
    rc, out = run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"])
    states = {line.strip() for line in out.splitlines() if line.strip()}
    if rc == 0:
        return bool(states - {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                              "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
    if "invalid job id" in out.lower():
        return False
    return None
