"""Real sshd servers on 127.0.0.1 for the SSH transport's tests: `ssh_server` and `ssh_slurm`
(import both in tests/conftest.py).

`ssh_server` (session scope) starts two `/usr/sbin/sshd -D -e` instances from an empty root
/tmp/lingjun-test-ssh-<pid>, key-only (no passwords, no keyboard-interactive, no PAM), root
login with keys, their own host keys, on free ports from 17022 up:
- the main server (`port`), the "login node";
- a jump host (`jump_port`), for ProxyJump (LogLevel DEBUG1, so its log shows the forwarding).

It exposes `client_key` (authorized), `wrong_key` (not authorized), `encrypted_key` (authorized,
passphrase PASSPHRASE: for ssh-agent tests), `known_hosts` (both servers' keys, `[127.0.0.1]:PORT`
form), `ssh_config` (aliases `lingjun-test`, `lingjun-jump`, `lingjun-via-jump`; every Host uses
`known_hosts` and never /etc/ssh), `env()` (LINGJUN_SSH_CONFIG and LINGJUN_KNOWN_HOSTS for a
child process or monkeypatch), `target` (`root@127.0.0.1:PORT`), `transport(target, **kw)`,
`accepted()` (how many logins the main sshd accepted so far: count connections), `log` and
`jump_log`, and `stop()`. Nothing reads or writes the real ~/.ssh or /etc/ssh (only /run/sshd,
sshd's privilege separation directory, is created when missing).

Remote sessions get PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin (sshd
SetEnv) and SLURM_CONF=<root>/slurm-etc/slurm.conf, a path that only works once `ssh_slurm` has
pointed <root>/slurm-etc at the test cluster's directory.

End-to-end tests (SSH in front of the test Slurm cluster) use **`ssh_slurm`**: the same server
object, after the `slurm_cluster` fixture is up and linked, so `sbatch`, `squeue`, `sacct` and
`scontrol` run over SSH reach that cluster with no environment of their own. Tests that need
no Slurm use `ssh_server` (no cluster is started for them).

Skipped where sshd, ssh-keygen, paramiko or root is missing, except under CI (CI set), where
that is a failure. LINGJUN_KEEP_TEST_SSH=1 keeps the root (configs, logs) after the session.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from tests.cluster.fixtures import unavailable

FIRST_PORT = 17022
SSHD = "/usr/sbin/sshd"
PASSPHRASE = "correct horse battery staple"
REMOTE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as sshd does: TIME_WAIT is no obstacle
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int, first: int = FIRST_PORT) -> list[int]:
    found = [p for p in range(first, first + 200) if _port_free(p)][:count]
    if len(found) < count:
        pytest.fail(f"no {count} free ports for the test sshd in {first}..{first + 200}")
    return found


def keygen(path: Path, passphrase: str = "") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", f"lingjun-test {path.name}",
                    "-f", str(path)], check=True, capture_output=True)
    return path


def require_sshd() -> None:
    if not os.path.exists(SSHD):
        unavailable(f"{SSHD} is not installed (apt-get install openssh-server openssh-client)")
    if not shutil.which("ssh-keygen"):
        unavailable("ssh-keygen is not installed (apt-get install openssh-client)")
    if os.geteuid() != 0:
        unavailable("the test sshd needs root")
    try:
        import paramiko  # noqa: F401
    except ImportError:
        unavailable("paramiko is not installed (pip install 'lingjun-slurm[ssh]')")


class SSHServer:
    """The sshd pair in `root` (an empty, private directory). Usable outside pytest too (bench/ssh.py):
    errors are then pytest.fail's exception, `pytest.fail.Exception`."""

    def __init__(self, root: Path, first_port: int = FIRST_PORT) -> None:
        self.root = root
        self.port, self.jump_port = free_ports(2, first_port)
        self.client_key = keygen(root / "client_key")
        self.wrong_key = keygen(root / "wrong_key")
        self.encrypted_key = keygen(root / "encrypted_key", PASSPHRASE)
        self.host_key = keygen(root / "host_key")
        self.jump_host_key = keygen(root / "jump_host_key")
        self.authorized_keys = root / "authorized_keys"
        self.authorized_keys.write_text(Path(f"{self.client_key}.pub").read_text()
                                        + Path(f"{self.encrypted_key}.pub").read_text())
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text(self.known_hosts_line(self.port, self.host_key)
                                    + self.known_hosts_line(self.jump_port, self.jump_host_key))
        self.slurm_etc = root / "slurm-etc"
        self.ssh_config = root / "ssh_config"
        self.ssh_config.write_text(self._client_config())
        self.log = root / "sshd.log"
        self.jump_log = root / "sshd-jump.log"
        self.procs: list[subprocess.Popen[bytes]] = []

    @staticmethod
    def known_hosts_line(port: int, host_key: Path) -> str:
        keytype, blob = Path(f"{host_key}.pub").read_text().split()[:2]
        return f"[127.0.0.1]:{port} {keytype} {blob}\n"

    def _client_config(self) -> str:
        def block(alias: str, port: int, extra: str = "") -> str:
            return (f"Host {alias}\n  HostName 127.0.0.1\n  Port {port}\n  User root\n"
                    f"  IdentityFile {self.client_key}\n  IdentitiesOnly yes\n{extra}")

        return (block("lingjun-test", self.port) + block("lingjun-jump", self.jump_port)
                + block("lingjun-via-jump", self.port, "  ProxyJump lingjun-jump\n")
                + f"Host *\n  UserKnownHostsFile {self.known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
                  "  StrictHostKeyChecking yes\n  BatchMode yes\n")

    def _server_config(self, name: str, port: int, host_key: Path, log_level: str) -> Path:
        path = self.root / f"{name}_config"
        path.write_text(f"""\
ListenAddress 127.0.0.1:{port}
HostKey {host_key}
PidFile {self.root / f"{name}.pid"}
AuthorizedKeysFile {self.authorized_keys}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitEmptyPasswords no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
AllowTcpForwarding yes
MaxStartups 100:30:200
LogLevel {log_level}
SetEnv PATH={REMOTE_PATH} SLURM_CONF={self.slurm_etc / "slurm.conf"}
Subsystem sftp internal-sftp
""")
        return path

    def _start(self, name: str, port: int, host_key: Path, log: Path, log_level: str) -> None:
        cfg = self._server_config(name, port, host_key, log_level)
        with open(log, "ab") as fh:
            proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdin=subprocess.DEVNULL,
                                    stdout=fh, stderr=fh)
        self.procs.append(proc)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"the test sshd ({name}) exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.02)
        pytest.fail(f"the test sshd ({name}) is not listening on {port} after 10 s:\n{log.read_text()[-3000:]}")

    def start(self, jump: bool = True) -> "SSHServer":
        """Start the main sshd and (jump=True) the jump host; stop() stops whatever was started."""
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        self._start("sshd", self.port, self.host_key, self.log, "VERBOSE")
        if jump:
            self._start("sshd-jump", self.jump_port, self.jump_host_key, self.jump_log, "DEBUG1")
        return self

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []

    # --- helpers for tests -------------------------------------------------------------------
    @property
    def target(self) -> str:
        return f"root@127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {"LINGJUN_SSH_CONFIG": str(self.ssh_config), "LINGJUN_KNOWN_HOSTS": str(self.known_hosts)}

    def transport(self, target: str = "lingjun-test", **kw: Any) -> Any:
        from lingjun_slurm.transport.ssh import SSHTransport

        kw.setdefault("ssh_config", self.ssh_config)
        kw.setdefault("known_hosts", self.known_hosts)
        return SSHTransport(target, **kw)

    def accepted(self, log: Optional[Path] = None) -> int:
        """Logins the (main) sshd accepted so far."""
        return (log or self.log).read_text(errors="replace").count("Accepted publickey")

    def link_slurm(self, cluster_root: Path) -> None:
        """Point the sessions' SLURM_CONF (<root>/slurm-etc/slurm.conf) at a cluster's directory."""
        if self.slurm_etc.is_symlink() or self.slurm_etc.exists():
            self.slurm_etc.unlink()
        self.slurm_etc.symlink_to(cluster_root, target_is_directory=True)


@pytest.fixture(scope="session")
def ssh_server() -> Iterator[SSHServer]:
    """Two running sshd instances (main + jump host) on 127.0.0.1; see the module docstring."""
    require_sshd()
    root = Path(f"/tmp/lingjun-test-ssh-{os.getpid()}")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(mode=0o700)
    server = SSHServer(root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        if not os.environ.get("LINGJUN_KEEP_TEST_SSH"):
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def ssh_slurm(ssh_server: SSHServer, slurm_cluster: Any) -> SSHServer:
    """`ssh_server` whose sessions reach the test Slurm cluster (`slurm_cluster`) through SLURM_CONF."""
    ssh_server.link_slurm(Path(slurm_cluster.slurm_conf).parent)
    return ssh_server
