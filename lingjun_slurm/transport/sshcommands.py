"""Remote commands over SSH: the command line handed to the login shell, and the exchange with
the program on its channel (stdin, stdout, stderr, the local end of the timeout).

Design notes (part of the SSH transport's; see ssh.py)

Commands
    The remote sshd hands the command line to the user's login shell (which must be POSIX-like:
    sh, bash, dash, zsh), so every word is quoted with shlex: `cd -- 'CWD' || exit 126; if
    command -v timeout >/dev/null 2>&1; then exec timeout -k 5 T env -- 'NAME=value' 'argv0'
    'arg'...; else exec env -- ...; fi` (see command_line()). Environment names are checked
    ([A-Za-z_][A-Za-z0-9_]*); values, arguments and paths are never interpreted by the shell.
    Values travel on that command line, so other users of the login node can read them in
    ps(1): never pass secrets in env. A relative cwd is `./CWD` (under the home; never a
    directory found through $CDPATH).
    stdin gets `input` then EOF; stdout and stderr are read by two threads (no deadlock on large
    outputs). The run's timeout (or command_timeout when the caller passes None; both None: no
    limit) is enforced on the remote by coreutils `timeout -k 5 T` when the remote has it
    (SIGTERM, SIGKILL 5 s later, exit 124 with the output so far); should no answer come
    LOCAL_GRACE_S after T (a hung connection, no `timeout` there), the program gets SIGTERM through
    an SSH "signal" request (best effort) and the channel is closed; exit 124 either way. A
    missing program is 127, a missing cwd 126, a command that ended without an exit status
    (killed by a signal) 255, like ssh(1). The PATH is what sshd gives a non-interactive
    session (plus whatever the login shell's rc files add for non-interactive shells).
    which() scans that PATH with a fixed `sh -c` script, the name passed as $1.
"""

from __future__ import annotations

import re
import shlex
import threading
import time
from typing import Callable, Mapping, Optional

import paramiko

from ..common.errors import UsageError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REMOTE_KILL_GRACE_S = 5  # timeout -k: SIGKILL this long after SIGTERM
LOCAL_GRACE_S = 10.0  # past the timeout, wait this long for the remote's own 124 before giving up on it
# which(): the first executable regular file named $1 on the PATH ($1 itself when it holds a /).
WHICH_SCRIPT = ('case $1 in */*) [ -f "$1" ] && [ -x "$1" ] && printf "%s\\n" "$1" && exit 0; exit 1;; esac; '
                'set -f; IFS=:; for d in $PATH; do [ -n "$d" ] || d=.; '
                'if [ -f "$d/$1" ] && [ -x "$d/$1" ]; then printf "%s\\n" "$d/$1"; exit 0; fi; done; exit 1')


def command_line(argv: tuple[str, ...], cwd: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None) -> str:
    """The remote command line for the login shell: every word quoted; `exec`, so the program
    replaces the shell; under coreutils' `timeout` when a timeout is given and it exists."""
    if not argv:
        raise UsageError("empty command")
    for name in env or {}:
        if not _ENV_NAME.match(name):
            raise UsageError(f"invalid environment variable name {name!r} for a remote command")
    words: list[str] = []
    if env:
        words += ["env", "--"] + [shlex.quote(f"{k}={v}") for k, v in env.items()]
    words += [shlex.quote(a) for a in argv]
    line = "exec " + " ".join(words)
    if timeout is not None:
        limited = f"exec timeout -k {REMOTE_KILL_GRACE_S} {max(timeout, 0.001):.3f} " + " ".join(words)
        line = f"if command -v timeout >/dev/null 2>&1; then {limited}; else {line}; fi"
    if cwd is not None:
        # ./ : a relative directory is the one under the home, never one found through $CDPATH
        # (cd would also print it, on the program's stdout).
        where = cwd if cwd.startswith("/") else f"./{cwd}"
        line = f"cd -- {shlex.quote(where)} || exit 126; {line}"
    return line


def send_signal(chan: paramiko.Channel, name: str) -> None:
    """Send an SSH "signal" request (RFC 4254 6.9). Best effort: OpenSSH's sshd honours it only
    with post-auth privilege separation, which it skips for root logins."""
    try:
        m = paramiko.Message()
        m.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
        m.add_int(chan.remote_chanid)
        m.add_string("signal")
        m.add_boolean(False)
        m.add_string(name)
        chan.transport._send_user_message(m)  # type: ignore[union-attr]
    except Exception:
        pass


def exchange(chan: paramiko.Channel, input: Optional[str], timeout: Optional[float]) -> tuple[bool, str, str]:
    """Talk to the program started on CHAN: send input then EOF, read stdout and stderr (two
    threads: no deadlock on large outputs) until its exit status arrives. Should none come
    LOCAL_GRACE_S after timeout (None: no limit), the program gets SIGTERM (best effort) and the
    channel is closed. Returns (timed out, stdout, stderr); the channel is left open otherwise."""
    out: list[bytes] = []
    err: list[bytes] = []

    def pump(recv: Callable[[int], bytes], sink: list[bytes]) -> None:
        try:
            while True:
                data = recv(1 << 16)
                if not data:
                    return
                sink.append(data)
        except Exception:
            return

    def feed() -> None:
        try:
            if input:
                chan.sendall(input.encode("utf-8"))
        except Exception:
            pass
        finally:
            try:
                chan.shutdown_write()
            except Exception:
                pass

    threads = [threading.Thread(target=pump, args=(chan.recv, out), daemon=True),
               threading.Thread(target=pump, args=(chan.recv_stderr, err), daemon=True),
               threading.Thread(target=feed, daemon=True)]
    for th in threads:
        th.start()
    deadline = None if timeout is None else time.monotonic() + timeout + LOCAL_GRACE_S
    timed_out = False
    for th in threads[:2]:
        th.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if th.is_alive():
            timed_out = True
            break
    if not timed_out:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not chan.status_event.wait(remaining):
            timed_out = True
    if timed_out:
        send_signal(chan, "TERM")
        chan.close()
        for th in threads:
            th.join(1.0)
    return timed_out, _text(out), _text(err)


def _text(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode("utf-8", errors="replace")
