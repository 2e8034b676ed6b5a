"""The queue reader status uses, and which one: squeue/sacct (the CLI) or pyslurm.

    QueueReader.queue()            every job slurmctld still knows        -> list[JobInfo]
    QueueReader.accounting(ids)    those jobs from the accounting database -> list[JobInfo] | None

SlurmCLI (client.py) forks `squeue` (its text form, `--Format` with epoch times: 0.9 MB for
10,000 jobs where `--json` prints 31 MB; `--json` where that squeue refuses a field of the text
form, then its `failed` says so) and `sacct`, on whatever transport it is given.
PyslurmReader (pyslurm_backend.py) calls libslurm in this process, so it only serves runs
whose transport is this machine. `choose_reader` picks one per status refresh:

    LINGJUN_SCHEDULER=cli       always the CLI
    LINGJUN_SCHEDULER=auto      (default) pyslurm when it passes the guard, else the CLI
    LINGJUN_SCHEDULER=pyslurm   as auto, but a failed guard is a warning on stderr

The guard (pyslurm_backend.detect) never imports pyslurm in this process before a child
process has imported it successfully with SLURM_CONF set, and checks that pyslurm's
major.minor is the cluster's Slurm major.minor. Every fallback has a reason that
`status --verbose` prints.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..common.errors import UsageError
from .reader import QueueReader

if TYPE_CHECKING:
    from ..transport.base import Transport

SCHEDULER_ENV = "LINGJUN_SCHEDULER"
CHOICES = ("auto", "cli", "pyslurm")


@dataclass(frozen=True)
class Choice:
    reader: QueueReader
    reason: str  # why this reader: shown by status --verbose


def scheduler_setting() -> str:
    value = os.environ.get(SCHEDULER_ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise UsageError(f"{SCHEDULER_ENV}={value!r}: expected one of {', '.join(CHOICES)}")
    return value


def choose_reader(t: "Transport", slurm_version: str) -> Choice:
    """The reader for runs on transport t whose cluster runs Slurm slurm_version ("" if unknown)."""
    from .client import SlurmCLI

    setting = scheduler_setting()
    cli = SlurmCLI(t)
    if setting == "cli":
        return Choice(cli, f"squeue/sacct ({SCHEDULER_ENV}=cli)")
    if t.kind != "local":
        why = f"squeue/sacct on {t.host} (pyslurm reads only this machine's cluster)"
        if setting == "pyslurm":
            print(f"warning: {SCHEDULER_ENV}=pyslurm: {why}", file=sys.stderr)
        return Choice(cli, why)
    from . import pyslurm_backend

    found = pyslurm_backend.detect(slurm_version)
    if found.ok:
        return Choice(pyslurm_backend.FallbackReader(pyslurm_backend.PyslurmReader(found.version), cli),
                      f"pyslurm {found.version} ({found.reason})")
    if setting == "pyslurm":
        print(f"warning: {SCHEDULER_ENV}=pyslurm, but {found.reason}: reading the queue with squeue/sacct",
              file=sys.stderr)
    return Choice(cli, f"squeue/sacct ({found.reason})")
