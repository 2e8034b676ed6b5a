"""The SSH transport: commands and files on a remote login node, over one paramiko connection.

Design notes (docs/remote.md summarises them for users)

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

Keys (never a password or passphrase prompt)
    Tried in OpenSSH's order: each IdentityFile (or, when the config names none,
    ~/.ssh/id_ed25519, id_ecdsa, id_rsa), signed by the ssh-agent ($SSH_AUTH_SOCK) when the agent
    holds that key (matched through the file's .pub), else loaded from the file; then the agent's
    other keys, unless IdentitiesOnly yes. The agent is the one at IdentityAgent (a path, $VAR,
    or none: no agent) when the config names one. An encrypted key file the agent does not hold is
    skipped, and when nothing works the message names it and says to ssh-add it. Password and
    keyboard-interactive authentication are never attempted; a server that wants a second
    factor after the key is an authentication failure.

Host keys
    Read from the known_hosts file (the `known_hosts` argument, else $LINGJUN_KNOWN_HOSTS, else
    the config's first UserKnownHostsFile, else ~/.ssh/known_hosts), the config's other
    UserKnownHostsFiles (%-tokens and ${VAR} expanded as ssh(1) does; an unsupported token is an
    error) or ~/.ssh/known_hosts2, and /etc/ssh/ssh_known_hosts{,2} (or GlobalKnownHostsFile).
    Host names are lowercased, as ssh(1) does, before they are matched or hashed. Hashed entries,
    wildcard and !negated patterns and @revoked lines are understood; @cert-authority lines are
    ignored (host certificates are not supported). The key is checked right after the key
    exchange, before any authentication, for every hop of a ProxyJump chain. Unknown: refused
    (HostKeyError, exit 5) unless accept_new_host_key=True (the CLI's --accept-new-host-key) or
    StrictHostKeyChecking accept-new/no/off in ssh_config, in which case it is accepted and
    appended to the first known_hosts file (plain `[host]:port type key` as OpenSSH writes, or
    hashed with HashKnownHosts yes; a missing file is created 0600 in a 0700 directory), after
    the files are read again under a flock of that file (another process may have recorded a
    key in the meantime, which is then checked instead).
    A mismatch, a key of a type other than the recorded one, or a revoked key is always refused
    (unlike OpenSSH's StrictHostKeyChecking=no, which connects anyway).

Connection
    Opened lazily on first use; one paramiko Transport plus one SFTP session serve every command
    and file operation until close() (a connection found dead before an operation is reopened).
    connect_timeout bounds the TCP connect, the banner, the key exchange and authentication;
    keepalive_s sends SSH keepalives (and TCP keepalive is on). Opening a channel and the
    requests paramiko would wait on for ever (exec, the sftp subsystem, SFTP's version exchange)
    are bounded by max(connect_timeout, 10 s). Errors: DNS failure, refused,
    timed out, no SSH server, a jump host that cannot forward -> HostUnreachable (3); no key
    accepted -> AuthFailed (4); host key unknown/mismatched/revoked -> HostKeyError (5); a
    connection lost during a command or a file operation -> TransportError (1) naming what ran.

Commands
    The remote sshd hands the command line to the user's login shell (which must be POSIX-like:
    sh, bash, dash, zsh), so every word is quoted with shlex: `cd -- 'CWD' || exit 126; if
    command -v timeout >/dev/null 2>&1; then exec timeout -k 5 T env -- 'NAME=value' 'argv0'
    'arg'...; else exec env -- ...; fi` (see command_line()). Environment names are checked
    ([A-Za-z_][A-Za-z0-9_]*); values, arguments and paths are never interpreted by the shell.
    Values travel on that command line, so other users of the login node can read them in
    ps(1): never pass secrets in env. A relative cwd is `./CWD` (under the home; never a
    directory found through $CDPATH).
    stdin gets `input` then EOF; stdout and stderr are read by two threads (no deadlock on large
    outputs). The run's timeout (or command_timeout when the caller passes None; both None: no
    limit) is enforced on the remote by coreutils `timeout -k 5 T` when the remote has it
    (SIGTERM, SIGKILL 5 s later, exit 124 with the output so far); should no answer come
    LOCAL_GRACE_S after T (a hung connection, no `timeout` there), the program gets SIGTERM through
    an SSH "signal" request (best effort) and the channel is closed; exit 124 either way. A
    missing program is 127, a missing cwd 126, a command that ended without an exit status
    (killed by a signal) 255, like ssh(1). The PATH is what sshd gives a non-interactive
    session (plus whatever the login shell's rc files add for non-interactive shells).
    which() scans that PATH with a fixed `sh -c` script, the name passed as $1.

Files (over the one SFTP session)
    `~` and `~/...` are expanded to the remote home (SFTP's normalize('.'), asked once);
    relative paths are relative to the home, as for commands. write_atomic and put write
    `.NAME.tmp.<random>` beside the target (created exclusively, mode 0600), chmod it, then
    posix-rename@openssh.com over the target (a server without that extension gets remove +
    rename: not atomic). put streams 1 MiB local reads as pipelined 32 KiB writes; get reads
    2 MiB windows of pipelined 32 KiB requests (paramiko's getfo keeps whatever arrives faster
    than it is written, up to the whole file) into a local temp file it then renames; neither
    holds the file in memory. No fsync on the remote. Each SFTP request is bounded by
    command_timeout. mkdir creates
    parents; exist_ok=False relies on the server's mkdir failing on an existing directory, so of
    two racing callers exactly one wins. follow() keeps one remote file handle open and polls it.

Lock
    lock(path) runs `flock -x -E 75 -w TIMEOUT PATH sh -c 'echo locked; exec cat >/dev/null'`
    on a channel of its own: the lock is held while that channel lives and released by closing
    its stdin (or when the connection dies: sshd closes the pipe). It excludes other holders on
    any host whose filesystem honours flock (local disks; NFSv4 maps it to POSIX locks; Lustre
    needs the `flock` mount option) and interoperates with the local transport's flock. It needs
    flock (util-linux) on the remote. A holder whose connection drops loses the lock; its next
    operation inside the with-block fails (TransportError) instead of reconnecting.

Not supported (yet)
    /etc/ssh/ssh_config, Match exec (needs the invoke package), CheckHostIP, ServerAliveCountMax
    (keepalives are sent, missing replies are not counted), host and user certificates,
    ControlMaster, ForwardAgent, passwords and keyboard-interactive. No reconnect in the middle of
    an operation: it fails (TransportError) and the next operation reconnects.

Logging
    Nothing secret is logged or put in messages: key files are named, key material and
    passphrases never. paramiko's logger is silenced (and gets a NullHandler, so its
    thread's tracebacks never reach the terminal) unless LINGJUN_DEBUG is set.
"""

from __future__ import annotations

import base64
import errno
import getpass
import glob
import logging
import os
import posixpath
import re
import secrets
import shlex
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping, Optional

import paramiko
import paramiko.agent

from ..errors import AuthFailed, HostKeyError, HostUnreachable, TransportError, UsageError
from . import knownhosts
from .base import Transport
from .target import format_hostport, parse_target

log = logging.getLogger("lingjun_slurm.ssh")

_paramiko_log = logging.getLogger("paramiko")
_paramiko_log.addHandler(logging.NullHandler())
if not os.environ.get("LINGJUN_DEBUG"):
    _paramiko_log.setLevel(logging.CRITICAL + 10)

DEFAULT_CONNECT_TIMEOUT = 15.0
DEFAULT_KEEPALIVE_S = 30
DEFAULT_COMMAND_TIMEOUT = 120.0
MAX_JUMP_DEPTH = 8
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")  # ssh(1)'s defaults
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LOCK_TIMEOUT_RC = 75
REMOTE_KILL_GRACE_S = 5  # timeout -k: SIGKILL this long after SIGTERM
LOCAL_GRACE_S = 10.0  # past the timeout, wait this long for the remote's own 124 before giving up on it
_TRUE = ("yes", "true", "on")
GET_WINDOW = 2 << 20  # get(): bytes requested at once (64 pipelined SFTP reads)
# Host key types recorded in known_hosts -> the algorithms that negotiate them.
_ALGS_FOR_TYPE = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}


@dataclass
class _Endpoint:
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
    jump: Optional["_Endpoint"] = None
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


def _expand(path: str) -> Path:
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
    return [_expand(w) for w in words]


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


class SSHTransport(Transport):
    """Commands and files on `target` over SSH (see the module docstring)."""

    kind = "ssh"

    def __init__(self, target: str, *, accept_new_host_key: bool = False, ssh_config: Optional[Path] = None,
                 known_hosts: Optional[Path] = None, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 keepalive_s: int = DEFAULT_KEEPALIVE_S,
                 command_timeout: Optional[float] = DEFAULT_COMMAND_TIMEOUT) -> None:
        super().__init__()
        parse_target(target)  # validate now: UsageError before anything connects
        self._target = target
        self.accept_new_host_key = accept_new_host_key
        config_path = ssh_config or os.environ.get("LINGJUN_SSH_CONFIG") or "~/.ssh/config"
        self.ssh_config_path = _expand(str(config_path))
        kh = known_hosts or os.environ.get("LINGJUN_KNOWN_HOSTS")
        self._known_hosts_arg = _expand(str(kh)) if kh else None
        self.connect_timeout = connect_timeout
        self.keepalive_s = keepalive_s
        self.command_timeout = command_timeout
        self._config: Optional[paramiko.SSHConfig] = None
        self._config_loaded = False
        self._lock = threading.RLock()
        self._t: Optional[paramiko.Transport] = None
        self._sftp: Optional[paramiko.SFTPClient] = None
        self._hops: list[paramiko.Transport] = []
        self._home: Optional[str] = None
        self._endpoint: Optional[_Endpoint] = None
        self._locks_held: list[str] = []  # lock() paths whose with-block is running
        self.connections = 0  # SSH connections opened (hops included): tests count them

    # --- identity -----------------------------------------------------------------------
    @property
    def host(self) -> str:
        return self._target

    def __repr__(self) -> str:
        return f"SSHTransport({self._target!r})"

    # --- ssh_config -----------------------------------------------------------------------
    def _ssh_config(self) -> Optional[paramiko.SSHConfig]:
        if not self._config_loaded:
            self._config_loaded = True
            if self.ssh_config_path.is_file():
                text = _config_text(self.ssh_config_path)
                try:
                    self._config = paramiko.SSHConfig.from_text(text)
                except Exception as exc:  # paramiko.ConfigParseError, a Match exec without invoke...
                    raise UsageError(f"cannot read the ssh_config {self.ssh_config_path}: {exc}") from None
        return self._config

    def _lookup(self, host: str) -> dict:
        config = self._ssh_config()
        if config is None:
            return {}
        try:
            return dict(config.lookup(host))
        except Exception as exc:
            raise UsageError(f"cannot apply the ssh_config {self.ssh_config_path} to {host}: {exc}") from None

    def _resolve(self, target: str, depth: int = 0, jump: object = "config", is_jump: bool = False) -> _Endpoint:
        if depth > MAX_JUMP_DEPTH:
            raise UsageError(f"ProxyJump chain for {self._target} is longer than {MAX_JUMP_DEPTH} hops "
                             f"(a loop in {self.ssh_config_path}?)")
        user, host, port = parse_target(target)
        opts = self._lookup(host)
        hostname = opts.get("hostname", host)
        try:
            port = port or int(opts.get("port", 22))
        except ValueError:
            raise UsageError(f"{self.ssh_config_path}: Port {opts.get('port')!r} for {host} is not a number") from None

        def number(key: str) -> Optional[float]:
            if key not in opts:
                return None
            try:
                return float(opts[key])
            except ValueError:
                raise UsageError(f"{self.ssh_config_path}: {key} {opts[key]!r} for {host} is not a number") from None

        login = user or opts.get("user") or _local_user(target)
        alias = opts.get("hostkeyalias")
        tokens = {"h": hostname, "p": str(port), "r": login, "n": host, "k": (alias or host).lower(),
                  "d": os.path.expanduser("~"), "i": str(os.getuid()), "l": socket.gethostname(),
                  "L": socket.gethostname().split(".")[0], "j": opts.get("proxyjump") or ""}
        if "userknownhostsfile" in opts and "%u" in opts["userknownhostsfile"]:
            tokens["u"] = _local_user(target)
        user_kh = _files_option(opts.get("userknownhostsfile"), tokens,
                                f"{self.ssh_config_path}: UserKnownHostsFile for {host}")
        global_kh = _files_option(opts.get("globalknownhostsfile")) if "globalknownhostsfile" in opts \
            else [Path(p) for p in GLOBAL_KNOWN_HOSTS]
        ka = number("serveraliveinterval")
        ep = _Endpoint(
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
                chain = self._resolve(hops[0], depth + 1, is_jump=True)
                for hop in hops[1:]:
                    chain = self._resolve(hop, depth + 1, jump=chain, is_jump=True)
                ep.jump = chain
            else:
                pc = opts.get("proxycommand")
                if pc and pc.strip().lower() != "none":
                    ep.proxy_command = pc
        else:
            ep.jump = jump  # type: ignore[assignment]
        return ep

    def _known_hosts_files(self, ep: _Endpoint) -> tuple[Path, list[Path]]:
        """(the file new keys go to, every file read)."""
        user_files = ep.user_known_hosts or [_expand(p) for p in USER_KNOWN_HOSTS]
        primary = self._known_hosts_arg or user_files[0]
        if self._known_hosts_arg and not ep.user_known_hosts:
            user_files = []  # the argument (or $LINGJUN_KNOWN_HOSTS) replaces the default files
        files = [primary] + [p for p in user_files if p != primary] + ep.global_known_hosts
        return primary, files

    # --- connecting -------------------------------------------------------------------------
    def _timeout_for(self, ep: _Endpoint) -> float:
        if self.connect_timeout == DEFAULT_CONNECT_TIMEOUT and ep.connect_timeout:
            return ep.connect_timeout
        return self.connect_timeout

    def _keepalive_for(self, ep: _Endpoint) -> int:
        if self.keepalive_s == DEFAULT_KEEPALIVE_S and ep.keepalive_s is not None:
            return ep.keepalive_s
        return self.keepalive_s

    def _ensure(self) -> paramiko.Transport:
        with self._lock:
            if self._t is not None and self._t.is_active():
                return self._t
            if self._t is not None:
                if self._locks_held:
                    raise TransportError(f"connection to {self.where} lost while holding the lock "
                                         f"{self._locks_held[-1]} there; the lock is released, so not reconnecting")
                log.debug("connection to %s found closed; reconnecting", self._target)
                self._close_connection()
            if self._endpoint is None:
                self._endpoint = self._resolve(self._target)
            hops: list[paramiko.Transport] = []
            try:
                self._t = self._connect(self._endpoint, hops)
            except BaseException:
                for t in reversed(hops):
                    t.close()
                raise
            self._hops = hops[:-1]
            return self._t

    def _sftp_client(self) -> paramiko.SFTPClient:
        with self._lock:
            t = self._ensure()
            if self._sftp is None or self._sftp.get_channel() is None or self._sftp.get_channel().closed:
                # Not SFTPClient.from_transport: its channel open, subsystem request and version
                # exchange wait without a limit (an hour, or for ever) on a server that hangs, as
                # one does whose home directory is on a hung NFS server.
                self._sftp = None
                limit = self._answer_limit()
                chan = self._open_session()
                try:
                    self._bounded(chan, limit, "the sftp subsystem request", lambda: chan.invoke_subsystem("sftp"))
                    chan.settimeout(limit)
                    sftp = paramiko.SFTPClient(chan)
                except TransportError:
                    chan.close()
                    raise
                except (socket.timeout, TimeoutError):
                    chan.close()
                    raise TransportError(f"cannot start SFTP on {self.where}: no answer within {limit:g} s") from None
                except (paramiko.SSHException, EOFError, OSError) as exc:
                    chan.close()
                    raise TransportError(f"cannot start SFTP on {self.where}: {exc or type(exc).__name__} "
                                         f"(is the sftp subsystem enabled there?)") from None
                chan.settimeout(self.command_timeout or None)
                self._sftp = sftp
                self._home = None
            return self._sftp

    def _answer_limit(self) -> float:
        """How long to wait for the server to answer a channel request (connect_timeout, at least 10 s)."""
        return max(self._timeout_for(self._endpoint) if self._endpoint else self.connect_timeout, 10.0)

    def _bounded(self, chan: paramiko.Channel, seconds: float, what: str, request: Callable[[], object]) -> None:
        """Run a channel request (exec, subsystem) that paramiko would wait on without a limit: close
        the channel (which wakes the waiter) when the server has not answered within seconds."""
        fired = threading.Event()

        def expire() -> None:
            fired.set()
            chan.close()

        timer = threading.Timer(seconds, expire)
        timer.daemon = True
        timer.start()
        try:
            request()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if fired.is_set():
                raise TransportError(f"{self.where} did not answer {what} within {seconds:g} s") from None
            t = chan.get_transport()
            if t is None or not t.is_active():
                raise TransportError(f"connection to {self.where} lost during {what}") from None
            raise TransportError(f"{what} failed on {self.where}: {exc or type(exc).__name__}") from None
        finally:
            timer.cancel()
        if fired.is_set():
            raise TransportError(f"{self.where} did not answer {what} within {seconds:g} s")

    def _open_socket(self, ep: _Endpoint, hops: list[paramiko.Transport], timeout: float) -> object:
        if ep.jump is not None:
            parent = self._connect(ep.jump, hops)
            try:
                return parent.open_channel("direct-tcpip", (ep.hostname, ep.port), ("127.0.0.1", 0), timeout=timeout)
            except paramiko.ChannelException as exc:
                why = {1: "forwarding is prohibited there (AllowTcpForwarding?)",
                       2: "it could not connect"}.get(exc.code, exc.text or f"channel error {exc.code}")
                raise HostUnreachable(f"cannot reach {ep.where} through {ep.jump.where}: {why}") from None
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise HostUnreachable(f"cannot reach {ep.where} through {ep.jump.where}: "
                                      f"{exc or type(exc).__name__}") from None
        if ep.proxy_command:
            try:
                return paramiko.ProxyCommand(ep.proxy_command)
            except Exception as exc:
                raise HostUnreachable(f"cannot reach {ep.where}: ProxyCommand failed to start: {exc}") from None
        try:
            sock = socket.create_connection((ep.hostname, ep.port), timeout=timeout)
        except socket.gaierror as exc:
            raise HostUnreachable(f"cannot reach {ep.where}: cannot resolve the host name {ep.hostname} "
                                  f"({exc.strerror})") from None
        except UnicodeError:  # the IDNA codec refuses the name (an empty or over-long label: a..b)
            raise HostUnreachable(f"cannot reach {ep.where}: cannot resolve the host name {ep.hostname} "
                                  f"(not a valid DNS name)") from None
        except ConnectionRefusedError:
            raise HostUnreachable(f"cannot reach {ep.where}: connection refused (no SSH server on port {ep.port}?)") from None
        except (socket.timeout, TimeoutError):
            raise HostUnreachable(f"cannot reach {ep.where}: timed out after {timeout:g} s") from None
        except OSError as exc:
            raise HostUnreachable(f"cannot reach {ep.where}: {exc.strerror or exc}") from None
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return sock

    def _connect(self, ep: _Endpoint, hops: list[paramiko.Transport]) -> paramiko.Transport:
        """Connect (through ep.jump when set), verify the host key, authenticate. Every Transport
        opened is appended to hops (the last one is ep's), so the caller can close them all."""
        timeout = self._timeout_for(ep)
        sock = self._open_socket(ep, hops, timeout)
        log.debug("connecting to %s", ep.where)
        t = paramiko.Transport(sock)  # type: ignore[arg-type]
        hops.append(t)
        t.banner_timeout = timeout
        t.handshake_timeout = timeout
        t.auth_timeout = timeout
        primary, files = self._known_hosts_files(ep)
        entries = knownhosts.load(files)
        self._prefer_known_types(t, knownhosts.known_types(entries, ep.key_name))
        try:
            t.start_client(timeout=timeout)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            text = str(exc) or type(exc).__name__
            if "banner" in text.lower() or isinstance(exc, (EOFError, OSError)):
                raise HostUnreachable(f"cannot reach {ep.where}: no SSH server answered ({text})") from None
            raise HostUnreachable(f"cannot reach {ep.where}: SSH negotiation failed ({text})") from None
        if not (t.is_active() and t.initial_kex_done):  # start_client's timeout returns quietly
            exc = t.get_exception()
            t.close()
            why = f"{exc}" if exc else f"no answer within {timeout:g} s"
            raise HostUnreachable(f"cannot reach {ep.where}: no SSH server answered ({why})")
        self.connections += 1
        self._check_host_key(t, ep, primary, files, entries)
        self._authenticate(t, ep)
        t.set_keepalive(self._keepalive_for(ep))
        log.debug("connected to %s as %s", ep.where, ep.user)
        return t

    @staticmethod
    def _prefer_known_types(t: paramiko.Transport, types: list[str]) -> None:
        if not types:
            return
        opts = t.get_security_options()
        available = list(opts.key_types)
        first = [alg for kt in types for alg in _ALGS_FOR_TYPE.get(kt, (kt,)) if alg in available]
        if first:
            opts.key_types = tuple(dict.fromkeys(first + available))

    def _check_host_key(self, t: paramiko.Transport, ep: _Endpoint, primary: Path, files: list[Path],
                        entries: list[knownhosts.KnownHost]) -> None:
        key = t.get_remote_server_key()
        blob = key.asbytes()
        ktype, fp = knownhosts.blob_type(blob), knownhosts.fingerprint(blob)
        verdict = knownhosts.check(entries, ep.key_name, blob)
        if verdict.status == "unknown":
            accept = self.accept_new_host_key or ep.strict in ("accept-new", "no", "off", "false")
            if not accept:
                raise HostKeyError(
                    f"the host key of {ep.where} is not known ({ktype} {fp} is in none of "
                    f"{', '.join(str(f) for f in files)}); check the fingerprint, then connect once with "
                    f"--accept-new-host-key to record it in {primary}")
            # Read the files again under a lock: another process may have recorded a key meanwhile.
            verdict = knownhosts.record(primary, files, ep.key_name, blob, hashed=ep.hash_known_hosts)
            if verdict.status == "added":
                log.info("recorded the new host key of %s in %s: %s %s", ep.where, primary, ktype, fp)
                return
        if verdict.status == "ok":
            log.debug("host key of %s matches %s", ep.where, verdict.entry.where if verdict.entry else "")
            return
        if verdict.status == "revoked":
            assert verdict.entry is not None
            raise HostKeyError(f"the host key of {ep.where} ({ktype} {fp}) is marked @revoked in "
                               f"{verdict.entry.where}; refusing to connect")
        e = verdict.entry
        assert verdict.status == "mismatch" and e is not None
        recorded = ("a different key" if knownhosts.blob_type(e.blob) == ktype
                    else f"only a {knownhosts.blob_type(e.blob)} key")
        raise HostKeyError(
            f"HOST KEY MISMATCH for {ep.where}: the server offers {ktype} {fp} but {e.where} records "
            f"{recorded} for {ep.key_name}; possible man-in-the-middle attack (or the host was "
            f"reinstalled); refusing to connect. If the change is expected, remove the old key "
            f"(ssh-keygen -R '{ep.key_name}' -f {e.path}) and connect again with --accept-new-host-key")

    def _agent_keys(self, ep: _Endpoint) -> tuple[list[paramiko.PKey], Optional[str], Optional[_SocketAgent]]:
        if ep.identity_agent == "none":
            return [], "no ssh-agent (IdentityAgent none)", None
        path = ep.identity_agent or os.environ.get("SSH_AUTH_SOCK")
        if not path:
            return [], "no ssh-agent ($SSH_AUTH_SOCK unset)", None
        agent = None
        try:
            agent = _SocketAgent(path)
            keys = list(agent.get_keys())
        except Exception as exc:  # a stale socket, an agent speaking something else
            if agent is not None:
                agent.close()
            return [], f"ssh-agent unusable ({type(exc).__name__})", None
        return keys, None if keys else "ssh-agent holds no keys", agent

    def _authenticate(self, t: paramiko.Transport, ep: _Endpoint) -> None:
        agent_keys, agent_note, agent = self._agent_keys(ep)
        try:
            self._authenticate_with(t, ep, agent_keys, agent_note)
        finally:
            if agent is not None:
                agent.close()  # one agent connection per login, not one left open per hop and reconnect

    def _authenticate_with(self, t: paramiko.Transport, ep: _Endpoint, agent_keys: list[paramiko.PKey],
                           agent_note: Optional[str]) -> None:
        explicit = bool(ep.identity_files)
        paths = [_expand(p) for p in (ep.identity_files or DEFAULT_IDENTITIES)]
        notes: list[str] = []
        if agent_note and (not ep.identities_only or agent_keys):
            notes.append(agent_note)
        agent_by_blob = {k.asbytes(): k for k in agent_keys}
        # As OpenSSH orders them: each identity file (its agent copy when the agent holds it, so an
        # encrypted file needs no passphrase), then the agent's other keys unless IdentitiesOnly.
        candidates: list[tuple[str, paramiko.PKey]] = []
        used: set[bytes] = set()

        def add(label: str, key: paramiko.PKey) -> None:
            if key.asbytes() not in used:
                used.add(key.asbytes())
                candidates.append((label, key))

        def agent_label(k: paramiko.PKey) -> str:
            return f"ssh-agent {k.get_name()} {knownhosts.fingerprint(k.asbytes())}"

        for path in paths:
            pub_blob = _public_blob(path)
            if pub_blob is not None and pub_blob in agent_by_blob:
                add(agent_label(agent_by_blob[pub_blob]), agent_by_blob[pub_blob])
                continue
            if not path.is_file():
                if explicit:
                    notes.append(f"identity file {path} does not exist")
                continue
            try:
                key = paramiko.PKey.from_path(str(path))
            except (TypeError, paramiko.PasswordRequiredException):
                notes.append(f"{path} is encrypted and ssh-agent does not hold it (ssh-add {path})")
                continue
            except Exception as exc:
                notes.append(f"cannot load the key {path} ({type(exc).__name__})")
                continue
            if key.asbytes() in agent_by_blob:
                add(agent_label(agent_by_blob[key.asbytes()]), agent_by_blob[key.asbytes()])
            else:
                add(f"{path} ({key.get_name()})", key)
        if not ep.identities_only:
            for k in agent_keys:
                add(agent_label(k), k)
        tried: list[str] = []
        who = f"{ep.user}@{ep.where}"
        for label, key in candidates:
            tried.append(label)
            try:
                remaining = t.auth_publickey(ep.user, key)
            except paramiko.BadAuthenticationType as exc:
                allowed = ", ".join(exc.allowed_types) or "none"
                raise AuthFailed(f"authentication failed for {who}: the server does not accept keys "
                                 f"(it allows: {allowed}); lingjun-slurm authenticates with keys only") from None
            except paramiko.AuthenticationException:
                continue
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if not t.is_active():
                    raise AuthFailed(f"authentication failed for {who}: the server closed the connection after "
                                     f"{len(tried)} key(s) ({'; '.join(tried)}; MaxAuthTries?)") from None
                raise TransportError(f"authentication with {who} failed: {exc or type(exc).__name__}") from None
            if remaining:
                raise AuthFailed(f"authentication failed for {who}: the key {label} was accepted but the server "
                                 f"also wants {', '.join(remaining)}, and lingjun-slurm never prompts")
            log.debug("authenticated to %s with %s", ep.where, label)
            return
        offered = f"none of the keys offered was accepted ({'; '.join(tried)})" if tried else "no key to offer"
        extra = f"; {'; '.join(notes)}" if notes else ""
        raise AuthFailed(f"authentication failed for {who}: {offered}{extra}. lingjun-slurm never asks for "
                         f"passwords: authorize a public key on the server, load it into ssh-agent, or name it "
                         f"with IdentityFile in {self.ssh_config_path}")

    def connect(self) -> "SSHTransport":
        """Connect now (otherwise the first command or file operation does)."""
        self._ensure()
        return self

    @property
    def where(self) -> str:
        if self._endpoint is None:
            self._endpoint = self._resolve(self._target)
        return self._endpoint.where

    def _close_connection(self) -> None:
        if self._sftp is not None:
            try:
                self._sftp.close()
            except Exception:
                pass
        if self._t is not None:
            self._t.close()
        for t in reversed(self._hops):
            t.close()
        self._sftp, self._t, self._hops, self._home = None, None, [], None

    def close(self) -> None:
        with self._lock:
            self._close_connection()

    # --- commands ---------------------------------------------------------------------------
    @staticmethod
    def command_line(argv: tuple[str, ...], cwd: Optional[str] = None,
                     env: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None) -> str:
        """The remote command line for the login shell: every word quoted; `exec`, so the program
        replaces the shell; under coreutils' `timeout` when a timeout is given and it exists."""
        if not argv:
            raise UsageError("empty command")
        for name in env or {}:
            if not _ENV_NAME.match(name):
                raise UsageError(f"invalid environment variable name {name!r} for a remote command")
        words: list[str] = []
        if env:
            words += ["env", "--"] + [shlex.quote(f"{k}={v}") for k, v in env.items()]
        words += [shlex.quote(a) for a in argv]
        line = "exec " + " ".join(words)
        if timeout is not None:
            limited = f"exec timeout -k {REMOTE_KILL_GRACE_S} {max(timeout, 0.001):.3f} " + " ".join(words)
            line = f"if command -v timeout >/dev/null 2>&1; then {limited}; else {line}; fi"
        if cwd is not None:
            # ./ : a relative directory is the one under the home, never one found through $CDPATH
            # (cd would also print it, on the program's stdout).
            where = cwd if cwd.startswith("/") else f"./{cwd}"
            line = f"cd -- {shlex.quote(where)} || exit 126; {line}"
        return line

    def _open_session(self) -> paramiko.Channel:
        t = self._ensure()
        limit = self._answer_limit()
        try:
            return t.open_session(timeout=limit)
        except paramiko.ChannelException as exc:
            raise TransportError(f"{self.where} refused a new session ({exc.text or exc.code}; MaxSessions?)") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if t.is_active():
                raise TransportError(f"{self.where} did not open a session within {limit:g} s "
                                     f"({exc or type(exc).__name__})") from None
            raise TransportError(f"connection to {self.where} lost: {exc or type(exc).__name__}") from None

    def _signal(self, chan: paramiko.Channel, name: str) -> None:
        """Send an SSH "signal" request (RFC 4254 6.9). Best effort: OpenSSH's sshd honours it only
        with post-auth privilege separation, which it skips for root logins."""
        try:
            m = paramiko.Message()
            m.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
            m.add_int(chan.remote_chanid)
            m.add_string("signal")
            m.add_boolean(False)
            m.add_string(name)
            chan.transport._send_user_message(m)  # type: ignore[union-attr]
        except Exception:
            pass

    def _run(self, argv: tuple[str, ...], *, cwd: Optional[str], env: Optional[Mapping[str, str]],
             input: Optional[str], timeout: Optional[float]) -> tuple[int, str, str]:
        if timeout is None:
            timeout = self.command_timeout
        line = self.command_line(argv, self._path(cwd) if cwd is not None else None, env, timeout)
        chan = self._open_session()
        started = time.monotonic()
        what = shlex.join(argv)
        try:
            self._bounded(chan, self._answer_limit(), f"the request to run {what}", lambda: chan.exec_command(line))
        except TransportError:
            chan.close()
            raise
        out: list[bytes] = []
        err: list[bytes] = []

        def pump(recv: Callable[[int], bytes], sink: list[bytes]) -> None:
            try:
                while True:
                    data = recv(1 << 16)
                    if not data:
                        return
                    sink.append(data)
            except Exception:
                return

        def feed() -> None:
            try:
                if input:
                    chan.sendall(input.encode("utf-8"))
            except Exception:
                pass
            finally:
                try:
                    chan.shutdown_write()
                except Exception:
                    pass

        threads = [threading.Thread(target=pump, args=(chan.recv, out), daemon=True),
                   threading.Thread(target=pump, args=(chan.recv_stderr, err), daemon=True),
                   threading.Thread(target=feed, daemon=True)]
        for th in threads:
            th.start()
        deadline = None if timeout is None else time.monotonic() + timeout + LOCAL_GRACE_S
        timed_out = False
        for th in threads[:2]:
            th.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if th.is_alive():
                timed_out = True
                break
        if not timed_out:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not chan.status_event.wait(remaining):
                timed_out = True

        def text(chunks: list[bytes]) -> str:
            return b"".join(chunks).decode("utf-8", errors="replace")

        def with_note(note: str) -> str:
            e = text(err)
            return f"{e}{'' if not e or e.endswith(chr(10)) else chr(10)}{note}"

        if timed_out:
            self._signal(chan, "TERM")
            chan.close()
            for th in threads:
                th.join(1.0)
            return 124, text(out), with_note(f"{argv[0]}: timed out after {timeout:g} s on {self.where}")
        rc = chan.exit_status
        chan.close()
        t = self._t
        if rc == -1 and (t is None or not t.is_active()):
            raise TransportError(f"connection to {self.where} lost while running: {what}")
        # timeout(1) exits 124, or, when the program outlived SIGTERM and took the SIGKILL, kills
        # itself with that signal (no exit status: -1) or exits 137.
        if rc in (124, 137, -1) and timeout is not None and time.monotonic() - started >= timeout:
            return 124, text(out), with_note(f"{argv[0]}: timed out after {timeout:g} s on {self.where}")
        if rc == -1:
            return 255, text(out), with_note(f"{argv[0]}: ended without an exit status (killed by a signal?)")
        return rc, text(out), text(err)

    _WHICH = ('case $1 in */*) [ -f "$1" ] && [ -x "$1" ] && printf "%s\\n" "$1" && exit 0; exit 1;; esac; '
              'set -f; IFS=:; for d in $PATH; do [ -n "$d" ] || d=.; '
              'if [ -f "$d/$1" ] && [ -x "$d/$1" ]; then printf "%s\\n" "$d/$1"; exit 0; fi; done; exit 1')

    def which(self, program: str) -> Optional[str]:
        if not program or any(c in program for c in "\0\n\r"):
            return None
        result = self.run(["sh", "-c", self._WHICH, "sh", program])
        found = result.stdout.strip()
        return found if result.returncode == 0 and found else None

    # --- files ------------------------------------------------------------------------------
    def home(self) -> str:
        """The remote home directory (SFTP's normalize('.'))."""
        sftp = self._sftp_client()
        if self._home is None:
            with self._sftp_errors("resolve the home directory", "~"):
                self._home = sftp.normalize(".")
        return self._home

    def _path(self, path: str) -> str:
        path = str(path)
        if path == "~" or path.startswith("~/"):
            return self.home() + path[1:]
        return path

    @contextmanager
    def _sftp_errors(self, what: str, path: str) -> Iterator[None]:
        try:
            yield
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, f"no such file or directory on {self.where}", path) from None
        except FileExistsError:
            raise
        except (socket.timeout, TimeoutError):
            self._drop_sftp()  # a late answer would confuse the next request: start a fresh session
            within = f"no answer within {self.command_timeout:g} s" if self.command_timeout else "timed out"
            raise TransportError(f"cannot {what} {path} on {self.where}: {within}") from None
        except paramiko.SFTPError as exc:  # a malformed answer ("Expected handle"...): not an OSError
            self._drop_sftp()
            raise TransportError(f"cannot {what} {path} on {self.where}: SFTP protocol error "
                                 f"({exc or type(exc).__name__})") from None
        except (paramiko.SSHException, EOFError, ConnectionError) as exc:
            if self._t is not None and self._t.is_active() and not isinstance(exc, EOFError):
                raise TransportError(f"cannot {what} {path} on {self.where}: {exc or type(exc).__name__}") from None
            raise TransportError(f"connection to {self.where} lost during: {what} {path}") from None
        except OSError as exc:
            if self._t is None or not self._t.is_active():
                raise TransportError(f"connection to {self.where} lost during: {what} {path}") from None
            raise TransportError(f"cannot {what} {path} on {self.where}: {exc.strerror or exc}") from None

    def _drop_sftp(self) -> None:
        with self._lock:
            if self._sftp is not None:
                try:
                    self._sftp.close()
                except Exception:
                    pass
                self._sftp = None

    def _stat(self, sftp: paramiko.SFTPClient, path: str) -> Optional[paramiko.SFTPAttributes]:
        try:
            return sftp.stat(path)
        except FileNotFoundError:
            return None

    def read_bytes(self, path: str) -> bytes:
        sftp = self._sftp_client()
        p = self._path(path)
        with self._sftp_errors("read", path):
            with sftp.open(p, "rb") as fh:
                fh.prefetch()
                return fh.read()

    def _stat_or_none(self, sftp: paramiko.SFTPClient, p: str) -> Optional[paramiko.SFTPAttributes]:
        """stat, None when missing or refused (permission denied and the like, as os.path.exists).
        A timeout, a lost connection or a protocol error is raised (by _sftp_errors): "no answer"
        is not "no such file"."""
        try:
            return self._stat(sftp, p)
        except OSError as exc:
            if _no_answer(exc):
                raise
            return None

    def exists(self, path: str) -> bool:
        sftp = self._sftp_client()
        p = self._path(path)
        with self._sftp_errors("stat", path):
            return self._stat_or_none(sftp, p) is not None

    def listdir(self, path: str) -> list[str]:
        sftp = self._sftp_client()
        p = self._path(path)
        with self._sftp_errors("list", path):
            try:
                return sorted(sftp.listdir(p))
            except FileNotFoundError:
                return []
            except OSError as exc:
                if _no_answer(exc):
                    raise
                st = self._stat(sftp, p)
                if st is None or not _is_dir(st):
                    return []
                raise

    def _makedirs(self, sftp: paramiko.SFTPClient, p: str, mode: int) -> None:
        st = self._stat(sftp, p)
        if st is not None:
            if not _is_dir(st):
                raise TransportError(f"cannot create directory {p} on {self.where}: a file is in the way")
            return
        parent = posixpath.dirname(p.rstrip("/"))
        if parent and parent != p:
            self._makedirs(sftp, parent, mode)
        try:
            sftp.mkdir(p, mode)
        except OSError as exc:
            if _no_answer(exc):
                raise
            st = self._stat(sftp, p)
            if st is None or not _is_dir(st):
                raise

    def mkdir(self, path: str, mode: int = 0o755, exist_ok: bool = True) -> None:
        sftp = self._sftp_client()
        p = self._path(path).rstrip("/") or "/"
        with self._sftp_errors("create directory", path):
            if exist_ok:
                self._makedirs(sftp, p, mode)
                return
            parent = posixpath.dirname(p)
            if parent and parent != p:
                self._makedirs(sftp, parent, mode)
            try:
                sftp.mkdir(p, mode)
            except OSError as exc:
                if _no_answer(exc):
                    raise  # it may have been created by this very request: not "someone else's"
                if self._stat(sftp, p) is not None:
                    raise FileExistsError(errno.EEXIST, f"{path} exists on {self.where}", path) from None
                raise exc

    def _tmp_beside(self, p: str) -> str:
        directory, name = posixpath.split(p)
        return posixpath.join(directory, f".{name}.tmp.{secrets.token_hex(6)}")

    def _replace(self, sftp: paramiko.SFTPClient, tmp: str, p: str) -> None:
        try:
            sftp.posix_rename(tmp, p)
        except OSError as exc:
            if "unsupported" not in str(exc).lower():
                raise
            # A server without posix-rename@openssh.com: not atomic (there is a moment without p).
            try:
                sftp.remove(p)
            except FileNotFoundError:
                pass
            sftp.rename(tmp, p)

    def _write_via_tmp(self, path: str, mode: int, write: Callable[[IO[bytes]], None], what: str) -> None:
        sftp = self._sftp_client()
        p = self._path(path)
        tmp = self._tmp_beside(p)
        created = False
        try:
            with self._sftp_errors(what, path):
                try:
                    fh = _open_new(sftp, tmp)
                except FileNotFoundError:
                    raise TransportError(f"cannot {what} {path} on {self.where}: "
                                         f"no directory {posixpath.dirname(p) or '.'}") from None
                created = True
                with fh:
                    fh.set_pipelined(True)
                    write(fh)  # type: ignore[arg-type]
                sftp.chmod(tmp, mode)
                self._replace(sftp, tmp, p)
                created = False
        finally:
            if created:
                try:
                    sftp.remove(tmp)
                except Exception:
                    pass

    def write_atomic(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        raw = data.encode("utf-8") if isinstance(data, str) else data

        def write(fh: IO[bytes]) -> None:
            for i in range(0, len(raw), 1 << 20):
                fh.write(raw[i:i + (1 << 20)])

        self._write_via_tmp(path, mode, write, "write")

    def put(self, local: Path, remote: str, mode: Optional[int] = None) -> None:
        local = Path(local)
        try:
            src = open(local, "rb")
        except OSError as exc:
            raise TransportError(f"cannot read {local}: {exc.strerror}") from None
        with src:
            if mode is None:
                mode = os.fstat(src.fileno()).st_mode & 0o777

            def write(fh: IO[bytes]) -> None:
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        return
                    fh.write(chunk)

            self._write_via_tmp(remote, mode, write, "upload to")

    def get(self, remote: str, local: Path) -> None:
        sftp = self._sftp_client()
        p = self._path(remote)
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.tmp.{secrets.token_hex(6)}")
        try:
            with self._sftp_errors("download", remote):
                with sftp.open(p, "rb") as fh, open(tmp, "wb") as out:
                    # Pipelined reads a window at a time: paramiko's getfo prefetches the whole file
                    # and keeps what arrived faster than it was written, possibly all of it.
                    size, offset, step = fh.stat().st_size, 0, fh.MAX_REQUEST_SIZE
                    while offset < size:
                        end = min(offset + GET_WINDOW, size)
                        for block in fh.readv([(o, min(step, end - o)) for o in range(offset, end, step)]):
                            out.write(block)
                        offset = end
            tmp.replace(local)
        finally:
            tmp.unlink(missing_ok=True)

    def size(self, path: str) -> Optional[int]:
        sftp = self._sftp_client()
        p = self._path(path)
        with self._sftp_errors("stat", path):
            st = self._stat_or_none(sftp, p)
        return None if st is None else st.st_size

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        sftp = self._sftp_client()
        p = self._path(path)
        with self._sftp_errors("read", path):
            try:
                with sftp.open(p, "rb") as fh:
                    fh.seek(offset)
                    return fh.read(length)
            except FileNotFoundError:
                return b""

    def follow(self, path: str, *, offset: int = 0, poll_s: float = 0.5,
               done: Optional[Callable[[], bool]] = None, chunk: int = 1 << 16) -> Iterator[bytes]:
        """As the base class, but one remote handle stays open while following (a read per poll)."""
        sftp = self._sftp_client()
        p = self._path(path)
        fh: Optional[paramiko.SFTPFile] = None
        finished = False
        try:
            while True:
                data = b""
                with self._sftp_errors("read", path):
                    if fh is None:
                        try:
                            fh = sftp.open(p, "rb")
                        except FileNotFoundError:
                            fh = None
                    if fh is not None:
                        fh.seek(offset)
                        data = fh.read(chunk)
                if data:
                    offset += len(data)
                    yield data
                    continue
                if finished:
                    return
                time.sleep(poll_s)
                if done is not None and done():
                    finished = True
        finally:
            if fh is not None:
                try:
                    fh.close()
                except Exception:
                    pass

    @contextmanager
    def lock(self, path: str, timeout: float = 60.0) -> Iterator[None]:
        p = self._path(path)
        parent = posixpath.dirname(p)
        if parent:
            self.mkdir(parent)
        # `--`: a relative path starting with '-' is the lock file, not one of flock's options.
        argv = ("flock", "-x", "-E", str(_LOCK_TIMEOUT_RC), "-w", f"{max(timeout, 0):g}", "--", p,
                "sh", "-c", "echo locked; exec cat >/dev/null")
        self.history.append(argv)
        chan = self._open_session()
        try:
            self._bounded(chan, self._answer_limit(), f"the request to lock {path}",
                          lambda: chan.exec_command(self.command_line(argv)))
            chan.settimeout(timeout + self._timeout_for(self._endpoint) + 5 if self._endpoint else timeout + 20)
            got = b""
            try:
                while b"locked\n" not in got:
                    data = chan.recv(64)
                    if not data:
                        break
                    got += data
            except socket.timeout:
                raise TransportError(f"timed out after {timeout:g} s waiting for the lock {path} on "
                                     f"{self.where} (no answer)") from None
            if b"locked\n" not in got:
                if self._t is None or not self._t.is_active():
                    raise TransportError(f"connection to {self.where} lost while waiting for the lock {path}")
                chan.settimeout(5)
                rc = chan.recv_exit_status() if chan.status_event.wait(5) else -1
                try:
                    err = chan.recv_stderr(4096).decode(errors="replace").strip()
                except Exception:
                    err = ""
                if rc == _LOCK_TIMEOUT_RC:
                    raise TransportError(f"timed out after {timeout:g} s waiting for the lock {path} on {self.where}")
                if rc == 127:
                    raise TransportError(f"cannot lock {path} on {self.where}: flock (util-linux) is not installed there")
                raise TransportError(f"cannot lock {path} on {self.where}: flock exit {rc}: {err or '(no output)'}")
        except BaseException:
            chan.close()
            raise
        # The lock lives as long as this connection: should it drop, the lock is gone, so until the
        # with-block ends no operation may silently reconnect and go on as if it were still held.
        with self._lock:
            self._locks_held.append(path)
        try:
            yield
        finally:
            with self._lock:
                self._locks_held.remove(path)
            try:
                chan.shutdown_write()
                chan.status_event.wait(5)
            except Exception:
                pass
            chan.close()


def _open_new(sftp: paramiko.SFTPClient, path: str) -> paramiko.SFTPFile:
    """sftp.open(path, "wbx"), but the file is created 0600: with no attributes the server creates
    it 0666 & umask (0644), readable by others while the data is written, before the chmod to
    the caller's mode."""
    from paramiko.sftp import CMD_HANDLE, CMD_OPEN, SFTP_FLAG_CREATE, SFTP_FLAG_EXCL, SFTP_FLAG_TRUNC, SFTP_FLAG_WRITE

    attrs = paramiko.SFTPAttributes()
    attrs.st_mode = 0o600
    t, msg = sftp._request(CMD_OPEN, sftp._adjust_cwd(path),
                           SFTP_FLAG_WRITE | SFTP_FLAG_CREATE | SFTP_FLAG_TRUNC | SFTP_FLAG_EXCL, attrs)
    if t != CMD_HANDLE:
        raise paramiko.SFTPError("Expected handle")
    return paramiko.SFTPFile(sftp, msg.get_binary(), "wb")


def _local_user(target: str) -> str:
    try:
        return getpass.getuser()
    except Exception:  # no $USER/$LOGNAME and a uid without a passwd entry (containers)
        raise UsageError(f"cannot tell the local user name to log in to {target} as: give USER@HOST "
                         f"or a User in the ssh_config") from None


class _SocketAgent(paramiko.agent.AgentSSH):
    """paramiko.Agent, for an agent socket named by IdentityAgent as well as $SSH_AUTH_SOCK."""

    def __init__(self, path: str) -> None:
        super().__init__()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
        except OSError:
            conn.close()
            return  # a dangling socket: the agent is gone (as paramiko.Agent: no keys)
        try:
            self._connect(conn)
        except BaseException:
            self._close()
            raise

    def close(self) -> None:
        self._close()


def _identity_agent(value: Optional[str]) -> Optional[str]:
    """IdentityAgent as ssh(1) reads it: none, SSH_AUTH_SOCK (the default), $VAR or a path."""
    if not value or value == "SSH_AUTH_SOCK":
        return None
    if value.lower() == "none":
        return "none"
    if value.startswith("$") and not value.startswith("${"):
        return os.environ.get(value[1:]) or "none"  # ssh(1): an unset variable means no agent
    return str(_expand(value))


def _no_answer(exc: BaseException) -> bool:
    """A timeout or a broken connection (for _sftp_errors to report), not an answer from the server."""
    return isinstance(exc, (socket.timeout, TimeoutError, ConnectionError))


def _public_blob(path: Path) -> Optional[bytes]:
    """The public key blob from PATH.pub, or None."""
    try:
        return base64.b64decode(Path(f"{path}.pub").read_text().split()[1], validate=True)
    except (OSError, IndexError, ValueError):
        return None


def _is_dir(st: paramiko.SFTPAttributes) -> bool:
    import stat as _stat

    return st.st_mode is not None and _stat.S_ISDIR(st.st_mode)
