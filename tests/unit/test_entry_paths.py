"""The module paths that rendered scripts, specs and users call keep working after the package
moved into wings (docs/architecture.md), and a plan rendered before the move says why its host
tools are off when it runs under this lingjun_slurm without its own copy in <run_dir>/site."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lingjun_slurm import __version__
from lingjun_slurm.injob.stages.contract import LAYOUT_MOVED_IN, layout_note
from lingjun_slurm.plan import PLAN_SCHEMA
from tests.conftest import REPO

PY = sys.executable


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run([PY, *args], capture_output=True, text=True, cwd=cwd, env=full, timeout=120)


@pytest.mark.parametrize("module, usage", [
    ("lingjun_slurm.stages", "python3 -m lingjun_slurm.stages"),
    ("lingjun_slurm.data.synthetic", "python3 -m lingjun_slurm.data.synthetic"),
    ("lingjun_slurm.cli", "Usage:"),
    ("lingjun_slurm.injob.host.exclusion", "usage:"),
    ("lingjun_slurm.injob.host.watchdog", "usage:"),
    ("lingjun_slurm.injob.host.retry", "usage:"),
    ("lingjun_slurm.injob.host.crashlog", "usage:"),
    ("lingjun_slurm.executors.launch", "usage:"),
    ("lingjun_slurm.nodes.clusterinit_gen", "usage:"),
])
def test_every_called_module_path_answers_help(tmp_path: Path, module: str, usage: str) -> None:
    proc = _run(["-m", module, "--help"], tmp_path)
    assert proc.returncode == 0 and usage in proc.stdout, (module, proc.stdout, proc.stderr)


def test_the_synthetic_corpus_path_of_the_example_writes_the_same_bytes(tmp_path: Path) -> None:
    """examples/tiny-gpt.yaml calls `python3 -m lingjun_slurm.data.synthetic`; it writes exactly
    what the job-side module writes."""
    assert "python3 -m lingjun_slurm.data.synthetic " in (REPO / "examples" / "tiny-gpt.yaml").read_text()
    a = _run(["-m", "lingjun_slurm.data.synthetic", str(tmp_path / "a"), "--docs", "40", "--vocab", "63"], tmp_path)
    b = _run(["-m", "lingjun_slurm.injob.data.synthetic", str(tmp_path / "b"), "--docs", "40", "--vocab", "63"],
             tmp_path)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    files_a = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files_a and files_a == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in files_a:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_a_plan_from_before_the_move_gets_one_warning_naming_the_moved_tools() -> None:
    note = layout_note({"tool_version": "0.1.0"}, __version__)
    assert note is not None and note.startswith("lingjun-slurm: warning: this run was rendered by lingjun_slurm 0.1.0")
    assert "lingjun_slurm.injob.host" in note and "run.ship_code: true" in note and "resubmit" in note
    assert layout_note({"tool_version": ".".join(map(str, LAYOUT_MOVED_IN)) + ".0"}, __version__) is None
    assert layout_note({"tool_version": __version__}, __version__) is None
    assert layout_note({"tool_version": "1.4.2"}, __version__) is None
    assert layout_note({}, __version__) is None and layout_note({"tool_version": "dev"}, __version__) is None


def test_the_stage_entry_prints_the_warning_for_an_old_plan(tmp_path: Path) -> None:
    """Through the real entry command: the stage starts, says which lingjun_slurm runs it, and
    warns once on stderr; a plan of this release gets no warning."""
    for version, warned in (("0.1.0", True), (__version__, False)):
        plan = tmp_path / f"plan-{version}.json"
        plan.write_text(json.dumps({"schema": PLAN_SCHEMA, "tool_version": version, "settings": {}}))
        proc = _run(["-m", "lingjun_slurm.stages", "preflight-judge", "--plan", str(plan), "--out",
                     str(tmp_path / f"out-{version}"), "--nodes", "n1"], tmp_path)
        assert f"lingjun_slurm {__version__} from" in proc.stdout, proc.stdout + proc.stderr
        assert proc.stderr.count("this run was rendered by lingjun_slurm 0.1.0") == (1 if warned else 0), proc.stderr
