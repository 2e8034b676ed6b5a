"""The SSH transport's cost, as ratios to local references measured in the same run.

    .venv/bin/python bench/ssh.py [--rtt 0,20] [--repeat 40] [--connects 5] [--ships 3] [--json]

Starts its own key-only sshd on 127.0.0.1 (tests/ssh/fixtures.py's SSHServer, main server only,
ports from 17222 up, root in a fresh /tmp/lingjun-bench-ssh-* directory) and always stops it and
removes that directory (the "remote" files are written inside it). No Slurm, no network: all
traffic is on 127.0.0.1. Needs root, /usr/sbin/sshd, ssh-keygen and paramiko.

Each round trip time in --rtt is one link: 0 is the sshd directly; any other value goes through
tests/remote/latency.py's LatencyProxy delaying every byte by RTT/2 each way, run in a process of
its own (so its sleeping threads do not compete with paramiko's for this process's GIL). Per link:

- connect: a fresh SSHTransport, connect + key auth + the first `run(["true"])`, --connects times;
  reference: one `LocalTransport().run(["true"])` (one local subprocess).
- command round trip: --repeat x `run(["true"])` on one open connection; reference: --repeat x
  `LocalTransport().run(["true"])`.
- the login shell, without SSH (once, link "(local)"): sshd runs every command through the user's
  login shell, and bash started by sshd sources ~/.bashrc; --repeat x `bash -c '. ~/.bashrc; exec
  true'` locally (only where the shell is bash and ~/.bashrc exists) shows that floor of a
  command round trip on this machine (here: root's ~/.bashrc runs `pyenv init`, ~100 ms).
- small-file write: --repeat x `write_atomic` of 1 KiB over SFTP (temp file, chmod, rename; no
  fsync); reference: --repeat x the local transport's write_atomic (which does fsync).
- ship: `bundle.ship` of lingjun_slurm into a fresh run directory, one upload of the wheel + one
  remote `python3 -c UNPACK` (the default for SSH) vs file by file (`unpack_remotely=False`, the
  switch the tests use for the fallback path); --ships times the first, the second as often at
  RTT 0 and once otherwise (it takes ~10 s at 20 ms); reference: the local ship. The bench checks
  that the one-command ship ran exactly one remote command and wrote one file, and that every
  ship produced the local ship's tree.

Medians are reported (the mean too: noise on a shared machine shows as mean >> median); "x" is
the SSH median over the local median. No thresholds: this is a benchmark, not a test. Exits
non-zero on any error.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.ssh.fixtures (the test sshd) and tests.remote.latency (the proxy)

import pytest  # noqa: E402  (the fixture helpers report errors with pytest.fail / pytest.skip)

from lingjun_slurm.bundle import ship  # noqa: E402
from lingjun_slurm.common.errors import LingjunError  # noqa: E402
from lingjun_slurm.transport import LocalTransport  # noqa: E402
from lingjun_slurm.transport.ssh import SSHTransport  # noqa: E402
from tests.ssh.fixtures import SSHD, SSHServer, require_sshd  # noqa: E402

FIRST_PORT = 17222  # the test suite's sshd starts at 17022: a bench next to a test run does not race it
SMALL = b"x" * 1024

# Runs in its own process: the proxy of tests/remote/latency.py until stdin closes.
PROXY = """
import sys
from tests.remote.latency import LatencyProxy
proxy = LatencyProxy(int(sys.argv[1]), float(sys.argv[2]))
print(proxy.port, flush=True)
sys.stdin.read()
proxy.close()
"""


class BenchError(Exception):
    """The benchmark could not run or the library did not do what it should."""


class CountingSSH(SSHTransport):
    """SSHTransport that also counts file writes (its history has the commands)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.writes = 0

    def write_atomic(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self.writes += 1
        super().write_atomic(path, data, mode)


class Proxy:
    """LatencyProxy(target_port, delay_s) in a child process."""

    def __init__(self, target_port: int, delay_s: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", PROXY, str(target_port), str(delay_s)], cwd=REPO,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            self.close()
            raise BenchError(f"the latency proxy did not start (exit {self.proc.returncode})")
        self.port = int(line)

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass
class Row:
    link: str
    what: str
    n: int
    median_ms: float
    mean_ms: float
    local_n: int
    local_median_ms: float
    ratio: float


@dataclass
class ShipRow:
    link: str
    files: int
    one_command_s: float
    one_command_n: int
    one_command_cmds: int
    one_command_writes: int
    file_by_file_s: float
    file_by_file_n: int
    file_by_file_cmds: int
    file_by_file_writes: int
    local_s: float
    ratio: float  # file by file / one command


def timed(fn: Callable[[int], object], n: int) -> list[float]:
    """Seconds of each of n calls fn(0), fn(1), ..."""
    out = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def row(link: str, what: str, ssh: list[float], local: list[float]) -> Row:
    med, ref = statistics.median(ssh), statistics.median(local)
    return Row(link, what, len(ssh), med * 1000, statistics.fmean(ssh) * 1000, len(local), ref * 1000, med / ref)


def tree(site: Path) -> list[str]:
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file())


def run_true(t: object) -> None:
    result = t.run(["true"])  # type: ignore[attr-defined]
    if result.returncode != 0:
        raise BenchError(f"`true` exited {result.returncode} on {t}: {result.stderr.strip()}")


class Bench:
    def __init__(self, server: SSHServer, root: Path, opts: argparse.Namespace) -> None:
        self.server, self.root, self.opts = server, root, opts
        self.config = root / "bench_ssh_config"
        self.known_hosts = root / "bench_known_hosts"
        self.aliases: dict[str, int] = {}
        self.seq = 0

    def add_alias(self, alias: str, port: int) -> None:
        """ssh_config Host `alias` -> 127.0.0.1:port, the server's host key recorded for that port."""
        self.aliases[alias] = port
        blocks = "".join(f"Host {a}\n  HostName 127.0.0.1\n  Port {p}\n  User root\n"
                         f"  IdentityFile {self.server.client_key}\n  IdentitiesOnly yes\n"
                         for a, p in self.aliases.items())
        self.config.write_text(blocks + f"Host *\n  UserKnownHostsFile {self.known_hosts}\n"
                                        "  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n"
                                        "  BatchMode yes\n")
        self.known_hosts.write_text("".join(SSHServer.known_hosts_line(p, self.server.host_key)
                                            for p in self.aliases.values()))

    def transport(self, alias: str) -> CountingSSH:
        return CountingSSH(alias, ssh_config=self.config, known_hosts=self.known_hosts)

    def fresh_dir(self, kind: str) -> Path:
        self.seq += 1
        return self.root / "remote" / f"{kind}-{self.seq}"

    def link(self, rtt_ms: float) -> tuple[list[Row], ShipRow]:
        opts = self.opts
        name = "127.0.0.1" if rtt_ms == 0 else f"{rtt_ms:g} ms RTT"
        proxy: Optional[Proxy] = None
        try:
            if rtt_ms == 0:
                alias = "direct"
                self.add_alias(alias, self.server.port)
            else:
                proxy = Proxy(self.server.port, rtt_ms / 2000)
                alias = f"rtt{rtt_ms:g}"
                self.add_alias(alias, proxy.port)
            local = LocalTransport()
            rows = []

            # connect + auth + first command, each on a new connection
            ref = timed(lambda i: run_true(LocalTransport()), opts.repeat)

            def connect(i: int) -> None:
                with self.transport(alias) as t:
                    run_true(t)

            rows.append(row(name, "connect + auth + first run(true)", timed(connect, opts.connects), ref))

            with self.transport(alias) as t:
                run_true(t)  # connected; the rest is on this connection
                rows.append(row(name, "command round trip: run(true)", timed(lambda i: run_true(t), opts.repeat),
                                timed(lambda i: run_true(local), opts.repeat)))
                remote_dir, local_dir = self.fresh_dir("small"), self.fresh_dir("small-local")
                t.mkdir(str(remote_dir))
                local.mkdir(str(local_dir))
                rows.append(row(name, "write_atomic 1 KiB (SFTP)",
                                timed(lambda i: t.write_atomic(f"{remote_dir}/f{i}", SMALL), opts.repeat),
                                timed(lambda i: local.write_atomic(f"{local_dir}/f{i}", SMALL), opts.repeat)))
                shipped = self.ships(t, name, rtt_ms)
        finally:
            if proxy is not None:
                proxy.close()
        return rows, shipped

    def ships(self, t: CountingSSH, name: str, rtt_ms: float) -> ShipRow:
        reference: list[str] = []
        local_s: list[float] = []
        for _ in range(self.opts.ships):
            where = self.fresh_dir("ship-local")
            start = time.perf_counter()
            ship(LocalTransport(), str(where), [])
            local_s.append(time.perf_counter() - start)
            reference = tree(where)
        if len(reference) < 50:
            raise BenchError(f"the local ship wrote {len(reference)} files; expected the whole package")

        def once(remote: bool) -> tuple[float, int, int]:
            where = self.fresh_dir(f"ship-{'one' if remote else 'files'}")
            cmds, writes = len(t.history), t.writes
            start = time.perf_counter()
            ship(t, str(where), [], unpack_remotely=None if remote else False)
            elapsed = time.perf_counter() - start
            cmds, writes = len(t.history) - cmds, t.writes - writes
            got = tree(where)
            if got != reference:
                raise BenchError(f"ship over SSH ({'one command' if remote else 'file by file'}, {name}) wrote "
                                 f"{len(got)} files, not the local ship's {len(reference)} (or other names)")
            if remote and (cmds, writes) != (1, 1):
                raise BenchError(f"the default ship over SSH ran {cmds} commands and wrote {writes} files; "
                                 "expected one upload and one python3 command")
            if not remote and (cmds, writes) != (0, len(reference)):  # the wheel and each site file
                raise BenchError(f"the file-by-file ship ran {cmds} commands and wrote {writes} files; "
                                 f"expected none and {len(reference)}")
            return elapsed, cmds, writes

        one = [once(True) for _ in range(self.opts.ships)]
        files = [once(False) for _ in range(self.opts.ships if rtt_ms == 0 else 1)]
        one_s, files_s = statistics.median(x[0] for x in one), statistics.median(x[0] for x in files)
        return ShipRow(name, len(reference), one_s, len(one), one[0][1], one[0][2], files_s, len(files),
                       files[0][1], files[0][2], statistics.median(local_s), files_s / one_s)


def login_shell_row(repeat: int) -> Optional[Row]:
    """sshd runs every command through the user's login shell; bash started by sshd sources ~/.bashrc
    (non-interactive, but run by sshd). Its cost, measured here without SSH, explains the floor of a
    remote command on this machine. None when the shell is not bash or there is no ~/.bashrc."""
    entry = pwd.getpwuid(os.getuid())
    rc = Path(entry.pw_dir) / ".bashrc"
    if os.path.basename(entry.pw_shell) != "bash" or not rc.is_file():
        return None
    argv = [entry.pw_shell, "-c", f". {rc} >/dev/null 2>&1; exec true"]
    ref = timed(lambda i: run_true(LocalTransport()), repeat)
    shell = timed(lambda i: subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True), repeat)
    return row("(local)", f"{os.path.basename(entry.pw_shell)} + ~/.bashrc, no SSH", shell, ref)


def sshd_version() -> str:
    try:
        out = subprocess.run([SSHD, "-V"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "sshd"
    first = (out.stderr or out.stdout).strip().splitlines()
    return first[0].split(",")[0] if first else "sshd"


def print_tables(info: dict[str, str], rows: list[Row], ships: list[ShipRow]) -> None:
    print(f"sshd: {info['sshd']} on 127.0.0.1:{info['port']}, key-only; client: paramiko {info['paramiko']}; "
          f"links: {info['links']}")
    print(f"{'measure':<34} {'link':<11} {'n':>3} {'median ms':>10} {'mean ms':>9} {'local ms':>9} {'x local':>8}")
    for r in rows:
        print(f"{r.what:<34} {r.link:<11} {r.n:>3} {r.median_ms:>10.2f} {r.mean_ms:>9.2f} "
              f"{r.local_median_ms:>9.2f} {r.ratio:>8.1f}")
    print("local ms: LocalTransport, same operation (connect: one local `true`); write_atomic: local does fsync, "
          "SFTP does not")
    if any(r.link == "(local)" for r in rows):
        print("bash + ~/.bashrc: what sshd starts before each remote command (the login shell, which sources "
              "~/.bashrc when run by sshd), timed here without SSH: the floor of a command round trip")
    print()
    files = ships[0].files if ships else 0
    print(f"ship lingjun_slurm (the wheel + {files - 1} files in site/), median seconds; "
          "(n, cmds, writes): ships timed, remote commands and files written per ship:")
    print(f"{'link':<11} {'one upload + python3':>20} {'(n, cmds, writes)':>18} {'file by file':>13} "
          f"{'(n, cmds, writes)':>18} {'local':>7} {'file by file / one':>19}")
    for s in ships:
        print(f"{s.link:<11} {s.one_command_s:>20.3f} "
              f"{f'({s.one_command_n}, {s.one_command_cmds}, {s.one_command_writes})':>18} "
              f"{s.file_by_file_s:>13.3f} {f'({s.file_by_file_n}, {s.file_by_file_cmds}, {s.file_by_file_writes})':>18} "
              f"{s.local_s:>7.3f} {s.ratio:>19.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt", default="0,20", help="comma-separated round trip times in ms (0: no proxy; "
                                                      "default 0,20)")
    parser.add_argument("--repeat", type=int, default=40, help="commands and small writes per link (default 40)")
    parser.add_argument("--connects", type=int, default=5, help="fresh connections per link (default 5)")
    parser.add_argument("--ships", type=int, default=3, help="one-command ships per link (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    opts = parser.parse_args()
    try:
        rtts = [float(x) for x in opts.rtt.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--rtt {opts.rtt!r}: give comma-separated milliseconds")
    if not rtts or min(rtts) < 0 or min(opts.repeat, opts.connects, opts.ships) < 1:
        parser.error("--rtt: milliseconds >= 0; --repeat, --connects, --ships: at least 1")

    import paramiko

    rows: list[Row] = []
    ships: list[ShipRow] = []
    info: dict[str, str] = {}
    server: Optional[SSHServer] = None
    root = Path(tempfile.mkdtemp(prefix="lingjun-bench-ssh-"))  # mode 0700
    try:
        require_sshd()
        server = SSHServer(root, first_port=FIRST_PORT)
        server.start(jump=False)
        info = {"sshd": sshd_version(), "port": str(server.port), "paramiko": paramiko.__version__,
                "links": ", ".join("direct" if r == 0 else f"{r:g} ms RTT (LatencyProxy, {r / 2:g} ms each way)"
                                   for r in rtts)}
        shell = login_shell_row(opts.repeat)
        if shell is not None:
            rows.append(shell)
        bench = Bench(server, root, opts)
        for rtt in rtts:
            link_rows, shipped = bench.link(rtt)
            rows += link_rows
            ships.append(shipped)
            if not opts.json:
                print(f"link {shipped.link} done", file=sys.stderr)
    except (BenchError, LingjunError) as exc:
        print(f"bench/ssh.py: error: {exc}", file=sys.stderr)
        return 1
    except (pytest.fail.Exception, pytest.skip.Exception) as exc:  # from the fixture helpers
        print(f"bench/ssh.py: error: {exc.msg}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    order = list(dict.fromkeys(r.what for r in rows if r.link != "(local)"))
    rows.sort(key=lambda r: order.index(r.what) if r.what in order else 1.5)  # by measure, then by link
    if opts.json:
        print(json.dumps({"info": info, "rows": [asdict(r) for r in rows], "ship": [asdict(s) for s in ships]},
                         indent=2))
    else:
        print_tables(info, rows, ships)
    return 0


if __name__ == "__main__":
    sys.exit(main())
