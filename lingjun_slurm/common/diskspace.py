"""A full disk, named as users need it: "no space left on <mount> (writing <path>)", or "disk
quota exceeded on ..." for EDQUOT. Used by the local executor (a job's or its own write failed:
executors/local.py) and the trainer (a checkpoint save failed: train/ckpt.py, stages/train.py).
Standard library only.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Optional

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)

# The messages programs print for ENOSPC / EDQUOT (strerror: "No space left on device", "Disk
# quota exceeded"), with the path where they give one: Python's OSError ("[Errno 28] No space
# left on device: '/w/x'"), coreutils ("cp: error writing '/w/x': No space left on device"),
# bash redirections ("bash: line 1: /w/x: No space left on device").
_NO_SPACE_RE = re.compile(
    r"(?:\[Errno (?:28|122)\] (?P<what1>No space left on device|Disk quota exceeded): '(?P<p1>[^']+)')"
    r"|(?:'(?P<p2>/[^']+)'[^\n']*?: (?P<what2>No space left on device|Disk quota exceeded))"
    r"|(?:(?P<p3>/[^\s:']+): (?P<what3>No space left on device|Disk quota exceeded))"
    r"|(?P<what4>No space left on device|Disk quota exceeded)")
LOG_TAIL = 64 << 10


def mount_point(path: str) -> str:
    """The mount point of the filesystem that holds path (or would hold it)."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and p != os.path.dirname(p):
        p = os.path.dirname(p)
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    return p


def no_space_reason(path: Optional[str], err: Optional[int]) -> Optional[str]:
    """"no space left on <mount> (writing <path>)" for ENOSPC, "disk quota exceeded on ..." for EDQUOT."""
    if err not in NO_SPACE:
        return None
    what = "no space left on" if err == errno.ENOSPC else "disk quota exceeded on"
    if not path:
        return f"{what} device"
    mount = mount_point(str(path))
    return f"{what} {mount}" + (f" (writing {path})" if os.path.abspath(str(path)) != mount else "")


def no_space_in_log(log: str) -> Optional[tuple[int, Optional[str]]]:
    """(ENOSPC or EDQUOT, the path if the message names one) of the last such message in the tail of
    a job's log; None when there is none."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.path.getsize(log) - LOG_TAIL))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    found = list(_NO_SPACE_RE.finditer(text))
    if not found:
        return None
    m = found[-1]
    path = m.group("p1") or m.group("p2") or m.group("p3")
    what = m.group("what1") or m.group("what2") or m.group("what3") or m.group("what4")
    return (errno.ENOSPC if what.startswith("No space") else errno.EDQUOT), path


def full_filesystem(path: str) -> Optional[str]:
    """The mount point when the filesystem holding path has no block left (for this user)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    free = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return mount_point(path) if st.f_blocks and free == 0 else None
