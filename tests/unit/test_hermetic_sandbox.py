"""Issue 26 item 11: the real-path guard (tests/hermetic.py) raises no false alarms and still
catches a test that writes a user's real paths. Each case runs pytest in a subprocess on a tiny
test file, with tests/conftest.py as its plugin and a HOME of its own (a temporary directory that
plays the user's real home): the inner session's guard protects <that home>/.local/state/lingjun-slurm."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

INNER = '''
import os
import subprocess
import sys
import time
from pathlib import Path

REAL = Path(os.environ["E26_REAL_STATE"])  # the "user's" run index, as the guard saw it at the start


def test_another_terminal_writes_meanwhile():
    deadline = time.monotonic() + 10
    while not (REAL / "other-terminal.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the other terminal keeps writing during the test
    assert (REAL / "other-terminal.txt").exists()


def test_writes_the_real_run_index():
    (REAL / "runs.json").write_text("[]")


def test_a_child_python_writes_the_real_run_index():
    subprocess.run([sys.executable, "-c", f"open({str(REAL / 'runs.json')!r}, 'w').write('[]')"])


def test_the_session_has_its_own_home_and_tmpdir():
    import tempfile

    assert not str(Path.home()).startswith(str(REAL.parents[2]))
    assert Path(tempfile.gettempdir()).parent == Path.home().parent
    assert Path(tempfile.gettempdir()).parent.name.startswith("ljt-")  # a fresh one, not the user's TMPDIR
    assert os.environ["PYTEST_DEBUG_TEMPROOT"] == os.environ["E26_USER_TMP"]  # tmp_path where pytest keeps it
    assert not any(k.startswith("XDG_") for k in os.environ)
'''


def _inner(tmp_path: Path, *select: str) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "userhome"
    real = home / ".local" / "state" / "lingjun-slurm"
    real.mkdir(parents=True, exist_ok=True)
    (tmp_path / "usertmp").mkdir(exist_ok=True)
    test = tmp_path / "inner" / "test_inner.py"
    test.parent.mkdir(exist_ok=True)
    test.write_text(textwrap.dedent(INNER))
    # A user's environment: no sandbox or guard of the outer session, no state dir of its own.
    outer = ("PYTHONPATH", "TMPDIR", "HOME", "PYTEST_DEBUG_TEMPROOT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LINGJUN_", "XDG_")) and k not in outer}
    env.update(HOME=str(home), TMPDIR=str(tmp_path / "usertmp"), PYTHONPATH=str(REPO), E26_REAL_STATE=str(real),
               E26_USER_TMP=str(tmp_path / "usertmp"))
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
            "--rootdir", str(test.parent), "-W", "default", str(test)]
    for name in select:
        args[-1:-1] = ["-k", name]
    return subprocess.run(args, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=120)


def test_another_process_writing_the_real_state_dir_does_not_fail_the_test(tmp_path: Path) -> None:
    """(a) The user's other terminal (a process outside the test session) writes the real run
    index while a test runs: the test passes (at most a warning)."""
    real = tmp_path / "userhome" / ".local" / "state" / "lingjun-slurm"
    real.mkdir(parents=True)
    code = ("import sys, time, pathlib; p = pathlib.Path(sys.argv[1]); end = time.time() + 15\n"
            "while time.time() < end:\n    p.write_text(str(time.time())); time.sleep(0.05)")
    writer = subprocess.Popen([sys.executable, "-c", code, str(real / "other-terminal.txt")],
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    try:
        time.sleep(0.3)
        proc = _inner(tmp_path, "another_terminal")
    finally:
        writer.kill()
        writer.wait()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout, proc.stdout[-4000:]


def test_a_test_that_writes_the_real_state_dir_is_still_caught(tmp_path: Path) -> None:
    """(b) A test that writes the real run index, itself or through a Python child: refused, and
    the test fails naming the path."""
    proc = _inner(tmp_path, "real_run_index")
    out = proc.stdout + proc.stderr
    runs = tmp_path / "userhome" / ".local" / "state" / "lingjun-slurm" / "runs.json"
    assert proc.returncode == 1, out[-4000:]
    assert "wrote real paths outside its temporary directories" in out, out[-4000:]
    # two writers refused: the test itself and its Python child (pytest may repeat the lines in its
    # short summary, in full when CI is set: distinct pids, not lines, are the count)
    assert len(set(re.findall(re.escape(f"{runs} (open, pid ") + r"(\d+)\)", out))) == 2, out[-4000:]
    assert "2 failed" in out or "2 error" in out, out[-4000:]
    assert not runs.exists()  # refused, not only reported


def test_the_session_runs_in_a_sandbox(tmp_path: Path) -> None:
    proc = _inner(tmp_path, "own_home")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
