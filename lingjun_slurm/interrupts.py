"""SIGTERM and SIGHUP as Ctrl-C: while jobs are being queued or watched, a closed terminal or
SSH session, or a `kill`, must take the same path as Ctrl-C, which cancels what was queued."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Iterator, Optional


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
