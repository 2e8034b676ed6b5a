"""The XID table (thresholds/xid.tsv) as lingjun-health reads it, for crash attribution.

lingjun-health (the bash program beside this file, check gpu-xid) and lingjun_slurm/injob/host/crashlog.py
judge an XID by the same table and the same SKU family, so that a node the crash attribution
blames for an XID is one the health check drains for it (and resumes when it clears), and an XID
the health check lets pass (NVIDIA's IGNORE/RESTART_APP codes such as 63, 92, 94 outside Azure;
94 on Azure) blames nobody.

The table: tab-separated lines, "#" comments;
    POLICY <name> <actions|fatal-list> <elapsed|whole-hours> <every-run|once>
    <code> <NVIDIA action or -> <fatal or -> <description>
(the file cites its sources: NVIDIA's XID catalog, Azure's azure_gpu_xid.nhc). A SKU's family is
its thresholds file's GPU_XID_POLICY (default nvidia); GPU_XID_ACTIONS and GPU_FATAL_XIDS adjust
it as in the program. The window and report-once rules are the health check's (a crash is judged
when it happens); this module only gives the verdict on a code.

Standard library only, Python >= 3.8: it runs on the batch host with plain python3.
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE_NAME = "xid.tsv"
PACKAGED_TABLE = os.path.join(HERE, "thresholds", TABLE_NAME)
PACKAGED_THRESHOLDS = os.path.join(HERE, "thresholds")
CONFIG = "/etc/lingjun-slurm/health.conf"  # the program's default configuration (under its --root)
THRESHOLDS = "/etc/lingjun-slurm/health/thresholds"
# The program's default (readonly DEFAULT_XID_ACTIONS in lingjun-health).
DEFAULT_ACTIONS = ("RESET_GPU", "RESTART_BM", "RESTART_VM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR",
                   "WORKFLOW_NVLINK5_ERR", "CHECK_MECHANICALS")
DEFAULT_POLICY = "nvidia"


class XidTableError(ValueError):
    """A malformed table, configuration or thresholds file: the message names the file and line."""


class Policy(NamedTuple):
    name: str
    drains: str  # "actions": NVIDIA's action in GPU_XID_ACTIONS; "fatal-list": the Azure column
    window: str  # "elapsed" or "whole-hours" (how lingjun-health counts GPU_XID_WINDOW_HOURS)
    report: str  # "every-run" or "once"


class Entry(NamedTuple):
    action: str  # NVIDIA's immediate action, "-" for none
    azure: str  # "fatal" or "-"
    text: str


class Table(NamedTuple):
    path: str
    policies: Dict[str, Policy]
    codes: Dict[int, Entry]


def _numbered_lines(path: str) -> List[Tuple[int, str]]:
    """(line number, line without its CR) of a text file; XidTableError naming it when unreadable."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise XidTableError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return [(n, line.rstrip("\r")) for n, line in enumerate(lines, 1)]


def load(path: Optional[str] = None) -> Table:
    """The table at `path` (default: the packaged one), checked line by line as the program does."""
    path = path or PACKAGED_TABLE
    policies: Dict[str, Policy] = {}
    codes: Dict[int, Entry] = {}
    for n, line in _numbered_lines(path):
        if not line or line.startswith("#"):
            continue
        cols = line.split("\t")
        if cols[0] == "POLICY":
            if (len(cols) != 5 or not re.match(r"^[a-z][a-z0-9_-]*$", cols[1]) or cols[2] not in ("actions", "fatal-list")
                    or cols[3] not in ("elapsed", "whole-hours") or cols[4] not in ("every-run", "once")):
                raise XidTableError(f"{path}:{n}: expected POLICY<TAB>name<TAB>actions|fatal-list<TAB>"
                                    f"elapsed|whole-hours<TAB>every-run|once")
            policies[cols[1]] = Policy(*cols[1:5])
            continue
        if (len(cols) != 4 or not cols[0].isdigit() or not re.match(r"^([A-Z0-9_]+|-)$", cols[1])
                or cols[2] not in ("fatal", "-") or not cols[3]):
            raise XidTableError(f"{path}:{n}: expected CODE<TAB>NVIDIA action or -<TAB>fatal or -<TAB>description")
        codes[int(cols[0])] = Entry(cols[1], cols[2], cols[3])
    return Table(path, policies, codes)


class Judge:
    """The verdict lingjun-health's gpu-xid check gives each code under one SKU family."""

    def __init__(self, table: Table, policy: str = DEFAULT_POLICY, actions: Optional[List[str]] = None,
                 fatal: Optional[List[int]] = None, source: str = "default") -> None:
        if policy not in table.policies:
            raise XidTableError(f"GPU_XID_POLICY={policy}: not a POLICY of {table.path} "
                                f"(known: {' '.join(sorted(table.policies))})")
        self.table = table
        self.policy = table.policies[policy]
        self.actions: Set[str] = set(DEFAULT_ACTIONS if actions is None else actions)
        self.fatal: Set[int] = set(fatal or [])
        self.source = source

    def describe(self, code: int) -> str:
        entry = self.table.codes.get(code)
        return entry.text if entry else "(not in NVIDIA's XID catalog)"

    def verdict(self, code: int, nonfatal: bool = False) -> Optional[str]:
        """Why the code drains a node ("Azure: fatal; NVIDIA: IGNORE", "NVIDIA: RESTART_BM"), as
        the program's FAIL line says it, or None when it does not. `nonfatal`: an NVLink5 XID whose
        line says "Nonfatal" (never drains)."""
        if nonfatal:
            return None
        entry = self.table.codes.get(code)
        action = entry.action if entry else "-"
        if self.policy.drains == "fatal-list" and entry is not None and entry.azure == "fatal":
            return f"Azure: fatal; NVIDIA: {action}"
        if self.policy.drains == "actions" and action in self.actions:
            return f"NVIDIA: {action}"
        if code in self.fatal:
            return f"NVIDIA: {action}"
        return None

    def as_dict(self) -> dict:
        return {"policy": self.policy.name, "source": self.source, "table": self.table.path}


def _parse_kv(path: str) -> Dict[str, str]:
    """KEY=VALUE lines as lingjun-health's parse_kv reads them (# comments, one pair of quotes)."""
    out: Dict[str, str] = {}
    for n, line in _numbered_lines(path):
        if re.match(r"^\s*(#|$)", line):
            continue
        m = re.match(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)$", line)
        if not m:
            raise XidTableError(f"{path}:{n}: expected KEY=VALUE, got: {line}")
        value = m.group(2).strip()
        q = re.match(r"^\"(.*)\"$|^'(.*)'$", value)
        if q:
            value = q.group(1) if q.group(1) is not None else q.group(2)
        out[m.group(1)] = value
    return out


def _find_thresholds(folder: str, sku: str) -> Optional[str]:
    """The program's find_thresholds: <sku>.conf case-insensitively, else a file listing it in
    INSTANCE_TYPES=."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".conf"))
    except OSError:
        return None
    low = sku.lower()
    for name in names:
        if name[:-5] == low or name.lower() == f"{low}.conf":
            return os.path.join(folder, name)
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    m = re.match(r"^\s*INSTANCE_TYPES\s*=(.*)$", line)
                    if m and low in [t.lower() for t in m.group(1).replace('"', "").replace("'", "").split()]:
                        return path
        except OSError:
            continue
    return None


def node_judge(root: Optional[str] = None, sku: Optional[str] = None, policy: Optional[str] = None) -> Judge:
    """The Judge lingjun-health would use on this node: its configuration (health.conf, then
    health.conf.d/*.conf, under `root` or $LINGJUN_HEALTH_ROOT), SKU (or `sku`), that SKU's
    thresholds file, GPU_XID_POLICY/GPU_XID_ACTIONS/GPU_FATAL_XIDS (config over file), and the
    table beside the thresholds. `policy` names the family directly. With neither a SKU nor a
    configuration: NVIDIA's catalog (the program's default policy)."""
    if root is None:
        root = os.environ.get("LINGJUN_HEALTH_ROOT", "")
    root = (root or "").rstrip("/")
    config = root + CONFIG
    files = [config] if os.path.isfile(config) else []
    dropins = config + ".d"
    if os.path.isdir(dropins):
        files += [os.path.join(dropins, n) for n in sorted(os.listdir(dropins))
                  if n.endswith(".conf") and os.path.isfile(os.path.join(dropins, n))]
    cfg: Dict[str, str] = {}
    for path in files:
        cfg.update(_parse_kv(path))
    if cfg.get("THRESHOLDS_DIR"):
        thr_dir = root + cfg["THRESHOLDS_DIR"]
    elif os.path.isdir(root + THRESHOLDS):
        thr_dir = root + THRESHOLDS
    else:
        thr_dir = PACKAGED_THRESHOLDS
    table_path = os.path.join(thr_dir, TABLE_NAME)
    table = load(table_path if os.path.isfile(table_path) else None)
    name = sku or cfg.get("SKU", "")
    thr: Dict[str, str] = {}
    source = "default (no SKU)"
    if name:
        thr_file = _find_thresholds(thr_dir, name)
        if thr_file is None:
            raise XidTableError(f"no thresholds for SKU '{name}' in {thr_dir}")
        thr = _parse_kv(thr_file)
        source = f"SKU {name}: {thr_file}"
    for key in ("GPU_XID_POLICY", "GPU_XID_ACTIONS", "GPU_FATAL_XIDS"):
        if key in cfg:
            thr[key] = cfg[key]
    fam = policy or thr.get("GPU_XID_POLICY") or DEFAULT_POLICY
    if policy:
        source = f"policy {policy} given"
    actions = thr["GPU_XID_ACTIONS"].split() if "GPU_XID_ACTIONS" in thr else None
    fatal_words = thr.get("GPU_FATAL_XIDS", "").split()
    bad = [w for w in fatal_words if not w.isdigit()]
    if bad:
        raise XidTableError(f"GPU_FATAL_XIDS: '{bad[0]}' is not a number")
    return Judge(table, fam, actions, [int(w) for w in fatal_words], source)
