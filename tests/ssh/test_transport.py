"""SSHTransport against a real sshd on 127.0.0.1: every Transport method, one connection, hostile
strings. The "remote" is this machine, so tests check the remote side through the local files."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from lingjun_slurm.common.errors import CommandError, TransportError, UsageError
from lingjun_slurm.transport import LocalTransport
from tests.ssh.fixtures import SSHServer

HOSTILE = ["$(touch pwned1)", "`touch pwned2`", "a'b", 'a"b', "a\nb; touch pwned3", "a b", ";touch pwned4",
           "&&", "|", "*", "~", "-n", "A=b", "\\", "$HOME", "'; touch pwned5; '"]


@pytest.fixture(scope="module")
def t(ssh_server: SSHServer) -> Iterator[Any]:
    with ssh_server.transport() as transport:
        yield transport


def test_run_output_exit_codes_and_missing_program(t: Any, tmp_path: Path) -> None:
    ok = t.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (ok.returncode, ok.stdout, ok.stderr) == (3, "out\n", "err\n")
    with pytest.raises(CommandError) as info:
        t.run(["sh", "-c", "echo 'sbatch: error: invalid partition' >&2; exit 1"], check=True, what="sbatch failed")
    assert "sbatch failed (exit 1) on lingjun-test" in str(info.value) and "invalid partition" in str(info.value)
    missing = t.run(["no-such-program-xyz", "arg"])
    assert missing.returncode == 127 and "no-such-program-xyz" in missing.stderr
    plain = tmp_path / "plain"
    plain.write_text("echo no\n")
    notexec = t.run([str(plain)])
    assert notexec.returncode == 126
    assert t.history[-1] == (str(plain),)
    assert t.run(["true"]).returncode == 0 and t.run(["false"]).returncode == 1


def test_run_cwd_env_input(t: Any, tmp_path: Path) -> None:
    r = t.run(["sh", "-c", 'pwd; printf "%s|%s\\n" "$A" "$B"; cat'], cwd=str(tmp_path),
              env={"A": "x y", "B": "$(touch pwned) 'q' \"d\"\nline2"}, input="hello\nworld")
    assert r.returncode == 0
    assert r.stdout == f"{tmp_path}\nx y|$(touch pwned) 'q' \"d\"\nline2\nhello\nworld"
    assert list(tmp_path.iterdir()) == []
    missing = t.run(["pwd"], cwd=str(tmp_path / "nope"))
    assert missing.returncode == 126 and "nope" in missing.stderr
    with pytest.raises(UsageError, match="environment variable name"):
        t.run(["true"], env={"A;touch x": "1"})
    # stdin gets EOF even without input, so a reader never hangs
    assert t.run(["cat"], timeout=10).returncode == 0


def test_run_large_outputs_and_input_do_not_deadlock(t: Any) -> None:
    started = time.monotonic()
    r = t.run(["sh", "-c", "head -c 6000000 /dev/zero | tr '\\0' a; head -c 3000000 /dev/zero | tr '\\0' b >&2; cat"],
              input="c" * 4_000_000, timeout=60)
    assert r.returncode == 0
    assert len(r.stdout) == 10_000_000 and r.stdout.count("a") == 6_000_000 and r.stdout.endswith("c" * 100)
    assert r.stderr == "b" * 3_000_000
    assert time.monotonic() - started < 20


def test_run_timeout_is_124_and_ends_the_remote_program(t: Any, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    r = t.run(["sh", "-c", f'echo partial; echo $$ > "{pidfile}"; exec sleep 30'], timeout=0.5)
    assert r.returncode == 124 and "timed out after 0.5 s" in r.stderr and r.stdout == "partial\n"
    assert time.monotonic() - started < 5
    pid = int(pidfile.read_text())
    end = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < end:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")
    # a program's own exit 124 is not reported as a timeout
    own = t.run(["sh", "-c", "exit 124"], timeout=30)
    assert own.returncode == 124 and "timed out" not in own.stderr


def test_hostile_argv_cwd_and_paths_run_nothing(t: Any, tmp_path: Path) -> None:
    r = t.run(["printf", "%s\\n", *HOSTILE], cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout == "".join(f"{h}\n" for h in HOSTILE)
    assert t.run(["$(touch pwned6)"], cwd=str(tmp_path)).returncode == 127
    weird = tmp_path / "d $(touch pwned7) 'q' \"x\"\nnl;`touch pwned8`"
    weird.mkdir()
    assert t.run(["pwd"], cwd=str(weird)).stdout == f"{weird}\n"
    # the same strings as remote paths
    for i, h in enumerate(HOSTILE):
        name = h.replace("/", "_")
        t.write_atomic(str(weird / name), f"content {i}")
        assert t.read_text(str(weird / name)) == f"content {i}"
        t.mkdir(str(weird / f"dir {name}"))
    assert t.which("$(touch pwned9)") is None and t.which("a\nb") is None
    with t.lock(str(weird / "lock $(touch pwned10) 'x'")):
        assert (weird / "lock $(touch pwned10) 'x'").exists()
    assert not [p for p in tmp_path.rglob("pwned*")]
    assert sorted(os.listdir(tmp_path)) == [weird.name]


def test_which(t: Any, tmp_path: Path) -> None:
    assert t.which("sh") in ("/usr/bin/sh", "/bin/sh")
    assert t.which("/bin/sh") == "/bin/sh"
    assert t.which("no-such-program-xyz") is None
    (tmp_path / "plain").write_text("")
    assert t.which(str(tmp_path / "plain")) is None  # not executable
    assert t.which("sshd") == "/usr/sbin/sshd"  # the remote PATH has the sbin directories


def test_files(t: Any, tmp_path: Path) -> None:
    d = tmp_path / "d"
    t.mkdir(str(d))
    target = str(d / "f.txt")
    t.write_atomic(target, "one", 0o600)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    t.write_atomic(target, b"two")
    assert t.read_text(target) == "two" and stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert t.read_bytes(target) == b"two"
    assert t.listdir(str(d)) == ["f.txt"]  # no temp files left behind
    assert t.listdir(str(tmp_path / "missing")) == [] and t.listdir(target) == []
    with pytest.raises(FileNotFoundError):
        t.read_bytes(str(tmp_path / "missing"))
    with pytest.raises(TransportError, match="nodir"):
        t.write_atomic(str(tmp_path / "nodir" / "x"), "x")
    assert t.exists(target) and t.exists(str(d)) and not t.exists(str(tmp_path / "missing"))
    assert t.size(target) == 3 and t.size(str(tmp_path / "missing")) is None
    t.write_atomic(target, b"0123456789")
    assert t.read_range(target, 2, 3) == b"234"
    assert t.read_range(target, 8, 100) == b"89"
    assert t.read_range(target, 10, 5) == b"" and t.read_range(str(tmp_path / "missing"), 0, 5) == b""
    assert t.read_text(target) == "0123456789"
    empty = str(d / "empty")
    t.write_atomic(empty, b"")
    assert t.read_bytes(empty) == b"" and t.size(empty) == 0


def test_tilde_is_the_remote_home(t: Any) -> None:
    home = t.run(["sh", "-c", "cd && pwd"]).stdout.strip()
    assert t.home() == home
    assert t._path("~") == home and t._path("~/x/y") == f"{home}/x/y"
    assert t._path("~other/x") == "~other/x" and t._path("/abs/~/x") == "/abs/~/x"
    assert t.run(["pwd"], cwd="~").stdout.strip() == home
    assert t.exists("~") and t.exists("~/")


def test_write_atomic_readers_never_see_half_a_file(t: Any, tmp_path: Path) -> None:
    path = tmp_path / "f"
    payloads = [bytes([c]) * 1_000_000 for c in b"ab"]
    t.write_atomic(str(path), payloads[0])
    stop = threading.Event()
    seen: set[tuple[int, bytes]] = set()

    def reader() -> None:
        while not stop.is_set():
            data = path.read_bytes()
            seen.add((len(data), data[:1] if not data.strip(data[:1]) else b"mixed"))
            time.sleep(0.001)

    th = threading.Thread(target=reader)
    th.start()
    try:
        for i in range(12):
            t.write_atomic(str(path), payloads[i % 2], 0o640)
    finally:
        stop.set()
        th.join()
    assert seen <= {(1_000_000, b"a"), (1_000_000, b"b")}, seen
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert os.listdir(tmp_path) == ["f"]


def test_mkdir_parents_modes_and_exist_ok_false_race(ssh_server: SSHServer, t: Any, tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b" / "c"
    t.mkdir(str(deep), mode=0o700)
    assert deep.is_dir() and stat.S_IMODE(os.stat(deep).st_mode) == 0o700
    t.mkdir(str(deep))  # exist_ok
    with pytest.raises(FileExistsError):
        t.mkdir(str(deep), exist_ok=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(TransportError, match="in the way"):
        t.mkdir(str(tmp_path / "file" / "sub"))
    t.mkdir(str(tmp_path / "new" / "leaf"), exist_ok=False)  # parents are created
    # of two callers (two connections) racing for the same directory, exactly one wins
    other = ssh_server.transport()
    wins: list[tuple[int, int]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(2)

    def racer(who: int, tr: Any) -> None:
        for i in range(15):
            barrier.wait()
            try:
                tr.mkdir(str(tmp_path / "race" / f"r{i}"), exist_ok=False)
            except FileExistsError:
                continue
            with lock:
                wins.append((i, who))

    try:
        other.connect()
        threads = [threading.Thread(target=racer, args=(n, tr)) for n, tr in enumerate((t, other))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        other.close()
    assert sorted(i for i, _ in wins) == list(range(15))


def test_put_and_get_stream_a_large_file(t: Any, tmp_path: Path) -> None:
    import tracemalloc

    src = tmp_path / "big.bin"
    data = os.urandom(8 << 20)
    src.write_bytes(data)
    os.chmod(src, 0o750)
    remote = tmp_path / "remote" / "big.bin"
    t.mkdir(str(remote.parent))
    tracemalloc.start()
    try:
        t.put(src, str(remote))
        put_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        back = tmp_path / "back" / "big.bin"
        t.get(str(remote), back)
        get_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    digest = hashlib.sha256(data).hexdigest()
    assert hashlib.sha256(remote.read_bytes()).hexdigest() == digest
    assert hashlib.sha256(back.read_bytes()).hexdigest() == digest
    assert stat.S_IMODE(os.stat(remote).st_mode) == 0o750  # the local mode by default
    # Streamed, never all 8 MiB in memory. get() asks for GET_WINDOW (2 MiB) at a time; paramiko
    # keeps a window's replies in its prefetch buffers and in the packets not yet parsed while
    # read() copies them out (peak seen at 4.75 MB on a loaded machine), so the bound is 6 MiB:
    # still well under the whole file.
    assert put_peak < 6 << 20 and get_peak < 6 << 20, (put_peak, get_peak)
    assert os.listdir(remote.parent) == ["big.bin"] and os.listdir(back.parent) == ["big.bin"]
    t.put(src, str(remote), mode=0o600)
    assert stat.S_IMODE(os.stat(remote).st_mode) == 0o600
    with pytest.raises(FileNotFoundError):
        t.get(str(tmp_path / "missing"), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_follow_streams_a_growing_file_with_one_open_handle(t: Any, tmp_path: Path) -> None:
    path = tmp_path / "log"
    finished = threading.Event()

    def writer() -> None:
        time.sleep(0.1)  # the file does not exist yet when following starts
        for i in range(6):
            with open(path, "a") as fh:
                fh.write(f"line {i}\n")
            time.sleep(0.05)
        finished.set()

    sftp = t._sftp_client()
    opens = []
    real_open = sftp.open

    def counting_open(*args: Any, **kw: Any) -> Any:
        handle = real_open(*args, **kw)
        opens.append(args[0])
        return handle

    sftp.open = counting_open
    try:
        threading.Thread(target=writer).start()
        got = b"".join(t.follow(str(path), poll_s=0.02, done=finished.is_set))
    finally:
        del sftp.open
    assert got.decode().splitlines() == [f"line {i}" for i in range(6)]
    assert opens == [str(path)]  # opened once, then polled
    assert b"".join(t.follow(str(path), offset=7, poll_s=0.01, done=lambda: True)).startswith(b"line 1\n")


def _hold(tr: Any, path: str, hold_s: float, out: list[tuple[float, float]]) -> None:
    with tr.lock(path, timeout=20):
        entered = time.monotonic()
        time.sleep(hold_s)
        out.append((entered, time.monotonic()))


def test_lock_excludes_other_holders(ssh_server: SSHServer, t: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "locks" / "runs.lock")  # the directory is created
    other = ssh_server.transport()
    spans: list[tuple[float, float]] = []
    try:
        threads = [threading.Thread(target=_hold, args=(tr, path, 0.3, spans)) for tr in (t, other)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        (a_in, a_out), (b_in, b_out) = sorted(spans)
        assert b_in >= a_out  # the second holder entered only after the first left
        with t.lock(path):
            with pytest.raises(TransportError, match="timed out after 0.3 s waiting for the lock"):
                with other.lock(path, timeout=0.3):
                    pass
        # interoperates with the local transport's flock on the same file
        with LocalTransport().lock(path):
            with pytest.raises(TransportError, match="timed out"):
                with other.lock(path, timeout=0.2):
                    pass
        with other.lock(path, timeout=5):
            pass
    finally:
        other.close()


def test_one_connection_serves_everything(ssh_server: SSHServer, tmp_path: Path) -> None:
    before = ssh_server.accepted()
    with ssh_server.transport() as tr:
        assert ssh_server.accepted() == before  # lazy: nothing until the first use
        tr.run(["true"])
        tr.which("sh")
        tr.mkdir(str(tmp_path / "d"))
        tr.write_atomic(str(tmp_path / "d" / "f"), "x")
        tr.read_text(str(tmp_path / "d" / "f"))
        tr.listdir(str(tmp_path / "d"))
        tr.size(str(tmp_path / "d" / "f"))
        tr.read_range(str(tmp_path / "d" / "f"), 0, 1)
        tr.put(tmp_path / "d" / "f", str(tmp_path / "d" / "g"))
        tr.get(str(tmp_path / "d" / "g"), tmp_path / "h")
        with tr.lock(str(tmp_path / "l")):
            tr.run(["true"])
        list(tr.follow(str(tmp_path / "d" / "f"), poll_s=0.01, done=lambda: True))
        assert tr.connections == 1
    assert ssh_server.accepted() == before + 1


def test_connection_lost_mid_command_then_reconnects(ssh_server: SSHServer) -> None:
    with ssh_server.transport() as tr:
        # kill the sshd process serving this connection from inside the command
        kill_sshd = ('p=$$; while [ "$(cat /proc/$p/comm)" != sshd ]; do p=$(cut -d" " -f4 /proc/$p/stat); done; '
                     'kill -9 "$p"; sleep 5')
        with pytest.raises(TransportError, match=r"connection to lingjun-test \(127.0.0.1:\d+\) lost while running: "
                                                 r"sh -c 'p=\$\$; while"):
            tr.run(["sh", "-c", kill_sshd])
        assert TransportError("x").exit_code == 1
        assert tr.run(["echo", "back"]).stdout == "back\n"  # the next use reconnects
        assert tr.connections == 2


# --- review fixes -------------------------------------------------------------------------------
def _kill_sshd_of(tr: Any) -> None:
    """Kill the sshd process serving this transport's connection (from inside a command)."""
    tr.run(["sh", "-c", 'p=$$; while [ "$(cat /proc/$p/comm)" != sshd ]; do p=$(cut -d" " -f4 /proc/$p/stat); done; '
                        'kill -9 "$p"; sleep 5'])


def test_write_atomic_and_put_temp_files_are_private_while_written(t: Any, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The data must never sit in a temp file others can read (the server's default 0666 & umask)."""
    import paramiko

    seen: list[int] = []
    real_write = paramiko.SFTPFile.write

    def write(self: Any, data: bytes) -> None:
        seen.extend(stat.S_IMODE(p.stat().st_mode) for p in tmp_path.glob(".*.tmp.*"))
        real_write(self, data)

    monkeypatch.setattr(paramiko.SFTPFile, "write", write)
    t.write_atomic(str(tmp_path / "secret"), b"s" * 100, 0o600)
    src = tmp_path / "local"
    src.write_bytes(b"k" * 100)
    src.chmod(0o600)
    t.put(src, str(tmp_path / "uploaded"))
    t.write_atomic(str(tmp_path / "public"), b"p", 0o644)
    assert seen and set(seen) == {0o600}, seen
    assert [stat.S_IMODE(os.stat(tmp_path / n).st_mode) for n in ("secret", "uploaded", "public")] == [0o600, 0o600, 0o644]


def test_lock_lost_with_the_connection_is_never_silently_reconnected(ssh_server: SSHServer, tmp_path: Path) -> None:
    path = str(tmp_path / "l")
    with ssh_server.transport() as tr:
        with pytest.raises(TransportError, match=r"lost while holding the lock .*/l there"):
            with tr.lock(path, timeout=5):
                with pytest.raises(TransportError, match="lost while running"):
                    _kill_sshd_of(tr)
                tr.run(["true"])  # would reconnect and go on as if the lock were still held
        assert tr.connections == 1
        assert tr.run(["echo", "back"]).stdout == "back\n"  # outside the block: reconnects
        with tr.lock(path, timeout=5):  # and the lock really was released
            pass
        assert tr.connections == 2


def test_lock_path_starting_with_a_dash_is_the_lock_file(t: Any) -> None:
    name = f"-lingjun-test-lock-{os.getpid()}"
    home = Path(t.home())
    try:
        with t.lock(name, timeout=5):  # relative: under the remote home
            assert (home / name).exists()
        assert not (home / "sh").exists()  # flock took `-...` for options and locked "sh"
    finally:
        (home / name).unlink(missing_ok=True)


def test_sftp_protocol_errors_and_timeouts_are_transport_errors(ssh_server: SSHServer, t: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import paramiko

    def bad(*a: Any, **kw: Any) -> None:
        raise paramiko.SFTPError("Expected handle")

    monkeypatch.setattr(t._sftp_client(), "_request", bad)
    with pytest.raises(TransportError, match="SFTP protocol error"):
        t.read_bytes("/etc/hostname")
    assert t.read_bytes("/etc/hostname")  # a fresh SFTP session

    def slow(*a: Any, **kw: Any) -> None:
        raise TimeoutError(110, "Connection timed out")

    with ssh_server.transport(command_timeout=None) as tr:
        monkeypatch.setattr(tr._sftp_client(), "_request", slow)
        with pytest.raises(TransportError, match="timed out"):
            tr.read_bytes("/etc/hostname")

    def closed(self: Any, command: str) -> None:
        raise paramiko.SSHException("Channel closed.")

    monkeypatch.setattr(paramiko.Channel, "exec_command", closed)
    with pytest.raises(TransportError, match="request to lock"):
        with t.lock(str(Path(t.home()) / f".lingjun-test-lock-{os.getpid()}"), timeout=1):
            pass
    with pytest.raises(TransportError, match="request to run true"):
        t.run(["true"])


def test_sftp_start_is_bounded_on_a_server_that_never_answers(ssh_server: SSHServer, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A server whose sftp never answers the version exchange (a home on a hung NFS server):
    paramiko's from_transport would wait for ever."""
    import socket as _socket
    import subprocess

    from lingjun_slurm.transport.ssh import SSHTransport
    from tests.ssh.fixtures import SSHD, free_ports

    (port,) = free_ports(1, 17400)
    cfg = ssh_server._server_config("sshd-hung-sftp", port, ssh_server.host_key, "ERROR")
    cfg.write_text(cfg.read_text().replace("Subsystem sftp internal-sftp", "Subsystem sftp /bin/sleep 600"))
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 10
        while time.monotonic() < end:
            with _socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.02)
        kh = tmp_path / "kh"
        kh.write_text(ssh_server.known_hosts_line(port, ssh_server.host_key))
        monkeypatch.setattr(SSHTransport, "_answer_limit", lambda self: 1.0)
        client_cfg = tmp_path / "cfg"
        client_cfg.write_text(f"Host hung\n  HostName 127.0.0.1\n  Port {port}\n  User root\n"
                              f"  IdentityFile {ssh_server.client_key}\n  GlobalKnownHostsFile /dev/null\n")
        with ssh_server.transport("hung", ssh_config=client_cfg, known_hosts=kh) as tr:
            assert tr.run(["echo", "ok"]).stdout == "ok\n"
            started = time.monotonic()
            with pytest.raises(TransportError, match="cannot start SFTP .* no answer within 1 s"):
                tr.read_bytes("/etc/hostname")
            assert time.monotonic() - started < 5
    finally:
        proc.terminate()
        proc.wait(5)


def test_relative_cwd_is_under_the_home_never_found_through_cdpath(tmp_path: Path) -> None:
    import subprocess

    from lingjun_slurm.transport.ssh import SSHTransport

    (tmp_path / "home" / "runs").mkdir(parents=True)
    (tmp_path / "elsewhere" / "runs" / "x").mkdir(parents=True)
    line = SSHTransport.command_line(("pwd",), cwd="runs/x")
    r = subprocess.run(["sh", "-c", line], cwd=tmp_path / "home", capture_output=True, text=True,
                       env={**os.environ, "CDPATH": str(tmp_path / "elsewhere")})
    assert r.returncode == 126 and r.stdout == ""  # not elsewhere/runs/x (which cd would also print)


def test_run_timeout_is_124_when_the_program_ignores_sigterm(t: Any) -> None:
    started = time.monotonic()
    r = t.run(["sh", "-c", "trap '' TERM; echo partial; sleep 30"], timeout=0.5)
    assert r.returncode == 124 and "timed out after 0.5 s" in r.stderr and r.stdout == "partial\n"
    assert time.monotonic() - started < 10  # SIGKILL REMOTE_KILL_GRACE_S after the SIGTERM
    killed = t.run(["sh", "-c", "kill -9 $$"], timeout=30)  # a real signal death, well within the timeout
    assert killed.returncode == 255 and "timed out" not in killed.stderr


def test_exists_and_size_raise_on_timeouts_instead_of_saying_missing(ssh_server: SSHServer, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import socket as _socket

    (tmp_path / "f").write_text("x")
    with ssh_server.transport() as tr:
        assert tr.exists(str(tmp_path / "f")) and tr.size(str(tmp_path / "f")) == 1

        def no_answer(*a: Any, **kw: Any) -> None:
            raise _socket.timeout("timed out")

        monkeypatch.setattr(tr._sftp_client(), "_request", no_answer)
        with pytest.raises(TransportError, match="no answer within"):
            tr.exists(str(tmp_path / "f"))
        monkeypatch.setattr(tr._sftp_client(), "_request", no_answer)
        with pytest.raises(TransportError, match="no answer within"):
            tr.size(str(tmp_path / "f"))
        monkeypatch.setattr(tr._sftp_client(), "_request", no_answer)
        with pytest.raises(TransportError, match="no answer within"):
            tr.listdir(str(tmp_path))
        assert tr.exists(str(tmp_path / "f")) and not tr.exists(str(tmp_path / "missing"))
        assert tr.size(str(tmp_path / "missing")) is None and tr.listdir(str(tmp_path)) == ["f"]
