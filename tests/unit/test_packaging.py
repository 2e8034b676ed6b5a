"""The wheel ships the templates and data files an installed tool needs."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_wheel_contains_templates_and_presets(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    wheel = next(tmp_path.glob("lingjun_slurm-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = {p.relative_to(REPO).as_posix() for p in (REPO / "slurm_templates").rglob("*.j2")}
    assert templates and all(f"lingjun_slurm/{t}" in names for t in templates)
    for data in ("models.yaml", "network_profiles.yaml", "megatron_flags.yaml", "nccl_unset.yaml"):
        assert f"lingjun_slurm/presets/{data}" in names
    assert "lingjun_slurm/nodes/nccltests/report.schema.json" in names
    # The node health checks: the bash program (executable) and every thresholds file.
    program = zipfile.ZipFile(wheel).getinfo("lingjun_slurm/nodes/health/lingjun-health")
    assert program.external_attr >> 16 & 0o777 == 0o755
    thresholds = {p.relative_to(REPO).as_posix() for p in (REPO / "lingjun_slurm/nodes/health/thresholds").glob("*.conf")}
    assert thresholds and thresholds <= names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "lingjun-slurm = lingjun_slurm.cli.main:main" in zipfile.ZipFile(wheel).read(entry).decode()
