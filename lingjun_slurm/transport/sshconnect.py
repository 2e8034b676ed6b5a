"""Opening SSH connections: the socket (direct, through a ProxyJump chain, or a ProxyCommand), the
host key checked against known_hosts, then key authentication; failures mapped to
HostUnreachable (exit 3), AuthFailed (4) and HostKeyError (5).

Design notes (part of the SSH transport's; see ssh.py)

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

Connecting
    connect_timeout bounds the TCP connect, the banner, the key exchange and authentication;
    keepalive_s sends SSH keepalives (and TCP keepalive is on). Each hop of a ProxyJump chain is a
    paramiko Transport of its own, connected through the previous hop's direct-tcpip channel, its
    host key checked and its login done before the next hop is reached. Errors: DNS failure,
    refused, timed out, no SSH server, a jump host that cannot forward -> HostUnreachable (3); no
    key accepted -> AuthFailed (4); host key unknown/mismatched/revoked -> HostKeyError (5).
"""

from __future__ import annotations

import base64
import logging
import os
import socket
from pathlib import Path
from typing import Optional

import paramiko
import paramiko.agent

from ..common.errors import AuthFailed, HostKeyError, HostUnreachable, TransportError
from . import knownhosts
from .sshconfig import Endpoint, expand_path

log = logging.getLogger("lingjun_slurm.ssh")

DEFAULT_CONNECT_TIMEOUT = 15.0
DEFAULT_KEEPALIVE_S = 30
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
# Host key types recorded in known_hosts -> the algorithms that negotiate them.
_ALGS_FOR_TYPE = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}


class SSHConnector:
    """Opens authenticated paramiko Transports to resolved endpoints, with the transport's
    settings: the known_hosts file new keys go to (None: the config's or ~/.ssh/known_hosts),
    whether an unknown host key may be accepted, and the connect timeout and keepalive interval
    (which ConnectTimeout and ServerAliveInterval replace while they are left at their defaults).
    ssh_config_path is named in messages."""

    def __init__(self, ssh_config_path: Path, *, known_hosts: Optional[Path], accept_new_host_key: bool,
                 connect_timeout: float, keepalive_s: int) -> None:
        self.ssh_config_path = ssh_config_path
        self.known_hosts = known_hosts
        self.accept_new_host_key = accept_new_host_key
        self.connect_timeout = connect_timeout
        self.keepalive_s = keepalive_s
        self.connections = 0  # SSH connections opened (hops included): tests count them

    def timeout_for(self, ep: Endpoint) -> float:
        """The connect timeout for EP: its ConnectTimeout while connect_timeout is the default."""
        if self.connect_timeout == DEFAULT_CONNECT_TIMEOUT and ep.connect_timeout:
            return ep.connect_timeout
        return self.connect_timeout

    def keepalive_for(self, ep: Endpoint) -> int:
        """The keepalive interval for EP: its ServerAliveInterval while keepalive_s is the default."""
        if self.keepalive_s == DEFAULT_KEEPALIVE_S and ep.keepalive_s is not None:
            return ep.keepalive_s
        return self.keepalive_s

    def known_hosts_files(self, ep: Endpoint) -> tuple[Path, list[Path]]:
        """(the file new keys go to, every file read)."""
        user_files = ep.user_known_hosts or [expand_path(p) for p in USER_KNOWN_HOSTS]
        primary = self.known_hosts or user_files[0]
        if self.known_hosts and not ep.user_known_hosts:
            user_files = []  # the argument (or $LINGJUN_KNOWN_HOSTS) replaces the default files
        files = [primary] + [p for p in user_files if p != primary] + ep.global_known_hosts
        return primary, files

    # --- connecting -------------------------------------------------------------------------
    def connect(self, ep: Endpoint, hops: list[paramiko.Transport]) -> paramiko.Transport:
        """Connect (through ep.jump when set), verify the host key, authenticate. Every Transport
        opened is appended to hops (the last one is ep's), so the caller can close them all."""
        timeout = self.timeout_for(ep)
        sock = self._open_socket(ep, hops, timeout)
        log.debug("connecting to %s", ep.where)
        t = paramiko.Transport(sock)  # type: ignore[arg-type]
        hops.append(t)
        t.banner_timeout = timeout
        t.handshake_timeout = timeout
        t.auth_timeout = timeout
        primary, files = self.known_hosts_files(ep)
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
        t.set_keepalive(self.keepalive_for(ep))
        log.debug("connected to %s as %s", ep.where, ep.user)
        return t

    def _open_socket(self, ep: Endpoint, hops: list[paramiko.Transport], timeout: float) -> object:
        if ep.jump is not None:
            parent = self.connect(ep.jump, hops)
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

    @staticmethod
    def _prefer_known_types(t: paramiko.Transport, types: list[str]) -> None:
        if not types:
            return
        opts = t.get_security_options()
        available = list(opts.key_types)
        first = [alg for kt in types for alg in _ALGS_FOR_TYPE.get(kt, (kt,)) if alg in available]
        if first:
            opts.key_types = tuple(dict.fromkeys(first + available))

    def _check_host_key(self, t: paramiko.Transport, ep: Endpoint, primary: Path, files: list[Path],
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

    def _agent_keys(self, ep: Endpoint) -> tuple[list[paramiko.PKey], Optional[str], Optional[_SocketAgent]]:
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

    def _authenticate(self, t: paramiko.Transport, ep: Endpoint) -> None:
        agent_keys, agent_note, agent = self._agent_keys(ep)
        try:
            self._authenticate_with(t, ep, agent_keys, agent_note)
        finally:
            if agent is not None:
                agent.close()  # one agent connection per login, not one left open per hop and reconnect

    def _authenticate_with(self, t: paramiko.Transport, ep: Endpoint, agent_keys: list[paramiko.PKey],
                           agent_note: Optional[str]) -> None:
        explicit = bool(ep.identity_files)
        paths = [expand_path(p) for p in (ep.identity_files or DEFAULT_IDENTITIES)]
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


def _public_blob(path: Path) -> Optional[bytes]:
    """The public key blob from PATH.pub, or None."""
    try:
        return base64.b64decode(Path(f"{path}.pub").read_text().split()[1], validate=True)
    except (OSError, IndexError, ValueError):
        return None
