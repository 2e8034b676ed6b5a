"""One nccl-tests run end to end on Slurm: write the script, submit it, wait, read the outputs."""

from __future__ import annotations

import re
from typing import Callable

from ..errors import CommandError, UsageError
from ..slurm.client import SlurmCLI
from ..transport.base import Transport
from .plan import HOSTLIST_RE, SCRIPT, NcclJob, render
from .results import OpOutput, load_op
from .run import Job, JobEnd, Waiter, submit_all

_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def expand_nodelist(t: Transport, nodelist: str) -> list[str]:
    """`scontrol show hostnames LIST`: node[1-3],gpu7 -> node1 node2 node3 gpu7 (Slurm's own expansion)."""
    if not HOSTLIST_RE.match(nodelist):
        raise UsageError(f"--nodelist {nodelist!r}: a Slurm host list such as node[1-4],gpu7")
    try:
        result = t.run(["scontrol", "show", "hostnames", nodelist], check=True,
                       what=f"--nodelist {nodelist!r}: scontrol show hostnames failed")
    except CommandError as exc:
        raise UsageError(str(exc)) from None
    names = result.stdout.split()
    bad = [n for n in names if not _HOST_RE.match(n)]
    if not names or bad:
        raise UsageError(f"--nodelist {nodelist!r}: unexpected node names {bad or names}")
    if len(set(names)) != len(names):
        raise UsageError(f"--nodelist {nodelist!r} names a node twice")
    return names


def write_script(t: Transport, job: NcclJob) -> str:
    t.mkdir(job.out_dir)
    path = f"{job.out_dir}/{SCRIPT}"
    t.write_atomic(path, render(job), mode=0o755)
    return path


def submit(t: Transport, sched: SlurmCLI, job: NcclJob) -> Job:
    """Write the script and sbatch it from its directory (its outputs and markers land there)."""
    if not sched.available():
        raise UsageError("sbatch is not on PATH: run this on a Slurm login node, or use --render-only DIR "
                         "and submit the script yourself")
    write_script(t, job)
    return submit_all(sched, [(SCRIPT, job.out_dir, job.job_name)])[0]


def run(t: Transport, waiter: Waiter, job: NcclJob, *,
        progress: Callable[[str], None]) -> tuple[list[JobEnd], list[OpOutput]]:
    submitted = submit(t, waiter.sched, job)
    progress(f"submitted job {submitted.job_id} ({job.shape()}); outputs in {job.out_dir}")
    ends = waiter.wait([submitted])
    return [ends[submitted.job_id]], [load_op(t, job.out_dir, op) for op in job.ops]
