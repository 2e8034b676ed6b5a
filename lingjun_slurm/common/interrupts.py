"""SIGTERM and SIGHUP as Ctrl-C: while jobs are being queued or watched, a closed terminal or
SSH session, or a `kill`, must take the same path as Ctrl-C, which cancels what was queued.

And how an interrupted command ends: exit 130 for Ctrl-C, one line on stderr, no traceback."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Iterator, NoReturn, Optional

from .errors import EXIT_FAILURE, LingjunError


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within the block SIGTERM and SIGHUP raise KeyboardInterrupt (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: Optional[FrameType]) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


# Ctrl-C ends every command with 128 + SIGINT = 130, the status a shell gives a process that
# SIGINT killed (bash(1), EXIT STATUS: "128+n"), after one line on stderr and never a traceback.
# SIGTERM and SIGHUP take the same cancelling path (signals_interrupt) but keep exit 1: they are
# what `lingjun-slurm cancel` and a closed terminal send, and a cancelled run "did not complete".
EXIT_INTERRUPTED = 128 + signal.SIGINT


class Interrupted(LingjunError):
    """The command was interrupted: exit 130 for Ctrl-C (SIGINT), 1 for SIGTERM or SIGHUP."""

    def __init__(self, message: str, signame: str = "SIGINT") -> None:
        super().__init__(message)
        self.signame = signame
        self.exit_code = exit_code_for(signame)


def signal_name(exc: BaseException) -> str:
    """The signal behind a KeyboardInterrupt: signals_interrupt passes its name, a real Ctrl-C none."""
    if isinstance(exc, KeyboardInterrupt) and exc.args and isinstance(exc.args[0], str):
        return exc.args[0]
    return "SIGINT"


def exit_code_for(signame: str) -> int:
    return EXIT_INTERRUPTED if signame == "SIGINT" else EXIT_FAILURE


def describe(signame: str) -> str:
    return "Ctrl-C" if signame == "SIGINT" else signame


def interrupted_exit(exc: BaseException) -> NoReturn:
    """The CLI's end for a KeyboardInterrupt: one line on stderr, exit 130 (Ctrl-C) or 1."""
    import sys

    name = signal_name(exc)
    try:
        sys.stderr.write(f"lingjun-slurm: interrupted ({describe(name)})\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # the terminal is gone (SIGHUP)
        pass
    sys.exit(exit_code_for(name))
