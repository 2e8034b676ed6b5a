"""Golden files for rendered scripts (submitit's sbatch record, NeMo-Run's artifacts/).

Regenerate after an intended change with:

    LINGJUN_UPDATE_GOLDEN=1 python -m pytest tests/golden

then review `git diff tests/golden/expected`.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import GOLDEN, REPO, normalize, render_scenario, scenario_files

EXPECTED = GOLDEN / "expected"
UPDATE = os.environ.get("LINGJUN_UPDATE_GOLDEN") == "1"
SCENARIOS = scenario_files()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_rendered_matches_golden(name: str) -> None:
    files = {k: normalize(v) for k, v in render_scenario(name, SCENARIOS[name]).items()}
    target = EXPECTED / name
    if UPDATE:
        target.mkdir(parents=True, exist_ok=True)
        for old in target.iterdir():
            old.unlink()
        for fname, text in files.items():
            (target / fname).write_text(text, encoding="utf-8")
        return
    assert target.is_dir(), f"no golden files for {name}: run LINGJUN_UPDATE_GOLDEN=1 python -m pytest tests/golden"
    expected = {p.name: p.read_text(encoding="utf-8") for p in target.iterdir()}
    assert sorted(files) == sorted(expected), "a different set of files was rendered"
    for fname, text in files.items():
        if text != expected[fname]:
            diff = "".join(difflib.unified_diff(expected[fname].splitlines(True), text.splitlines(True),
                                                f"golden/{name}/{fname}", f"rendered/{name}/{fname}"))
            pytest.fail(f"{name}/{fname} differs from its golden file "
                        f"(regenerate with LINGJUN_UPDATE_GOLDEN=1 if intended):\n{diff}")


def test_rendering_is_deterministic() -> None:
    for name, path in SCENARIOS.items():
        assert render_scenario(name, path) == render_scenario(name, path)


def test_scenarios_cover_the_required_variety() -> None:
    """Single and multi-node, with and without a container, Lingjun/Azure/TCP, skipped stages."""
    import json

    plans = {n: json.loads((EXPECTED / n / "plan.json").read_text()) for n in SCENARIOS}
    trains = [next((s for s in p["stages"] if s["kind"] == "train"), None) for p in plans.values()]
    nodes = {t["resources"]["nodes"] for t in trains if t}
    assert 1 in nodes and max(nodes) > 1
    containers = {s["container"] for p in plans.values() for s in p["stages"]}
    assert containers == {True, False}
    profiles = {t["network_profile"] for t in trains if t}
    assert {"lingjun", "tcp"} <= profiles and any(p.startswith("azure-") for p in profiles)
    assert any(len([s for s in p["stages"] if s["kind"] != "command"]) < 4 for p in plans.values())
    assert len(SCENARIOS) >= 6


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_rendered_scripts_pass_shellcheck(name: str, shellcheck: str, tmp_path: Path) -> None:
    files = render_scenario(name, SCENARIOS[name])
    scripts = []
    for fname, text in files.items():
        if fname.endswith((".sh", ".sbatch")):
            (tmp_path / fname).write_text(text)
            scripts.append(str(tmp_path / fname))
    proc = subprocess.run([shellcheck, "--severity=style", "--shell=bash", *scripts], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# Other projects' scripts kept byte for byte as test data (their SOURCES.md says whose): not ours to lint.
UPSTREAM_SHELL = ("tests/cluster_init/fixtures/cyclecloud-slurm-install/",)


def test_repository_shell_files_pass_shellcheck(shellcheck: str) -> None:
    tracked = subprocess.run(["git", "ls-files", "*.sh", "**/*.sh", ".ci/run"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()
    files = sorted({str(REPO / f) for f in tracked if (REPO / f).is_file() and not f.startswith(UPSTREAM_SHELL)})
    if not files:
        pytest.skip("no shell files tracked yet")
    proc = subprocess.run([shellcheck, "--severity=style", *files], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_local_executor_scripts_pass_shellcheck_and_drop_slurm_launch(name: str, shellcheck: str,
                                                                     tmp_path: Path) -> None:
    """Scripts rendered for the local executor: no srun, no pyxis flags, no scontrol/scancel, clean shellcheck."""
    from lingjun_slurm.plan import build_plan
    from lingjun_slurm.render import render_plan
    from lingjun_slurm.spec import load_spec

    loaded = load_spec(SCENARIOS[name])
    files = render_plan(build_plan(loaded.spec, spec_sha256=loaded.sha256, executor="local"))
    scripts = []
    for fname, text in files.items():
        if fname.endswith(".sbatch"):
            body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
            assert not re.search(r"\bsrun\b", body) and "--container-" not in body, fname
            assert "scontrol" not in body and "scancel" not in body, fname
            assert "lingjun_slurm.executors.launch" in body, fname
            (tmp_path / fname).write_text(text)
            scripts.append(str(tmp_path / fname))
    proc = subprocess.run([shellcheck, "--severity=style", "--shell=bash", *scripts], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
