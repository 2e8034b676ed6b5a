"""The SSH transport: commands and files on a remote login node, over one paramiko connection.

Design notes (docs/remote.md summarises them for users). The notes on the parts that live in
modules of their own are in those modules' docstrings:
    sshconfig.py    Target and configuration (ssh_config, Include, ProxyJump chains)
    sshconnect.py   Keys, Host keys, Connecting (and its errors: exit codes 3, 4, 5)
    sshcommands.py  Commands (quoting for the login shell, timeouts, exit statuses, which())
    sshfiles.py     the SFTP building blocks of the file operations below

Connection
    Opened lazily on first use (by sshconnect.py: its timeouts, keepalives and errors are described
    there); one paramiko Transport plus one SFTP session serve every command and file operation
    until close() (a connection found dead before an operation is reopened). Opening a channel
    and the requests paramiko would wait on for ever (exec, the sftp subsystem, SFTP's version
    exchange) are bounded by max(connect_timeout, 10 s). A connection lost during a command or a
    file operation -> TransportError (1) naming what ran.

Files (over the one SFTP session)
    `~` and `~/...` are expanded to the remote home (SFTP's normalize('.'), asked once);
    relative paths are relative to the home, as for commands. write_atomic and put write
    `.NAME.tmp.<random>` beside the target (created exclusively, mode 0600), chmod it, then
    posix-rename@openssh.com over the target (a server without that extension gets remove +
    rename: not atomic). put streams 1 MiB local reads as pipelined 32 KiB writes; get reads
    2 MiB windows of pipelined 32 KiB requests (paramiko's getfo keeps whatever arrives faster
    than it is written, up to the whole file) into a local temp file it then renames; neither
    holds the file in memory. No fsync on the remote. Each SFTP request is bounded by
    command_timeout. mkdir creates
    parents; exist_ok=False relies on the server's mkdir failing on an existing directory, so of
    two racing callers exactly one wins. follow() keeps one remote file handle open and polls it.

Lock
    lock(path) runs `flock -x -E 75 -w TIMEOUT PATH sh -c 'echo locked; exec cat >/dev/null'`
    on a channel of its own: the lock is held while that channel lives and released by closing
    its stdin (or when the connection dies: sshd closes the pipe). It excludes other holders on
    any host whose filesystem honours flock (local disks; NFSv4 maps it to POSIX locks; Lustre
    needs the `flock` mount option) and interoperates with the local transport's flock. It needs
    flock (util-linux) on the remote. A holder whose connection drops loses the lock; its next
    operation inside the with-block fails (TransportError) instead of reconnecting.

Not supported (yet)
    /etc/ssh/ssh_config, Match exec (needs the invoke package), CheckHostIP, ServerAliveCountMax
    (keepalives are sent, missing replies are not counted), host and user certificates,
    ControlMaster, ForwardAgent, passwords and keyboard-interactive. No reconnect in the middle of
    an operation: it fails (TransportError) and the next operation reconnects.

Logging
    Nothing secret is logged or put in messages: key files are named, key material and
    passphrases never. paramiko's logger is silenced (and gets a NullHandler, so its
    thread's tracebacks never reach the terminal) unless LINGJUN_DEBUG is set.
"""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import secrets
import shlex
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping, Optional

import paramiko

from ..common.errors import TransportError
from . import sshcommands, sshfiles
from .base import Transport
from .sshconfig import Endpoint, SSHConfigFile, expand_path
from .sshconnect import DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEEPALIVE_S, SSHConnector
from .target import parse_target

log = logging.getLogger("lingjun_slurm.ssh")

_paramiko_log = logging.getLogger("paramiko")
_paramiko_log.addHandler(logging.NullHandler())
if not os.environ.get("LINGJUN_DEBUG"):
    _paramiko_log.setLevel(logging.CRITICAL + 10)

DEFAULT_COMMAND_TIMEOUT = 120.0
_LOCK_TIMEOUT_RC = 75

# read_dir_files in one remote command (not one SFTP open+read+close per file: a 1,024-task
# array's markers). Output: a line "HEX(name) HEX(first max_bytes bytes)" per regular file whose
# name starts with the prefix, sorted by name, then "END": hex, so a name or a content with
# newlines, spaces, quotes or bytes that are not UTF-8 cannot break the record; "END" tells a
# complete answer from one cut short. python3 (any 3.5+; no f-strings) opens each file
# O_NONBLOCK and keeps it only when fstat says regular file, so a FIFO never blocks; without
# python3 the POSIX shell loop below does the same with od(1) and dd(1) (`[ -f ]` then dd: a file
# swapped for a FIFO in between would block, until the command's timeout). Arguments: $1 the
# directory, $2 the prefix (a quoted pattern word: its *?[ match literally), $3 max_bytes,
# $4 the python source. Missing directory or not a directory: just "END".
_READ_DIR_PY = """import os, stat, sys
d, p, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
w = sys.stdout.write
try:
    names = sorted(os.listdir(d))
except OSError as e:
    if e.errno not in (2, 20):
        sys.stderr.write("cannot list %s: %s\\n" % (d, e.strerror))
        sys.exit(2)
    names = []
for x in names:
    if not x.startswith(p):
        continue
    try:
        fd = os.open(os.path.join(d, x), os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        continue
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            continue
        b = b""
        while len(b) < n:
            c = os.read(fd, n - len(b))
            if not c:
                break
            b += c
    except OSError:
        continue
    finally:
        os.close(fd)
    w(os.fsencode(x).hex() + " " + b.hex() + "\\n")
w("END\\n")
"""
_READ_DIR_SH = (
    'd=$1 p=$2 n=$3; '
    'if command -v python3 >/dev/null 2>&1; then exec python3 -c "$4" "$d" "$p" "$n"; fi; '
    'if [ ! -d "$d" ]; then echo END; exit 0; fi; '
    'cd -- "$d" || exit 2; '
    "hx() { od -An -v -tx1 | tr -d ' \\t\\n'; }; "
    'set -- ./"$p"*; [ -n "$p" ] || set -- "$@" ./.*; '
    'for f do if [ ! -f "$f" ] || [ ! -r "$f" ]; then continue; fi; '
    'printf %s "${f#./}" | hx; printf " "; dd if="$f" bs="$n" count=1 2>/dev/null | hx; printf "\\n"; done; '
    'echo END')


class SSHTransport(Transport):
    """Commands and files on `target` over SSH (see the module docstring)."""

    kind = "ssh"

    def __init__(self, target: str, *, accept_new_host_key: bool = False, ssh_config: Optional[Path] = None,
                 known_hosts: Optional[Path] = None, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 keepalive_s: int = DEFAULT_KEEPALIVE_S,
                 command_timeout: Optional[float] = DEFAULT_COMMAND_TIMEOUT) -> None:
        super().__init__()
        parse_target(target)  # validate now: UsageError before anything connects
        self._target = target
        config_path = ssh_config or os.environ.get("LINGJUN_SSH_CONFIG") or "~/.ssh/config"
        self._ssh_config = SSHConfigFile(expand_path(str(config_path)))
        kh = known_hosts or os.environ.get("LINGJUN_KNOWN_HOSTS")
        self._connector = SSHConnector(self._ssh_config.path, known_hosts=expand_path(str(kh)) if kh else None,
                                       accept_new_host_key=accept_new_host_key,
                                       connect_timeout=connect_timeout, keepalive_s=keepalive_s)
        self.command_timeout = command_timeout
        self._lock = threading.RLock()
        self._t: Optional[paramiko.Transport] = None
        self._sftp: Optional[paramiko.SFTPClient] = None
        self._hops: list[paramiko.Transport] = []
        self._home: Optional[str] = None
        self._endpoint: Optional[Endpoint] = None
        self._locks_held: list[str] = []  # lock() paths whose with-block is running

    # --- identity -----------------------------------------------------------------------
    @property
    def host(self) -> str:
        return self._target

    def __repr__(self) -> str:
        return f"SSHTransport({self._target!r})"

    # --- settings (the connector's, which connects with them) --------------------------------
    @property
    def ssh_config_path(self) -> Path:
        return self._ssh_config.path

    @property
    def accept_new_host_key(self) -> bool:
        return self._connector.accept_new_host_key

    @accept_new_host_key.setter
    def accept_new_host_key(self, value: bool) -> None:
        self._connector.accept_new_host_key = value

    @property
    def connect_timeout(self) -> float:
        return self._connector.connect_timeout

    @connect_timeout.setter
    def connect_timeout(self, value: float) -> None:
        self._connector.connect_timeout = value

    @property
    def keepalive_s(self) -> int:
        return self._connector.keepalive_s

    @keepalive_s.setter
    def keepalive_s(self, value: int) -> None:
        self._connector.keepalive_s = value

    @property
    def connections(self) -> int:
        """SSH connections opened (hops included): tests count them."""
        return self._connector.connections

    # --- ssh_config ---------------------------------------------------------------------------
    def _resolve(self, target: str) -> Endpoint:
        return self._ssh_config.resolve(target, origin=self._target)

    # --- connecting -------------------------------------------------------------------------
    def _timeout_for(self, ep: Endpoint) -> float:
        return self._connector.timeout_for(ep)

    def _ensure(self) -> paramiko.Transport:
        with self._lock:
            if self._t is not None and self._t.is_active():
                return self._t
            if self._t is not None:
                if self._locks_held:
                    raise TransportError(f"connection to {self.where} lost while holding the lock "
                                         f"{self._locks_held[-1]} there; the lock is released, so not reconnecting")
                log.debug("connection to %s found closed; reconnecting", self._target)
                self._close_connection()
            if self._endpoint is None:
                self._endpoint = self._resolve(self._target)
            hops: list[paramiko.Transport] = []
            try:
                self._t = self._connector.connect(self._endpoint, hops)
            except BaseException:
                for t in reversed(hops):
                    t.close()
                raise
            self._hops = hops[:-1]
            return self._t

    def _sftp_client(self) -> paramiko.SFTPClient:
        with self._lock:
            self._ensure()
            if self._sftp is None or self._sftp.get_channel() is None or self._sftp.get_channel().closed:
                # Not SFTPClient.from_transport: its channel open, subsystem request and version
                # exchange wait without a limit (an hour, or for ever) on a server that hangs, as
                # one does whose home directory is on a hung NFS server.
                self._sftp = None
                limit = self._answer_limit()
                chan = self._open_session()
                try:
                    self._bounded(chan, limit, "the sftp subsystem request", lambda: chan.invoke_subsystem("sftp"))
                    chan.settimeout(limit)
                    sftp = paramiko.SFTPClient(chan)
                except TransportError:
                    chan.close()
                    raise
                except (socket.timeout, TimeoutError):
                    chan.close()
                    raise TransportError(f"cannot start SFTP on {self.where}: no answer within {limit:g} s") from None
                except (paramiko.SSHException, EOFError, OSError) as exc:
                    chan.close()
                    raise TransportError(f"cannot start SFTP on {self.where}: {exc or type(exc).__name__} "
                                         f"(is the sftp subsystem enabled there?)") from None
                chan.settimeout(self.command_timeout or None)
                self._sftp = sftp
                self._home = None
            return self._sftp

    def _answer_limit(self) -> float:
        """How long to wait for the server to answer a channel request (connect_timeout, at least 10 s)."""
        return max(self._timeout_for(self._endpoint) if self._endpoint else self.connect_timeout, 10.0)

    def _bounded(self, chan: paramiko.Channel, seconds: float, what: str, request: Callable[[], object]) -> None:
        """Run a channel request (exec, subsystem) that paramiko would wait on without a limit: close
        the channel (which wakes the waiter) when the server has not answered within seconds."""
        fired = threading.Event()

        def expire() -> None:
            fired.set()
            chan.close()

        timer = threading.Timer(seconds, expire)
        timer.daemon = True
        timer.start()
        try:
            request()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if fired.is_set():
                raise TransportError(f"{self.where} did not answer {what} within {seconds:g} s") from None
            t = chan.get_transport()
            if t is None or not t.is_active():
                raise TransportError(f"connection to {self.where} lost during {what}") from None
            raise TransportError(f"{what} failed on {self.where}: {exc or type(exc).__name__}") from None
        finally:
            timer.cancel()
        if fired.is_set():
            raise TransportError(f"{self.where} did not answer {what} within {seconds:g} s")

    def connect(self) -> "SSHTransport":
        """Connect now (otherwise the first command or file operation does)."""
        self._ensure()
        return self

    @property
    def where(self) -> str:
        if self._endpoint is None:
            self._endpoint = self._resolve(self._target)
        return self._endpoint.where

    def _close_connection(self) -> None:
        if self._sftp is not None:
            try:
                self._sftp.close()
            except Exception:
                pass
        if self._t is not None:
            self._t.close()
        for t in reversed(self._hops):
            t.close()
        self._sftp, self._t, self._hops, self._home = None, None, [], None

    def close(self) -> None:
        with self._lock:
            self._close_connection()

    # --- commands ---------------------------------------------------------------------------
    command_line = staticmethod(sshcommands.command_line)

    def _open_session(self) -> paramiko.Channel:
        t = self._ensure()
        limit = self._answer_limit()
        try:
            return t.open_session(timeout=limit)
        except paramiko.ChannelException as exc:
            raise TransportError(f"{self.where} refused a new session ({exc.text or exc.code}; MaxSessions?)") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if t.is_active():
                raise TransportError(f"{self.where} did not open a session within {limit:g} s "
                                     f"({exc or type(exc).__name__})") from None
            raise TransportError(f"connection to {self.where} lost: {exc or type(exc).__name__}") from None

    def _run(self, argv: tuple[str, ...], *, cwd: Optional[str], env: Optional[Mapping[str, str]],
             input: Optional[str], timeout: Optional[float]) -> tuple[int, str, str]:
        if timeout is None:
            timeout = self.command_timeout
        line = self.command_line(argv, self._path(cwd) if cwd is not None else None, env, timeout)
        chan = self._open_session()
        started = time.monotonic()
        what = shlex.join(argv)
        try:
            self._bounded(chan, self._answer_limit(), f"the request to run {what}", lambda: chan.exec_command(line))
        except TransportError:
            chan.close()
            raise
        timed_out, out, err = sshcommands.exchange(chan, input, timeout)

        def with_note(note: str) -> str:
            return f"{err}{'' if not err or err.endswith(chr(10)) else chr(10)}{note}"

        if timed_out:
            return 124, out, with_note(f"{argv[0]}: timed out after {timeout:g} s on {self.where}")
        rc = chan.exit_status
        chan.close()
        t = self._t
        if rc == -1 and (t is None or not t.is_active()):
            raise TransportError(f"connection to {self.where} lost while running: {what}")
        # timeout(1) exits 124, or, when the program outlived SIGTERM and took the SIGKILL, kills
        # itself with that signal (no exit status: -1) or exits 137.
        if rc in (124, 137, -1) and timeout is not None and time.monotonic() - started >= timeout:
            return 124, out, with_note(f"{argv[0]}: timed out after {timeout:g} s on {self.where}")
        if rc == -1:
            return 255, out, with_note(f"{argv[0]}: ended without an exit status (killed by a signal?)")
        return rc, out, err

    def which(self, program: str) -> Optional[str]:
        if not program or any(c in program for c in "\0\n\r"):
            return None
        result = self.run(["sh", "-c", sshcommands.WHICH_SCRIPT, "sh", program])
        found = result.stdout.strip()
        return found if result.returncode == 0 and found else None

    # --- files ------------------------------------------------------------------------------
    def home(self) -> str:
        """The remote home directory (SFTP's normalize('.'))."""
        sftp = self._sftp_client()
        if self._home is None:
            with self._sftp_errors("resolve the home directory", "~"):
                self._home = sftp.normalize(".")
        return self._home

    def _path(self, path: str) -> str:
        path = str(path)
        if path == "~" or path.startswith("~/"):
            return self.home() + path[1:]
        return path

    @contextmanager
    def _sftp_errors(self, what: str, path: str) -> Iterator[None]:
        try:
            yield
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, f"no such file or directory on {self.where}", path) from None
        except FileExistsError:
            raise
        except (socket.timeout, TimeoutError):
            self._drop_sftp()  # a late answer would confuse the next request: start a fresh session
            within = f"no answer within {self.command_timeout:g} s" if self.command_timeout else "timed out"
            raise TransportError(f"cannot {what} {path} on {self.where}: {within}") from None
        except paramiko.SFTPError as exc:  # a malformed answer ("Expected handle"...): not an OSError
            self._drop_sftp()
            raise TransportError(f"cannot {what} {path} on {self.where}: SFTP protocol error "
                                 f"({exc or type(exc).__name__})") from None
        except (paramiko.SSHException, EOFError, ConnectionError) as exc:
            if self._t is not None and self._t.is_active() and not isinstance(exc, EOFError):
                raise TransportError(f"cannot {what} {path} on {self.where}: {exc or type(exc).__name__}") from None
            raise TransportError(f"connection to {self.where} lost during: {what} {path}") from None
        except OSError as exc:
            if self._t is None or not self._t.is_active():
                raise TransportError(f"connection to {self.where} lost during: {what} {path}") from None
            raise TransportError(f"cannot {what} {path} on {self.where}: {exc.strerror or exc}") from None

    def _drop_sftp(self) -> None:
        with self._lock:
            if self._sftp is not None:
                try:
                    self._sftp.close()
                except Exception:
                    pass
                self._sftp = None

    def read_bytes(self, path: str) -> bytes:
        sftp = self._sftp_client()
        p = self._path(path)
        with self._sftp_errors("read", path):
            with sftp.open(p, "rb") as fh:
                fh.prefetch()
                return fh.read()

    def exists(self, path: str) -> bool:
        sftp = self._sftp_client()
        p = self._path(path)
        with self._sftp_errors("stat", path):
            return sshfiles.stat_or_none(sftp, p) is not None

    def listdir(self, path: str) -> list[str]:
        sftp = self._sftp_client()
        p = self._path(path)
        with self._sftp_errors("list", path):
            try:
                return sorted(sftp.listdir(p))
            except FileNotFoundError:
                return []
            except OSError as exc:
                if sshfiles.no_answer(exc):
                    raise
                st = sshfiles.stat(sftp, p)
                if st is None or not sshfiles.is_dir(st):
                    return []
                raise

    def mkdir(self, path: str, mode: int = 0o755, exist_ok: bool = True) -> None:
        sftp = self._sftp_client()
        p = self._path(path).rstrip("/") or "/"
        with self._sftp_errors("create directory", path):
            if exist_ok:
                sshfiles.makedirs(sftp, p, mode, self.where)
                return
            parent = posixpath.dirname(p)
            if parent and parent != p:
                sshfiles.makedirs(sftp, parent, mode, self.where)
            try:
                sftp.mkdir(p, mode)
            except OSError as exc:
                if sshfiles.no_answer(exc):
                    raise  # it may have been created by this very request: not "someone else's"
                if sshfiles.stat(sftp, p) is not None:
                    raise FileExistsError(errno.EEXIST, f"{path} exists on {self.where}", path) from None
                raise exc

    def rename_new(self, src: str, dst: str) -> None:
        """SFTP rename on the host (OpenSSH's sftp-server: rename(2) for a directory), after a stat
        that dst is absent: rename(2) would replace an empty directory dst."""
        sftp = self._sftp_client()
        a, b = self._path(src), self._path(dst)
        with self._sftp_errors("rename", f"{src} to {dst}"):
            if sshfiles.stat_or_none(sftp, b) is not None:
                raise FileExistsError(errno.EEXIST, f"{dst} exists on {self.where}", dst)
            sftp.rename(a, b)

    def remove_tree(self, path: str) -> None:
        sftp = self._sftp_client()
        root = self._path(path)
        with self._sftp_errors("remove", path):
            st = sshfiles.stat_or_none(sftp, root)
            if st is None:
                return
            stack, dirs = [root], []
            while stack:
                d = stack.pop()
                dirs.append(d)
                for attr in sftp.listdir_attr(d):
                    child = posixpath.join(d, attr.filename)
                    if sshfiles.is_dir(attr):
                        stack.append(child)
                    else:
                        sftp.remove(child)
            for d in reversed(dirs):
                sftp.rmdir(d)

    def _write_via_tmp(self, path: str, mode: int, write: Callable[[IO[bytes]], None], what: str) -> None:
        sftp = self._sftp_client()
        p = self._path(path)
        tmp = sshfiles.tmp_beside(p)
        created = False
        try:
            with self._sftp_errors(what, path):
                try:
                    fh = sshfiles.open_new(sftp, tmp)
                except FileNotFoundError:
                    raise TransportError(f"cannot {what} {path} on {self.where}: "
                                         f"no directory {posixpath.dirname(p) or '.'}") from None
                created = True
                with fh:
                    fh.set_pipelined(True)
                    write(fh)  # type: ignore[arg-type]
                sftp.chmod(tmp, mode)
                sshfiles.replace(sftp, tmp, p)
                created = False
        finally:
            if created:
                try:
                    sftp.remove(tmp)
                except Exception:
                    pass

    def write_atomic(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        raw = data.encode("utf-8") if isinstance(data, str) else data

        def write(fh: IO[bytes]) -> None:
            for i in range(0, len(raw), 1 << 20):
                fh.write(raw[i:i + (1 << 20)])

        self._write_via_tmp(path, mode, write, "write")

    def put(self, local: Path, remote: str, mode: Optional[int] = None) -> None:
        local = Path(local)
        try:
            src = open(local, "rb")
        except OSError as exc:
            raise TransportError(f"cannot read {local}: {exc.strerror}") from None
        with src:
            if mode is None:
                mode = os.fstat(src.fileno()).st_mode & 0o777

            def write(fh: IO[bytes]) -> None:
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        return
                    fh.write(chunk)

            self._write_via_tmp(remote, mode, write, "upload to")

    def get(self, remote: str, local: Path) -> None:
        sftp = self._sftp_client()
        p = self._path(remote)
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.tmp.{secrets.token_hex(6)}")
        try:
            with self._sftp_errors("download", remote):
                with sftp.open(p, "rb") as fh, open(tmp, "wb") as out:
                    sshfiles.copy_out(fh, out)
            tmp.replace(local)
        finally:
            tmp.unlink(missing_ok=True)

    def size(self, path: str) -> Optional[int]:
        sftp = self._sftp_client()
        p = self._path(path)
        with self._sftp_errors("stat", path):
            st = sshfiles.stat_or_none(sftp, p)
        return None if st is None else st.st_size

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        sftp = self._sftp_client()
        p = self._path(path)
        with self._sftp_errors("read", path):
            try:
                with sftp.open(p, "rb") as fh:
                    fh.seek(offset)
                    return fh.read(length)
            except FileNotFoundError:
                return b""

    def read_dir_files(self, path: str, prefix: str = "", max_bytes: int = 1 << 16) -> dict[str, bytes]:
        """One remote command (_READ_DIR_SH: python3, else a shell loop) for the whole directory,
        whatever the number of files; where it fails (no answer ending in END, a line that is not
        the format), the base's SFTP reads, one per file. A connection lost is TransportError."""
        p = self._path(path)
        result = self.run(["sh", "-c", _READ_DIR_SH, "sh", p, prefix, str(max(0, int(max_bytes))), _READ_DIR_PY])
        parsed = parse_dir_records(result.stdout, prefix, max_bytes) if result.returncode == 0 else None
        if parsed is None:
            log.debug("read_dir_files %s: one-command read failed (exit %s: %s); reading file by file",
                      path, result.returncode, result.stderr.strip()[:200])
            return super().read_dir_files(path, prefix, max_bytes)
        return parsed

    @contextmanager
    def _range_reader(self, path: str) -> Iterator[Callable[[int, int], bytes]]:
        """follow() keeps one remote handle open (opened once the file exists): a read per poll."""
        sftp = self._sftp_client()
        p = self._path(path)
        fh: Optional[paramiko.SFTPFile] = None

        def read(offset: int, length: int) -> bytes:
            nonlocal fh
            with self._sftp_errors("read", path):
                if fh is None:
                    try:
                        fh = sftp.open(p, "rb")
                    except FileNotFoundError:
                        return b""
                fh.seek(offset)
                return fh.read(length)

        try:
            yield read
        finally:
            if fh is not None:
                try:
                    fh.close()
                except Exception:
                    pass

    @contextmanager
    def lock(self, path: str, timeout: float = 60.0) -> Iterator[None]:
        p = self._path(path)
        parent = posixpath.dirname(p)
        if parent:
            self.mkdir(parent)
        # `--`: a relative path starting with '-' is the lock file, not one of flock's options.
        argv = ("flock", "-x", "-E", str(_LOCK_TIMEOUT_RC), "-w", f"{max(timeout, 0):g}", "--", p,
                "sh", "-c", "echo locked; exec cat >/dev/null")
        self.history.append(argv)
        chan = self._open_session()
        try:
            self._bounded(chan, self._answer_limit(), f"the request to lock {path}",
                          lambda: chan.exec_command(self.command_line(argv)))
            chan.settimeout(timeout + self._timeout_for(self._endpoint) + 5 if self._endpoint else timeout + 20)
            got = b""
            try:
                while b"locked\n" not in got:
                    data = chan.recv(64)
                    if not data:
                        break
                    got += data
            except socket.timeout:
                raise TransportError(f"timed out after {timeout:g} s waiting for the lock {path} on "
                                     f"{self.where} (no answer)") from None
            if b"locked\n" not in got:
                if self._t is None or not self._t.is_active():
                    raise TransportError(f"connection to {self.where} lost while waiting for the lock {path}")
                chan.settimeout(5)
                rc = chan.recv_exit_status() if chan.status_event.wait(5) else -1
                try:
                    err = chan.recv_stderr(4096).decode(errors="replace").strip()
                except Exception:
                    err = ""
                if rc == _LOCK_TIMEOUT_RC:
                    raise TransportError(f"timed out after {timeout:g} s waiting for the lock {path} on {self.where}")
                if rc == 127:
                    raise TransportError(f"cannot lock {path} on {self.where}: flock (util-linux) is not installed there")
                raise TransportError(f"cannot lock {path} on {self.where}: flock exit {rc}: {err or '(no output)'}")
        except BaseException:
            chan.close()
            raise
        # The lock lives as long as this connection: should it drop, the lock is gone, so until the
        # with-block ends no operation may silently reconnect and go on as if it were still held.
        with self._lock:
            self._locks_held.append(path)
        try:
            yield
        finally:
            with self._lock:
                self._locks_held.remove(path)
            try:
                chan.shutdown_write()
                chan.status_event.wait(5)
            except Exception:
                pass
            chan.close()


def parse_dir_records(out: str, prefix: str, max_bytes: int) -> Optional[dict[str, bytes]]:
    """_READ_DIR_SH's answer -> {name: bytes}; None unless it is complete (ends with END) and
    every line is two hex words. A name that is not the prefix's, holds a `/` or is `.`/`..`, or
    content over max_bytes, is left out: whatever the remote printed, the caller gets only files
    of that directory. Names that are not UTF-8 come back with U+FFFD, as SFTP's listdir gives them."""
    lines = out.split("\n")
    if len(lines) < 2 or lines[-1] != "" or lines[-2] != "END":
        return None
    files: dict[str, bytes] = {}
    for line in lines[:-2]:
        name_hex, sep, data_hex = line.partition(" ")
        try:
            if not sep or not name_hex:
                return None
            name = bytes.fromhex(name_hex).decode("utf-8", errors="replace")
            data = bytes.fromhex(data_hex)
        except ValueError:
            return None
        if not name.startswith(prefix) or "/" in name or "\0" in name or name in (".", "..") or len(data) > max_bytes:
            continue
        files[name] = data
    return files
