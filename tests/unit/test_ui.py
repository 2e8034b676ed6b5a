"""Terminal output (issue 15, item 8): rich only on a terminal without NO_COLOR, the plain text
byte for byte elsewhere, --json never touched.

The rendering is checked on rich's recording Console (force_terminal=True, width=100,
record=True); the CLI end to end on a real pseudo-terminal (pty) against a pipe.
"""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from lingjun_slurm.cli import ui
from lingjun_slurm.status import RunStatus, StageStatus, format_table
from tests.integration.helpers import PY, chain_spec, cli, submitted_run_id

PATH = f"{os.path.dirname(PY)}{os.pathsep}{os.environ.get('PATH', '')}"


def recording():
    from rich.console import Console

    return Console(force_terminal=True, width=100, record=True, color_system="standard")


def sample() -> list[RunStatus]:
    return [RunStatus("chain-20261202-010203-abcd", "chain", "local", "this machine", [
        StageStatus("prep", ["11"], "COMPLETED", None, 0, 3, "n1", 0),
        StageStatus("train", ["12"], "FAILED", "NonZeroExitCode", 2, 65, "n1", 1),
        StageStatus("eval", ["13"], "RUNNING", None, None, 7, "n1", 0),
        StageStatus("upload", ["14"], "PENDING", "Dependency", None, None, None, 0),
        StageStatus("notify", ["15"], "CANCELLED", "DependencyNeverSatisfied (train FAILED)", None, None, None, 0),
    ], "/w/runs/x")]


class Tty(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        if self.closed:
            raise ValueError("I/O operation on closed file")  # as a closed sys.stdout does
        return self.tty


# ------------------------------------------------------------------ when rich draws


def test_rich_only_on_a_terminal_without_no_color_and_not_dumb() -> None:
    tty, pipe = Tty(True), Tty(False)
    assert ui.use_rich(tty, {"TERM": "xterm-256color"}) is True
    assert ui.use_rich(tty, {}) is True
    assert ui.use_rich(pipe, {"TERM": "xterm"}) is False
    # no-color.org: "present and not an empty string" disables colour, whatever the value.
    assert ui.use_rich(tty, {"TERM": "xterm", "NO_COLOR": "1"}) is False
    assert ui.use_rich(tty, {"TERM": "xterm", "NO_COLOR": "0"}) is False
    assert ui.use_rich(tty, {"TERM": "xterm", "NO_COLOR": ""}) is True
    assert ui.use_rich(tty, {"TERM": "dumb"}) is False
    assert ui.use_rich(tty, {"TERM": "unknown"}) is False
    closed = Tty(True)
    closed.close()
    assert ui.use_rich(closed, {}) is False


def test_plain_commands_never_import_rich(tmp_path: Path) -> None:
    code = ("import sys; from lingjun_slurm.cli import ui; import lingjun_slurm.cli.main; "
            "assert 'rich' not in sys.modules, 'rich imported'; print('ok')")
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr


# ------------------------------------------------------------------ the table


def test_table_has_a_header_and_colours_by_state() -> None:
    con = recording()
    ui.print_status(sample(), con)
    plain = con.export_text(clear=False)
    coloured = con.export_text(styles=True)
    lines = plain.splitlines()
    assert lines[0] == "run chain-20261202-010203-abcd  (local on this machine)"
    header = lines[1].split()
    assert header == ["STAGE", "JOB", "STATE", "ELAPSED", "EXIT", "RESTARTS", "NODES", "REASON"]
    assert "\x1b[1mSTAGE" in coloured  # the header row is bold
    assert "\x1b[32mCOMPLETED" in coloured            # green
    assert "\x1b[1;31mFAILED" in coloured             # bold red
    assert "\x1b[1;36mRUNNING" in coloured            # bold cyan
    assert "\x1b[33mPENDING" in coloured              # yellow
    assert "\x1b[35mCANCELLED" in coloured            # magenta
    assert "\x1b[31m   2\x1b[0m" in coloured          # the non-zero exit code in red
    assert "\x1b[31m   0" not in coloured
    train = next(line for line in lines if line.lstrip().startswith("train"))
    assert train.split()[:7] == ["train", "12", "FAILED", "00:01:05", "2", "1", "n1"]
    assert "DependencyNeverSatisfied (train FAILED)" in plain
    assert all(len(line) <= 100 for line in lines)


def test_stale_and_slurm_down_runs_say_so_in_their_header() -> None:
    stale, down = sample()[0], sample()[0]
    stale.stale_as_of = 0.0
    down.run_id = "other"
    down.slurm_error = "Unable to contact slurm controller (connect failure)"
    con = recording()
    ui.print_status([stale, down], con)
    text = " ".join(con.export_text().split())  # the header wraps at the console's width
    assert "STALE: this machine is unreachable; last status seen here at never" in text
    assert "UNKNOWN: Slurm did not answer: Unable to contact slurm controller (connect failure)" in text
    con = recording()
    ui.print_status([], con)
    assert con.export_text() == "no runs\n"


def test_watch_header_says_what_how_often_and_when() -> None:
    con = recording()
    con.print(ui.watch_header(5.0, ["slurmctld: no answer; watching on"], now=0.0))
    text = con.export_text()
    assert text.startswith("lingjun-slurm status --watch  every 5s, last refresh ")
    assert "Ctrl-C stops watching" in text and "slurmctld: no answer; watching on" in text


def test_status_watch_draws_frames_in_place() -> None:
    con = recording()
    with ui.StatusWatch(2.0, con) as view:
        view.update(sample())
        runs = sample()
        runs[0].stages[2].state = "COMPLETED"
        view.update(runs)
    text = con.export_text()
    assert text.count("lingjun-slurm status --watch") >= 2  # redrawn, not appended to a log
    assert "every 2s" in text


# ------------------------------------------------------------------ progress lines


def test_runner_lines_keep_their_text_with_the_state_coloured() -> None:
    con = recording()
    line = "12:00:01 train          RUNNING    job 3 (pid 77) -> /w/logs/train-3.out"
    con.print(ui.styled_line(line))
    con.print(ui.styled_line("12:00:09 train          FAILED     job 3 (exit 1)"))
    con.print(ui.styled_line("12:00:10 SIGINT: cancelling run r"))
    assert con.export_text(clear=False).splitlines() == [line, "12:00:09 train          FAILED     job 3 (exit 1)",
                                              "12:00:10 SIGINT: cancelling run r"]
    coloured = con.export_text(styles=True)
    assert "\x1b[1;36mRUNNING\x1b[0m" in coloured and "\x1b[1;31mFAILED\x1b[0m" in coloured


def test_local_progress_summary_counts_stages_not_tasks() -> None:
    tasks = [("prep", "COMPLETED"), ("prep", "RUNNING"), ("merge", "PENDING"), ("a", "COMPLETED"), ("b", "FAILED")]
    summary = ui.LocalProgress("r1", lambda: tasks).summary()
    assert summary.startswith("run r1: 2/4 stages ended; running prep; failed b; 00:00:0")
    assert summary.endswith("(Ctrl-C cancels)")


def test_follow_view_prints_whole_lines_with_the_logs_own_colours() -> None:
    con = recording()
    view = ui.FollowView("/w/logs/train-3.out", "train", con)
    view.write(b"iteration 1 loss 6.5\nitera")
    assert con.export_text(clear=False) == "iteration 1 loss 6.5\n"  # "itera" waits for its newline
    view.write(b"tion 2 \x1b[31mloss\x1b[0m 6.1\n")
    view.write("caf\u00e9".encode()[:4])  # a UTF-8 character split across reads
    view.write("caf\u00e9".encode()[4:] + b"\n" + b"x" * 150 + b"\nno newline at the end")
    view.flush()
    assert view.read == 26 + 25 + 6 + 151 + 21
    assert con.export_text(clear=False) == ("iteration 1 loss 6.5\niteration 2 loss 6.1\ncaf\u00e9\n" + "x" * 150
                                            + "\nno newline at the end\n")  # the long line not cut by rich
    assert "\x1b[31mloss\x1b[0m" in con.export_text(styles=True)


def test_follow_view_live_line_says_file_stage_and_bytes() -> None:
    con = recording()
    view = ui.FollowView("/w/logs/train-3.out", "train", con)
    with view:
        view.state = "RUNNING"
        view.write(b"a\n")
    text = con.export_text()
    assert "following /w/logs/train-3.out: stage train RUNNING, 2 B read (Ctrl-C stops)" in text
    assert "a\n" in text


# ------------------------------------------------------------------ the CLI on a terminal and on a pipe


def on_pty(args: list[str], env: dict[str, str], timeout: float = 120) -> tuple[int, str, str]:
    """Run the CLI with stdout on a new pseudo-terminal; (exit code, stdout with \\r\\n as \\n, stderr)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([PY, "-m", "lingjun_slurm.cli", *args], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=subprocess.PIPE, env={**os.environ, "PATH": PATH, "COLUMNS": "100", **env})
    os.close(slave)
    out = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        out += data
    os.close(master)
    err = proc.stderr.read().decode() if proc.stderr else ""
    rc = proc.wait(timeout=timeout)
    return rc, out.decode().replace("\r\n", "\n"), err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("ui")
    env = {"LINGJUN_STATE_DIR": str(tmp / "state"), "LINGJUN_LOCAL_KILL_GRACE_S": "3"}
    spec = chain_spec(tmp / "s.yaml", tmp / "work", [{"name": "ok", "command": "echo fine"},
                                                     {"name": "bad", "command": "exit 3"},
                                                     {"name": "after", "command": "true"}])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", env=env, check=1).stdout)
    return run_id, env


def test_status_on_a_pipe_is_the_plain_table_byte_for_byte(finished_run: tuple[str, dict[str, str]]) -> None:
    run_id, env = finished_run
    piped = cli("status", run_id, env={**env, "TERM": "xterm-256color"}, check=0).stdout
    doc = json.loads(cli("status", run_id, "--json", env=env).stdout)
    runs = [RunStatus.from_json(r) for r in doc["runs"]]
    assert piped == format_table(runs)
    assert "\x1b[" not in piped


def test_status_on_a_terminal_is_coloured_and_no_color_gives_the_plain_text(
        finished_run: tuple[str, dict[str, str]]) -> None:
    run_id, env = finished_run
    piped = cli("status", run_id, env=env).stdout
    rc, out, err = on_pty(["status", run_id], {**env, "TERM": "xterm-256color"})
    assert rc == 0, err
    assert "\x1b[" in out and "FAILED" in out and "STAGE" in out
    assert "\x1b[1;31mFAILED" in out and "\x1b[32mCOMPLETED" in out
    for extra in ({"NO_COLOR": "1"}, {"TERM": "dumb"}):
        rc, out, err = on_pty(["status", run_id], {**env, "TERM": "xterm-256color", **extra})
        assert rc == 0, err
        assert out == piped, extra


def test_json_is_the_same_on_a_terminal(finished_run: tuple[str, dict[str, str]]) -> None:
    run_id, env = finished_run
    piped = cli("status", run_id, "--json", env=env).stdout
    rc, out, err = on_pty(["status", run_id, "--json"], {**env, "TERM": "xterm-256color"})
    assert rc == 0, err
    assert json.loads(out) == json.loads(piped) and "\x1b[" not in out


def test_watch_of_an_ended_run_on_a_terminal_draws_once_and_exits(finished_run: tuple[str, dict[str, str]]) -> None:
    run_id, env = finished_run
    rc, out, err = on_pty(["status", run_id, "--watch", "--interval", "1"], {**env, "TERM": "xterm-256color"})
    assert rc == 0, err
    assert "lingjun-slurm status --watch" in out and "\x1b[1;31mFAILED" in out


def test_local_submit_on_a_terminal_colours_the_state_changes(tmp_path: Path) -> None:
    env = {"LINGJUN_STATE_DIR": str(tmp_path / "state"), "TERM": "xterm-256color"}
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "one", "command": "echo one"},
                                                               {"name": "two", "command": "exit 4"}])
    rc, out, err = on_pty(["submit", str(spec), "--executor", "local"], env)
    assert rc == 1, (out, err)
    assert "\x1b[1;36mRUNNING\x1b[0m" in out and "\x1b[1;31mFAILED\x1b[0m" in out
    assert "did not complete" in err and "Traceback" not in err
    # The same chain on a pipe: the runner's lines as they were, no escape sequence.
    env.pop("TERM")
    piped = cli("submit", str(spec), "--executor", "local", "--run-id", "piped", env=env, check=1)
    assert "\x1b[" not in piped.stdout
    assert any(line.split()[1:3] == ["two", "FAILED"] for line in piped.stdout.splitlines() if line[:1].isdigit())


def test_logs_follow_on_a_terminal_prints_the_log(finished_run: tuple[str, dict[str, str]]) -> None:
    run_id, env = finished_run
    rc, out, err = on_pty(["logs", run_id, "ok", "--follow"], {**env, "TERM": "xterm-256color"})
    assert rc == 0, err
    assert "fine\n" in out
    piped = cli("logs", run_id, "ok", "--follow", env=env).stdout
    assert piped.endswith("\nfine\n") and "\x1b[" not in piped
    for line in piped.splitlines():  # every line whole (rich wraps none of them)
        assert f"{line}\n" in out


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("pty and /proc: Linux")


def test_a_terminal_that_went_away_is_an_oserror_for_the_runner_never_a_traceback(capsys) -> None:
    """SIGHUP: writes to the dead terminal fail with EIO. The live line's refresh thread must not die
    with a traceback on stderr; the runner's echo sees an OSError once and silences itself."""
    from rich.console import Console

    class Dead(io.StringIO):
        def isatty(self) -> bool:
            return True

        def write(self, text: str) -> int:
            raise OSError(5, "Input/output error")

    out = Console(file=ui.Guarded(Dead()), force_terminal=True, width=100)
    progress = ui.LocalProgress("r1", lambda: [("a", "RUNNING")], out)
    with progress:
        with pytest.raises(OSError):
            progress.line("12:00:01 a              RUNNING    job 1 (pid 9) -> /w/a.out")
        import time as _time
        _time.sleep(0.6)  # a few refreshes of the live line
    follow = ui.FollowView("/w/a.out", "a", out)
    with pytest.raises(BrokenPipeError):
        follow.write(b"line\n")
    assert "Traceback" not in capsys.readouterr().err
