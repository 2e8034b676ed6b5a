"""The guard that keeps the test suite hermetic (issue 15, item 1; issue 26, item 11).

The guarantee: no test writes a user's real paths, and only a write made by this test session can
fail a test. Three layers (tests/conftest.py sets them up before any test, fixture or plugin reads
the environment):

1. A sandbox for the whole session (enter_sandbox): HOME and TMPDIR point into a directory of its
   own (/tmp/ljt-XXXXXXXX/home, /tmp/ljt-XXXXXXXX/tmp, removed at the end of the session) and
   XDG_* are unset, so everything the tool derives from them (the run index under
   ~/.local/state, ~/.cache, ~/.config, tempfile's directory) is out of the user's reach by
   default. pytest's tmp_path stays where pytest keeps it (PYTEST_DEBUG_TEMPROOT: the real temp
   dir's pytest-of-<user>/, last 3 sessions kept). Each test still gets its own LINGJUN_STATE_DIR.
2. A write guard on the real paths (guarded_roots: the README main job's workdir, the real run
   index, ~/.cache and ~/.config of lingjun-slurm, ~/.ssh, /etc/nccl.conf, /etc/slurm,
   /etc/enroot, as they were before the sandbox): tests/hermetic_hook.py, a Python audit hook in
   the pytest process and, as `sitecustomize` in front of PYTHONPATH, in every Python process the
   tests start with the session's environment. A write there by one of them is refused
   (PermissionError) and recorded with its pid; the test during which it happened fails, naming
   the path. The attribution is certain: it is the writing process's own audit event, so the
   user's other terminal writing the same paths meanwhile never fails a test (the false alarms
   of issue 26 item 11).
3. The snapshot of those roots before and after each test (snapshot/changes: every entry's
   type, size, mtime and inode) still runs, for writers the hook cannot see (a non-Python
   program, a Python started with a fresh environment). A change it finds that the hook did not
   record is a warning (Unattributed), not a failure: it cannot tell this session's non-Python
   writes from another process's.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests import hermetic_hook

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
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
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


class Unattributed(UserWarning):
    """A guarded real path changed during a test, and no process of this session was seen writing it."""


# What the sandbox takes out of the environment: every XDG base directory (their defaults then
# lie under the sandbox's HOME, XDG Base Directory Specification 0.8).
XDG_VARS = ("XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR",
            "XDG_CONFIG_DIRS", "XDG_DATA_DIRS")


@dataclass
class Sandbox:
    root: Path  # /tmp/ljt-XXXXXXXX
    log: Path  # the refused writes, one line each: "<pid> <event> <path>"
    saved: dict[str, str | None]  # the variables it changed, as they were

    def log_size(self) -> int:
        try:
            return self.log.stat().st_size
        except FileNotFoundError:
            return 0

    def refused_since(self, offset: int) -> list[str]:
        """The writes refused since `offset` of the log: "<path> (<event>, pid <pid>)"."""
        try:
            with open(self.log, "rb") as fh:
                fh.seek(offset)
                text = fh.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            pid, _, rest = line.partition(" ")
            event, _, path = rest.partition(" ")
            out.append(f"{path} ({event}, pid {pid})")
        return out

    def leave(self, keep: bool = False) -> None:
        """Give the environment back; remove the sandbox unless `keep`."""
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        tempfile.tempdir = None
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)


def enter_sandbox(roots: list[Path]) -> Sandbox:
    """Point HOME and TMPDIR into a fresh directory, unset XDG_*, and guard `roots` against writes
    by this process and by the Python processes it starts (tests/hermetic_hook.py)."""
    root = Path(tempfile.mkdtemp(prefix="ljt-")).resolve()  # short: unix socket paths stay < 108 bytes
    # Daemons the tests start under their own users (the test cluster's mariadbd as mysql) write to
    # TMPDIR too: the tree is traversable, tmp/ is like /tmp (sticky, world-writable).
    root.chmod(0o755)
    for name, mode in (("home", 0o755), ("tmp", 0o1777), ("site", 0o755)):
        (root / name).mkdir()
        (root / name).chmod(mode)
    log = root / "guard.log"
    shown = [str(r) for r in roots]
    if any(str(log).startswith(r.rstrip("/") + "/") for r in shown):
        raise RuntimeError(f"the test sandbox {root} lies under a guarded path")
    hook_source = Path(hermetic_hook.__file__).read_text(encoding="utf-8")
    (root / "site" / "sitecustomize.py").write_text(hook_source + _CHAIN, encoding="utf-8")
    # pytest's own tmp_path stays where pytest keeps it (<the real temp dir>/pytest-of-<user>/, the
    # last 3 sessions kept for a look after a failure; _pytest/tmpdir.py getbasetemp reads
    # PYTEST_DEBUG_TEMPROOT first): the sandbox can go at the end of every session.
    changed = {"PYTEST_DEBUG_TEMPROOT": os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir(),
               "HOME": str(root / "home"), "TMPDIR": str(root / "tmp"),
               hermetic_hook.GUARDED_ENV: os.pathsep.join(shown), hermetic_hook.LOG_ENV: str(log),
               "PYTHONPATH": os.pathsep.join([str(root / "site")] + [p for p in
                                              os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    saved: dict[str, str | None] = {k: os.environ.get(k) for k in [*changed, *XDG_VARS]}
    os.environ.update(changed)
    for key in XDG_VARS:
        os.environ.pop(key, None)
    tempfile.tempdir = None  # tempfile caches its directory: read TMPDIR again
    hermetic_hook.install(shown, str(log))
    return Sandbox(root, log, saved)


# Appended to tests/hermetic_hook.py in the sandbox's sitecustomize.py: guard this process, then
# run the sitecustomize this one shadows (Debian's python3 has one), as site.py would have.
_CHAIN = """

install_from_environment()


def _chain():  # type: ignore[no-untyped-def]
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import sitecustomize  # noqa: F401
    except Exception:  # site.py reports a failing sitecustomize and goes on, too
        pass
    finally:
        sys.path[:] = saved
        if ours is not None:
            sys.modules["sitecustomize"] = ours


_chain()
"""
