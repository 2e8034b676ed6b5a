"""Where this machine keeps lingjun-slurm's own state (the run index, mirrors of remote runs):
$LINGJUN_STATE_DIR, else $XDG_STATE_HOME/lingjun-slurm, else ~/.local/state/lingjun-slurm."""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    if os.environ.get("LINGJUN_STATE_DIR"):
        return Path(os.environ["LINGJUN_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "lingjun-slurm"
