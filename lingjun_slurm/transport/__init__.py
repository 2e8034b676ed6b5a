"""Where commands run and files live: this machine (local) or a login node over SSH.

`SSHTransport` (paramiko) is imported only when asked for: the CLI starts without paramiko.
"""

from typing import TYPE_CHECKING, Any

from .base import CommandResult, Transport
from .local import LocalTransport
from .target import parse_target

if TYPE_CHECKING:
    from .ssh import SSHTransport

__all__ = ["CommandResult", "Transport", "LocalTransport", "SSHTransport", "open_transport", "parse_target"]


def open_transport(kind: str, host: str = "", **options: Any) -> Transport:
    """The transport a run record (or the command line) names: "local", or "ssh" to `host`
    ([USER@]HOST[:PORT] or an ssh_config alias) with SSHTransport's keyword options
    (accept_new_host_key, ssh_config, known_hosts, connect_timeout, keepalive_s,
    command_timeout). The local transport takes no options and ignores them."""
    from ..common.errors import UsageError

    if kind == "local":
        return LocalTransport()
    if kind == "ssh":
        if not host:
            raise UsageError("an SSH transport needs a host ([USER@]HOST[:PORT] or an ssh_config alias)")
        try:
            from .ssh import SSHTransport
        except ImportError as exc:
            raise UsageError(f"SSH needs paramiko ({exc}); pip install 'lingjun-slurm[ssh]'") from None
        return SSHTransport(host, **options)
    raise UsageError(f"runs on transport {kind!r} ({host}) need a lingjun-slurm with that transport")


def __getattr__(name: str) -> Any:
    if name == "SSHTransport":
        from .ssh import SSHTransport

        return SSHTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
