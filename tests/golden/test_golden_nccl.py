"""Golden files for `lingjun-slurm nccl-test --render-only` scripts (same mechanism as test_golden.py).

Each case is a command line; the script is rendered through the CLI into a temporary directory,
whose path is stored as @OUTDIR@ (and the version as @VERSION@). Regenerate with

    LINGJUN_UPDATE_GOLDEN=1 python -m pytest tests/golden

and review `git diff tests/golden/expected`.
"""

from __future__ import annotations

import difflib
import os
import subprocess
from pathlib import Path

import pytest

from lingjun_slurm.cli.main import main
from tests.conftest import GOLDEN, normalize

EXPECTED = GOLDEN / "expected"
UPDATE = os.environ.get("LINGJUN_UPDATE_GOLDEN") == "1"
CASES: dict[str, list[str]] = {
    # Azure ND H100 v5 in the default NGC container: the profile's /opt/microsoft mount, --container-env.
    "nccl-test-azure-h100-container": ["--profile", "azure-nd-h100-v5", "--nodes", "2", "--partition", "gpu",
                                       "--account", "research"],
    # Lingjun on the hosts, binaries in a build directory, a fixed node count, pmi2.
    "nccl-test-lingjun-host-binaries": ["--instance-type", "ml.gu7xf.8xlarge-gu108", "--nodes", "4", "--no-container",
                                        "--tests-dir", "/opt/nccl-tests/build", "--mpi", "pmi2", "--time", "20"],
    # TCP, no GPUs, one op, a size range, NCCL overrides, shared nodes, an image with a mount.
    "nccl-test-tcp-all-gather": ["--profile", "tcp", "--nodes", "3", "--gpus-per-node", "0", "--ops", "all_gather",
                                 "--min-bytes", "1M", "--max-bytes", "1G", "--step-factor", "4", "--no-exclusive",
                                 "--set", "NCCL_DEBUG=INFO", "--unset", "NCCL_SOCKET_IFNAME", "--image",
                                 "/shared/images/nccl-tests.sqsh", "--mount", "/data:/data:ro", "--job-name", "nt"],
}


def render_case(args: list[str], outdir: Path) -> str:
    with pytest.raises(SystemExit) as info:
        main(["nccl-test", "--render-only", str(outdir), *args])
        raise SystemExit(0)
    assert not info.value.code, info.value.code
    return (outdir / "nccl-test.sbatch").read_text()


@pytest.mark.parametrize("name", sorted(CASES))
def test_nccl_script_matches_golden(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outdir = tmp_path / "out"
    text = normalize(render_case(CASES[name], outdir)).replace(str(outdir), "@OUTDIR@")
    target = EXPECTED / name / "nccl-test.sbatch"
    if UPDATE:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        return
    assert target.is_file(), f"no golden file for {name}: run LINGJUN_UPDATE_GOLDEN=1 python -m pytest tests/golden"
    expected = target.read_text(encoding="utf-8")
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            f"golden/{name}", f"rendered/{name}"))
        pytest.fail(f"{name} differs from its golden file (regenerate with LINGJUN_UPDATE_GOLDEN=1 if intended):\n{diff}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_nccl_script_is_deterministic_and_passes_shellcheck(name: str, tmp_path: Path, shellcheck: str) -> None:
    first = render_case(CASES[name], tmp_path / "out")
    assert render_case(CASES[name], tmp_path / "out") == first
    proc = subprocess.run([shellcheck, "--severity=style", "--shell=bash", str(tmp_path / "out" / "nccl-test.sbatch")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
