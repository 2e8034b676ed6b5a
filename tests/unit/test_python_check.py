"""submit's check of the python3 the host-side built-in stages will run (issue 15, item 7).

Real interpreters only: the system /usr/bin/python3 (no lingjun_slurm, no torch) and this venv's
(lingjun_slurm installed, the megatron stack present), each reached through a PATH directory
holding a `python3` link, the way a job's PATH finds it (lingjun_slurm/python_check.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lingjun_slurm import __version__, python_check
from lingjun_slurm.runs.index import RunIndex
from lingjun_slurm.spec.load import parse_spec
from lingjun_slurm.submit import Prepared, prepare, prepare_local, ship_code
from lingjun_slurm.transport import LocalTransport
from tests.conftest import REPO

SYSTEM_PY = Path("/usr/bin/python3")
TINY = REPO / "examples" / "tiny-gpt.yaml"

VENV_BIN = str(Path(sys.executable).parent)  # as an activated venv puts it on PATH (a link elsewhere is no venv)
needs_system_python = pytest.mark.skipif(
    not SYSTEM_PY.exists() or subprocess.run([str(SYSTEM_PY), "-c", "import lingjun_slurm"], cwd="/",
                                             capture_output=True).returncode == 0,
    reason="needs a system /usr/bin/python3 without lingjun_slurm")


def tiny_prep(tmp_path: Path, executor: str = "slurm", extra: str = "") -> Prepared:
    text = TINY.read_text().replace("/tmp/lingjun-slurm/tiny-gpt", str(tmp_path / "work")) + extra
    loaded = parse_spec(text, str(tmp_path / "tiny.yaml"))
    prep = prepare(loaded, run_id="check-1", executor=executor)
    os.makedirs(prep.run_dir)
    return prep


def path_with(tmp_path: Path, python: Path | None, name: str = "bin") -> str:
    """A PATH of one directory holding `python3` -> python (none when python is None)."""
    bindir = tmp_path / name
    bindir.mkdir()
    if python is not None:
        (bindir / "python3").symlink_to(python)
    return str(bindir)


STAGES = "preprocess, merge, train, checkpoint"


@needs_system_python
def test_system_python_without_lingjun_slurm_is_one_warning_naming_it_and_the_fix(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    prep = tiny_prep(tmp_path)
    bindir = path_with(tmp_path, SYSTEM_PY)
    monkeypatch.setenv("PATH", bindir)
    line = python_check.warning(LocalTransport(), prep.plan, prep.run_dir, ship_code=False)
    activate = Path(sys.executable).parent / "activate"
    fix = (f"activate the venv before submitting (`. {activate}`)" if activate.exists()
           else f"put this tool's interpreter first on PATH (`export PATH={Path(sys.executable).parent}:$PATH`)")
    assert line == (f"warning: the stages {STAGES} will run `python3` ({bindir}/python3), from the PATH the jobs "
                    "get from sbatch, which cannot import lingjun_slurm: ModuleNotFoundError: No module named "
                    f"'lingjun_slurm'; submitted anyway: {fix}, or install lingjun-slurm[megatron] for the python3 "
                    "on PATH (docs/submitting.md, \"Which Python the stages run\")")


def test_the_venv_python_passes_silently(tmp_path: Path, monkeypatch) -> None:
    prep = tiny_prep(tmp_path)
    monkeypatch.setenv("PATH", f"{VENV_BIN}:/usr/bin:/bin")
    t = LocalTransport()
    assert python_check.warning(t, prep.plan, prep.run_dir, ship_code=False) is None
    assert [argv[:2] for argv in t.history] == [("python3", "-c")]  # one subprocess, nothing else


@needs_system_python
def test_shipped_code_imports_but_the_stack_is_missing(tmp_path: Path, monkeypatch) -> None:
    """run.ship_code (the default): lingjun_slurm comes from <run_dir>/site, as in the jobs, so what the
    system python lacks is numpy (preprocess, merge), torch and megatron-core (train): the warning lists
    them once each, in stage order (stages/runtime.py's words)."""
    prep = tiny_prep(tmp_path)
    t = LocalTransport()
    assert ship_code(t, prep)  # the real wheel, unpacked into <run_dir>/site
    bindir = path_with(tmp_path, SYSTEM_PY)
    monkeypatch.setenv("PATH", bindir)
    line = python_check.warning(t, prep.plan, prep.run_dir, ship_code=True)
    assert line is not None
    assert line.startswith(f"warning: the stages {STAGES} will run `python3` ({bindir}/python3), from the PATH the "
                           "jobs get from sbatch, which lacks what they need: numpy>=1.24 is not installed; "
                           "torch>=2.4 is not installed; megatron-core>=0.16.1 is not installed; ")
    assert "; submitted anyway: " in line and line.count("\n") == 0


@needs_system_python
def test_another_lingjun_slurm_version_is_a_warning(tmp_path: Path, monkeypatch) -> None:
    old = tmp_path / "old-site" / "lingjun_slurm"
    old.mkdir(parents=True)
    (old / "__init__.py").write_text('__version__ = "0.0.7"\n')
    prep = tiny_prep(tmp_path)
    monkeypatch.setenv("PATH", path_with(tmp_path, SYSTEM_PY))
    monkeypatch.setenv("PYTHONPATH", str(old.parent))
    line = python_check.warning(LocalTransport(), prep.plan, prep.run_dir, ship_code=False)
    assert line is not None
    assert f"which imports lingjun_slurm 0.0.7 (not {__version__}, the one submitting); submitted anyway: " in line


def test_no_python3_on_path(tmp_path: Path, monkeypatch) -> None:
    prep = tiny_prep(tmp_path)
    monkeypatch.setenv("PATH", path_with(tmp_path, None))
    line = python_check.warning(LocalTransport(), prep.plan, prep.run_dir, ship_code=False)
    assert line is not None
    assert line.startswith(f"warning: the stages {STAGES} will run `python3`, from the PATH the jobs get from sbatch, "
                           "which cannot import lingjun_slurm: no python3 on the PATH; submitted anyway: ")


def test_a_python3_that_hangs_is_cut_off_by_the_timeout(tmp_path: Path, monkeypatch) -> None:
    prep = tiny_prep(tmp_path)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").write_text("#!/bin/sh\nexec sleep 30\n")
    (bindir / "python3").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    started = time.monotonic()
    line = python_check.warning(LocalTransport(), prep.plan, prep.run_dir, ship_code=False, timeout=1)
    assert time.monotonic() - started < 25  # cut off, not waited out (30 s)
    assert line is not None and "which cannot import lingjun_slurm: it did not answer within 1 s; " in line


@needs_system_python
@pytest.mark.parametrize("value,warns", [("NONE", False), ("NIL", False), ("HOME,USER", False),
                                         ("PATH=/opt/bin", False), ("ALL", True), ("ALL,FOO=1", True),
                                         ("HOME,PATH", True)])
def test_sbatch_export_that_drops_path_means_no_guess(tmp_path: Path, monkeypatch, value: str, warns: bool) -> None:
    """sbatch.1 --export: only ALL (or naming PATH itself) passes the caller's PATH to the job."""
    prep = tiny_prep(tmp_path)
    monkeypatch.setenv("PATH", path_with(tmp_path, SYSTEM_PY))
    monkeypatch.setenv("SBATCH_EXPORT", value)
    line = python_check.warning(LocalTransport(), prep.plan, prep.run_dir, ship_code=False)
    assert (line is not None) == warns, line


def test_stages_in_containers_are_not_checked_and_cost_no_subprocess(tmp_path: Path, monkeypatch) -> None:
    """pyxis stages run the image's python3: unknowable before the job; the stage checks itself."""
    text = TINY.read_text().replace("runtime: none", "runtime: pyxis\n  image: nvcr.io#nvidia/pytorch:25.04-py3\n"
                                                     "  stage: never")
    text = text.replace("/tmp/lingjun-slurm/tiny-gpt", str(tmp_path / "work"))
    prep = prepare(parse_spec(text, str(tmp_path / "p.yaml")), run_id="c-2", executor="slurm")
    assert all(st.container for st in prep.plan.stages if st.kind != "command")
    t = LocalTransport()
    monkeypatch.setenv("PATH", path_with(tmp_path, None))
    assert python_check.host_side_stages(prep.plan) == []
    assert python_check.warning(t, prep.plan, prep.run_dir, ship_code=True) is None
    assert t.history == []


def test_staged_image_stage_runs_on_the_host_and_is_checked(tmp_path: Path) -> None:
    text = TINY.read_text().replace("runtime: none", "runtime: pyxis\n  image: nvcr.io#nvidia/pytorch:25.04-py3")
    text = text.replace("/tmp/lingjun-slurm/tiny-gpt", str(tmp_path / "work"))
    prep = prepare(parse_spec(text, str(tmp_path / "p.yaml")), run_id="c-3", executor="slurm")
    assert [st.name for st in python_check.host_side_stages(prep.plan)] == ["image"]


def test_a_chain_of_commands_only_is_not_checked(tmp_path: Path) -> None:
    loaded = parse_spec((REPO / "examples" / "command-chain.yaml").read_text(), "command-chain.yaml")
    prep = prepare(loaded, run_id="c-4", executor="slurm")
    t = LocalTransport()
    assert python_check.warning(t, prep.plan, "/nonexistent", ship_code=True) is None and t.history == []


@needs_system_python
def test_local_submit_warns_on_stderr_and_goes_on(tmp_path: Path, monkeypatch, capsys) -> None:
    """The local executor puts its own interpreter's directory first on PATH (executors/local.py): an
    interpreter whose directory's python3 is another Python gets the warning; the run record is written."""
    prep = tiny_prep(tmp_path, executor="local")
    os.rmdir(prep.run_dir)
    fake = tmp_path / "tool-bin"
    fake.mkdir()
    (fake / "python3").symlink_to(SYSTEM_PY)
    monkeypatch.setattr(sys, "executable", str(fake / "python"))
    monkeypatch.setenv("PATH", f"{VENV_BIN}:/usr/bin:/bin")
    manifest = prepare_local(LocalTransport(), prep, RunIndex())
    err = capsys.readouterr().err
    assert manifest.state == "submitted" and Path(prep.run_dir, "manifest.json").exists()
    assert err.startswith(f"warning: the stages {STAGES} will run `python3` ({fake}/python3), from the local "
                          "executor's PATH, which cannot import lingjun_slurm: ModuleNotFoundError")
    assert err.count("\n") == 1


def test_local_submit_with_this_venv_prints_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    prep = tiny_prep(tmp_path, executor="local")
    os.rmdir(prep.run_dir)
    monkeypatch.setenv("PATH", path_with(tmp_path, None))  # the runner's own bin dir still comes first
    prepare_local(LocalTransport(), prep, RunIndex())
    assert capsys.readouterr().err == ""


def test_warn_never_raises(tmp_path: Path, capsys) -> None:
    class Broken(LocalTransport):
        def _run(self, *a, **k):  # type: ignore[override]
            raise OSError("the connection dropped")

    prep = tiny_prep(tmp_path)
    line = python_check.warn(Broken(), prep.plan, prep.run_dir, ship_code=False)
    assert line == "warning: could not check which Python the stages will run: the connection dropped"
    assert capsys.readouterr().err == line + "\n"


@needs_system_python
@pytest.mark.slurm
def test_on_real_slurm_the_job_runs_the_python3_the_warning_named(slurm_cluster, tmp_path: Path) -> None:
    """The modelling checked end to end: submit with the system python3 first on PATH (no venv activated)
    warns on stderr and exits 0; sbatch's --export=ALL hands that PATH to the job, whose stage then
    stops on exactly the interpreter and the packages the warning named (stages/runtime.py)."""
    text = TINY.read_text().replace("/tmp/lingjun-slurm/tiny-gpt", str(tmp_path / "work"))
    text = text[:text.index("stages:\n  commands:")]  # no make-corpus: the built-in stages only
    spec = tmp_path / "tiny.yaml"
    spec.write_text(text)
    bindir = path_with(tmp_path, SYSTEM_PY)
    env = {**os.environ, **slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state"),
           "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin"}
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", "submit", str(spec), "--executor", "slurm"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    warning = [line for line in proc.stderr.splitlines() if line.startswith("warning: the stages ")]
    assert len(warning) == 1, proc.stderr
    assert warning[0].startswith(f"warning: the stages {STAGES} will run `python3` ({bindir}/python3), from the "
                                 "PATH the jobs get from sbatch, which lacks what they need: numpy>=1.24 is not "
                                 "installed; torch>=2.4 is not installed; megatron-core>=0.16.1 is not installed; ")
    run_id = next(line.split()[2] for line in proc.stdout.splitlines() if line.startswith("submitted run "))
    log_dir = tmp_path / "work" / "logs"
    deadline = time.monotonic() + 90
    said = ""
    while time.monotonic() < deadline and "cannot run with this Python" not in said:
        time.sleep(0.5)
        said = "".join(p.read_text(errors="replace") for p in log_dir.rglob("*preprocess*"))
    # preprocess needs numpy (and the tokenizer's package; tiny-gpt's is null): no torch, no megatron-core
    assert (f"lingjun-slurm: the preprocess stage cannot run with this Python ({bindir}/python3): numpy>=1.24 is "
            "not installed.") in said, (run_id, said)
