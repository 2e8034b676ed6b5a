"""Resolving an SSH target through ssh_config: the endpoints (host, port, user, keys, known_hosts
files, jump hosts) that the SSH transport connects to.

paramiko is imported here at module level: this module is imported only through ssh.py, which
the transport package imports lazily (the CLI starts without paramiko).

Design notes (part of the SSH transport's; see ssh.py)

Target and configuration
    `SSHTransport(target)` takes `[USER@]HOST[:PORT]`, `ssh://[USER@]HOST[:PORT]` or an ssh_config
    alias; `host` returns it exactly as given (it is stored in run records and reopened from
    there). The ssh_config file is the `ssh_config` argument, else $LINGJUN_SSH_CONFIG, else
    ~/.ssh/config (a missing file is no config; /etc/ssh/ssh_config is not read). Include lines
    are expanded first (globs, relative names under ~/.ssh, 16 levels; see _config_text() for
    the one case refused). Honoured, through paramiko.SSHConfig (so Host/Match blocks and
    %h/%p/%r/~ tokens work as paramiko supports them; %r is the config's User, not one given in
    the target): HostName, User, Port, IdentityFile (several), IdentitiesOnly, ProxyJump
    (a comma-separated chain, each hop resolved through the config too, the first hop's own
    ProxyJump included; `none` disables), ProxyCommand (when there is no ProxyJump; run by
    paramiko), UserKnownHostsFile, GlobalKnownHostsFile, HashKnownHosts, HostKeyAlias,
    StrictHostKeyChecking, ConnectTimeout, ServerAliveInterval, IdentityAgent. A user or port in the target
    wins over the config's. ConnectTimeout/ServerAliveInterval apply when the constructor's
    connect_timeout/keepalive_s are left at their defaults.
    UserKnownHostsFile names get %-tokens and ${VAR} expanded as ssh(1) does (an unsupported token
    is an error); GlobalKnownHostsFile names do not.
"""

from __future__ import annotations

import getpass
import glob
import os
import re
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import paramiko

from ..common.errors import UsageError
from . import knownhosts
from .target import format_hostport, parse_target

MAX_JUMP_DEPTH = 8
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")  # ssh(1)'s defaults
_TRUE = ("yes", "true", "on")


@dataclass
class Endpoint:
    """One SSH server to connect to, resolved through ssh_config."""

    label: str  # as the user (or the ProxyJump line) wrote it
    hostname: str
    port: int
    user: str
    identity_files: list[str]
    identities_only: bool
    identity_agent: Optional[str]  # IdentityAgent: None (use $SSH_AUTH_SOCK), "none", or a socket path
    global_known_hosts: list[Path]
    user_known_hosts: list[Path]
    strict: str
    hash_known_hosts: bool
    host_key_alias: Optional[str]
    connect_timeout: Optional[float]
    keepalive_s: Optional[int]
    proxy_command: Optional[str] = None
    jump: Optional["Endpoint"] = None
    is_jump: bool = False

    @property
    def hostport(self) -> str:
        return format_hostport(self.hostname, self.port)

    @property
    def where(self) -> str:
        """`alias (hostname:port)`, or just `hostname:port` when that is what was written."""
        shown = self.hostport if self.label in (self.hostport, self.hostname) else f"{self.label} ({self.hostport})"
        return f"jump host {shown}" if self.is_jump else shown

    @property
    def key_name(self) -> str:
        """The name looked up in known_hosts, lowercased as ssh(1) does (hashed entries hash it)."""
        if self.host_key_alias:
            return self.host_key_alias.lower()
        return knownhosts.host_key_name(self.hostname, self.port)


def expand_path(path: str) -> Path:
    """PATH with ~ expanded."""
    return Path(os.path.expanduser(path))


def _files_option(value: Optional[str], tokens: Optional[Mapping[str, str]] = None, what: str = "") -> list[Path]:
    """File names of a known-hosts option; with tokens, %-tokens and ${VAR} are expanded as
    ssh(1) does for UserKnownHostsFile (never for GlobalKnownHostsFile)."""
    if not value:
        return []
    try:
        words = shlex.split(value)
    except ValueError:
        words = value.split()
    words = [w for w in words if w.lower() != "none"]
    if tokens is not None:
        words = [_percent_expand(os.path.expanduser(w), tokens, what) for w in words]
    return [expand_path(w) for w in words]


def _percent_expand(value: str, tokens: Mapping[str, str], what: str) -> str:
    """%% and %X for X in tokens, ${VAR} from the environment. An unknown token is an error (as in
    ssh(1)): a literal `%h` in a known_hosts file name would silently read a file that does not
    exist, and accepting new keys would then accept a changed one."""
    out: list[str] = []
    i = 0
    while i < len(value):
        if value[i] == "%":
            k = value[i + 1:i + 2]
            if k == "%":
                out.append("%")
            elif k and k in tokens:
                out.append(tokens[k])
            else:
                raise UsageError(f"{what}: unsupported token %{k} in {value!r}")
            i += 2
        elif value.startswith("${", i):
            end = value.find("}", i)
            name = value[i + 2:end] if end > 0 else ""
            if not name or name not in os.environ:
                raise UsageError(f"{what}: environment variable {name or value[i:]!r} in {value!r} is not set")
            out.append(os.environ[name])
            i = end + 1
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


_CONFIG_LINE = re.compile(r"^\s*(\w+)(?:\s*=\s*|\s+)(.*?)\s*$")
MAX_INCLUDE_DEPTH = 16


def _config_keyword(line: str) -> tuple[str, str]:
    m = _CONFIG_LINE.match(line)
    return (m.group(1).lower(), m.group(2)) if m else ("", "")


def _config_text(path: Path, depth: int = 0, enclosing: Optional[str] = None) -> str:
    """An ssh_config file with its Include lines replaced by the files they name (paramiko ignores
    Include). As ssh(1): names may be globs, relative names are under ~/.ssh, files are read in
    sorted order, at most 16 levels. After the included lines the enclosing Host/Match block (or,
    at the top, `Host *`) is opened again, so the lines that follow keep applying where they did.
    A Host or Match line in a file included inside a Host/Match block is refused: ssh(1) makes
    such blocks conditional on the enclosing one, which paramiko cannot express, and applying
    them unconditionally could apply settings (StrictHostKeyChecking no...) to every host."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read the ssh_config {path}: {exc.strerror}") from None
    out: list[str] = []
    header = enclosing
    for raw in text.splitlines():
        key, value = _config_keyword(raw)
        if key in ("host", "match"):
            if enclosing is not None:
                raise UsageError(f"{path}: {raw.strip()!r} in a file included inside the block {enclosing.strip()!r}: "
                                 f"Host and Match lines are only supported in files included outside Host/Match blocks")
            header = raw
        if key != "include":
            out.append(raw)
            continue
        if depth >= MAX_INCLUDE_DEPTH:
            raise UsageError(f"{path}: Include nested more than {MAX_INCLUDE_DEPTH} levels deep (a loop?)")
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise UsageError(f"{path}: bad Include line {raw.strip()!r}: {exc}") from None
        for word in words:
            pattern = os.path.expanduser(word)
            if not os.path.isabs(pattern):
                pattern = os.path.join(os.path.expanduser("~/.ssh"), pattern)
            for name in sorted(glob.glob(pattern)):
                if os.path.isfile(name):
                    out.append(f"# Include {name}")
                    out.append(_config_text(Path(name), depth + 1, header))
                    out.append(header if header is not None else "Host *")
    return "\n".join(out) + "\n"


def _local_user(target: str) -> str:
    try:
        return getpass.getuser()
    except Exception:  # no $USER/$LOGNAME and a uid without a passwd entry (containers)
        raise UsageError(f"cannot tell the local user name to log in to {target} as: give USER@HOST "
                         f"or a User in the ssh_config") from None


def _identity_agent(value: Optional[str]) -> Optional[str]:
    """IdentityAgent as ssh(1) reads it: none, SSH_AUTH_SOCK (the default), $VAR or a path."""
    if not value or value == "SSH_AUTH_SOCK":
        return None
    if value.lower() == "none":
        return "none"
    if value.startswith("$") and not value.startswith("${"):
        return os.environ.get(value[1:]) or "none"  # ssh(1): an unset variable means no agent
    return str(expand_path(value))


class SSHConfigFile:
    """One ssh_config file, read (Include lines expanded) on first use, and the endpoints it
    resolves targets to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._config: Optional[paramiko.SSHConfig] = None
        self._loaded = False

    def config(self) -> Optional[paramiko.SSHConfig]:
        """The parsed file; None when there is no such file."""
        if not self._loaded:
            self._loaded = True
            if self.path.is_file():
                text = _config_text(self.path)
                try:
                    self._config = paramiko.SSHConfig.from_text(text)
                except Exception as exc:  # paramiko.ConfigParseError, a Match exec without invoke...
                    raise UsageError(f"cannot read the ssh_config {self.path}: {exc}") from None
        return self._config

    def lookup(self, host: str) -> dict[str, Any]:
        """The options ssh_config gives HOST (lowercased keys), {} without a config."""
        config = self.config()
        if config is None:
            return {}
        try:
            return dict(config.lookup(host))
        except Exception as exc:
            raise UsageError(f"cannot apply the ssh_config {self.path} to {host}: {exc}") from None

    def resolve(self, target: str, *, origin: str, depth: int = 0, jump: object = "config",
                is_jump: bool = False) -> Endpoint:
        """The endpoint for TARGET, with its ProxyJump chain (or ProxyCommand). origin is the target
        the whole chain is resolved for; jump, when not "config", is the chain to put in front of
        this hop instead of the config's ProxyJump."""
        if depth > MAX_JUMP_DEPTH:
            raise UsageError(f"ProxyJump chain for {origin} is longer than {MAX_JUMP_DEPTH} hops "
                             f"(a loop in {self.path}?)")
        user, host, port = parse_target(target)
        opts = self.lookup(host)
        hostname = opts.get("hostname", host)
        try:
            port = port or int(opts.get("port", 22))
        except ValueError:
            raise UsageError(f"{self.path}: Port {opts.get('port')!r} for {host} is not a number") from None

        def number(key: str) -> Optional[float]:
            if key not in opts:
                return None
            try:
                return float(opts[key])
            except ValueError:
                raise UsageError(f"{self.path}: {key} {opts[key]!r} for {host} is not a number") from None

        login = user or opts.get("user") or _local_user(target)
        alias = opts.get("hostkeyalias")
        tokens = {"h": hostname, "p": str(port), "r": login, "n": host, "k": (alias or host).lower(),
                  "d": os.path.expanduser("~"), "i": str(os.getuid()), "l": socket.gethostname(),
                  "L": socket.gethostname().split(".")[0], "j": opts.get("proxyjump") or ""}
        if "userknownhostsfile" in opts and "%u" in opts["userknownhostsfile"]:
            tokens["u"] = _local_user(target)
        user_kh = _files_option(opts.get("userknownhostsfile"), tokens,
                                f"{self.path}: UserKnownHostsFile for {host}")
        global_kh = _files_option(opts.get("globalknownhostsfile")) if "globalknownhostsfile" in opts \
            else [Path(p) for p in GLOBAL_KNOWN_HOSTS]
        ka = number("serveraliveinterval")
        ep = Endpoint(
            label=target, hostname=hostname, port=port, user=login,
            identity_files=list(opts.get("identityfile", [])),
            identities_only=str(opts.get("identitiesonly", "no")).lower() in _TRUE,
            identity_agent=_identity_agent(opts.get("identityagent")),
            global_known_hosts=global_kh, user_known_hosts=user_kh,
            strict=str(opts.get("stricthostkeychecking", "yes")).lower(),
            hash_known_hosts=str(opts.get("hashknownhosts", "no")).lower() in _TRUE,
            host_key_alias=alias, connect_timeout=number("connecttimeout"),
            keepalive_s=int(ka) if ka is not None else None, is_jump=is_jump)
        if jump == "config":
            pj = opts.get("proxyjump")
            if pj and pj.strip().lower() != "none":
                hops = [h.strip() for h in pj.split(",") if h.strip()]
                chain = self.resolve(hops[0], origin=origin, depth=depth + 1, is_jump=True)
                for hop in hops[1:]:
                    chain = self.resolve(hop, origin=origin, depth=depth + 1, jump=chain, is_jump=True)
                ep.jump = chain
            else:
                pc = opts.get("proxycommand")
                if pc and pc.strip().lower() != "none":
                    ep.proxy_command = pc
        else:
            ep.jump = jump  # type: ignore[assignment]
        return ep
