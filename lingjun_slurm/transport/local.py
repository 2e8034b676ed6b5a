"""The local transport: commands as subprocesses, files through the OS, locks with flock."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from typing import Iterator, Mapping, Optional

from ..common.errors import TransportError
from .base import Transport


class LocalTransport(Transport):
    kind = "local"

    @property
    def host(self) -> str:
        return socket.gethostname()

    def _run(self, argv: tuple[str, ...], *, cwd: Optional[str], env: Optional[Mapping[str, str]],
             input: Optional[str], timeout: Optional[float]) -> tuple[int, str, str]:
        full_env = None if env is None else {**os.environ, **env}
        try:
            proc = subprocess.run(argv, cwd=cwd, env=full_env, input=input, capture_output=True, text=True,
                                  timeout=timeout, errors="replace")
        except FileNotFoundError as exc:
            if cwd is not None and not os.path.isdir(cwd):
                return 126, "", f"working directory {cwd} does not exist"
            return 127, "", f"{argv[0]}: command not found ({exc.strerror})"
        except PermissionError as exc:
            return 126, "", f"{argv[0]}: cannot run it ({exc.strerror})"
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return 124, out, f"{argv[0]}: timed out after {timeout} s"
        return proc.returncode, proc.stdout, proc.stderr

    def which(self, program: str) -> Optional[str]:
        return shutil.which(program)

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as fh:
            return fh.read()

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def mkdir(self, path: str, mode: int = 0o755, exist_ok: bool = True) -> None:
        try:
            if exist_ok:
                os.makedirs(path, mode=mode, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path.rstrip("/")) or "/", mode=mode, exist_ok=True)
                os.mkdir(path, mode)
        except FileExistsError:
            if not exist_ok:
                raise
        except OSError as exc:
            raise TransportError(f"cannot create directory {path}: {exc.strerror}") from exc

    def write_atomic(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        raw = data.encode("utf-8") if isinstance(data, str) else data
        directory = os.path.dirname(path) or "."
        tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}.{time.monotonic_ns()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(raw)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise TransportError(f"cannot write {path}: {exc.strerror}") from exc

    def rename_new(self, src: str, dst: str) -> None:
        # rename(2) would put an empty directory dst aside silently: it must not exist at all
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, f"{dst} exists", dst)
        try:
            os.rename(src, dst)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise FileExistsError(errno.EEXIST, f"{dst} exists", dst) from None
            raise TransportError(f"cannot rename {src} to {dst}: {exc.strerror}") from exc

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    @contextmanager
    def lock(self, path: str, timeout: float = 60.0) -> Iterator[None]:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TransportError(f"timed out after {timeout:.0f} s waiting for the lock {path}") from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def size(self, path: str) -> Optional[int]:
        try:
            return os.stat(path).st_size
        except OSError:
            return None

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                return fh.read(length)
        except FileNotFoundError:
            return b""

    def read_dir_files(self, path: str, prefix: str = "", max_bytes: int = 1 << 16) -> dict[str, bytes]:
        """One scandir; each file opened with O_NONBLOCK and kept only when fstat says it is a
        regular file (a symlink is followed, as read_bytes does), so a FIFO or device among the
        names never blocks the read; an unreadable or vanished file is left out."""
        return read_dir_files_here(path, prefix, max_bytes)


def read_dir_files_here(path: str, prefix: str, max_bytes: int) -> dict[str, bytes]:
    """Transport.read_dir_files on this machine (standard library only)."""
    import stat

    try:
        names = sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    out: dict[str, bytes] = {}
    for name in names:
        if not name.startswith(prefix):
            continue
        try:
            fd = os.open(os.path.join(path, name), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            chunks: list[bytes] = []
            left = max_bytes
            while left > 0:
                chunk = os.read(fd, left)
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            out[name] = b"".join(chunks)
        except OSError:
            continue
        finally:
            os.close(fd)
    return out
