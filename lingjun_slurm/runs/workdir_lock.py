"""One run per workdir at a time: the holder-file lock `<workdir>/run.lock` (holderlock.py).

Two runs of one spec share the workdir's data shards, merged dataset and checkpoint directory;
run side by side they fail by timing. So submit (and resubmit) takes this lock before anything
is written or queued and refuses a second run up front, naming the holder.

Who holds it:
- a Slurm run: the submitting process creates the file (O_EXCL) before the first sbatch, writes
  each job id into it as its sbatch returns, and exits; from then on the chain's jobs hold it.
  It is stale once ONE squeue (`squeue -h -t all -j ID,ID,... -o %T`) shows none of them pending
  or running; a chain that ended leaves the file, which the next submit breaks by that query.
  cancel removes it at once when Slurm already says every job has ended. A failed submission
  (everything rolled back) releases it.
- a local run: the runner process (the submit itself in the foreground, or the detached runner,
  which takes it over from the submit that started it, its parent, before it writes its first state). It releases the lock when the chain
  ends; a runner that was killed leaves a stale holder (its pid is gone), unless one of its
  stages still runs without it (status shows RUNNING (orphaned)): then the run still holds it.

--force: a stale lock never needs it (it is broken automatically). --force breaks a lock whose
holder cannot be checked from here: taken on another host outside any Slurm job (a submit
running, or killed, there), held by jobs while Slurm cannot be asked, or a holder file that
stays unreadable. A holder that is verifiably alive (a live process here, a job Slurm shows
pending or running) is never broken, --force or not.

The workdir lives on the host the transport reaches (the login node, for --host/--cluster). On
this machine the file is made with os.open(O_CREAT|O_EXCL); over SSH with bash's noclobber
redirection, which opens with O_WRONLY|O_CREAT|O_EXCL (checked with strace on bash 5.2.15:
`openat(AT_FDCWD, "x", O_WRONLY|O_CREAT|O_EXCL, 0666)`), and mv/ln/rm for the stale-holder break.
"""

from __future__ import annotations

import os
import posixpath
import time
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from ..common.errors import TransportError, WorkdirBusy
from ..common.holderlock import (SQUEUE_FILTER_VARS, Files, Holder, HolderLock, LocalFiles, Verdict, process_start,
                                 read_holder, slurm_jobs_alive, this_host)

if TYPE_CHECKING:
    from ..transport.base import Transport

LOCK_NAME = "run.lock"
# The checkpoint directory's lock (issue 26 item 4): two specs with different workdirs and one
# checkpoint.dir would train into it at once, so a chain with a train or checkpoint stage also
# holds <checkpoint dir>/checkpoint.lock, the same holder-file lock taken and released with the
# workdir's. Its own name: a checkpoint.dir that is the workdir itself must not meet run.lock.
CKPT_LOCK_NAME = "checkpoint.lock"
CKPT_STAGES = ("train", "checkpoint")


def lock_path(workdir: str) -> str:
    return f"{workdir.rstrip('/')}/{LOCK_NAME}"


def workdir_of(run_dir: str) -> str:
    """<workdir>/runs/<run-id> -> <workdir> (submit.run_dir_for)."""
    return posixpath.dirname(posixpath.dirname(run_dir.rstrip("/")))


class TransportFiles:
    """Holder-file operations on the transport's host, one short command each."""

    _CREATE = ('set -o noclobber; { printf "%s\\n" "$2" > "$1"; } 2>/dev/null && exit 0; '
               '[ -e "$1" ] && exit 17; printf "%s\\n" "$2" > "$1"')
    _AGE = 'm=$(stat -c %Y -- "$1" 2>/dev/null) || exit 3; echo $(( $(date +%s) - m ))'
    _RENAME = '[ -e "$1" ] || exit 3; mv -f -T -- "$1" "$2" && exit 0; [ -e "$1" ] || exit 3; exit 1'
    _LINK = 'ln -T -- "$1" "$2" 2>/dev/null && exit 0; [ -e "$2" ] && exit 17; ln -T -- "$1" "$2"'

    def __init__(self, t: "Transport") -> None:
        self.t = t

    def _bash(self, script: str, *args: str) -> tuple[int, str, str]:
        r = self.t.run(["bash", "-c", script, "lingjun-lock", *args], timeout=60)
        return r.returncode, r.stdout, r.stderr

    def _fail(self, what: str, path: str, err: str) -> TransportError:
        return TransportError(f"cannot {what} {path} on {self.t.host}: {err.strip() or '(no output)'}")

    def create_exclusive(self, path: str, text: str) -> bool:
        rc, _out, err = self._bash(self._CREATE, path, text.rstrip("\n"))
        if rc == 0:
            return True
        if rc == 17:
            return False
        raise self._fail("create the lock file", path, err)

    def read(self, path: str) -> Optional[str]:
        try:
            return self.t.read_text(path)
        except (FileNotFoundError, TransportError):
            return None

    def age_s(self, path: str) -> Optional[float]:
        rc, out, err = self._bash(self._AGE, path)
        if rc == 3:
            return None
        if rc != 0 or not out.strip().lstrip("-").isdigit():
            raise self._fail("read the age of", path, err)
        return float(out.strip())

    def rename(self, src: str, dst: str) -> bool:
        rc, _out, err = self._bash(self._RENAME, src, dst)
        if rc == 3:
            return False
        if rc != 0:
            raise self._fail("rename", src, err)
        return True

    def link(self, src: str, dst: str) -> bool:
        rc, _out, err = self._bash(self._LINK, src, dst)
        if rc == 17:
            return False
        if rc != 0:
            raise self._fail("link", src, err)
        return True

    def unlink(self, path: str) -> None:
        rc, _out, err = self._bash('rm -f -- "$1"', path)
        if rc != 0:
            raise self._fail("remove", path, err)

    def replace(self, path: str, text: str) -> None:
        self.t.write_atomic(path, text)


def squeue_on(t: "Transport", said: Optional[list[str]] = None) -> Callable[[list[str]], tuple[int, str]]:
    """run(argv) for holderlock.slurm_jobs_alive through the transport, without squeue's filter
    variables (`env -u`); what a failing squeue printed is appended to `said`."""

    def run(argv: list[str]) -> tuple[int, str]:
        unset = [a for v in SQUEUE_FILTER_VARS for a in ("-u", v)]
        r = t.run(["env", *unset, *argv], timeout=120)
        out = r.stdout + r.stderr
        if r.returncode != 0 and said is not None:
            said.append(out.strip() or f"exit {r.returncode}")
        return r.returncode, out

    return run


def _orphaned_stage(workdir: str, holder: Holder) -> Optional[str]:
    """A local run whose runner is gone may still have stages running without it."""
    if not holder.run_id or holder.host != this_host() or holder.jobs:
        return None
    from ..executors.localstate import live_orphans

    found = live_orphans(holder.run_dir or posixpath.join(workdir, "runs", holder.run_id))
    if not found:
        return None
    what = ", ".join(f"stage {stage} (pid {pid})" for stage, pid in found)
    return (f"its runner (pid {holder.pid}) is gone but {what} still runs; "
            f"`lingjun-slurm cancel {holder.run_id}` stops it")


class WorkdirLock:
    """The lock of one workdir, for one run (run_id), on the host the transport reaches."""

    def __init__(self, t: "Transport", workdir: str, run_id: str, *, what: str = "workdir",
                 path: Optional[str] = None, run_dir: str = "") -> None:
        """what: "workdir", or "checkpoint directory" (then workdir is that directory, path its
        checkpoint.lock and run_dir the holding run's directory, which the holder file records)."""
        self.t = t
        self.workdir = workdir.rstrip("/")
        self.run_id = run_id
        self.what = what
        self.path = path or lock_path(self.workdir)
        self.slurm_said: list[str] = []
        local = t.kind == "local"
        files: Files = LocalFiles() if local else TransportFiles(t)
        squeue = squeue_on(t, self.slurm_said)
        self.lock = HolderLock(self.path, purpose="submitting", run_id=run_id, files=files, run_dir=run_dir,
                               jobs_alive=lambda ids: slurm_jobs_alive(ids, squeue),
                               job_alive=lambda job: slurm_jobs_alive([job], squeue),
                               still_alive=(lambda h: _orphaned_stage(self.workdir, h)) if local else None)

    @property
    def held(self) -> bool:
        return self.lock.held is not None

    def acquire(self, *, force: bool = False, same_run: bool = False) -> str:
        """Take the lock or raise WorkdirBusy naming the holder. same_run: a lock held by this
        run's own Slurm jobs is taken over (resubmit). Returns a note when --force broke a lock."""
        note = ""
        self.t.mkdir(self.workdir)
        for _ in range(5):
            if self.lock.try_acquire():
                return note
            holder, verdict = self.lock.last_holder, self.lock.last_verdict
            if verdict is None or verdict.state == "stale":
                continue  # released or broken meanwhile: try again
            if same_run and holder is not None and holder.run_id == self.run_id and holder.jobs:
                self.lock.adopt(holder)
                return note
            if verdict.state == "unknown" and force:
                if self.lock.break_held(holder):
                    who = holder.describe() if holder else "an unreadable holder file"
                    note = f"--force: broke the lock {self.path} held by {who} ({verdict.why})"
                continue
            raise WorkdirBusy(self._busy(holder, verdict, force))
        holder, verdict = self.lock.judge_current()
        if verdict.state == "stale":
            verdict = Verdict("unknown", "its holder file kept changing while it was being taken")
        raise WorkdirBusy(self._busy(holder, verdict, force))

    def _busy(self, holder: Optional[Holder], verdict: Verdict, force: bool) -> str:
        run = holder.run_id if holder and holder.run_id else ""
        if holder is None:
            who = "a holder whose file cannot be read"
        else:
            who = (f"run {run}: " if run else "") + holder.describe()
        why = verdict.why
        if self.slurm_said and verdict.state == "unknown":
            why += f": {self.slurm_said[-1]}"
        if holder is not None and why == f"pid {holder.pid} is running on {holder.host}":
            why = ""  # said by the description already
        ckpt = self.what != "workdir"
        lines = [f"{self.what} {self.workdir} is in use by {who}" + (f"; {why}." if why else "."),
                 "  Two runs training into one checkpoint directory would overwrite each other's checkpoints."
                 if ckpt else "  Two runs in one workdir would share its data shards and checkpoints."]
        if verdict.state == "alive":
            cancel = f"`lingjun-slurm cancel {run}`" if run else "cancelling it"
            other = "checkpoint.dir" if ckpt else "run.workdir"
            lines.append(f"  Wait for it to end, stop it ({cancel}), or give this spec another {other}"
                         + ("; --force never breaks a lock whose holder is alive." if force else "."))
        else:
            lines.append("  It cannot be checked from here. If you know it is over, submit again with --force "
                         "to break the lock.")
        lines.append(f"  lock file: {self.path}")
        return "\n".join(lines)

    def record_jobs(self, job_ids: Sequence[str]) -> None:
        """The chain's job ids so far (after each sbatch): from now on they hold the lock."""
        if self.lock.held is not None:
            self.lock.update(jobs=tuple(job_ids), purpose="Slurm chain")

    def release(self) -> None:
        self.lock.release()


def ckpt_lock_path(ckpt_dir: str) -> str:
    return f"{ckpt_dir.rstrip('/')}/{CKPT_LOCK_NAME}"


def checkpoint_dir_of(plan: object) -> Optional[str]:
    """The directory a chain trains into (plan.json's host_checkpoint_dir, as the submit host sees
    it) when it has a train or checkpoint stage; None otherwise (nothing of it to lock)."""
    if not isinstance(plan, dict):
        return None
    stages = plan.get("stages")
    kinds = {st.get("kind") for st in stages if isinstance(st, dict)} if isinstance(stages, list) else set()
    where = plan.get("host_checkpoint_dir") or plan.get("checkpoint_dir")
    return where if isinstance(where, str) and where and kinds & set(CKPT_STAGES) else None


def _plan_of(t: "Transport", run_dir: str) -> object:
    import json

    try:
        return json.loads(t.read_text(f"{run_dir.rstrip('/')}/plan.json"))
    except (OSError, ValueError, TransportError):
        return None


class RunLocks:
    """Every lock a run holds: its workdir's, and its checkpoint directory's when it trains
    (CKPT_LOCK_NAME). Taken in that order, all or none (WorkdirBusy names the holder of the first
    one that is held), recording the same job ids, released together."""

    def __init__(self, t: "Transport", workdir: str, run_id: str, run_dir: str,
                 ckpt_dir: Optional[str] = None) -> None:
        self.locks = [WorkdirLock(t, workdir, run_id, run_dir=run_dir)]
        if ckpt_dir:
            self.locks.append(WorkdirLock(t, ckpt_dir, run_id, what="checkpoint directory",
                                          path=ckpt_lock_path(ckpt_dir), run_dir=run_dir))

    @classmethod
    def of_run(cls, t: "Transport", run_dir: str, run_id: str) -> "RunLocks":
        """The locks of a rendered run (its plan.json says whether it trains, and where)."""
        return cls(t, workdir_of(run_dir), run_id, run_dir, checkpoint_dir_of(_plan_of(t, run_dir)))

    @property
    def workdir(self) -> WorkdirLock:
        return self.locks[0]

    @property
    def held(self) -> bool:
        return any(lock.held for lock in self.locks)

    def acquire(self, *, force: bool = False, same_run: bool = False) -> str:
        notes: list[str] = []
        taken: list[WorkdirLock] = []
        try:
            for lock in self.locks:
                note = lock.acquire(force=force, same_run=same_run)
                taken.append(lock)
                if note:
                    notes.append(note)
        except BaseException:
            for lock in taken:
                lock.release()
            raise
        return "\n".join(notes)

    def record_jobs(self, job_ids: Sequence[str]) -> None:
        for lock in self.locks:
            lock.record_jobs(job_ids)

    def release(self) -> None:
        for lock in reversed(self.locks):
            lock.release()


def runner_lock(run_dir: str, run_id: str) -> RunLocks:
    """The local runner's hold on its workdir (and checkpoint directory): taken over from the submit
    that started it (its parent) or already its own (foreground); a runner started by hand takes
    them, or refuses."""
    from ..transport.local import LocalTransport

    locks = RunLocks.of_run(LocalTransport(), run_dir, run_id)
    taken: list[WorkdirLock] = []
    try:
        for lock in locks.locks:
            holder = read_holder(lock.path)
            mine = (holder is not None and holder.run_id == run_id and holder.host == this_host()
                    and not holder.jobs and holder.pid in (os.getpid(), os.getppid()))
            if mine and holder is not None:
                lock.lock.adopt(holder)
                if holder.pid != os.getpid() or holder.purpose != "local runner":
                    lock.lock.update(pid=os.getpid(), start=process_start(os.getpid()) or "", since=time.time(),
                                     purpose="local runner")
            else:
                lock.lock.purpose = "local runner"
                lock.acquire()
            taken.append(lock)
    except BaseException:
        for lock in taken:
            lock.release()
        raise
    return locks


def release_if_over(t: "Transport", run_dir: str, run_id: str) -> bool:
    """Remove the run's locks (workdir, checkpoint directory) that this run holds and whose holder
    is surely gone (cancel). True when the workdir's was removed."""
    released = []
    for lock in RunLocks.of_run(t, run_dir, run_id).locks:
        holder, verdict = lock.lock.judge_current()
        if holder is None or holder.run_id != run_id or verdict.state != "stale":
            released.append(False)
            continue
        released.append(lock.lock.break_held(holder))
    return released[0]
