"""The local executor's job supervisor: one per job, so that a job never outlives its runner.

    python3 -m lingjun_slurm.executors.supervise --parent RUNNER_PID [--grace S] -- bash SCRIPT

The local runner starts it in a new session (it leads the job's process group) and it runs the
job's command in that same group, then exits with the command's status (a signal N as 128+N).
When the runner dies, by any signal including SIGKILL, the supervisor stops the whole group:
SIGTERM, then SIGKILL once S seconds passed with any process of the group still alive, the way
Slurm stops a job's processes (the stage scripts' TERM traps write their end markers).

It learns of the runner's death twice over:
- PR_SET_PDEATHSIG (prctl(2)): the kernel sends SIGTERM when the parent dies. The man page says
  the signal goes at the death of the parent THREAD that created this process, not of the whole
  parent process: the runner forks every supervisor from the one thread that runs its scheduling
  loop (LocalRunner.run), which lives as long as the jobs do. prctl(2) also says to check the
  parent afterwards, since it may have died before the call: `--parent` against getppid().
- getppid() polled every POLL_S seconds: another parent means the runner is gone (Linux without
  the prctl, a subreaper). The kernel reparents before it sends the death signal (kernel/exit.c,
  forget_original_parent), so a SIGTERM with the parent unchanged came from the runner's cancel
  (which signals the whole group) and is left to the job's own handling.

Standard library only (ctypes for prctl): it starts before any training code.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import Optional

from .childwait import wait_any
from .localstate import group_members

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 0.2
RUNNER_GONE_EXIT = 125  # the runner was already gone when the supervisor started: nothing ran


class RunnerGone(Exception):
    pass


def set_parent_death_signal(sig: int) -> bool:
    """prctl(PR_SET_PDEATHSIG, sig) through libc; False where there is no such call."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def stop_group(child: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the group, SIGKILL once grace_s passed with any member alive (this process too)."""
    pgid = os.getpgrp()
    me = os.getpid()
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        child.poll()
        if not group_members(pgid, exclude=me):
            return
        time.sleep(0.05)
    child.poll()
    if group_members(pgid, exclude=me):
        os.killpg(pgid, signal.SIGKILL)  # ends this supervisor as well: nobody waits for it any more


def supervise(parent: int, argv: list[str], grace_s: float) -> int:
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:
        return RUNNER_GONE_EXIT
    state = {"armed": False, "stopping": False}

    def on_signal(signum: int, _frame: Optional[FrameType]) -> None:
        # The runner's cancel signals the whole group, the job included: the job handles it and
        # its exit status is ours. A changed parent means this is the death signal.
        if state["armed"] and not state["stopping"] and os.getppid() != parent:
            raise RunnerGone()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    child = subprocess.Popen(argv)  # a death signal meanwhile is seen by the first getppid() below
    state["armed"] = True
    try:
        while True:
            if os.getppid() != parent:
                raise RunnerGone()
            rc = child.poll()
            if rc is not None:
                return 128 - rc if rc < 0 else rc
            wait_any([child.pid], POLL_S)  # wakes at the child's exit, else polls getppid()
    except RunnerGone:
        state["stopping"] = True
        try:
            print(f"lingjun-slurm: the local runner (pid {parent}) is gone: stopping this job", file=sys.stderr,
                  flush=True)
        except OSError:
            pass
        stop_group(child, grace_s)
        rc = child.wait()
        return 128 - rc if rc < 0 else rc


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="lingjun-slurm-supervise", description=__doc__.splitlines()[0])
    parser.add_argument("--parent", type=int, required=True, help="The runner's pid.")
    parser.add_argument("--grace", type=float, default=10.0, help="Seconds between SIGTERM and SIGKILL.")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the job's command after --")
    return supervise(args.parent, command, args.grace)


if __name__ == "__main__":
    sys.exit(main())
