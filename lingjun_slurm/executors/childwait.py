"""Wait for child processes to exit without a polling lag.

`wait_any(pids, timeout)` returns as soon as one of the given children has exited (it is then a
zombie until the caller's `Popen.poll()` reaps it), or after `timeout` seconds. It selects on a
pidfd per child: pidfd_open(2) (Linux 5.3+) gives a file descriptor that becomes readable when
the process terminates (waited for with poll(2)). Where there is none (an older kernel), it sleeps for `timeout`, which is
what the callers did before. Signals interrupt it the way they interrupt time.sleep: a handler that
raises ends the wait, one that returns lets it go on (PEP 475).

Standard library only: the local runner, the job supervisor and the srun stand-in import it.
"""

from __future__ import annotations

import os
import select
import time
from typing import Iterable


def wait_any(pids: Iterable[int], timeout: float) -> None:
    fds: list[int] = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                return  # already reaped by someone: let the caller's poll() see it now
            except (AttributeError, OSError):
                break  # no pidfd_open here: fall back to sleeping
        else:
            if fds:
                poller = select.poll()  # not select.select: it cannot take fd numbers >= 1024
                for fd in fds:
                    poller.register(fd, select.POLLIN)
                poller.poll(max(0, int(timeout * 1000)))
                return
        time.sleep(timeout)
    finally:
        for fd in fds:
            os.close(fd)
