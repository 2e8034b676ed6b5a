"""Where commands run and files live: this machine (local) or, later, a login node over SSH."""

from .base import CommandResult, Transport
from .local import LocalTransport

__all__ = ["CommandResult", "Transport", "LocalTransport", "open_transport"]


def open_transport(kind: str, host: str = "") -> Transport:
    """The transport a run record names (kind "local"; "ssh" arrives with the SSH transport)."""
    from ..errors import UsageError

    if kind == "local":
        return LocalTransport()
    raise UsageError(f"runs on transport {kind!r} ({host}) need a lingjun-slurm with that transport")
