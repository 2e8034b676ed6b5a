"""Node health checks: the bash program `lingjun-health` and its thresholds, packaged as data.

thresholds/ holds one KEY=VALUE file per SKU (*.conf) and the XID table (xid.tsv), which the
program and crash attribution (lingjun_slurm/injob/host/crashlog.py, through xid.py here) both read.

The program runs on nodes, as Slurm's HealthCheckProgram and once at boot, where a recent
Python may be missing (RHEL 8 ships 3.6), so it is bash. This module only finds the packaged
files: for `lingjun-slurm health`, for the cluster-init generator (clusterinit_gen) and for
tests. What each check does: docs/health-checks.md.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

PROGRAM = "lingjun-health"
THRESHOLDS = "thresholds"
XID_TABLE = "xid.tsv"  # in thresholds/: one verdict per XID for each SKU family (xid.py)
# Where lingjun-health reads its configuration without --config (under --root or
# $LINGJUN_HEALTH_ROOT), and its drop-in directory: the program's "configuration" section.
DEFAULT_CONFIG = "/etc/lingjun-slurm/health.conf"

__all__ = ["DEFAULT_CONFIG", "PROGRAM", "THRESHOLDS", "XID_TABLE", "copy_to", "default_config", "installed_dir", "is_configured",
           "parse_conf", "program_text", "sku_names", "threshold_texts"]


def _root() -> Traversable:
    return resources.files(__name__)


def program_text() -> str:
    """The bash program, as shipped."""
    return (_root() / PROGRAM).read_text(encoding="utf-8")


def threshold_texts() -> dict[str, str]:
    """Every file of thresholds/ that ships with the program: <name>.conf (one per SKU) and the XID
    table (XID_TABLE) -> text, sorted by name. Installers copy them all side by side."""
    folder = _root() / THRESHOLDS
    return {entry.name: entry.read_text(encoding="utf-8")
            for entry in sorted(folder.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".conf") or entry.name == XID_TABLE}


def sku_names() -> list[str]:
    """The thresholds shipped with the program, by name (what --sku accepts besides INSTANCE_TYPES=)."""
    return [name[:-len(".conf")] for name in threshold_texts() if name.endswith(".conf")]


def default_config(root: "str | Path | None") -> Path:
    """The configuration file lingjun-health reads when not given --config: DEFAULT_CONFIG under the
    root (--root, else $LINGJUN_HEALTH_ROOT, as the program's ROOT; its trailing / dropped)."""
    prefix = str(root).rstrip("/") if root else ""
    return Path(prefix + DEFAULT_CONFIG)


def is_configured(config: "str | Path | None", root: "str | Path | None") -> bool:
    """Whether the node has a configuration of its own, as lingjun-health finds it: --config given, or
    the default file or a drop-in (health.conf.d/*.conf) exists. False on a node that cluster-init
    (docs/cluster-init.md) never set up."""
    if config is not None:
        return True
    path = default_config(root)
    return path.is_file() or any(p.is_file() for p in Path(f"{path}.d").glob("*.conf"))


def parse_conf(text: str) -> dict[str, str]:
    """KEY=VALUE lines as lingjun-health reads them: # comments and blank lines skipped,
    whitespace around key and value dropped, one pair of surrounding quotes removed."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        if not sep:
            raise ValueError(f"not a KEY=VALUE line: {line!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


@contextmanager
def installed_dir() -> Iterator[Path]:
    """A real directory holding lingjun-health and thresholds/ side by side (the program finds
    its thresholds beside itself). The package directory itself when installed as files,
    else a temporary copy (zip imports)."""
    root = _root()
    if isinstance(root, Path):
        yield root
        return
    with tempfile.TemporaryDirectory(prefix="lingjun-health-") as tmp:
        dest = Path(tmp)
        (dest / PROGRAM).write_text(program_text(), encoding="utf-8")
        (dest / PROGRAM).chmod(0o755)
        (dest / THRESHOLDS).mkdir()
        for name, text in threshold_texts().items():
            (dest / THRESHOLDS / name).write_text(text, encoding="utf-8")
        yield dest


def copy_to(dest: Path) -> None:
    """Write the program (mode 0755) and thresholds/ into dest (for tests and installers)."""
    dest.mkdir(parents=True, exist_ok=True)
    with installed_dir() as src:
        shutil.copyfile(src / PROGRAM, dest / PROGRAM)
    (dest / PROGRAM).chmod(0o755)
    (dest / THRESHOLDS).mkdir(exist_ok=True)
    for name, text in threshold_texts().items():
        (dest / THRESHOLDS / name).write_text(text, encoding="utf-8")
