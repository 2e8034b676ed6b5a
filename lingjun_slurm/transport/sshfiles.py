"""SFTP building blocks of the SSH transport's file operations: stat without raising on a missing
file, parents-first mkdir, private temp files beside a target and the rename over it, windowed
pipelined reads. The operations themselves, and their design notes, are SSHTransport's (ssh.py).
"""

from __future__ import annotations

import posixpath
import secrets
import socket
import stat as _stat
from typing import IO, Optional

import paramiko

from ..common.errors import TransportError

GET_WINDOW = 2 << 20  # get(): bytes requested at once (64 pipelined SFTP reads)


def no_answer(exc: BaseException) -> bool:
    """A timeout or a broken connection (for _sftp_errors to report), not an answer from the server."""
    return isinstance(exc, (socket.timeout, TimeoutError, ConnectionError))


def is_dir(st: paramiko.SFTPAttributes) -> bool:
    return st.st_mode is not None and _stat.S_ISDIR(st.st_mode)


def stat(sftp: paramiko.SFTPClient, path: str) -> Optional[paramiko.SFTPAttributes]:
    """sftp.stat, None when there is no such file."""
    try:
        return sftp.stat(path)
    except FileNotFoundError:
        return None


def stat_or_none(sftp: paramiko.SFTPClient, p: str) -> Optional[paramiko.SFTPAttributes]:
    """stat, None when missing or refused (permission denied and the like, as os.path.exists).
    A timeout, a lost connection or a protocol error is raised (by _sftp_errors): "no answer"
    is not "no such file"."""
    try:
        return stat(sftp, p)
    except OSError as exc:
        if no_answer(exc):
            raise
        return None


def makedirs(sftp: paramiko.SFTPClient, p: str, mode: int, where: str) -> None:
    """Create directory P and its missing parents on the server WHERE names (in messages);
    one that exists already (another caller's, created meanwhile) is fine."""
    st = stat(sftp, p)
    if st is not None:
        if not is_dir(st):
            raise TransportError(f"cannot create directory {p} on {where}: a file is in the way")
        return
    parent = posixpath.dirname(p.rstrip("/"))
    if parent and parent != p:
        makedirs(sftp, parent, mode, where)
    try:
        sftp.mkdir(p, mode)
    except OSError as exc:
        if no_answer(exc):
            raise
        st = stat(sftp, p)
        if st is None or not is_dir(st):
            raise


def tmp_beside(p: str) -> str:
    """`.NAME.tmp.<random>` in P's directory."""
    directory, name = posixpath.split(p)
    return posixpath.join(directory, f".{name}.tmp.{secrets.token_hex(6)}")


def replace(sftp: paramiko.SFTPClient, tmp: str, p: str) -> None:
    """Rename TMP over P: posix-rename@openssh.com, else remove + rename."""
    try:
        sftp.posix_rename(tmp, p)
    except OSError as exc:
        if "unsupported" not in str(exc).lower():
            raise
        # A server without posix-rename@openssh.com: not atomic (there is a moment without p).
        try:
            sftp.remove(p)
        except FileNotFoundError:
            pass
        sftp.rename(tmp, p)


def open_new(sftp: paramiko.SFTPClient, path: str) -> paramiko.SFTPFile:
    """sftp.open(path, "wbx"), but the file is created 0600: with no attributes the server creates
    it 0666 & umask (0644), readable by others while the data is written, before the chmod to
    the caller's mode."""
    from paramiko.sftp import CMD_HANDLE, CMD_OPEN, SFTP_FLAG_CREATE, SFTP_FLAG_EXCL, SFTP_FLAG_TRUNC, SFTP_FLAG_WRITE

    attrs = paramiko.SFTPAttributes()
    attrs.st_mode = 0o600
    t, msg = sftp._request(CMD_OPEN, sftp._adjust_cwd(path),
                           SFTP_FLAG_WRITE | SFTP_FLAG_CREATE | SFTP_FLAG_TRUNC | SFTP_FLAG_EXCL, attrs)
    if t != CMD_HANDLE:
        raise paramiko.SFTPError("Expected handle")
    return paramiko.SFTPFile(sftp, msg.get_binary(), "wb")


def copy_out(fh: paramiko.SFTPFile, out: IO[bytes]) -> None:
    """Write the remote file FH to OUT. Pipelined reads a window at a time: paramiko's getfo
    prefetches the whole file and keeps what arrived faster than it was written, possibly all of it."""
    size, offset, step = fh.stat().st_size, 0, fh.MAX_REQUEST_SIZE
    while offset < size:
        end = min(offset + GET_WINDOW, size)
        for block in fh.readv([(o, min(step, end - o)) for o in range(offset, end, step)]):
            out.write(block)
        offset = end
