"""Ctrl-C ends every long-running command with exit 130 (128 + SIGINT, what a shell reports for a
process SIGINT ended: bash(1), EXIT STATUS), one line on stderr, never a traceback (issue 15, item 8).

The CLI runs in a subprocess, as a user starts it, and gets a real SIGINT once it is under way:
status --watch and logs --follow of a local run (on a pipe and on a pseudo-terminal, where rich
draws), and a foreground submit --executor local. The child's SIGINT disposition is reset to the
default first: a shell without job control starts background jobs with SIGINT ignored, and
Python then never installs its own handler.
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

import click
import pytest

from lingjun_slurm.cli import main as cli_module
from lingjun_slurm.common.interrupts import EXIT_INTERRUPTED, Interrupted
from tests.integration.helpers import PY, chain_spec, cli, status, submitted_run_id

PATH = f"{os.path.dirname(PY)}{os.pathsep}{os.environ.get('PATH', '')}"
ONE_LINE = "lingjun-slurm: interrupted (Ctrl-C)"


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"LINGJUN_STATE_DIR": str(tmp_path / "state"), "LINGJUN_LOCAL_KILL_GRACE_S": "3"}


def wait_until(pred, timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or pred}")
        time.sleep(0.05)


@pytest.fixture
def live_run(tmp_path: Path, env: dict[str, str]):
    """A detached local run whose first stage prints a line and then sleeps; cancelled afterwards."""
    marker = tmp_path / "started"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "slow", "command": f"echo started-slow; touch {marker}; exec sleep 120"},
        {"name": "after", "command": "true"},
    ])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", "--detach", env=env).stdout)
    wait_until(marker.exists, 60, "the slow stage to start")
    yield run_id
    cli("cancel", run_id, env=env, check=None)


def start(args: list[str], env: dict[str, str], stdout: Optional[int] = subprocess.PIPE) -> subprocess.Popen[bytes]:
    return subprocess.Popen([PY, "-m", "lingjun_slurm.cli", *args], stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=subprocess.PIPE, env={**os.environ, "PATH": PATH, **env},
                            preexec_fn=default_sigint)


def interrupt(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(timeout=60)
    err = proc.stderr.read().decode() if proc.stderr else ""
    return rc, err


def assert_one_line(err: str, line: str = ONE_LINE) -> None:
    assert "Traceback" not in err, err
    assert err.strip().splitlines() == [line], err


def test_status_watch_exits_130(live_run: str, env: dict[str, str]) -> None:
    proc = start(["status", live_run, "--watch", "--interval", "1"], env)
    assert proc.stdout is not None
    first = proc.stdout.readline().decode()  # the first table is out: the watch is under way
    assert first.startswith(f"run {live_run}")
    rc, err = interrupt(proc)
    assert rc == 130
    assert_one_line(err)


def test_logs_follow_exits_130(live_run: str, env: dict[str, str]) -> None:
    proc = start(["logs", live_run, "slow", "--follow"], env)
    assert proc.stdout is not None
    seen = b""
    while b"started-slow\n" not in seen:
        line = proc.stdout.readline()
        assert line, "the log ended before its first line"
        seen += line
    rc, err = interrupt(proc)
    assert rc == 130
    assert_one_line(err)


@pytest.mark.parametrize("args", [["status", "{run}", "--watch", "--interval", "1"], ["logs", "{run}", "slow", "-f"]])
def test_on_a_terminal_too(live_run: str, env: dict[str, str], args: list[str]) -> None:
    """Where rich draws a Live display: Ctrl-C ends it and the command exits 130 all the same."""
    master, slave = pty.openpty()
    proc = start([a.format(run=live_run) for a in args], {**env, "TERM": "xterm-256color", "COLUMNS": "100"},
                 stdout=slave)
    os.close(slave)
    out = b""
    want = b"started-slow" if args[0] == "logs" else b"lingjun-slurm status --watch"
    deadline = time.monotonic() + 60
    while want not in out and time.monotonic() < deadline:
        out += os.read(master, 65536)
    assert want in out, out
    time.sleep(0.3)
    rc, err = interrupt(proc)
    os.close(master)
    assert rc == 130
    assert_one_line(err)


def test_foreground_local_submit_exits_130_and_cancels(tmp_path: Path, env: dict[str, str]) -> None:
    marker = tmp_path / "started"
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [
        {"name": "slow", "command": f"touch {marker}; exec sleep 120"},
        {"name": "after", "command": "true"},
    ])
    proc = start(["submit", str(spec), "--executor", "local"], env)
    wait_until(marker.exists, 60, "the slow stage to start")
    proc.send_signal(signal.SIGINT)
    out, err_b = proc.communicate(timeout=60)
    err = err_b.decode()
    assert proc.returncode == 130, (out, err)
    run_id = submitted_run_id(out.decode())
    assert "SIGINT: cancelling run" in out.decode()
    assert_one_line(err, f"run {run_id} cancelled (Ctrl-C); `lingjun-slurm resubmit {run_id} --from STAGE` "
                         "continues it")
    stages = status(run_id, env)
    assert stages["slow"]["state"] == "CANCELLED" and stages["after"]["state"] == "CANCELLED"


# ------------------------------------------------------------------ how the CLI ends, in-process


@click.command()
@click.option("--how", type=click.Choice(["ctrl-c", "sigterm", "interrupted", "abort"]))
def raiser(how: str) -> None:
    if how == "ctrl-c":
        raise KeyboardInterrupt  # what Python raises on SIGINT
    if how == "sigterm":
        raise KeyboardInterrupt("SIGTERM")  # what interrupts.signals_interrupt raises
    if how == "interrupted":
        raise Interrupted("run r cancelled (Ctrl-C)")
    raise click.Abort()  # a prompt answered "no": not an interrupt


@pytest.mark.parametrize("how, code, line", [
    ("ctrl-c", 130, ONE_LINE),
    ("sigterm", 1, "lingjun-slurm: interrupted (SIGTERM)"),
    ("interrupted", 130, "run r cancelled (Ctrl-C)"),
    ("abort", 1, "aborted"),
])
def test_exit_codes(capsys: pytest.CaptureFixture[str], how: str, code: int, line: str) -> None:
    with pytest.raises(SystemExit) as ended:
        cli_module._run(raiser, ["--how", how])
    assert ended.value.code == code
    assert capsys.readouterr().err.strip().splitlines() == [line]
    assert EXIT_INTERRUPTED == 130
