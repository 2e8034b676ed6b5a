"""<run_dir>/stage-notes/<stage>.txt: one JSON line a stage leaves for `lingjun-slurm status`,
{"time", "job", "note"}, shown in the stage's REASON while "job" is the stage's current job
(status.py _read_note). Written by the trainer's checkpoint fallback (train/resume.py), by the
batch host's requeue decision (retry.py), by the hang watchdog when it ends a step (watchdog.py),
and by the built-in stages when they fail for a reason they know (note_failure: a missing input
or tokenizer file, a bad record, a full disk; stages/preprocess.py, merge.py, checkpoint.py,
train.py). The local executor puts the note of a failed job into its REASON
(executors/local.py _why_failed). docs/status-reasons.md lists the reasons.

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
    from lingjun_slurm.common.atomicfile import atomic_write

    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "job": current_job(), "note": text}
    os.makedirs(os.path.join(run_dir, NOTES_DIR), exist_ok=True)
    atomic_write(note_path(run_dir, stage), (json.dumps(record) + "\n").encode())


def current_job() -> str:
    """The job id the run's manifest records for this job: an array task's SLURM_ARRAY_JOB_ID (Slurm
    gives every task its own SLURM_JOB_ID; the manifest keeps the array's), else SLURM_JOB_ID."""
    return os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID", "")


def run_dir_of(plan: dict) -> str | None:
    """<workdir>/runs/<run_id> of a plan.json (lingjun_slurm/plan.py; train/settings.py reads it the
    same way), or the job's environment when the plan lacks them: the batch prelude's rule,
    SLURM_SUBMIT_DIR (submit runs sbatch in the run directory), else LINGJUN_RUN_DIR (the local
    executor)."""
    workdir, run_id = plan.get("workdir"), plan.get("run_id")
    if isinstance(workdir, str) and workdir and isinstance(run_id, str) and run_id:
        return os.path.join(workdir, "runs", run_id)
    return os.environ.get("SLURM_SUBMIT_DIR") or os.environ.get("LINGJUN_RUN_DIR") or None


def lead_task() -> bool:
    """The one task of a multi-task step that speaks for it: rank 0 (RANK, else SLURM_PROCID)."""
    return (os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0") == "0"


def note_failure(run_dir: str | None, stage: str, text: str) -> None:
    """A failed stage's cause for `status`, best effort: a note that cannot be written (no run
    directory, a full disk) never changes how the stage ends; the message is on stderr already."""
    if not run_dir or not current_job() or not lead_task():
        return
    try:
        write_note(run_dir, stage, " ".join(text.split()))
    except OSError:
        pass


def read_note(run_dir: str, stage: str, job_ids: list[str]) -> str | None:
    """The note of one of `job_ids` for `stage` (status.py _read_note's rule, on a local path):
    None when there is none, it is another job's, or it cannot be read."""
    try:
        text = note_path(run_dir, stage).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return note_of(text, job_ids)


def note_of(text: str, job_ids: list[str]) -> str | None:
    """The note in a stage-notes file's text when its last record is one of `job_ids`' (lines
    that are not JSON are skipped); None for another job's note (an earlier run of the stage)."""
    for line in reversed(text.splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and str(record.get("job", "")) in job_ids and isinstance(record.get("note"), str):
            return " ".join(record["note"].split()) or None
        return None
    return None
