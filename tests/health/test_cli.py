"""`lingjun-slurm health` runs the packaged program and passes its output and exit status through."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from lingjun_slurm.cli.main import cli
from lingjun_slurm.cli.health import health_argv
from tests.health.machines import Node, azure_nd_h200_v5


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    n = Node(tmp_path, azure_nd_h200_v5())
    for key in [k for k in os.environ if k.startswith(("NCCL_", "SLURM"))]:
        monkeypatch.delenv(key)
    for key, value in n.base_env().items():  # the stand-ins' PATH and settings
        monkeypatch.setenv(key, value)
    return n


def test_argv() -> None:
    assert health_argv(Path("/etc/h.conf"), "cpu", True, True, "n5", Path("/r"), True) == [
        "--config", "/etc/h.conf", "--sku", "cpu", "--node", "n5", "--root", "/r", "--no-drain", "--json", "--boot"]
    assert health_argv(None, None, False, False, None, None, False) == []


def test_healthy_json_and_exit_codes(node: Node) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["health", "--root", str(node.root), "--node", node.name, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["healthy"] is True and doc["node"] == node.name and doc["action"] == "none"
    node.set_port("mlx5_ib2", state="1: DOWN", phys_state="2: Polling")
    res = runner.invoke(cli, ["health", "--root", str(node.root), "--node", node.name])
    assert res.exit_code == 1 and "FAIL ib-ports mlx5_ib2 port 1 DOWN" in res.stdout
    assert node.slurm()["reason"] == "lingjun-health: mlx5_ib2 port 1 DOWN"
    res = runner.invoke(cli, ["health", "--root", str(node.root), "--sku", "nope", "--no-drain"])
    assert res.exit_code == 2 and "no thresholds for SKU 'nope'" in res.stderr


def test_through_the_console_entry_point_without_torch(node: Node) -> None:
    code = ("import sys; from lingjun_slurm.cli.main import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron', 'numpy')]\n"
            "    print('HEAVY', heavy, file=sys.stderr); raise\n")
    proc = subprocess.run([sys.executable, "-c", code, "health", "--root", str(node.root), "--node", node.name,
                           "--no-drain"], capture_output=True, text=True, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert "OK gpu-count 8 GPUs" in proc.stdout and "HEAVY" not in proc.stderr
    node.set_port("mlx5_ib2", state="1: DOWN", phys_state="2: Polling")
    proc = subprocess.run([sys.executable, "-c", code, "health", "--root", str(node.root), "--node", node.name],
                          capture_output=True, text=True, env=dict(os.environ))
    assert proc.returncode == 1 and "HEAVY []" in proc.stderr, proc.stderr  # the status survives cli.main
    assert node.slurm()["reason"] == "lingjun-health: mlx5_ib2 port 1 DOWN"
    help_text = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", "health", "--help"], capture_output=True,
                               text=True).stdout
    for option in ("--config", "--sku", "--no-drain", "--json", "--node", "--root", "--boot"):
        assert option in help_text
