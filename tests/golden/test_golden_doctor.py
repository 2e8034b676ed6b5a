"""Golden files and shellcheck for `lingjun-slurm doctor`'s script (slurm_templates/doctor.sbatch.j2).

Same mechanism as test_golden.py: regenerate with

    LINGJUN_UPDATE_GOLDEN=1 python -m pytest tests/golden

and review `git diff tests/golden/expected`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import subprocess
from pathlib import Path

import pytest

from lingjun_slurm import doctor
from lingjun_slurm.spec import load_spec
from tests.conftest import GOLDEN, REPO, normalize, scenario_files

EXPECTED = GOLDEN / "expected"
UPDATE = os.environ.get("LINGJUN_UPDATE_GOLDEN") == "1"
SCENARIOS = scenario_files()
STAGED = "/shared/images/sha256-" + "ab" * 32 + ".sqsh"
# (golden name, scenario, image choice): the spec's own .sqsh; a registry image through the squashfs
# a run staged; the same with nothing staged (the hosts, no container).
CASES = {
    "doctor-azure-h100-builtin": ("azure-h100-builtin",
                                  doctor.ImageChoice("/shared/images/nemo-25.04.sqsh", "spec",
                                                     "/shared/images/nemo-25.04.sqsh")),
    "doctor-skip-data-roce-staged": ("skip-data-roce",
                                     doctor.ImageChoice(STAGED, "run llm-20250101-000000-abcdef",
                                                        "registry.local:5000#llm/train:2025.11")),
    "doctor-skip-data-roce-hosts": ("skip-data-roce",
                                    doctor.ImageChoice(None, "unstaged", "registry.local:5000#llm/train:2025.11")),
}


def render(scenario: str, choice: doctor.ImageChoice) -> dict[str, str]:
    path = SCENARIOS[scenario]
    label = str(path.relative_to(REPO))
    loaded = dataclasses.replace(load_spec(path), source=label)
    job = doctor.prepare(loaded, run_id="golden-doctor-20250101-000000-abcdef", choice=choice,
                         reproduce=f"lingjun-slurm doctor {label}")
    return job.files


@pytest.mark.parametrize("name", sorted(CASES))
def test_doctor_script_matches_golden(name: str) -> None:
    text = normalize(render(*CASES[name])[doctor.SCRIPT])
    target = EXPECTED / name / doctor.SCRIPT
    if UPDATE:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        return
    assert target.is_file(), f"no golden file for {name}: run LINGJUN_UPDATE_GOLDEN=1 python -m pytest tests/golden"
    expected = target.read_text(encoding="utf-8")
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            f"golden/{name}/{doctor.SCRIPT}", f"rendered/{name}/{doctor.SCRIPT}"))
        pytest.fail(f"{name}/{doctor.SCRIPT} differs from its golden file (regenerate with "
                    f"LINGJUN_UPDATE_GOLDEN=1 if intended):\n{diff}")


def test_doctor_scripts_of_every_scenario_pass_shellcheck(shellcheck: str, tmp_path: Path) -> None:
    """Every golden scenario with a train stage, with a container image and on the hosts."""
    scripts = []
    for name, path in sorted(SCENARIOS.items()):
        if load_spec(path).spec.stages.train.skip:
            continue
        for mode, choice in (("image", doctor.ImageChoice(STAGED, "cache")), ("hosts", doctor.ImageChoice(None, "x"))):
            out = tmp_path / f"{name}-{mode}.sbatch"
            out.write_text(render(name, choice)[doctor.SCRIPT])
            scripts.append(str(out))
    assert len(scripts) >= 10
    proc = subprocess.run([shellcheck, "--severity=style", "--shell=bash", *scripts], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
