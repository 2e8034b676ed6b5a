"""Pre-flight on the allocated nodes: one short step across every node before training starts.

Node side (lingjun_slurm/injob/preflight/node.py), one task per node, inside the run's container:

    python3 -m lingjun_slurm.stages preflight --plan PLAN.json --out DIR

writes DIR/<node>.json. Judge (lingjun_slurm/injob/preflight/judge.py), on the batch host:

    python3 -m lingjun_slurm.stages preflight-judge --plan PLAN.json --out DIR --nodes "n1 n2"

reads every report, prints one line per bad node and writes DIR/verdict.json; exit 0 all good,
1 bad nodes that can be blamed, 2 a job-wide problem (no single node to blame).

Standard library only, Python >= 3.8: this runs in users' containers and on plain hosts.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Optional
from urllib.parse import quote

SCHEMA = 1
PREFIX = "lingjun-slurm: preflight:"
SHARE_TIMEOUT_S = 60.0  # how long a node waits for the other nodes' tokens
SKEW_BOUND_S = 5.0  # clocks may differ by this much
MIN_CHECKPOINTS = 2  # free space for this many checkpoints

__all__ = ["MIN_CHECKPOINTS", "PREFIX", "SCHEMA", "SHARE_TIMEOUT_S", "SKEW_BOUND_S", "file_name", "knobs",
           "token_dir_name", "train_stage", "write_json"]


def file_name(node: str, suffix: str) -> str:
    """A node's file name: its name percent-encoded (no "/", no leading "."), then SUFFIX."""
    if not node:
        raise ValueError("empty node name")
    name = quote(node, safe="-_@+=,")
    if name.startswith("."):
        name = "%2E" + name[1:]
    return name + suffix


def token_dir_name(job: str, restart: str) -> str:
    """The shared-directory probe's subdirectory: per job and per requeue (a requeued job keeps its
    id, and the tokens of the attempt before must not pass for this one's)."""
    return ".preflight-" + file_name(f"{job}.{restart}", "")


def write_json(path: str, doc: Any) -> None:
    """Write PATH atomically (a temporary file in the same directory, then rename)."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def train_stage(plan: dict) -> Optional[dict]:
    return next((st for st in plan.get("stages") or [] if st.get("kind") == "train"), None)


def knobs(plan: dict) -> dict:
    """settings.preflight of the plan (the spec's training.preflight, when the renderer puts it
    there): share_timeout_s, skew_s, min_checkpoints, checkpoint_bytes, thresholds."""
    settings = plan.get("settings") or {}
    got = settings.get("preflight") or {}
    return got if isinstance(got, dict) else {}
