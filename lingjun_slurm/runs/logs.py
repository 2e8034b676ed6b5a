"""Where a run's logs are: the stage script's `#SBATCH --output` pattern, resolved.

Slurm's filename patterns: %x job name, %j job id, %A array job id, %a array task id,
%% a literal percent. The local executor writes to the same names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ..common.errors import UsageError
from ..transport.base import Transport
from .manifest import Manifest, StageRecord

NO_TASK = 4294967294  # what Slurm substitutes for %a outside an array


def array_indices(spec: str) -> list[int]:
    """Slurm --array syntax (ranges, lists, ':step', '%limit'): 0-3 / 1,4,7-9 / 0-15:4%2."""
    out: list[int] = []
    for part in spec.split("%")[0].split(","):
        rng, _, step = part.partition(":")
        lo, _, hi = rng.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1, int(step or 1)))
    return out


def array_limit(spec: str) -> Optional[int]:
    """The `%M` of an --array spec: at most M tasks run at once; None without one. slurmctld reads
    it with atoi() and only a value > 0 limits (src/slurmctld/job_mgr.c _create_job_array,
    slurm-22-05-8-1 lines 5019-5024)."""
    _, sep, limit = spec.partition("%")
    return int(limit) if sep and limit.isdigit() and int(limit) > 0 else None


def sbatch_option(script_text: str, key: str) -> Optional[str]:
    match = re.search(rf"^#SBATCH --{re.escape(key)}=(.*)$", script_text, re.M)
    return match.group(1).strip() if match else None


def resolve_pattern(pattern: str, job_name: str, job_id: str, task: Optional[int], cwd: str) -> str:
    subs = {"x": job_name, "j": job_id, "A": job_id, "a": str(task if task is not None else NO_TASK), "%": "%"}
    path = re.sub(r"%([xjAa%])", lambda m: subs[m.group(1)], pattern)
    return path if path.startswith("/") else f"{cwd.rstrip('/')}/{path}"


@dataclass(frozen=True)
class LogFile:
    stage: str
    job_id: str
    task: Optional[int]
    path: str


def stage_logs(t: Transport, m: Manifest, rec: StageRecord, task: Optional[int] = None) -> list[LogFile]:
    if not rec.job_ids:
        return []
    script = t.read_text(f"{m.run_dir}/{rec.script}")
    pattern = sbatch_option(script, "output") or ("slurm-%A_%a.out" if rec.array else "slurm-%j.out")
    job_id = rec.job_ids[0]
    if rec.array:
        tasks = array_indices(rec.array)
        if task is not None:
            if task not in tasks:
                raise UsageError(f"stage {rec.name} has array tasks {rec.array}; no task {task}")
            tasks = [task]
        # sbatch's %j in an array is each task's own job id, unknown here: only %A/%a patterns resolve.
        return [LogFile(rec.name, job_id, i, resolve_pattern(pattern, rec.job_name, job_id, i, m.run_dir))
                for i in tasks]
    if task not in (None, 0):
        raise UsageError(f"stage {rec.name} is not an array job: no --task {task}")
    return [LogFile(rec.name, job_id, None, resolve_pattern(pattern, rec.job_name, job_id, None, m.run_dir))]
