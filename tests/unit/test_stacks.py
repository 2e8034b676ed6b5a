"""Stack dumps on SIGUSR2 (lingjun_slurm.injob.stacks) and pyrun, which runs a script as python3 does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lingjun_slurm.injob import stacks
from tests.conftest import REPO


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("LINGJUN_STACKS_DIR", "RANK", "SLURM_PROCID")}
    return {**base, "PYTHONPATH": str(REPO), **extra}


def wait_for(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.exists(), f"{path} never appeared"


def wait_grown(path: Path, size: int, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.stat().st_size > size:
            time.sleep(0.2)  # let the dump finish
            return path.read_text()
        time.sleep(0.02)
    pytest.fail(f"{path} did not grow")


SLEEPER = """
import os, signal, sys, threading, time
{pre}
from lingjun_slurm.injob import stacks
print(stacks.install(), flush=True)
def a_named_function_that_sleeps():
    open(sys.argv[1], "w").close()
    time.sleep(60)
threading.Thread(target=lambda: time.sleep(60), name="helper", daemon=True).start()
a_named_function_that_sleeps()
"""


def test_sigusr2_dumps_every_thread_and_the_task_keeps_running(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(SLEEPER.format(pre=""))
    d = tmp_path / "stacks"
    p = subprocess.Popen([sys.executable, str(script), str(tmp_path / "ready")], stdout=subprocess.PIPE, text=True,
                         env=env(LINGJUN_STACKS_DIR=str(d), RANK="5", SLURMD_NODENAME="gpu-07"))
    try:
        wait_for(tmp_path / "ready")
        path = d / f"gpu-07-rank5-pid{p.pid}.txt"
        header = path.read_text()
        assert header.startswith(f"# lingjun-slurm stacks: node gpu-07 rank 5 pid {p.pid} since ")
        p.send_signal(signal.SIGUSR2)
        text = wait_grown(path, len(header))
        assert "in a_named_function_that_sleeps" in text and text.count("hread 0x") >= 2  # "Current thread 0x..." and "Thread 0x..."
        assert p.poll() is None  # faulthandler's handler, not SIGUSR2's default action (terminate)
        p.send_signal(signal.SIGUSR2)  # a second dump appends
        assert wait_grown(path, len(text)).count("in a_named_function_that_sleeps") == 2
    finally:
        p.kill()
        p.wait()
    assert p.stdout is not None and p.stdout.read().strip() == str(path)


def test_an_earlier_python_handler_is_chained(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    marker = tmp_path / "handler-ran"
    script.write_text(SLEEPER.format(
        pre=f"signal.signal(signal.SIGUSR2, lambda *a: open({str(marker)!r}, 'w').close())"))
    d = tmp_path / "stacks"
    p = subprocess.Popen([sys.executable, str(script), str(tmp_path / "ready")], stdout=subprocess.DEVNULL,
                         env=env(LINGJUN_STACKS_DIR=str(d)))
    try:
        wait_for(tmp_path / "ready")
        (path,) = d.iterdir()
        assert path.name.endswith(f"-rankx-pid{p.pid}.txt")
        p.send_signal(signal.SIGUSR2)
        assert "a_named_function_that_sleeps" in wait_grown(path, path.stat().st_size)
        wait_for(marker)
    finally:
        p.kill()
        p.wait()


def test_no_directory_no_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LINGJUN_STACKS_DIR", raising=False)
    before = signal.getsignal(signal.SIGUSR2)
    assert stacks.install() is None and signal.getsignal(signal.SIGUSR2) == before


def test_an_unwritable_directory_is_one_warning(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert stacks.install(str(blocker / "stacks")) is None
    assert "lingjun-slurm: stacks: cannot record stack traces in" in capsys.readouterr().err


def test_file_names_parse_back() -> None:
    from lingjun_slurm.injob.host.watchdog import parse_stacks_name

    assert stacks.file_name("node/1 a", "12", 99) == "node_1_a-rank12-pid99.txt"
    assert parse_stacks_name("/x/" + stacks.file_name("gpu-a-01", "12", 99)) == {"node": "gpu-a-01", "rank": 12,
                                                                                  "pid": 99}


# --- pyrun ----------------------------------------------------------------------------------------

PROBE = """
import json, sys
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "file": __file__, "name": __name__,
                  "spec": repr(__spec__), "package": __package__, "cached": __cached__,
                  "main_is_me": sys.modules["__main__"].__dict__ is globals(),
                  "keys": sorted(k for k in globals() if k.startswith("__"))}))
import helper_next_to_the_script
code = int(sys.argv[1]) if len(sys.argv) > 1 else 0
if code:
    sys.exit(code)
"""


def run_both(tmp_path: Path, script: str, *args: str) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    plain = subprocess.run([sys.executable, script, *args], cwd=tmp_path, env=env(), capture_output=True, text=True,
                           timeout=60)
    wrapped = subprocess.run([sys.executable, "-m", "lingjun_slurm.injob.pyrun", script, *args], cwd=tmp_path, env=env(),
                             capture_output=True, text=True, timeout=60)
    return plain, wrapped


@pytest.mark.parametrize("via", ["real/probe.py", "link/probe.py", "./real/../real/probe.py"])
def test_pyrun_sets_up_the_script_as_python3_does(tmp_path: Path, via: str) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").mkdir()
    (tmp_path / "real" / "probe.py").write_text(PROBE)
    (tmp_path / "real" / "helper_next_to_the_script.py").write_text("")  # importable only from sys.path[0]
    (tmp_path / "link" / "probe.py").symlink_to(tmp_path / "real" / "probe.py")
    plain, wrapped = run_both(tmp_path, via, "0", "--flag")
    assert plain.returncode == 0, plain.stderr
    assert (wrapped.returncode, wrapped.stdout, wrapped.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    plain, wrapped = run_both(tmp_path, via, "7")
    assert plain.returncode == wrapped.returncode == 7


def test_pyrun_exit_codes_and_tracebacks(tmp_path: Path) -> None:
    (tmp_path / "boom.py").write_text("def f():\n    raise ValueError('boom')\nf()\n")
    plain, wrapped = run_both(tmp_path, "boom.py")
    assert plain.returncode == wrapped.returncode == 1
    assert wrapped.stderr == plain.stderr and "lingjun_slurm" not in wrapped.stderr
    (tmp_path / "msg.py").write_text("import sys\nsys.exit('a message')\n")
    plain, wrapped = run_both(tmp_path, "msg.py")
    assert (wrapped.returncode, wrapped.stderr) == (plain.returncode, plain.stderr) == (1, "a message\n")
    plain, wrapped = run_both(tmp_path, "missing.py")
    assert (wrapped.returncode, wrapped.stderr) == (plain.returncode, plain.stderr)
    assert plain.returncode == 2


def test_pyrun_installs_the_dump_before_the_script(tmp_path: Path) -> None:
    (tmp_path / "hung.py").write_text(
        "import sys, time\ndef pretrain_stuck_in_allreduce():\n"
        "    open(sys.argv[1], 'w').close()\n    time.sleep(60)\npretrain_stuck_in_allreduce()\n")
    d = tmp_path / "stacks"
    p = subprocess.Popen([sys.executable, "-m", "lingjun_slurm.injob.pyrun", "hung.py", str(tmp_path / "ready")],
                         cwd=tmp_path, env=env(LINGJUN_STACKS_DIR=str(d), SLURM_PROCID="3"))
    try:
        wait_for(tmp_path / "ready")
        (path,) = d.iterdir()
        assert path.name.endswith(f"-rank3-pid{p.pid}.txt")
        p.send_signal(signal.SIGUSR2)
        text = wait_grown(path, path.stat().st_size)
        assert "in pretrain_stuck_in_allreduce" in text and "hung.py" in text
    finally:
        p.kill()
        p.wait()
