"""Typed errors and the CLI's exit codes (0 ok, 1 run-time failure, 2 invalid input; SSH: 3 host
unreachable, 4 authentication failed, 5 host key refused; 130 Ctrl-C, lingjun_slurm/common/interrupts.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_INVALID = 2
EXIT_UNREACHABLE = 3
EXIT_AUTH = 4
EXIT_HOSTKEY = 5

Loc = tuple[str | int, ...]


def dotted(loc: Loc) -> str:
    """Render a location tuple as a dotted path: ("data", "inputs", 0) -> "data.inputs[0]"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


@dataclass(frozen=True)
class Issue:
    """One problem in a spec: where it is and what was expected."""

    loc: Loc
    message: str
    line: int | None = None

    def format(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line else source
        return f"{where}: {dotted(self.loc)}: {self.message}"


class LingjunError(Exception):
    """Base class for the tool's own errors; the CLI prints them without a traceback."""

    exit_code = EXIT_FAILURE


@dataclass
class SpecError(LingjunError):
    """A spec file is invalid; carries every issue found, each with file, line and field."""

    source: str
    issues: list[Issue] = field(default_factory=list)
    exit_code = EXIT_INVALID

    def __str__(self) -> str:
        head = f"{self.source}: invalid spec ({len(self.issues)} problem{'s' if len(self.issues) != 1 else ''})"
        return "\n".join([head] + ["  " + i.format(self.source) for i in self.issues])


class UsageError(LingjunError):
    """The command line asked for something that cannot be done (bad profile name, ...)."""

    exit_code = EXIT_INVALID


class CommandError(LingjunError):
    """A command (sbatch, squeue, scancel, ...) failed; carries its argv, exit code and raw output."""

    def __init__(self, argv: "list[str] | tuple[str, ...]", returncode: int, stdout: str = "", stderr: str = "",
                 what: str | None = None, host: str = "localhost") -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.what = what
        self.host = host
        super().__init__(str(self))

    def __str__(self) -> str:
        import shlex

        raw = (self.stderr.strip() or self.stdout.strip() or "(no output)").replace("\n", "\n    ")
        head = self.what or f"{self.argv[0] if self.argv else 'command'} failed"
        where = "" if self.host in ("localhost", "") else f" on {self.host}"
        return (f"{head} (exit {self.returncode}){where}: {raw}\n"
                f"  command: {shlex.join(self.argv)}")


class TransportError(LingjunError):
    """The transport itself failed (a file could not be read or written, a connection dropped)."""


class SSHError(TransportError):
    """Connecting over SSH failed; the subclasses carry the exit codes 3, 4 and 5. Messages are one
    line naming the host as written and the resolved HOSTNAME:PORT, never a secret."""


class HostUnreachable(SSHError):
    """DNS failure, connection refused or timed out, no SSH server answering, a jump host that
    could not forward the connection."""

    exit_code = EXIT_UNREACHABLE


class AuthFailed(SSHError):
    """The server accepted none of the keys offered (there are never password prompts)."""

    exit_code = EXIT_AUTH


class HostKeyError(SSHError):
    """The server's host key is not in known_hosts (and accepting new keys was not asked for),
    differs from the recorded one (possible man-in-the-middle) or is revoked."""

    exit_code = EXIT_HOSTKEY


class SubmitError(LingjunError):
    """A submission failed part-way; everything already queued was cancelled."""


class RunNotFound(LingjunError):
    """A RUN argument matched no run, or more than one."""

    exit_code = EXIT_INVALID


class SlurmUnavailable(LingjunError):
    """Slurm could not be asked (slurmctld unreachable, down, or answering with errors): carries
    Slurm's own words. status shows every run it can and marks the rest UNKNOWN before this ends
    the command with exit 1; cancel and resubmit refuse up front."""

    def __init__(self, host: str, message: str, doing: str = "") -> None:
        self.host = host
        self.message = message
        self.doing = doing
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f" on {self.host}" if self.host else ""
        head = f"{self.doing}: " if self.doing else ""
        return f"{head}Slurm did not answer{where}: {self.message}"


class WorkdirBusy(LingjunError):
    """Another run holds the run's workdir (runs/workdir_lock.py); the message names the holder."""
