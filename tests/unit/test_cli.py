"""The CLI: validate/render/schema behaviour, exit codes, and what it imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.unit.clirun import run_cli
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "megatron-gpt.yaml"
TINY = REPO / "examples" / "tiny-gpt.yaml"


def test_validate_ok(capsys) -> None:
    code, out, _ = run_cli(capsys, "validate", str(EXAMPLE))
    assert code == 0 and "preprocess -> merge -> train -> checkpoint -> eval" in out


def test_render_writes_all_files_and_prints_the_chain(capsys, tmp_path: Path) -> None:
    code, out, _ = run_cli(capsys, "render", str(EXAMPLE), "-o", str(tmp_path / "out"))
    assert code == 0
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["checkpoint.sbatch", "eval.sbatch", "image.sbatch", "merge.sbatch", "plan.json", "preprocess.sbatch",
                     "submit.sh", "train.sbatch"]
    assert "afterok:merge" in out and "array 0-15" in out
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["schema"] == 1
    assert [s["name"] for s in plan["stages"]][:5] == ["image", "preprocess", "merge", "train", "checkpoint"]
    assert plan["stages"][3]["depends_on"] == [{"stage": "merge", "type": "afterok"}]
    train = (tmp_path / "out" / "train.sbatch").read_text()
    # The header says how to reproduce the script.
    assert f"lingjun-slurm render {EXAMPLE} -o {tmp_path / 'out'}" in train
    for key, value in [("NCCL_IB_TC", "136"), ("NCCL_IB_GID_INDEX", "3"), ("NCCL_IB_HCA", "mlx5")]:
        assert f"export {key}={value}\n" in train
    env_line = next(line for line in train.splitlines() if "--container-env=" in line)
    for key in ("NCCL_IB_TC", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "CUDA_DEVICE_MAX_CONNECTIONS", "MASTER_ADDR"):
        assert key in env_line
    assert "--container-image=\"$LINGJUN_IMAGE\"" in train  # the staged .sqsh (image stage)
    assert "--container-mounts=/mnt/cpfs:/mnt/cpfs,/mnt/data:/mnt/data:ro" in train
    assert (tmp_path / "out" / "submit.sh").stat().st_mode & 0o111


def test_render_stage_prints_one_script(capsys) -> None:
    code, out, _ = run_cli(capsys, "render", str(TINY), "--stage", "train")
    assert code == 0 and out.startswith("#!/bin/bash") and "#SBATCH --job-name=tiny-gpt-train" in out
    assert "set -euo pipefail" in out and "--requeue" in out and "--signal=B:USR1@60" in out
    code, _, err = run_cli(capsys, "render", str(TINY), "--stage", "nope")
    assert code == 2 and "stages: make-corpus, preprocess, merge, train, checkpoint" in err


def test_render_usage_errors(capsys) -> None:
    assert run_cli(capsys, "render", str(TINY))[0] == 2
    assert run_cli(capsys, "render", str(TINY), "--stage", "train", "--run-id", "bad id")[0] == 2
    assert run_cli(capsys, "bogus-command")[0] == 2


def test_run_id_sets_job_names(capsys) -> None:
    code, out, _ = run_cli(capsys, "render", str(TINY), "--stage", "merge", "--run-id", "tiny-20261129-ab12")
    assert code == 0 and "#SBATCH --job-name=tiny-20261129-ab12-merge" in out


def test_schema_is_json_schema(capsys) -> None:
    code, out, _ = run_cli(capsys, "schema")
    schema = json.loads(out)
    assert code == 0 and schema["title"] == "lingjun-slurm spec" and "run" in schema["required"]


def test_cli_never_imports_torch_or_megatron(tmp_path: Path) -> None:
    """--help, validate, render, submit --dry-run, list and status in a fresh interpreter: neither torch
    nor megatron is loaded."""
    code = f"""
import sys
from lingjun_slurm.cli.main import main
for args in (["--help"], ["validate", {str(EXAMPLE)!r}], ["render", {str(EXAMPLE)!r}, "-o", {str(tmp_path)!r}],
             ["nccl-env", "--profile", "lingjun"], ["submit", {str(EXAMPLE)!r}, "--executor", "slurm", "--dry-run"],
             ["list"], ["status"]):
    try:
        main(args)
    except SystemExit as exc:
        assert not exc.code, (args, exc.code)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "megatron", "numpy", "paramiko", "pyslurm"))
print("HEAVY", heavy)
"""
    env = {**os.environ, "LINGJUN_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert "HEAVY []" in proc.stdout, proc.stdout


def test_console_script_exit_code_and_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("run:\n  name: ok\n  workdir: relative\n")
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", "validate", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert f"{bad}:3: run.workdir:" in proc.stderr and "Traceback" not in proc.stderr


def test_stage_entry_contract(tmp_path: Path, capsys) -> None:
    """python3 -m lingjun_slurm.stages STAGE --plan PLAN parses the rendered plan."""
    code, _, _ = run_cli(capsys, "render", str(TINY), "-o", str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.stages", "preprocess", "--plan",
                           str(tmp_path / "plan.json")], capture_output=True, text=True)
    assert proc.returncode == 2 and "--shard" in proc.stderr
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps({"schema": 99, "run_id": "x"}))
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.stages", "train", "--plan", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "re-render" in proc.stderr


def test_submit_rejects_hostile_run_ids_before_doing_anything(tmp_path: Path) -> None:
    env = {**os.environ, "LINGJUN_STATE_DIR": str(tmp_path / "state")}
    for bad in ("$(touch pwned)", "a b", "x;y", "../up", "-flag", "a\nb"):
        proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", "submit", str(EXAMPLE), "--executor",
                               "local", "--run-id", bad], capture_output=True, text=True, cwd=tmp_path, env=env)
        assert proc.returncode == 2, (bad, proc.stderr)
        assert "--run-id" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_run_commands_on_unknown_runs_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "LINGJUN_STATE_DIR": str(tmp_path / "state")}
    for args in (["status", "nope"], ["logs", "nope"], ["cancel", "nope"], ["resubmit", "nope", "--from", "x"]):
        proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", *args], capture_output=True, text=True,
                              env=env)
        assert proc.returncode == 2 and "no run matches 'nope'" in proc.stderr, (args, proc.stderr)
