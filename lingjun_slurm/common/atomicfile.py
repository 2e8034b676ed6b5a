"""Whole-file writes that readers never see half done, for every file the tool rewrites in place:
Megatron's tracker and lingjun-manifest.json (checkpoint/), the local executor's local-state.json
(executors/local.py) and the holder files of the workdir and image-cache locks (holderlock.py).

Standard library only: the stages import it on compute nodes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional, Union


def current_umask() -> int:
    """The process umask, read without changing it where Linux shows it (/proc/self/status, "Umask:",
    Linux 4.7+); elsewhere set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Union[str, Path], data: Union[bytes, str], *, mode: Optional[int] = None,
                 durable: bool = True) -> None:
    """Write via a temporary file in the same directory (".<name>.<random>.tmp"), fsync, rename:
    readers see old or new, never half.

    mode None: the mode a plain open(path, "w") would give (0666 & ~umask, 0644 under the usual
    022), not mkstemp's 0600: other users of the cluster read the tracker and lingjun-manifest.json
    the way Megatron-LM writes its tracker, with open(tracker_filename, 'w')
    (NVIDIA/Megatron-LM megatron/training/checkpointing.py:1083 and :1217, commit d98e8a64).
    durable=False: no fsync (a file rewritten every few seconds whose loss in a crash costs nothing,
    the Prometheus textfile: promfile.py); the rename is still atomic.
    """
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), (0o666 & ~current_umask()) if mode is None else mode)
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if not durable:
        return
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
