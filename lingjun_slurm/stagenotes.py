"""<run_dir>/stage-notes/<stage>.txt: one JSON line a stage leaves for `lingjun-slurm status`,
{"time", "job", "note"}, shown in the stage's REASON while "job" is the stage's current job
(status.py _read_note). Written by the trainer's checkpoint fallback (train/resume.py) and by the
batch host's requeue decision (retry.py).

Standard library only: it runs on the batch host with plain python3 and inside jobs.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

NOTES_DIR = "stage-notes"


def note_path(run_dir: str, stage: str) -> Path:
    return Path(run_dir) / NOTES_DIR / f"{stage}.txt"


def write_note(run_dir: str, stage: str, text: str) -> None:
    """Replace the stage's note, atomically, with `text` for $SLURM_JOB_ID (the local executor sets it
    too), so a later job's row never shows it. Raises OSError."""
    from .atomicfile import atomic_write

    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "job": os.environ.get("SLURM_JOB_ID", ""), "note": text}
    os.makedirs(os.path.join(run_dir, NOTES_DIR), exist_ok=True)
    atomic_write(note_path(run_dir, stage), (json.dumps(record) + "\n").encode())
