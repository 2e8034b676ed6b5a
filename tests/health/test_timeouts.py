"""Every probe has a timeout and the whole run a budget inside slurmd's 60 s HealthCheckProgram
limit (SchedMD/slurm src/slurmd/slurmd/slurmd.c run_script_health_check: max_wait 60 * 1000 in
22.05; HealthCheckTimeout, default 60, since 26.05). No speed is asserted here: these check that
a hung probe is killed with the timeout its verdict names (bench/health_runtime.py measures).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from tests.health.machines import Node, azure_nd_h200_v5, lines


@pytest.fixture
def ib(tmp_path: Path) -> Node:
    return Node(tmp_path, azure_nd_h200_v5())


def gone(pid: int, within: float = 10.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_hung_nvidia_smi_is_killed_and_named(ib: Node, tmp_path: Path) -> None:
    pidfile = tmp_path / "smi.pid"
    ib.change(config={"CMD_TIMEOUT": "2", "ENROOT_IMAGE": "health-probe"})
    proc = ib.run(FAKE_SMI_HANG="1", FAKE_SMI_PIDFILE=str(pidfile))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    reason = "nvidia-smi -q timed out after 2 s, expected 8 GPUs"
    assert lines(proc, "FAIL")[0] == f"FAIL gpu-count {reason}"
    assert "SKIP gpu-nvlink not asked: nvidia-smi -q timed out after 2 s" in lines(proc)
    # the container starts without the GPU hook: the driver is what hangs
    assert "SKIP gpu-container not tried: nvidia-smi -q timed out after 2 s" in lines(proc)
    assert ib.enroot_calls() == [["start", "health-probe", "true"]]
    assert ib.slurm()["reason"].startswith(f"lingjun-health: {reason}")
    assert gone(int(pidfile.read_text())), "the hung nvidia-smi was left running"


def test_the_budget_caps_each_probe(ib: Node) -> None:
    """TIME_BUDGET=12 leaves 12 - 8 (kept for scontrol) = 4 s for the checks: the hung nvidia-smi
    gets at most 4 s although CMD_TIMEOUT is 20 (3 s when the clock's second ticks over during the
    checks before it: the script's clock counts whole seconds), and the probes after it that have
    no time left say so."""
    ib.change(config={"CMD_TIMEOUT": "20", "TIME_BUDGET": "12"})
    proc = ib.run(FAKE_SMI_HANG="1")
    first = lines(proc, "FAIL")[0]
    got = re.fullmatch(r"FAIL gpu-count nvidia-smi -q timed out after (\d+) s, expected 8 GPUs", first)
    assert got and 1 <= int(got.group(1)) <= 4, proc.stdout
    assert any(ln.startswith("FAIL enroot-space df ") and "no time left of TIME_BUDGET=12 s" in ln
               for ln in lines(proc)), proc.stdout
    assert ib.slurm()["state"] == "IDLE+DRAIN", "the drain still has its reserved time"


def test_a_hung_scontrol_ends_the_run(ib: Node) -> None:
    ib.change(config={"CMD_TIMEOUT": "2"})
    ib.set_port("mlx5_ib2", state="1: DOWN", phys_state="2: Polling")
    proc = ib.run(FAKE_SLURM_HANG="1")
    assert proc.returncode == 1
    assert f"lingjun-health: cannot read the state of node {ib.name} (timed out after 2 s); not drained" in proc.stderr
