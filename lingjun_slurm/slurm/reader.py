"""The one interface status reads the Slurm queue through (slurm/queue.py chooses the backend):

    QueueReader.queue()            every job slurmctld still knows        -> list[JobInfo]
    QueueReader.accounting(ids)    those jobs from the accounting database -> list[JobInfo] | None

Implemented by SlurmCLI (client.py: squeue/sacct) and PyslurmReader (pyslurm_backend.py).
"""

from __future__ import annotations

from typing import Iterable, Optional, Protocol

from .parse import JobInfo


class QueueReader(Protocol):
    name: str

    def queue(self) -> list[JobInfo]:
        """Every job slurmctld still remembers (callers filter by job id)."""
        ...

    def accounting(self, job_ids: Iterable[str]) -> Optional[list[JobInfo]]:
        """Accounting records of these jobs; None when accounting is not available."""
        ...
