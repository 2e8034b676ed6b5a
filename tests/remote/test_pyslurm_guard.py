"""The pyslurm backend's guard, with stand-in `pyslurm` packages on PYTHONPATH (PyPI has no pyslurm for
Debian's Slurm 22.05): pyslurm is imported in a child process first, with SLURM_CONF set, and only a
version matching the cluster's Slurm is used; anything else falls back to squeue/sacct. Each case runs
the real CLI in a fresh process, so a pyslurm that kills its importer would kill the test's command."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from lingjun_slurm.runs.index import RunIndex, entry_for
from lingjun_slurm.runs.manifest import ClusterRecord, Manifest, SpecRecord, StageRecord, TransportRecord
from lingjun_slurm.slurm.pyslurm_backend import job_info, major_minor
from lingjun_slurm.transport import LocalTransport
from tests.integration.helpers import cli

RUN = "guard-20261130-010101-abcdef"

FAKE_JOBS = """
import json, os


def _log(*what):
    with open(os.environ["FAKE_PYSLURM_LOG"], "a") as fh:
        fh.write(json.dumps(list(what)) + "\\n")


_log("import", os.environ.get("SLURM_CONF"))


class Job:
    def __init__(self, **kw):
        self.__dict__.update(dict(array_id=None, array_task_id=None, array_tasks_waiting=None, exit_code=None,
                                  exit_code_signal=None, start_time=None, end_time=None, allocated_nodes=None,
                                  requeue_count=0, state_reason=None, run_time=0), **kw)


class Jobs(dict):
    @staticmethod
    def load():
        _log("Jobs.load")
        RAISE
        return Jobs({101: Job(id=101, name="@RUN@-a", state="RUNNING", start_time=1700000000,
                              allocated_nodes="node1", state_reason="None")})


class _Db:
    class JobFilter:
        def __init__(self, **kw):
            self.ids = kw.get("ids")

    class Jobs(list):
        @staticmethod
        def load(flt):
            _log("db.Jobs.load", flt.ids)
            return [Job(id=102, name="@RUN@-b", state="COMPLETED", exit_code=0, exit_code_signal=0,
                        start_time=1700000000, end_time=1700000060, elapsed_time=60, nodelist="node2")]


db = _Db()


def version():
    return "VERSION"
"""


def fake_pyslurm(root: Path, *, version: str = "22.5.1", on_import: str = "", raises: bool = False) -> Path:
    pkg = root / "pyslurm"
    pkg.mkdir(parents=True)
    body = FAKE_JOBS.replace("VERSION", version).replace("@RUN@", RUN)
    body = body.replace("RAISE", "raise RuntimeError('slurm_load_jobs: Unable to contact slurm controller')"
                        if raises else "pass")
    (pkg / "__init__.py").write_text(textwrap.dedent(on_import) + body)
    return root


def fake_slurm_bin(root: Path) -> Path:
    """squeue/sacct stand-ins that record their calls (the CLI backend must not run when pyslurm does)."""
    root.mkdir(parents=True)
    for prog, out in (("squeue", '{"jobs": []}'), ("sacct", "")):
        script = root / prog
        # squeue: no jobs, as JSON for --json and as nothing at all for the text form (slurm/client.py queue)
        body = (f'case " $* " in *" --json "*) printf \'%s\\n\' \'{out}\';; esac\n' if prog == "squeue"
                else f"printf '%s\\n' '{out}'\n")
        script.write_text(f"#!/bin/sh\necho {prog} >> \"$FAKE_SLURM_LOG\"\n{body}")
        script.chmod(0o755)
    return root


def make_run(tmp_path: Path, slurm_version: str = "22.05.8") -> dict[str, str]:
    state = tmp_path / "state"
    run_dir = tmp_path / "work" / "runs" / RUN
    run_dir.mkdir(parents=True)
    now = time.time()
    stages = [StageRecord(name=n, kind="command", script=f"{n}.sbatch", job_name=f"{RUN}-{n}", job_ids=[j],
                          submitted_at=now) for n, j in (("a", "101"), ("b", "102"))]
    m = Manifest(run_id=RUN, name="guard", created_at=now, updated_at=now, tool_version="0", user="u",
                 executor="slurm", transport=TransportRecord(kind="local", host="h"),
                 cluster=ClusterRecord(name="c", slurm_version=slurm_version, accounting=True),
                 spec=SpecRecord(source="s.yaml", sha256="0"), run_dir=str(run_dir), log_dir=str(run_dir),
                 state="submitted", stages=stages)
    LocalTransport().write_atomic(str(run_dir / "manifest.json"), m.to_json())
    RunIndex(state).add(entry_for(RUN, "guard", now, "slurm", "local", "h", str(run_dir), "s.yaml"))
    conf = tmp_path / "slurm.conf"
    conf.write_text("# a stand-in: the fake pyslurm only checks that SLURM_CONF is set\n")
    return {"LINGJUN_STATE_DIR": str(state), "FAKE_PYSLURM_LOG": str(tmp_path / "pyslurm.log"),
            "FAKE_SLURM_LOG": str(tmp_path / "slurm.log"), "SLURM_CONF": str(conf)}


def run_status(tmp_path: Path, env: dict[str, str], pythonpath: Path, check: int = 0):  # type: ignore[no-untyped-def]
    bin_dir = fake_slurm_bin(tmp_path / "bin")
    full = {**env, "PYTHONPATH": str(pythonpath), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return cli("status", RUN, "--json", "--verbose", env=full, check=check)


def calls(path: str) -> list[list[object]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()] if os.path.exists(path) else []


def slurm_calls(env: dict[str, str]) -> list[str]:
    path = Path(env["FAKE_SLURM_LOG"])
    return path.read_text().split() if path.exists() else []


def test_matching_pyslurm_reads_the_queue_and_accounting_without_forking(tmp_path: Path) -> None:
    env = make_run(tmp_path)
    proc = run_status(tmp_path, env, fake_pyslurm(tmp_path / "py"))
    stages = {s["name"]: s for s in json.loads(proc.stdout)["runs"][0]["stages"]}
    assert stages["a"]["state"] == "RUNNING" and stages["a"]["nodes"] == "node1"
    assert stages["b"]["state"] == "COMPLETED" and stages["b"]["exit_code"] == 0 and stages["b"]["elapsed_s"] == 60
    assert "queue read with pyslurm 22.5.1 (matches Slurm 22.05.8)" in proc.stderr
    got = calls(env["FAKE_PYSLURM_LOG"])
    # Imported twice: by the probe process, then here; both with SLURM_CONF set.
    assert [c for c in got if c[0] == "import"] == [["import", env["SLURM_CONF"]]] * 2
    assert ["Jobs.load"] in got and ["db.Jobs.load", [102]] in got
    assert slurm_calls(env) == []  # neither squeue nor sacct was forked


def test_a_pyslurm_that_kills_its_importer_never_runs_in_the_cli_process(tmp_path: Path) -> None:
    env = make_run(tmp_path)
    deadly = fake_pyslurm(tmp_path / "py", on_import="import os\nos.abort()\n")
    proc = run_status(tmp_path, env, deadly)  # exit 0: the CLI process survived
    assert "squeue/sacct (`import pyslurm` killed the probe process (SIGABRT))" in proc.stderr
    assert slurm_calls(env) == ["squeue", "sacct"]
    # The variant that aborts only without SLURM_CONF (pyslurm's real behaviour): with no slurm.conf to
    # give it, the guard does not even start the probe.
    env2 = dict(env)
    env2.pop("SLURM_CONF")
    picky = fake_pyslurm(tmp_path / "py2", on_import="import os\nif not os.environ.get('SLURM_CONF'):\n    os.abort()\n")
    os.unlink(env["FAKE_PYSLURM_LOG"]) if os.path.exists(env["FAKE_PYSLURM_LOG"]) else None
    bin_dir = tmp_path / "bin"
    full = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    full.update(env2, PYTHONPATH=str(picky), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", "status", RUN, "--verbose"], env=full,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    if not any(os.path.isfile(p) for p in ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf")):
        assert "SLURM_CONF is unset and there is no /etc/slurm/slurm.conf" in proc.stderr
        assert calls(env["FAKE_PYSLURM_LOG"]) == []


def test_a_pyslurm_for_another_slurm_is_not_used(tmp_path: Path) -> None:
    env = make_run(tmp_path)
    proc = run_status(tmp_path, env, fake_pyslurm(tmp_path / "py", version="23.2.2"))
    assert "pyslurm 23.2.2 is built for Slurm 23.02, the cluster runs Slurm 22.05.8" in proc.stderr
    assert [c[0] for c in calls(env["FAKE_PYSLURM_LOG"])] == ["import"]  # the probe only
    assert slurm_calls(env) == ["squeue", "sacct"]


def test_a_failing_pyslurm_call_falls_back_to_squeue(tmp_path: Path) -> None:
    env = make_run(tmp_path)
    proc = run_status(tmp_path, env, fake_pyslurm(tmp_path / "py", raises=True))
    assert "warning: pyslurm Jobs.load() failed (RuntimeError: slurm_load_jobs" in proc.stderr
    assert slurm_calls(env) == ["squeue", "sacct"]


def test_the_scheduler_setting(tmp_path: Path) -> None:
    env = make_run(tmp_path)
    py = fake_pyslurm(tmp_path / "py")
    proc = run_status(tmp_path, {**env, "LINGJUN_SCHEDULER": "cli"}, py)
    assert "squeue/sacct (LINGJUN_SCHEDULER=cli)" in proc.stderr
    assert calls(env["FAKE_PYSLURM_LOG"]) == []  # not even probed
    proc = cli("status", RUN, env={**env, "LINGJUN_SCHEDULER": "fast"}, check=2)
    assert "LINGJUN_SCHEDULER='fast': expected one of auto, cli, pyslurm" in proc.stderr
    # Forced, but unusable: a warning, and the CLI answers.
    proc = run_status(tmp_path / "x", {**env, "LINGJUN_SCHEDULER": "pyslurm"},
                      fake_pyslurm(tmp_path / "py3", version="21.8.0"))
    assert "warning: LINGJUN_SCHEDULER=pyslurm, but pyslurm 21.8.0 is built for Slurm 21.08" in proc.stderr


def test_not_installed_and_version_parsing(tmp_path: Path) -> None:
    env = make_run(tmp_path)
    (tmp_path / "empty").mkdir()
    proc = run_status(tmp_path, env, tmp_path / "empty")
    assert "queue read with squeue/sacct (pyslurm is not installed)" in proc.stderr
    assert major_minor("23.02.7") == (23, 2) == major_minor("23.2.2")
    assert major_minor("22.05") == (22, 5) and major_minor("abc") is None


@pytest.mark.parametrize("attrs, want", [
    (dict(id=7, array_id=5, array_task_id=2, state="FAILED", exit_code=3, exit_code_signal=0), ("5_2", "FAILED", 3)),
    (dict(id=5, array_id=5, array_task_id=None, array_tasks_waiting="3-9%2", state="PENDING"), ("5_[3-9]", "PENDING",
                                                                                                None)),
    (dict(id=9, state="CANCELLED", exit_code=0, exit_code_signal=9), ("9", "CANCELLED", None)),
])
def test_job_records_map_like_squeue(attrs: dict, want: tuple) -> None:  # type: ignore[type-arg]
    job = type("J", (), {"name": "n", **attrs})()
    info = job_info(job, "pyslurm")
    assert (info.job_id, info.state, info.exit_code) == want


def test_the_probe_must_have_imported_the_pyslurm_this_process_would(tmp_path: Path) -> None:
    """`python -c` puts the working directory first on sys.path; the installed CLI (a console script) does
    not. A harmless pyslurm in the working directory must not vouch for a different one on the path
    that aborts its importer: the guard compares the files and falls back to squeue/sacct."""
    import subprocess
    import sys

    env = make_run(tmp_path)
    deadly = fake_pyslurm(tmp_path / "installed", on_import="import os\nos.abort()\n")
    cwd = tmp_path / "cwd"
    fake_pyslurm(cwd)  # a checkout with a pyslurm/ that imports fine and has the right version
    bin_dir = fake_slurm_bin(tmp_path / "bin")
    launcher = tmp_path / "scripts" / "lingjun-slurm"  # as the console script runs: sys.path[0] is its directory
    launcher.parent.mkdir()
    launcher.write_text("import sys\nfrom lingjun_slurm.cli.main import main\nsys.exit(main())\n")
    full = {k: v for k, v in os.environ.items() if not k.startswith("LINGJUN")}
    full.update(env, PYTHONPATH=str(deadly), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run([sys.executable, str(launcher), "status", RUN, "--json", "--verbose"], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)  # -6 (SIGABRT) when the guard was fooled
    assert "the probe process imported pyslurm from" in proc.stderr, proc.stderr
    assert slurm_calls(env) == ["squeue", "sacct"]
