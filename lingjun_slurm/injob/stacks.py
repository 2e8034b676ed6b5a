"""Python stack traces of a running task on SIGUSR2, for the hang watchdog (lingjun_slurm.injob.host.watchdog).

    from lingjun_slurm.injob import stacks; stacks.install()

With LINGJUN_STACKS_DIR set, install() opens <dir>/<node>-rank<R>-pid<P>.txt, writes one header
line and registers faulthandler for SIGUSR2 with all_threads=True: each SIGUSR2 appends the
traceback of every thread to that file. Without LINGJUN_STACKS_DIR it does nothing.

faulthandler's handler is a C signal handler: it dumps even while the main thread is blocked
inside a C call that never returns to the interpreter (an NCCL wait, a stuck CUDA sync), where
a Python-level signal handler would never run. Attaching a debugger (py-spy, gdb) from another
Slurm step is no alternative: ptrace across steps is blocked (Yama ptrace_scope, containers).

A Python handler that some code set for SIGUSR2 before install() is chained (called after the
dump); SIG_DFL is not (chaining to it would terminate the task). A task that has not called
install() yet is terminated by SIGUSR2 (its default action): the watchdog ends the step right
after anyway. Standard library only; never raises: a stacks directory that cannot be written
is one warning on stderr.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import time
from typing import IO, Optional

ENV = "LINGJUN_STACKS_DIR"
SIGNAL = signal.SIGUSR2

_file: Optional[IO[str]] = None  # kept open for the life of the process: faulthandler writes to its fd


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0] or "node"


def task_rank() -> str:
    for name in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return value
    return "x"


def file_name(node: str, rank: str, pid: int) -> str:
    """<node>-rank<R>-pid<P>.txt; the watchdog parses it back (watchdog.parse_stacks_name)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in node) or "node"
    return f"{safe}-rank{rank}-pid{pid}.txt"


def install(directory: Optional[str] = None) -> Optional[str]:
    """Register the SIGUSR2 dump; the file's path, or None when not enabled (or it failed)."""
    global _file
    directory = directory if directory is not None else os.environ.get(ENV, "")
    if not directory:
        return None
    if _file is not None and not _file.closed:  # already installed in this process
        return _file.name
    node, rank, pid = node_name(), task_rank(), os.getpid()
    path = os.path.join(directory, file_name(node, rank, pid))
    try:
        os.makedirs(directory, exist_ok=True)
        fh = open(path, "a", encoding="utf-8")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        fh.write(f"# lingjun-slurm stacks: node {node} rank {rank} pid {pid} since {stamp}; "
                 f"each SIGUSR2 appends every thread's traceback below\n")
        fh.flush()
        previous = signal.getsignal(SIGNAL)
        chain = callable(previous)  # a Python handler; not SIG_DFL / SIG_IGN / None (set outside Python)
        faulthandler.register(SIGNAL, file=fh, all_threads=True, chain=chain)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"lingjun-slurm: stacks: cannot record stack traces in {directory}: {exc}", file=sys.stderr, flush=True)
        return None
    _file = fh
    return path


def uninstall() -> None:
    """Undo install() (tests; a process that wants SIGUSR2 back)."""
    global _file
    if _file is None:
        return
    faulthandler.unregister(SIGNAL)
    _file.close()
    _file = None
