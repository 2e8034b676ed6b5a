"""The one interface every backend talks through (NeMo-Run's Tunnel, in spirit).

A Transport runs commands and handles files on the host that talks to Slurm. The Slurm
scheduler, run records, submit/status/logs/cancel and the local executor use nothing
else, so an SSH transport only has to implement these methods.
"""

from __future__ import annotations

import abc
import time
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Sequence

from ..common.errors import CommandError


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float

    def check(self, what: Optional[str] = None, host: str = "localhost") -> "CommandResult":
        if self.returncode != 0:
            raise CommandError(self.argv, self.returncode, self.stdout, self.stderr, what=what, host=host)
        return self


class Transport(abc.ABC):
    """Commands and files on the submit host. Paths are POSIX strings on that host."""

    kind: str = "abstract"

    def __init__(self) -> None:
        # Every command run through this transport, in order: tests and bench/submit count them.
        self.history: list[tuple[str, ...]] = []

    @property
    @abc.abstractmethod
    def host(self) -> str:
        """The host commands run on, for messages and run records."""

    # --- commands -------------------------------------------------------------------------
    def run(self, argv: Sequence[str], *, cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
            input: Optional[str] = None, timeout: Optional[float] = 120.0, check: bool = False,
            what: Optional[str] = None) -> CommandResult:
        """Run argv (never through a shell). With check=True a non-zero exit raises CommandError."""
        argv = tuple(str(a) for a in argv)
        self.history.append(argv)
        started = time.monotonic()
        rc, out, err = self._run(argv, cwd=cwd, env=env, input=input, timeout=timeout)
        result = CommandResult(argv, rc, out, err, time.monotonic() - started)
        return result.check(what, self.host) if check else result

    @abc.abstractmethod
    def _run(self, argv: tuple[str, ...], *, cwd: Optional[str], env: Optional[Mapping[str, str]],
             input: Optional[str], timeout: Optional[float]) -> tuple[int, str, str]:
        """Run and return (exit code, stdout, stderr); a missing program is exit 127."""

    @abc.abstractmethod
    def which(self, program: str) -> Optional[str]:
        """Absolute path of a program on the host's PATH, or None."""

    # --- files ----------------------------------------------------------------------------
    @abc.abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """Raise FileNotFoundError when missing."""

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode("utf-8", errors="replace")

    def read_dir_files(self, path: str, prefix: str = "", max_bytes: int = 1 << 16) -> dict[str, bytes]:
        """Every regular file directly in directory path whose name starts with prefix -> its first
        max_bytes bytes; {} when the directory does not exist. For many small files (a 1,024-task
        array's markers): a backend answers in a bounded number of round trips, not one per file.
        This default reads them one by one (fine locally)."""
        out: dict[str, bytes] = {}
        for name in self.listdir(path):
            if not name.startswith(prefix):
                continue
            try:
                out[name] = self.read_range(f"{path}/{name}", 0, max_bytes)
            except (IsADirectoryError, PermissionError):
                continue
        return out

    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...

    @abc.abstractmethod
    def listdir(self, path: str) -> list[str]:
        """Names in a directory; [] when it does not exist."""

    @abc.abstractmethod
    def mkdir(self, path: str, mode: int = 0o755, exist_ok: bool = True) -> None:
        """Create a directory and its parents. exist_ok=False: raise FileExistsError if it exists
        (atomic: of two callers exactly one succeeds)."""

    @abc.abstractmethod
    def write_atomic(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write a temp file beside path, then rename it over path: readers never see half a file."""

    @abc.abstractmethod
    def rename_new(self, src: str, dst: str) -> None:
        """Rename the directory src to dst, which must not exist (FileExistsError if it does): the
        last step of writing a directory whole (submit.write_run_dir), on the host itself."""

    @abc.abstractmethod
    def remove_tree(self, path: str) -> None:
        """Remove a directory and everything in it; nothing when it does not exist."""

    def put(self, local: Path, remote: str, mode: Optional[int] = None) -> None:
        """Copy a local file to the host (atomically)."""
        self.write_atomic(remote, Path(local).read_bytes(), mode if mode is not None else Path(local).stat().st_mode & 0o777)

    def get(self, remote: str, local: Path) -> None:
        """Copy a file from the host to this machine."""
        data = self.read_bytes(remote)
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.tmp")
        tmp.write_bytes(data)
        tmp.replace(local)

    @abc.abstractmethod
    def lock(self, path: str, timeout: float = 60.0) -> AbstractContextManager[None]:
        """An exclusive lock held for the with-block (path is the lock file)."""

    @abc.abstractmethod
    def size(self, path: str) -> Optional[int]:
        """Size in bytes, None when missing."""

    @abc.abstractmethod
    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Up to length bytes from offset (b'' at the end or when missing)."""

    def follow(self, path: str, *, offset: int = 0, poll_s: float = 0.5,
               done: Optional[Callable[[], bool]] = None, chunk: int = 1 << 16) -> Iterator[bytes]:
        """Stream a growing file (tail -f): yield new bytes as they appear.

        Stops once done() returns True and everything written up to then has been read;
        done is asked at most once per poll interval. Without done it never stops.
        """
        with self._range_reader(path) as read:
            yield from _poll(read, offset=offset, poll_s=poll_s, done=done, chunk=chunk)

    @contextmanager
    def _range_reader(self, path: str) -> Iterator[Callable[[int, int], bytes]]:
        """read(offset, length) for follow(); a backend may keep a handle open across reads."""
        yield lambda offset, length: self.read_range(path, offset, length)

    def close(self) -> None:
        """Release connections (nothing to do for the local transport)."""

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _poll(read: Callable[[int, int], bytes], *, offset: int, poll_s: float, done: Optional[Callable[[], bool]],
          chunk: int) -> Iterator[bytes]:
    """The tail -f loop behind Transport.follow."""
    finished = False
    while True:
        data = read(offset, chunk)
        if data:
            offset += len(data)
            yield data
            continue
        if finished:
            return
        time.sleep(poll_s)
        if done is not None and done():
            finished = True  # one last read picks up what was written before the end
