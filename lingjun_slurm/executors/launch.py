"""The local executor's srun: start N tasks of one command on this machine.

    python3 -m lingjun_slurm.executors.launch --ntasks N [--kill-on-bad-exit] -- CMD...

Each task gets what srun gives a task: SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS,
SLURM_STEP_NUM_TASKS. SIGTERM/SIGINT/SIGUSR2 are forwarded to every task; what the tasks leave behind is cleaned up by the
local runner, which stops the job's whole process group when the job ends. The exit status is the
first non-zero task status (a signal N becomes 128+N); with --kill-on-bad-exit the other
tasks are terminated as soon as one fails, as `srun --kill-on-bad-exit=1` does.
Standard library only: it runs before any training code.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import Optional

from .childwait import wait_any


def _status(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def launch(ntasks: int, argv: list[str], kill_on_bad_exit: bool = False, grace_s: float = 10.0) -> int:
    procs: list[subprocess.Popen[bytes]] = []
    for rank in range(ntasks):
        env = {**os.environ, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
               "SLURM_NTASKS": str(ntasks), "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_STEP_NUM_NODES": "1"}
        # Tasks stay in the job's process group: whoever stops the job (the local runner, Ctrl-C)
        # reaches them and everything they started, as Slurm's process tracking does.
        procs.append(subprocess.Popen(argv, env=env))

    def signal_all(signum: int) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    def forward(signum: int, _frame: Optional[FrameType]) -> None:
        signal_all(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGUSR2, forward)  # the hang watchdog's "dump your stacks" (lingjun_slurm.injob.stacks), as srun does
    first_bad = 0
    killed_at: Optional[float] = None
    while True:
        running = [p for p in procs if p.poll() is None]
        for p in procs:
            rc = p.returncode
            if rc is not None and rc != 0 and first_bad == 0:
                first_bad = _status(rc)
                print(f"lingjun-slurm launch: task {procs.index(p)} exited with {first_bad}", file=sys.stderr)
        if not running:
            return first_bad
        if first_bad and kill_on_bad_exit:
            if killed_at is None:
                killed_at = time.monotonic()
                signal_all(signal.SIGTERM)
            elif time.monotonic() - killed_at > grace_s:
                signal_all(signal.SIGKILL)
        wait_any([p.pid for p in running], 0.05)  # returns at a task's exit


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="lingjun-slurm-launch", description=__doc__.splitlines()[0])
    parser.add_argument("--ntasks", type=int, default=1)
    parser.add_argument("--kill-on-bad-exit", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.ntasks < 1:
        parser.error("give --ntasks N >= 1 and a command after --")
    return launch(args.ntasks, command, args.kill_on_bad_exit)


if __name__ == "__main__":
    sys.exit(main())
