"""Shipping code with a run: the wheel of the running package, unpacked into <run_dir>/site."""

from __future__ import annotations

import hashlib
import base64
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lingjun_slurm import __version__
from lingjun_slurm.bundle import build_wheel, ship, wheel_members
from lingjun_slurm.common.errors import UsageError
from lingjun_slurm.plan import PLAN_SCHEMA
from lingjun_slurm.injob.stages import runtime
from lingjun_slurm.transport import LocalTransport


def test_wheel_is_deterministic_complete_and_its_record_is_right() -> None:
    name, data = build_wheel()
    assert name == f"lingjun_slurm-{__version__}-py3-none-any.whl"
    assert build_wheel()[1] == data
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = set(zf.namelist())
        record = zf.read(f"lingjun_slurm-{__version__}.dist-info/RECORD").decode().splitlines()
        for line in record:
            path, digest, size = line.rsplit(",", 2)
            if digest:
                raw = zf.read(path)
                want = base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).rstrip(b"=").decode()
                assert digest == f"sha256={want}" and int(size) == len(raw), path
    for must in ("lingjun_slurm/injob/stages/dispatch.py", "lingjun_slurm/presets/network_profiles.yaml",
                 "lingjun_slurm/slurm_templates/train.sbatch.j2", "lingjun_slurm/injob/data/tokenizer.py"):
        assert must in names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


def test_pip_accepts_the_wheel(tmp_path: Path) -> None:
    name, data = build_wheel()
    (tmp_path / name).write_bytes(data)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                           str(tmp_path / "t"), str(tmp_path / name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "t" / "lingjun_slurm" / "stages" / "__main__.py").is_file()


def test_ship_unpacks_importable_code_and_refuses_bad_wheels(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    names = ship(LocalTransport(), str(run_dir), [])
    assert names == [build_wheel()[0]]
    assert (run_dir / "wheels" / names[0]).is_file()
    assert (run_dir / "site" / "lingjun_slurm" / "injob" / "stages" / "runtime.py").is_file()
    with pytest.raises(UsageError, match="not a wheel"):
        ship(LocalTransport(), str(run_dir), [str(tmp_path / "missing.whl")])
    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../escape.py", "x")
    with pytest.raises(UsageError, match="unsafe path"):
        wheel_members("evil.whl", evil.getvalue())


def test_stage_entry_in_a_python_without_the_stack_says_what_is_missing(tmp_path: Path) -> None:
    """The interpreter the venv was made from has neither torch nor lingjun_slurm: like a bare image.
    The shipped site/ gives it lingjun_slurm; the runtime check names what else is missing."""
    bare = Path(sys.base_prefix) / "bin" / "python3"
    probe = subprocess.run([str(bare), "-c", "import torch"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("the base interpreter has torch; it cannot stand in for a bare image")
    run_dir = tmp_path / "run"
    ship(LocalTransport(), str(run_dir), [])
    plan = run_dir / "plan.json"
    plan.write_text(json.dumps({"schema": PLAN_SCHEMA, "run_id": "r", "settings": {}}))
    proc = subprocess.run([str(bare), "-m", "lingjun_slurm.stages", "train", "--plan", str(plan)],
                          env={"PYTHONPATH": str(run_dir / "site"), "PATH": "/usr/bin:/bin"}, cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert f"from {run_dir / 'site' / 'lingjun_slurm'}" in proc.stdout
    assert "torch>=2.4 is not installed" in proc.stderr and "Traceback" not in proc.stderr


def test_runtime_schema_matches_the_plan() -> None:
    assert runtime.PLAN_SCHEMA == PLAN_SCHEMA
    assert runtime.check("merge") is None  # this venv has the whole stack


def test_task_wrapper_prepends_the_shipped_code_to_the_images_pythonpath() -> None:
    """Inside the container the image's PYTHONPATH (e.g. a Megatron-LM checkout) must survive."""
    from lingjun_slurm.plan import TASK_WRAPPER

    env = {"PATH": "/usr/bin:/bin", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1",
           "LINGJUN_SITE": "/run/site", "PYTHONPATH": "/workspace/Megatron-LM"}
    argv = [str(w) for w in TASK_WRAPPER] + ["sh", "-c", 'echo "$PYTHONPATH"']
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == "/run/site:/workspace/Megatron-LM"
    env.pop("LINGJUN_SITE")
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == "/workspace/Megatron-LM"


def test_rendered_container_env_passes_the_site_not_pythonpath(capsys) -> None:
    from lingjun_slurm.cli.main import main
    from tests.conftest import REPO

    with pytest.raises(SystemExit):
        main(["render", str(REPO / "examples" / "megatron-gpt.yaml"), "--stage", "train"])
        raise SystemExit(0)
    script = capsys.readouterr().out
    env_line = next(line for line in script.splitlines() if "--container-env=" in line)
    assert "LINGJUN_SITE" in env_line and "PYTHONPATH" not in env_line.split("--container-env=")[1]


def test_megatron_core_found_in_a_checkout_without_package_metadata(tmp_path: Path) -> None:
    """An image with Megatron-LM on PYTHONPATH but no megatron-core distribution: the version comes
    from megatron/core/package_info.py (read, not imported)."""
    bare = Path(sys.base_prefix) / "bin" / "python3"
    if subprocess.run([str(bare), "-c", "import megatron"], capture_output=True).returncode == 0:
        pytest.skip("the base interpreter has megatron")
    core = tmp_path / "mlm" / "megatron" / "core"
    core.mkdir(parents=True)
    (tmp_path / "mlm" / "megatron" / "__init__.py").write_text("")
    (core / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (core / "package_info.py").write_text("MAJOR = 0\nMINOR = 16\nPATCH = 1\nPRE_RELEASE = ''\n")
    site = tmp_path / "site"
    ship(LocalTransport(), str(tmp_path / "run"), [])
    site = tmp_path / "run" / "site"
    code = "from lingjun_slurm.injob.stages.runtime import installed; print(installed('megatron-core'))"
    out = subprocess.run([str(bare), "-c", code], env={"PYTHONPATH": f"{site}:{tmp_path / 'mlm'}"}, cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.stdout.strip() == "0.16.1", out.stderr
