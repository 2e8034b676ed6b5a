"""Errors of the checkpoint tools; the CLI prints them without a traceback."""

from __future__ import annotations

from pathlib import Path

from lingjun_slurm.common.errors import EXIT_FAILURE, EXIT_INVALID, LingjunError


class CheckpointError(LingjunError):
    """A checkpoint operation was refused or failed at run time (exit 1)."""

    exit_code = EXIT_FAILURE


class CheckpointUsageError(LingjunError):
    """The command cannot start: no such directory, unknown URL protocol, missing package (exit 2)."""

    exit_code = EXIT_INVALID


class CheckpointDamaged(CheckpointError):
    """Verification found problems; each one says what is wrong and where."""

    def __init__(self, path: Path | str, problems: list[str]) -> None:
        self.path = str(path)
        self.problems = list(problems)
        super().__init__(str(self))

    def __str__(self) -> str:
        n = len(self.problems)
        head = f"checkpoint {self.path} is damaged ({n} problem{'s' if n != 1 else ''}):"
        return "\n".join([head] + [f"  {p}" for p in self.problems])
