"""The write guard of the test session (tests/hermetic.py): a Python audit hook (PEP 578,
sys.addaudithook) that refuses a write to a guarded real path and records it.

It runs in the pytest process itself and, as the `sitecustomize` module of a directory the session
puts in front of PYTHONPATH, in every Python process the tests start that keeps the session's
environment: the CLI, the local executor's runner and jobs, stage processes, the watchdog. A
write by such a process is attributed to the session with certainty (the process's own audit
event: CPython's "open" with its flags, "os.mkdir", "os.rename" (os.replace too), "os.remove",
"shutil.rmtree", ... as listed in the audit events table, docs.python.org/3.11/library/audit_events.html),
so another terminal of the same user writing the same paths meanwhile can never fail a test.

Standard library only, no import beyond os and sys at load: it is every child Python's
sitecustomize, and some tests count the modules a fresh CLI imports.

    LINGJUN_TEST_GUARDED  the guarded roots, os.pathsep-separated
    LINGJUN_TEST_GUARD_LOG  the file each refused write is appended to: "<pid> <event> <path>"
"""

import os
import sys

GUARDED_ENV = "LINGJUN_TEST_GUARDED"
LOG_ENV = "LINGJUN_TEST_GUARD_LOG"
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# event -> the positions of its path arguments and, for each, the position of its dir_fd (or None).
_EVENTS = {
    "os.mkdir": ((0, 2),), "os.rename": ((0, 2), (1, 3)), "os.remove": ((0, 1),), "os.rmdir": ((0, 1),),
    "os.symlink": ((1, 2),), "os.link": ((1, 3),), "os.truncate": ((0, None),), "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.mkfifo": ((0, 2),), "os.mknod": ((0, 3),),
    "shutil.rmtree": ((0, 1),), "shutil.copyfile": ((1, None),), "shutil.copytree": ((1, None),),
    "shutil.move": ((0, None), (1, None)), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),),
}


def _resolve(path, dir_fd):  # type: ignore[no-untyped-def]
    if isinstance(path, int):
        return None  # an open descriptor: its open was checked
    try:
        text = os.fsdecode(path)
    except TypeError:
        return None
    if not os.path.isabs(text):
        base = os.getcwd()
        if isinstance(dir_fd, int) and dir_fd >= 0:
            try:
                base = os.readlink(f"/proc/self/fd/{dir_fd}")
            except OSError:
                return None
        text = os.path.join(base, text)
    return os.path.normpath(text)


def install(roots, log):  # type: ignore[no-untyped-def]
    """Guard `roots` (absolute paths) in this process; refused writes are appended to `log`."""
    roots = tuple(os.path.normpath(r) for r in roots if r)
    events = frozenset(_EVENTS) | {"open"}

    def under(path):  # type: ignore[no-untyped-def]
        for candidate in (path, os.path.realpath(path)):
            for root in roots:
                if candidate == root or candidate.startswith(root + "/"):
                    return True
        return False

    def hook(event, args):  # type: ignore[no-untyped-def]
        if event not in events:
            return
        if event == "open":
            if len(args) < 3 or not isinstance(args[2], int) or not args[2] & _WRITE_FLAGS:
                return
            places = ((0, None),)
        else:
            places = _EVENTS[event]
        # (The log's own open below raises an "open" event too: the log is never under a root.)
        for at, fd_at in places:
            if at >= len(args):
                continue
            path = _resolve(args[at], args[fd_at] if fd_at is not None and fd_at < len(args) else None)
            if path is None or not under(path):
                continue
            line = f"{os.getpid()} {event} {path}\n".encode("utf-8", "replace")
            try:
                fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
            except OSError:
                pass
            raise PermissionError(13, f"tests/hermetic.py: a test may not write the user's real path ({event})", path)

    sys.addaudithook(hook)


def install_from_environment():  # type: ignore[no-untyped-def]
    roots = os.environ.get(GUARDED_ENV)
    log = os.environ.get(LOG_ENV)
    if roots and log:
        install(roots.split(os.pathsep), log)
