"""`[USER@]HOST[:PORT]` targets (also `ssh://[USER@]HOST[:PORT]` and ssh_config aliases).

No paramiko here: the CLI validates `--host` without importing it.
"""

from __future__ import annotations

import re
from typing import Optional

from ..common.errors import UsageError

# Host names, IPv4 addresses and ssh_config aliases; IPv6 addresses go in brackets: [::1]:2222.
_HOST_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?$|^[A-Za-z0-9_]$")
_IPV6_RE = re.compile(r"^[0-9A-Fa-f:.]+(?:%[A-Za-z0-9._-]+)?$")
_USER_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.@+-]*\$?$")
_EXPECTED = "expected [USER@]HOST[:PORT], ssh://[USER@]HOST[:PORT] or an ssh_config alias"


def parse_target(s: str) -> tuple[Optional[str], str, Optional[int]]:
    """Split a target into (user or None, host, port or None); raise UsageError when it is not one.

    Refused: empty host, whitespace, quotes, control characters, shell metacharacters, a host
    starting with '-', ports outside 1..65535. The host is returned without IPv6 brackets.
    """
    if not isinstance(s, str) or not s:
        raise UsageError(f"invalid host {s!r}: {_EXPECTED}")
    rest = s
    if rest.lower().startswith("ssh://"):
        rest = rest[len("ssh://"):]
        if rest.endswith("/"):
            rest = rest[:-1]
    user: Optional[str] = None
    if "@" in rest:
        user, _, rest = rest.rpartition("@")
        if not _USER_RE.match(user):
            raise UsageError(f"invalid host {s!r}: bad user name {user!r} ({_EXPECTED})")
    port: Optional[int] = None
    if rest.startswith("["):
        host, sep, tail = rest[1:].partition("]")
        if not sep or not _IPV6_RE.match(host) or (tail and not tail.startswith(":")):
            raise UsageError(f"invalid host {s!r}: {_EXPECTED}")
        port_text = tail[1:] if tail else None
    else:
        host, sep, port_text_ = rest.partition(":")
        port_text = port_text_ if sep else None
        if not _HOST_RE.match(host):
            raise UsageError(f"invalid host {s!r}: {_EXPECTED}")
    if port_text is not None:
        if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise UsageError(f"invalid host {s!r}: the port must be a number in 1..65535")
        port = int(port_text)
    return user, host, port


def format_hostport(host: str, port: int) -> str:
    """HOST:PORT, with brackets around IPv6 addresses."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
