"""Connecting: ssh_config, ProxyJump, host keys, keys and ssh-agent, the exit codes 3/4/5 and their
messages, nothing secret in messages or logs. HOME is a temporary directory in every test here, so
~/.ssh/* (default keys, known_hosts) is the test's own; SSH_AUTH_SOCK is unset unless a test starts
its own ssh-agent."""

from __future__ import annotations

import base64
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
import pytest

from lingjun_slurm.common.errors import (EXIT_AUTH, EXIT_HOSTKEY, EXIT_UNREACHABLE, AuthFailed, HostKeyError,
                                  HostUnreachable, SSHError, TransportError, UsageError)
from lingjun_slurm.transport import LocalTransport, open_transport, parse_target
from lingjun_slurm.transport import knownhosts
from tests.ssh.fixtures import PASSPHRASE, SSHServer, free_ports, keygen

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    for var in ("SSH_AUTH_SOCK", "LINGJUN_SSH_CONFIG", "LINGJUN_KNOWN_HOSTS"):
        monkeypatch.delenv(var, raising=False)
    return h


def block(alias: str, port: int, key: Path, extra: str = "") -> str:
    return (f"Host {alias}\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  IdentityFile {key}\n"
            f"  IdentitiesOnly yes\n{extra}")


def write_config(path: Path, server: SSHServer, *extra: str, key: Path | None = None) -> Path:
    """The fixture's aliases without its `Host *` known_hosts line, plus extra blocks."""
    key = key or server.client_key
    text = (block("lingjun-test", server.port, key) + block("lingjun-jump", server.jump_port, key)
            + block("lingjun-via-jump", server.port, key, "  ProxyJump lingjun-jump\n") + "".join(extra)
            + "Host *\n  GlobalKnownHostsFile /dev/null\n")
    path.write_text(text)
    return path


def closed_port() -> int:
    return free_ports(1, 17300)[0]


def private_key_lines(*keys: Path) -> list[str]:
    return [line for k in keys for line in k.read_text().splitlines() if line and not line.startswith("-----")]


# --- targets and open_transport -----------------------------------------------------------------
def test_parse_target() -> None:
    assert parse_target("root@127.0.0.1:17022") == ("root", "127.0.0.1", 17022)
    assert parse_target("lingjun-test") == (None, "lingjun-test", None)
    assert parse_target("ssh://alice@login.example.org:2222") == ("alice", "login.example.org", 2222)
    assert parse_target("[::1]:2222") == (None, "::1", 2222)
    assert parse_target("a.b-c_d") == (None, "a.b-c_d", None)
    for bad in ("", "a b", "h:0", "h:70000", "h:x", "$(touch x)", "-oProxyCommand=x", "u@", "@h", "a'b", 'a"b',
                "a\nb", "h;x", "ssh://h/path", "h:22:33", "[::1", "`x`"):
        with pytest.raises(UsageError, match="invalid host"):
            parse_target(bad)


def test_open_transport_kinds(ssh_server: SSHServer) -> None:
    t = open_transport("ssh", "lingjun-test", ssh_config=ssh_server.ssh_config, known_hosts=ssh_server.known_hosts,
                       accept_new_host_key=False, connect_timeout=5.0, keepalive_s=10, command_timeout=30.0)
    assert (t.kind, t.host) == ("ssh", "lingjun-test")
    with t:
        assert t.run(["echo", "ok"]).stdout == "ok\n"
    assert isinstance(open_transport("local", "", accept_new_host_key=True), LocalTransport)
    with pytest.raises(UsageError, match="needs a host"):
        open_transport("ssh", "")
    with pytest.raises(UsageError, match="invalid host"):
        open_transport("ssh", "a b; touch x")
    with pytest.raises(UsageError):
        open_transport("telnet", "h")


def test_importing_the_transport_package_does_not_import_paramiko() -> None:
    code = "import sys, lingjun_slurm.transport as t; t.parse_target('h'); print('paramiko' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.strip() == "False"


def test_error_classes_and_exit_codes() -> None:
    assert (EXIT_UNREACHABLE, EXIT_AUTH, EXIT_HOSTKEY) == (3, 4, 5)
    assert [c("x").exit_code for c in (HostUnreachable, AuthFailed, HostKeyError)] == [3, 4, 5]
    assert all(issubclass(c, SSHError) and issubclass(c, TransportError) for c in (HostUnreachable, AuthFailed, HostKeyError))


def test_known_hosts_matching(tmp_path: Path) -> None:
    key = keygen(tmp_path / "k")
    blob = base64.b64decode(Path(f"{key}.pub").read_text().split()[1])
    assert knownhosts.blob_type(blob) == "ssh-ed25519"
    assert knownhosts.matches("[127.0.0.1]:17022", "[127.0.0.1]:17022")
    assert not knownhosts.matches("127.0.0.1", "[127.0.0.1]:17022")  # port 22 entries are not for other ports
    assert knownhosts.matches("*.example.org,!bad.example.org", "login.EXAMPLE.org")
    assert not knownhosts.matches("*.example.org,!bad.example.org", "bad.example.org")
    assert knownhosts.matches("[127.0.0.?]:*", "[127.0.0.1]:2222")
    kh = tmp_path / "kh"
    knownhosts.append(kh, "[h]:2222", blob, hashed=True)
    (entry,) = knownhosts.load([kh])
    assert entry.patterns.startswith("|1|") and "h" not in entry.patterns.split("|")[2:]
    assert knownhosts.check([entry], "[h]:2222", blob).status == "ok"
    assert knownhosts.check([entry], "[h]:2223", blob).status == "unknown"


# --- ssh_config ----------------------------------------------------------------------------------
def test_ssh_config_alias_user_port_identityfile(ssh_server: SSHServer, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with ssh_server.transport("lingjun-test") as t:
        assert t.run(["id", "-un"]).stdout == "root\n"
        assert t.where == f"lingjun-test (127.0.0.1:{ssh_server.port})"
        assert t.host == "lingjun-test"
    # the target's port wins over the config's
    with pytest.raises(HostUnreachable, match=rf"lingjun-test:{closed_port()} \(127.0.0.1:\d+\): connection refused"):
        ssh_server.transport(f"lingjun-test:{closed_port()}").run(["true"])
    # IdentityFile with %h; the environment variables select the config and known_hosts
    keys = tmp_path / "keys"
    keys.mkdir()
    shutil.copy(ssh_server.client_key, keys / "127.0.0.1")
    cfg = tmp_path / "cfg"
    cfg.write_text(f"Host tokens\n  HostName 127.0.0.1\n  Port {ssh_server.port}\n  User root\n"
                   f"  IdentityFile {keys}/%h\n  ConnectTimeout 3\n  ServerAliveInterval 7\n")
    monkeypatch.setenv("LINGJUN_SSH_CONFIG", str(cfg))
    monkeypatch.setenv("LINGJUN_KNOWN_HOSTS", str(ssh_server.known_hosts))
    import paramiko

    from lingjun_slurm.transport.ssh import SSHTransport

    keepalives: list[int] = []
    real = paramiko.Transport.set_keepalive
    monkeypatch.setattr(paramiko.Transport, "set_keepalive", lambda self, n: (keepalives.append(n), real(self, n)))
    with SSHTransport("tokens") as t:
        assert t.run(["echo", "ok"]).stdout == "ok\n"
        assert t._timeout_for(t._endpoint) == 3.0  # ConnectTimeout
    assert keepalives == [7]  # ServerAliveInterval
    with SSHTransport("tokens", connect_timeout=4.0, keepalive_s=11) as t:  # explicit arguments win
        t.run(["true"])
        assert t._timeout_for(t._endpoint) == 4.0
    assert keepalives == [7, 11]


def test_default_identity_and_missing_config(ssh_server: SSHServer, home: Path) -> None:
    (home / ".ssh").mkdir(mode=0o700)
    shutil.copy(ssh_server.client_key, home / ".ssh" / "id_ed25519")
    from lingjun_slurm.transport.ssh import SSHTransport

    # no ~/.ssh/config: no config; the default key ~/.ssh/id_ed25519
    with SSHTransport(ssh_server.target, known_hosts=ssh_server.known_hosts) as t:
        assert t.run(["echo", "ok"]).stdout == "ok\n"
        assert t.where == f"root@127.0.0.1:{ssh_server.port} (127.0.0.1:{ssh_server.port})"


def test_proxyjump_goes_through_the_jump_host(ssh_server: SSHServer, tmp_path: Path) -> None:
    forwarded = f"target 127.0.0.1 port {ssh_server.port}"
    before = (ssh_server.jump_log.read_text().count(forwarded), ssh_server.accepted(),
              ssh_server.accepted(ssh_server.jump_log))
    with ssh_server.transport("lingjun-via-jump") as t:
        assert t.run(["echo", "hop"]).stdout == "hop\n"
        t.write_atomic(str(tmp_path / "f"), "via jump")
        assert t.connections == 2
    assert (tmp_path / "f").read_text() == "via jump"
    after = (ssh_server.jump_log.read_text().count(forwarded), ssh_server.accepted(),
             ssh_server.accepted(ssh_server.jump_log))
    assert after == (before[0] + 1, before[1] + 1, before[2] + 1)  # the jump sshd forwarded the one connection
    # a chain: jump -> jump -> main, each hop resolved through the config
    cfg = write_config(tmp_path / "cfg", ssh_server, block("chain", ssh_server.port, ssh_server.client_key,
                                                             "  ProxyJump lingjun-jump,lingjun-jump\n"))
    with ssh_server.transport("chain", ssh_config=cfg) as t:
        assert t.run(["echo", "chain"]).stdout == "chain\n" and t.connections == 3


def test_proxyjump_failures_name_the_hop(ssh_server: SSHServer, tmp_path: Path) -> None:
    dead = closed_port()
    cfg = write_config(tmp_path / "cfg", ssh_server,
                       block("dead-jump", ssh_server.port, ssh_server.client_key, f"  ProxyJump root@127.0.0.1:{dead}\n"),
                       block("nowhere", dead, ssh_server.client_key, "  ProxyJump lingjun-jump\n"),
                       block("loop-a", ssh_server.port, ssh_server.client_key, "  ProxyJump loop-b\n"),
                       block("loop-b", ssh_server.port, ssh_server.client_key, "  ProxyJump loop-a\n"))
    with pytest.raises(HostUnreachable, match=rf"cannot reach jump host root@127.0.0.1:{dead} \(127.0.0.1:{dead}\): connection refused"):
        ssh_server.transport("dead-jump", ssh_config=cfg).run(["true"])
    with pytest.raises(HostUnreachable, match=rf"cannot reach nowhere \(127.0.0.1:{dead}\) through jump host "
                                              rf"lingjun-jump \(127.0.0.1:{ssh_server.jump_port}\): it could not connect"):
        ssh_server.transport("nowhere", ssh_config=cfg).run(["true"])
    with pytest.raises(UsageError, match="ProxyJump chain"):
        ssh_server.transport("loop-a", ssh_config=cfg).run(["true"])
    # the jump host's key is verified too
    kh = tmp_path / "kh"
    kh.write_text(ssh_server.known_hosts_line(ssh_server.port, ssh_server.host_key))
    with pytest.raises(HostKeyError, match=rf"host key of jump host lingjun-jump \(127.0.0.1:{ssh_server.jump_port}\) "
                                           "is not known"):
        ssh_server.transport("lingjun-via-jump", ssh_config=cfg, known_hosts=kh).run(["true"])


def test_proxycommand(ssh_server: SSHServer, tmp_path: Path) -> None:
    if not shutil.which("ssh"):
        pytest.skip("no ssh client")
    cfg = tmp_path / "cfg"
    cfg.write_text(block("pc", ssh_server.port, ssh_server.client_key,
                         f"  ProxyCommand ssh -F {ssh_server.ssh_config} -W %h:%p lingjun-jump\n"))
    with ssh_server.transport("pc", ssh_config=cfg) as t:
        assert t.run(["echo", "pc"]).stdout == "pc\n"


# --- host keys -----------------------------------------------------------------------------------
def test_unknown_host_key_refused_then_accepted_and_recorded(ssh_server: SSHServer, tmp_path: Path, home: Path) -> None:
    cfg = write_config(tmp_path / "cfg", ssh_server)
    kh = home / ".ssh" / "known_hosts"  # the default: neither the argument nor LINGJUN_KNOWN_HOSTS is set
    from lingjun_slurm.transport.ssh import SSHTransport

    before = ssh_server.accepted()
    with pytest.raises(HostKeyError) as info:
        SSHTransport("lingjun-test", ssh_config=cfg).run(["true"])
    msg = str(info.value)
    assert info.value.exit_code == 5 and "\n" not in msg
    assert f"host key of lingjun-test (127.0.0.1:{ssh_server.port}) is not known" in msg
    assert "--accept-new-host-key" in msg and "SHA256:" in msg and str(kh) in msg
    assert not kh.exists() and not kh.parent.exists()
    assert ssh_server.accepted() == before  # refused before authenticating

    with SSHTransport("lingjun-test", ssh_config=cfg, accept_new_host_key=True) as t:
        assert t.run(["echo", "ok"]).stdout == "ok\n"
    assert kh.read_text() == ssh_server.known_hosts_line(ssh_server.port, ssh_server.host_key)
    assert stat.S_IMODE(kh.stat().st_mode) == 0o600 and stat.S_IMODE(kh.parent.stat().st_mode) == 0o700
    with SSHTransport("lingjun-test", ssh_config=cfg) as t:  # known now
        assert t.run(["true"]).returncode == 0
    assert kh.read_text().count("\n") == 1  # recorded once


def test_ssh_config_accept_new_hash_and_user_known_hosts_file(ssh_server: SSHServer, tmp_path: Path) -> None:
    ukh = tmp_path / "ukh"
    ukh.write_text("# no newline at the end")
    cfg = write_config(tmp_path / "cfg", ssh_server,
                       f"Host lingjun-test\n  StrictHostKeyChecking accept-new\n  HashKnownHosts yes\n"
                       f"  UserKnownHostsFile {ukh}\n")
    from lingjun_slurm.transport.ssh import SSHTransport

    with SSHTransport("lingjun-test", ssh_config=cfg) as t:
        assert t.run(["true"]).returncode == 0
    lines = ukh.read_text().splitlines()
    assert lines[0] == "# no newline at the end" and lines[1].startswith("|1|") and "127.0.0.1" not in lines[1]
    assert knownhosts.check(knownhosts.load([ukh]), f"[127.0.0.1]:{ssh_server.port}",
                            knownhosts.load([ssh_server.known_hosts])[0].blob).status == "ok"
    with SSHTransport("lingjun-test", ssh_config=cfg) as t:
        assert t.run(["true"]).returncode == 0
    assert len(ukh.read_text().splitlines()) == 2


def test_mismatched_or_revoked_key_refused_even_with_the_option(ssh_server: SSHServer, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg", ssh_server)
    kh = tmp_path / "kh"
    # line 2 records the jump host's key for the main server: as if someone were in the middle
    kh.write_text("# header\n" + ssh_server.known_hosts_line(ssh_server.port, ssh_server.jump_host_key))
    before = ssh_server.accepted()
    for accept in (False, True):
        with pytest.raises(HostKeyError) as info:
            ssh_server.transport("lingjun-test", ssh_config=cfg, known_hosts=kh, accept_new_host_key=accept).run(["true"])
        msg = str(info.value)
        assert info.value.exit_code == 5 and "\n" not in msg
        assert msg.startswith(f"HOST KEY MISMATCH for lingjun-test (127.0.0.1:{ssh_server.port})")
        assert "man-in-the-middle" in msg and f"{kh}:2" in msg and f"ssh-keygen -R '[127.0.0.1]:{ssh_server.port}'" in msg
    assert kh.read_text().count("\n") == 2 and ssh_server.accepted() == before  # unchanged; never authenticated
    # only a key of another type recorded
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(tmp_path / "ecdsa")], check=True)
    kh.write_text(ssh_server.known_hosts_line(ssh_server.port, tmp_path / "ecdsa"))
    with pytest.raises(HostKeyError, match="records only a ecdsa-sha2-nistp256 key"):
        ssh_server.transport("lingjun-test", ssh_config=cfg, known_hosts=kh, accept_new_host_key=True).run(["true"])
    # @revoked wins over a matching line
    good = ssh_server.known_hosts_line(ssh_server.port, ssh_server.host_key)
    kh.write_text(good + "@revoked * " + good.split(" ", 1)[1])
    with pytest.raises(HostKeyError, match=rf"marked @revoked in {kh}:2"):
        ssh_server.transport("lingjun-test", ssh_config=cfg, known_hosts=kh, accept_new_host_key=True).run(["true"])


# --- authentication ------------------------------------------------------------------------------
def test_wrong_key_is_auth_failed(ssh_server: SSHServer, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg", ssh_server, key=ssh_server.wrong_key)
    with pytest.raises(AuthFailed) as info:
        ssh_server.transport("lingjun-test", ssh_config=cfg).run(["true"])
    msg = str(info.value)
    assert info.value.exit_code == 4 and "\n" not in msg
    assert msg.startswith(f"authentication failed for root@lingjun-test (127.0.0.1:{ssh_server.port})")
    assert str(ssh_server.wrong_key) in msg and "never asks for passwords" in msg
    # no key at all (no IdentityFile, no ~/.ssh/id_*, no agent)
    with pytest.raises(AuthFailed, match="no key to offer; no ssh-agent"):
        ssh_server.transport(ssh_server.target, ssh_config=tmp_path / "none").run(["true"])


def test_encrypted_key_needs_the_agent(ssh_server: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write_config(tmp_path / "cfg", ssh_server, key=ssh_server.encrypted_key)
    with pytest.raises(AuthFailed, match=rf"{ssh_server.encrypted_key} is encrypted and ssh-agent does not hold it "
                                         rf"\(ssh-add {ssh_server.encrypted_key}\)"):
        ssh_server.transport("lingjun-test", ssh_config=cfg).run(["true"])
    if not shutil.which("ssh-agent") or not shutil.which("ssh-add"):
        pytest.skip("no ssh-agent")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 5
        while not sock.exists() and time.monotonic() < end:
            time.sleep(0.01)
        askpass = tmp_path / "askpass"
        askpass.write_text(f"#!/bin/sh\necho '{PASSPHRASE}'\n")
        askpass.chmod(0o700)
        env = dict(os.environ, SSH_AUTH_SOCK=str(sock), SSH_ASKPASS=str(askpass), SSH_ASKPASS_REQUIRE="force",
                   DISPLAY=":0")
        subprocess.run(["ssh-add", str(ssh_server.encrypted_key)], env=env, check=True, capture_output=True,
                       stdin=subprocess.DEVNULL, timeout=10)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        with ssh_server.transport("lingjun-test", ssh_config=cfg) as t:  # the agent signs for the encrypted key
            assert t.run(["echo", "agent"]).stdout == "agent\n"
        # IdentitiesOnly yes: the agent's key is not offered for a host whose IdentityFile is another key
        cfg2 = write_config(tmp_path / "cfg2", ssh_server, key=ssh_server.wrong_key)
        with pytest.raises(AuthFailed) as info:
            ssh_server.transport("lingjun-test", ssh_config=cfg2).run(["true"])
        assert "ssh-agent" not in str(info.value).split("(", 2)[-1].split(")")[0]
        # without IdentitiesOnly the agent's keys are tried after the IdentityFile
        cfg3 = tmp_path / "cfg3"
        cfg3.write_text(f"Host agent\n  HostName 127.0.0.1\n  Port {ssh_server.port}\n  User root\n"
                        f"  IdentityFile {ssh_server.wrong_key}\n")
        with ssh_server.transport("agent", ssh_config=cfg3) as t:
            assert t.run(["true"]).returncode == 0
    finally:
        agent.terminate()
        agent.wait(5)


# --- unreachable ---------------------------------------------------------------------------------
def _serve(behaviour: str) -> tuple[int, socket.socket]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def loop() -> None:
        held = []
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            if behaviour == "http":
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
                conn.close()
            else:
                held.append(conn)  # silent: accept and never answer

    threading.Thread(target=loop, daemon=True).start()
    return srv.getsockname()[1], srv


def test_unreachable(ssh_server: SSHServer, monkeypatch: pytest.MonkeyPatch) -> None:
    port = closed_port()
    with pytest.raises(HostUnreachable) as info:
        ssh_server.transport(f"root@127.0.0.1:{port}").run(["true"])
    assert info.value.exit_code == 3
    assert str(info.value) == (f"cannot reach root@127.0.0.1:{port} (127.0.0.1:{port}): connection refused "
                               f"(no SSH server on port {port}?)")
    http_port, http = _serve("http")
    silent_port, silent = _serve("silent")
    try:
        with pytest.raises(HostUnreachable, match="no SSH server answered"):
            ssh_server.transport(f"127.0.0.1:{http_port}").run(["true"])
        started = time.monotonic()
        with pytest.raises(HostUnreachable, match=rf"cannot reach 127.0.0.1:{silent_port}: no SSH server answered"):
            ssh_server.transport(f"127.0.0.1:{silent_port}", connect_timeout=0.5).run(["true"])
        assert time.monotonic() - started < 5
    finally:
        http.close()
        silent.close()

    def no_dns(*a: object, **kw: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", no_dns)
    with pytest.raises(HostUnreachable, match=r"cannot reach login.invalid:22: cannot resolve the host name "
                                              r"login.invalid \(Name or service not known\)"):
        ssh_server.transport("login.invalid").run(["true"])


# --- through the CLI's error handling, in a fresh process --------------------------------------------
PROBE = """
import sys, click
from lingjun_slurm.cli.main import _run
from lingjun_slurm.transport import open_transport

@click.command()
@click.argument("host")
def probe(host):
    with open_transport("ssh", host) as t:
        t.run(["true"], check=True)
    click.echo("ok")

_run(probe, sys.argv[1:])
"""


def test_cli_exit_codes_one_line_no_traceback_no_secret(ssh_server: SSHServer, tmp_path: Path, home: Path) -> None:
    cfg = write_config(tmp_path / "cfg", ssh_server,
                       block("wrong", ssh_server.port, ssh_server.wrong_key),
                       block("locked", ssh_server.port, ssh_server.encrypted_key),
                       block("closed", closed_port(), ssh_server.client_key))
    http_port, http = _serve("http")
    empty_kh = tmp_path / "empty_kh"
    empty_kh.write_text("")
    secrets = private_key_lines(ssh_server.client_key, ssh_server.wrong_key, ssh_server.encrypted_key) + [PASSPHRASE]
    base = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "LINGJUN_DEBUG")}
    base.update(HOME=str(home), LINGJUN_SSH_CONFIG=str(cfg), LINGJUN_KNOWN_HOSTS=str(ssh_server.known_hosts))
    cases = [("lingjun-test", {}, 0, "ok"),
             ("closed", {}, 3, "connection refused"),
             (f"127.0.0.1:{http_port}", {}, 3, "no SSH server answered"),
             ("wrong", {}, 4, "authentication failed"),
             ("locked", {}, 4, "is encrypted"),
             ("lingjun-test", {"LINGJUN_KNOWN_HOSTS": str(empty_kh)}, 5, "--accept-new-host-key")]
    try:
        for host, env, code, text in cases:
            proc = subprocess.run([sys.executable, "-c", PROBE, host], capture_output=True, text=True, timeout=60,
                                  env={**base, **env}, cwd=REPO)
            out = proc.stdout + proc.stderr
            assert proc.returncode == code, (host, out)
            assert text in out and len(out.strip().splitlines()) == 1, (host, out)
            assert "Traceback" not in out and not any(s in out for s in secrets), (host, out)
    finally:
        http.close()


def test_nothing_secret_in_messages_or_debug_logs(ssh_server: SSHServer, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="paramiko")
    cfg = write_config(tmp_path / "cfg", ssh_server, block("wrong", ssh_server.port, ssh_server.wrong_key),
                       block("locked", ssh_server.port, ssh_server.encrypted_key))
    messages = []
    with ssh_server.transport("lingjun-test", ssh_config=cfg) as t:
        t.run(["true"])
        t.write_atomic(str(tmp_path / "f"), "x")
    for host in ("wrong", "locked"):
        with pytest.raises(AuthFailed) as info:
            ssh_server.transport(host, ssh_config=cfg).run(["true"])
        messages.append(str(info.value))
    assert "Authentication (publickey) successful" in caplog.text and "authenticated to" in caplog.text  # logs were on
    secrets = private_key_lines(ssh_server.client_key, ssh_server.wrong_key, ssh_server.encrypted_key) + [PASSPHRASE]
    for s in secrets:
        assert s not in caplog.text and not any(s in m for m in messages)


def test_paramiko_logger_is_quiet_by_default() -> None:
    code = ("import logging, lingjun_slurm.transport.ssh; "
            "print(logging.getLogger('paramiko.transport').getEffectiveLevel() > logging.CRITICAL)")
    env = {k: v for k, v in os.environ.items() if k != "LINGJUN_DEBUG"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO).stdout
    assert out.strip() == "True"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**env, "LINGJUN_DEBUG": "1"}).stdout
    assert out.strip() == "False"


# --- review fixes: host names, Include, known_hosts file names, recording races -----------------
def _hashed(kh: Path) -> None:
    subprocess.run(["ssh-keygen", "-H", "-f", str(kh)], check=True, capture_output=True)
    Path(f"{kh}.old").unlink()


def test_host_names_are_lowercased_as_ssh_does(ssh_server: SSHServer, tmp_path: Path) -> None:
    """ssh(1) lowercases the host (and HostKeyAlias) before hashing it: a mixed-case target must
    find the hashed entry OpenSSH wrote, or accepting new keys would accept a changed one."""
    cfg = tmp_path / "cfg"
    cfg.write_text(f"Host *\n  User root\n  IdentityFile {ssh_server.client_key}\n  GlobalKnownHostsFile /dev/null\n"
                   "Host aliased\n  HostName 127.0.0.1\n  HostKeyAlias Login-Node.Example\n")
    kh = tmp_path / "kh"
    # the recorded key of [localhost]:PORT is the jump host's: the server's own key is a change
    kh.write_text(ssh_server.known_hosts_line(ssh_server.port, ssh_server.jump_host_key)
                  .replace("[127.0.0.1]", "[localhost]")
                  + ssh_server.known_hosts_line(ssh_server.port, ssh_server.jump_host_key)
                  .replace(f"[127.0.0.1]:{ssh_server.port}", "login-node.example"))
    _hashed(kh)
    recorded = kh.read_text()
    for host in (f"LocalHost:{ssh_server.port}", f"aliased:{ssh_server.port}"):
        with pytest.raises(HostKeyError, match="HOST KEY MISMATCH"):
            ssh_server.transport(host, ssh_config=cfg, known_hosts=kh, accept_new_host_key=True).run(["true"])
    assert kh.read_text() == recorded  # nothing appended
    # the right key, hashed for the lowercase name: found for the mixed-case target
    kh.write_text(ssh_server.known_hosts_line(ssh_server.port, ssh_server.host_key).replace("[127.0.0.1]", "[localhost]"))
    _hashed(kh)
    recorded = kh.read_text()
    with ssh_server.transport(f"LOCALHOST:{ssh_server.port}", ssh_config=cfg, known_hosts=kh) as t:
        assert t.run(["true"]).returncode == 0
    # a new key is recorded under the lowercase name
    kh.write_text("")
    with ssh_server.transport(f"LocalHost:{ssh_server.port}", ssh_config=cfg, known_hosts=kh,
                              accept_new_host_key=True) as t:
        t.run(["true"])
    assert kh.read_text().startswith(f"[localhost]:{ssh_server.port} ssh-ed25519 ")
    assert knownhosts.matches(recorded.split()[0], f"[LocalHost]:{ssh_server.port}")


def test_ssh_config_include(ssh_server: SSHServer, tmp_path: Path, home: Path) -> None:
    d = home / ".ssh" / "config.d"
    d.mkdir(parents=True)
    (d / "10-cluster.conf").write_text(block("included", ssh_server.port, ssh_server.client_key))
    (d / "20-other.conf").write_text("Host other\n  HostName 127.0.0.2\n")
    (tmp_path / "inner").write_text(f"  Port 2299\n  Include {tmp_path / 'innermost'}\n  ServerAliveInterval 9\n")
    (tmp_path / "innermost").write_text("  User innermost-user\n")
    cfg = tmp_path / "cfg"
    cfg.write_text("Include config.d/*.conf\n"  # relative: under ~/.ssh; a glob, in sorted order
                   "ConnectTimeout 7\n"  # still applies to every host after the Include
                   f"Host porty\n  Include {tmp_path / 'inner'}\n  User porty-user\n"
                   f"Host *\n  UserKnownHostsFile {ssh_server.known_hosts}\n  GlobalKnownHostsFile /dev/null\n")
    with ssh_server.transport("included", ssh_config=cfg, known_hosts=None) as t:
        assert t.run(["echo", "included"]).stdout == "included\n"
        assert t._endpoint.connect_timeout == 7.0
    other = ssh_server.transport("other", ssh_config=cfg)._resolve("other")
    assert (other.hostname, other.connect_timeout) == ("127.0.0.2", 7.0)
    porty = ssh_server.transport("porty", ssh_config=cfg)._resolve("porty")
    assert (porty.port, porty.user, porty.keepalive_s, porty.connect_timeout) == (2299, "innermost-user", 9, 7.0)
    # an included file with Host lines inside a Host block: refused, not misapplied to every host
    (tmp_path / "blocks").write_text("Host *\n  StrictHostKeyChecking no\n")
    cfg.write_text(f"Host trusted\n  Include {tmp_path / 'blocks'}\n")
    with pytest.raises(UsageError, match="only supported in files included outside Host/Match blocks"):
        ssh_server.transport("lingjun-test", ssh_config=cfg).run(["true"])
    (tmp_path / "loop").write_text(f"Include {tmp_path / 'loop'}\n")
    with pytest.raises(UsageError, match="nested more than 16"):
        ssh_server.transport("lingjun-test", ssh_config=tmp_path / "loop").run(["true"])


def test_user_known_hosts_file_tokens_are_expanded(ssh_server: SSHServer, tmp_path: Path) -> None:
    """UserKnownHostsFile ~/.ssh/known_hosts.d/%k: read the file ssh(1) reads. A literal `%k` file
    would not exist, and with accept-new a changed key would be accepted."""
    khd = tmp_path / "kh.d"
    khd.mkdir()
    (khd / "lingjun-test").write_text(ssh_server.known_hosts_line(ssh_server.port, ssh_server.jump_host_key))
    cfg = write_config(tmp_path / "cfg", ssh_server,
                       f"Host lingjun-test\n  StrictHostKeyChecking accept-new\n  UserKnownHostsFile {khd}/%k\n")
    from lingjun_slurm.transport.ssh import SSHTransport

    with pytest.raises(HostKeyError, match=rf"HOST KEY MISMATCH .* {khd}/lingjun-test:1"):
        SSHTransport("lingjun-test", ssh_config=cfg).run(["true"])
    assert not (khd / "%k").exists()
    (khd / "lingjun-test").write_text(ssh_server.known_hosts_line(ssh_server.port, ssh_server.host_key))
    with SSHTransport("lingjun-test", ssh_config=cfg) as t:
        assert t.run(["true"]).returncode == 0
    cfg.write_text(cfg.read_text().replace("%k", "%h-%p-%r-%%"))
    (khd / f"127.0.0.1-{ssh_server.port}-root-%").write_text(ssh_server.known_hosts_line(ssh_server.port, ssh_server.host_key))
    with SSHTransport("lingjun-test", ssh_config=cfg) as t:
        assert t.run(["true"]).returncode == 0
    cfg.write_text(cfg.read_text().replace("%h-%p-%r-%%", "%Z"))
    with pytest.raises(UsageError, match="unsupported token %Z"):
        SSHTransport("lingjun-test", ssh_config=cfg).run(["true"])


def test_known_hosts2_is_read_by_default(ssh_server: SSHServer, tmp_path: Path, home: Path) -> None:
    (home / ".ssh").mkdir()
    (home / ".ssh" / "known_hosts2").write_text(ssh_server.known_hosts_line(ssh_server.port, ssh_server.jump_host_key))
    cfg = write_config(tmp_path / "cfg", ssh_server, "Host lingjun-test\n  StrictHostKeyChecking accept-new\n")
    from lingjun_slurm.transport.ssh import SSHTransport

    with pytest.raises(HostKeyError, match="known_hosts2:1"):
        SSHTransport("lingjun-test", ssh_config=cfg).run(["true"])
    assert not (home / ".ssh" / "known_hosts").exists()


def test_accepting_a_key_rereads_known_hosts(ssh_server: SSHServer, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process records a (different) key while this one is connecting: the key is checked
    against it, not appended beside it."""
    kh = tmp_path / "kh"
    kh.write_text(ssh_server.known_hosts_line(ssh_server.port, ssh_server.jump_host_key))
    real_load = knownhosts.load
    calls = []

    def load(paths: object) -> list:
        calls.append(1)
        return [] if len(calls) == 1 else real_load(paths)  # the first read happens "before" the other process

    monkeypatch.setattr(knownhosts, "load", load)
    cfg = write_config(tmp_path / "cfg", ssh_server)
    with pytest.raises(HostKeyError, match="HOST KEY MISMATCH"):
        ssh_server.transport("lingjun-test", ssh_config=cfg, known_hosts=kh, accept_new_host_key=True).run(["true"])
    assert kh.read_text().count("\n") == 1
    calls.clear()
    kh.write_text(ssh_server.known_hosts_line(ssh_server.port, ssh_server.host_key))
    with ssh_server.transport("lingjun-test", ssh_config=cfg, known_hosts=kh, accept_new_host_key=True) as t:
        t.run(["true"])
    assert kh.read_text().count("\n") == 1  # already there: not recorded twice


def test_invalid_dns_names_are_unreachable_not_a_traceback(ssh_server: SSHServer) -> None:
    for host in ("a..b", "x" * 70 + ".example"):
        with pytest.raises(HostUnreachable, match="not a valid DNS name") as info:
            ssh_server.transport(host).run(["true"])
        assert info.value.exit_code == 3


def test_identity_agent_none_and_path(ssh_server: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """IdentityAgent none: the agent's keys are never offered to that host; a path: that agent."""
    if not shutil.which("ssh-agent") or not shutil.which("ssh-add"):
        pytest.skip("no ssh-agent")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 5
        while not sock.exists() and time.monotonic() < end:
            time.sleep(0.01)
        subprocess.run(["ssh-add", str(ssh_server.client_key)], env=dict(os.environ, SSH_AUTH_SOCK=str(sock)),
                       check=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=10)
        cfg = tmp_path / "cfg"
        head = (f"Host *\n  HostName 127.0.0.1\n  Port {ssh_server.port}\n  User root\n"
                f"  IdentityFile {ssh_server.wrong_key}\n  GlobalKnownHostsFile /dev/null\n")
        cfg.write_text(f"Host no-agent\n  IdentityAgent none\nHost by-path\n  IdentityAgent {sock}\n" + head)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        with pytest.raises(AuthFailed, match=r"IdentityAgent none") as info:
            ssh_server.transport("no-agent", ssh_config=cfg).run(["true"])
        assert "ssh-agent ssh-ed25519" not in str(info.value)  # only the wrong key was offered
        monkeypatch.delenv("SSH_AUTH_SOCK")
        with ssh_server.transport("by-path", ssh_config=cfg) as t:
            assert t.run(["echo", "agent"]).stdout == "agent\n"
    finally:
        agent.terminate()
        agent.wait(5)
