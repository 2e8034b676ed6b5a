"""The guard that keeps the test suite hermetic (issue 15, item 1).

A test may write only inside its own temporary directories and state dir. This module lists
the real paths a user's runs and machine keep (the README main job's workdir, the run index,
the user's SSH files, node configuration) and snapshots them cheaply: every entry's type, size,
mtime and inode. tests/conftest.py takes a snapshot before and after each test and fails the
test that changed one, naming the path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

Snapshot = dict[str, tuple[int, int, int, int] | None]
# Past this many entries under one root only the directories are compared (their mtimes still
# change when an entry is added, removed or renamed), so a huge real workdir stays cheap.
MAX_ENTRIES = 20000


def real_state_dir(environ: os._Environ[str] | dict[str, str]) -> Path:
    """The run index lingjun-slurm would use for this user (lingjun_slurm.runs.index's rule)."""
    if environ.get("LINGJUN_STATE_DIR"):
        return Path(environ["LINGJUN_STATE_DIR"])
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "lingjun-slurm"


def guarded_roots(environ: os._Environ[str] | dict[str, str]) -> list[Path]:
    """Real paths no test may change: the user's runs and state, SSH files and node configuration."""
    home = Path.home()
    return [
        Path("/tmp/lingjun-slurm"),  # the README main job's workdir (examples/tiny-gpt.yaml)
        real_state_dir(environ),
        home / ".cache" / "lingjun-slurm",
        home / ".config" / "lingjun-slurm",
        home / ".ssh",
        Path("/etc/nccl.conf"),
        Path("/etc/slurm"),
        Path("/etc/enroot"),
    ]


def _entry(st: os.stat_result) -> tuple[int, int, int, int]:
    return (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino)


def snapshot(roots: list[Path]) -> Snapshot:
    """path -> (type, size, mtime_ns, inode), or None for a root that does not exist."""
    found: Snapshot = {}
    for root in roots:
        try:
            st = os.lstat(root)
        except FileNotFoundError:
            found[str(root)] = None
            continue
        found[str(root)] = _entry(st)
        if not stat.S_ISDIR(st.st_mode):
            continue
        count = 0
        stack = [str(root)]
        while stack:
            top = stack.pop()
            try:
                entries = list(os.scandir(top))
            except OSError:
                continue
            for ent in entries:
                try:
                    est = ent.stat(follow_symlinks=False)
                except OSError:
                    continue
                count += 1
                is_dir = stat.S_ISDIR(est.st_mode)
                if is_dir or count <= MAX_ENTRIES:
                    found[ent.path] = _entry(est)
                if is_dir:
                    stack.append(ent.path)
    return found


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """What changed between two snapshots, one line per path, sorted."""
    lines = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        if old is None:
            lines.append(f"created {path}")
        elif new is None:
            lines.append(f"removed {path}")
        else:
            lines.append(f"modified {path}")
    return lines
