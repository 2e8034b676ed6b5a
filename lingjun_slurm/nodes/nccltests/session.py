"""One nccl-tests run end to end on Slurm: write the script, submit it, wait, read the outputs."""

from __future__ import annotations

import os
import re
from typing import Callable

from lingjun_slurm.common.errors import CommandError, UsageError
from lingjun_slurm.slurm.client import SlurmCLI
from lingjun_slurm.transport.base import Transport
from .plan import HOSTLIST_RE, SCRIPT, NcclJob, render
from .results import OpOutput, load_op
from .run import Job, JobEnd, Waiter, submit_all, unconfigured_hint

_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def expand_nodelist(t: Transport, nodelist: str) -> list[str]:
    """`scontrol show hostnames LIST`: node[1-3],gpu7 -> node1 node2 node3 gpu7 (Slurm's own expansion)."""
    if not HOSTLIST_RE.match(nodelist):
        raise UsageError(f"--nodelist {nodelist!r}: a Slurm host list such as node[1-4],gpu7")
    try:
        result = t.run(["scontrol", "show", "hostnames", nodelist], check=True,
                       what=f"--nodelist {nodelist!r}: scontrol show hostnames failed")
    except CommandError as exc:
        raise UsageError(f"{exc}{unconfigured_hint(exc)}") from None
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


def require_slurm(t: Transport, programs: tuple[str, ...] = ("sbatch",)) -> None:
    """Before anything is written: the Slurm commands nccl-test runs are there, and a SLURM_CONF set
    here names a file. UsageError (exit 2) saying what to install or configure, never a traceback.

    A SLURM_CONF naming no file is checked here because Slurm itself would retry it for 60 s before
    failing (SchedMD/slurm src/common/read_config.c: SLURM_CONF is always respected, "leave
    s_p_parse_file() to see if it can actually load the file"; src/common/parse_config.c
    s_p_parse_file: "retrying in 1sec up to 60sec"). Only for the local transport: a remote
    shell's environment is not known here."""
    for program in programs:
        if t.which(program) is not None:
            continue
        if t.kind == "local":
            raise UsageError(f"{program} not found: nccl-test submits through Slurm: run it on a Slurm login node, "
                             "pass --host [USER@]HOST or --cluster NAME to run there over SSH, or write the script "
                             "with --render-only DIR and submit it yourself")
        raise UsageError(f"{program} is not on the PATH of a non-interactive SSH session on {t.host}: put Slurm's "
                         "bin directory on PATH in the shell startup file those sessions read (e.g. ~/.bashrc), "
                         "or use another host")
    problem = slurm_conf_problem(t)
    if problem:
        raise UsageError(problem)


def slurm_conf_problem(t: Transport) -> str:
    """Why Slurm's commands here cannot read their configuration, when SLURM_CONF (local transport
    only) names no file; "" otherwise (see require_slurm)."""
    conf = os.environ.get("SLURM_CONF") if t.kind == "local" else None
    if conf and not os.path.isfile(conf):
        return (f"SLURM_CONF={conf}: no such file (Slurm's commands would retry it for 60 s, then fail): "
                "point SLURM_CONF at the cluster's slurm.conf, or unset it to use /etc/slurm/slurm.conf "
                "or the configless setup")
    return ""


def submit(t: Transport, sched: SlurmCLI, job: NcclJob, *, checked: bool = False) -> Job:
    """Write the script and sbatch it from its directory (its outputs and markers land there).
    checked: the caller has run require_slurm already (over SSH each which() is a command)."""
    if not checked:
        require_slurm(t)
    write_script(t, job)
    return submit_all(sched, [(SCRIPT, job.out_dir, job.job_name)])[0]


def run(t: Transport, waiter: Waiter, job: NcclJob, *, progress: Callable[[str], None],
        checked: bool = False) -> tuple[list[JobEnd], list[OpOutput]]:
    submitted = submit(t, waiter.sched, job, checked=checked)
    progress(f"submitted job {submitted.job_id} ({job.shape()}); outputs in {job.out_dir}")
    ends = waiter.wait([submitted])
    return [ends[submitted.job_id]], [load_op(t, job.out_dir, op) for op in job.ops]
