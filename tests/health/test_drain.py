"""Drain and resume: lingjun-health drains with a precise reason and resumes only the nodes it drained.

scontrol is a stand-in (tests/health/machines.py) that keeps the node's State/Reason and prints
them in Slurm 22.05's `scontrol show node -o` format; the same flows run against a real Slurm
in tests/health/test_slurm.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.health.machines import Node, azure_nd_h200_v5, lines, packaged_program

REASON = "lingjun-health: mlx5_ib2 port 1 DOWN"


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path, azure_nd_h200_v5())


def break_port(node: Node, hca: str = "mlx5_ib2") -> None:
    node.set_port(hca, state="1: DOWN", phys_state="2: Polling")


def heal_port(node: Node, hca: str = "mlx5_ib2") -> None:
    node.set_port(hca, state="4: ACTIVE", phys_state="5: LinkUp")


def heal_in_place(node: Node, hca: str = "mlx5_ib2") -> None:
    """The port comes up without rebuilding the tree (which would also drop /var/lib's state)."""
    d = node.root / "sys/class/infiniband" / hca / "ports/1"
    (d / "state").write_text("4: ACTIVE\n")
    (d / "phys_state").write_text("5: LinkUp\n")


def test_drain_then_resume_its_own_drain(node: Node) -> None:
    break_port(node)
    proc = node.run()
    assert proc.returncode == 1 and f"DRAIN {node.name} {REASON}" in proc.stdout
    assert node.slurm() == {"state": "IDLE+DRAIN", "reason": REASON}
    proc = node.run()  # still failing, same reason: Slurm is left alone (no new timestamp)
    assert proc.returncode == 1 and "(already drained)" in proc.stdout and len(node.updates()) == 1
    heal_port(node)
    proc = node.run()
    assert proc.returncode == 0 and f"RESUME {node.name} (was drained: {REASON})" in proc.stdout
    assert node.updates()[-1] == ["update", f"NodeName={node.name}", "State=RESUME"]
    assert node.slurm() == {"state": "IDLE", "reason": ""}
    node.run()  # healthy and not drained: nothing to do
    assert len(node.updates()) == 2


@pytest.mark.parametrize("state", ["IDLE+DRAIN", "MIXED+DRAIN", "ALLOCATED+DRAIN", "DOWN+DRAIN"])
def test_resumes_own_drain_in_any_drain_state(node: Node, state: str) -> None:
    node.set_slurm(state, "lingjun-health: GPU 3 XID 79")
    proc = node.run()
    assert proc.returncode == 0 and node.updates() == [["update", f"NodeName={node.name}", "State=RESUME"]]


def test_a_new_failure_replaces_its_own_older_reason(node: Node) -> None:
    node.set_slurm("IDLE+DRAIN", "lingjun-health: GPU 3 XID 79")
    break_port(node)
    assert node.run().returncode == 1
    assert node.slurm()["reason"] == REASON


@pytest.mark.parametrize("foreign", ["maintenance: swap DIMM B3", "Kill task failed", "lingjun health check (manual)"])
def test_never_resumes_or_rewrites_a_drain_by_someone_else(node: Node, foreign: str) -> None:
    node.set_slurm("IDLE+DRAIN", foreign)
    proc = node.run()  # healthy, but drained by an admin or by Slurm itself
    assert proc.returncode == 0 and f"KEEP {node.name} drained by someone else: {foreign}" in proc.stdout
    break_port(node)
    proc = node.run()  # failing: their reason stays
    assert proc.returncode == 1 and f"KEEP {node.name} drained by someone else: {foreign}" in proc.stdout
    assert node.updates() == [] and node.slurm() == {"state": "IDLE+DRAIN", "reason": foreign}


@pytest.mark.parametrize("state", ["DOWN", "DOWN*", "IDLE+FAIL"])
def test_never_drains_over_a_node_someone_else_took_down(node: Node, state: str) -> None:
    """An admin's DOWN (or Slurm's "Not responding") keeps its reason: drained over, the reason
    would become ours and the next passing check would put the node back into service."""
    node.set_slurm(state, "maintenance: replace PSU")
    break_port(node)
    proc = node.run()
    assert proc.returncode == 1 and f"KEEP {node.name} {state} by someone else: maintenance: replace PSU" in proc.stdout
    assert node.updates() == [] and node.slurm() == {"state": state, "reason": "maintenance: replace PSU"}
    heal_port(node)
    assert node.run().returncode == 0 and node.updates() == []


def test_no_drain_never_calls_scontrol(node: Node) -> None:
    break_port(node)
    assert node.run("--no-drain").returncode == 1
    node.set_slurm("IDLE+DRAIN", REASON)
    heal_port(node)
    assert node.run("--no-drain").returncode == 0
    assert node.calls() == []


def test_slurm_unreachable_in_periodic_mode(node: Node) -> None:
    break_port(node)
    proc = node.run(FAKE_SLURM_DOWN="1")
    assert proc.returncode == 1 and node.updates() == []
    assert (f"lingjun-health: cannot read the state of node {node.name} (rc 1: slurm_load_node error: Unable to "
            "contact slurm controller (connect failure)); not drained") in proc.stderr
    heal_port(node)
    proc = node.run(FAKE_SLURM_DOWN="1")  # healthy, but cannot tell whether to resume: say so
    assert proc.returncode == 1 and "cannot read the state of node" in proc.stderr


def test_boot_failure_is_recorded_then_drained_by_the_next_run(node: Node) -> None:
    boot_file = node.root / "var/lib/lingjun-slurm/health/boot-failure"
    break_port(node)
    proc = node.run("--boot", FAKE_SLURM_DOWN="1")
    assert proc.returncode == 1 and f"BOOT-FAILURE {node.name} {REASON}: Slurm not reachable" in proc.stdout
    stamp, reason = boot_file.read_text().rstrip("\n").split(" ", 1)
    assert reason == REASON and stamp.endswith("Z")
    proc = node.run()  # the periodic run, Slurm up: drains and clears the record
    assert proc.returncode == 1 and node.slurm()["reason"] == REASON and not boot_file.exists()


def test_boot_failure_cleared_when_healthy_later(node: Node) -> None:
    boot_file = node.root / "var/lib/lingjun-slurm/health/boot-failure"
    break_port(node)
    node.run("--boot", FAKE_SLURM_DOWN="1")
    assert boot_file.exists()
    heal_in_place(node)
    proc = node.run("--json")
    assert proc.returncode == 0 and not boot_file.exists() and node.updates() == []
    assert json.loads(proc.stdout)["message"] == f"the boot check's failure ({REASON}) is no longer seen"


def test_boot_mode_with_slurm_up_drains_and_a_healthy_boot_is_quiet(node: Node) -> None:
    break_port(node)
    proc = node.run("--boot")
    assert proc.returncode == 1 and node.slurm()["reason"] == REASON
    heal_port(node)
    proc = node.run("--boot", "--json")
    assert proc.returncode == 0 and '"mode": "boot"' in proc.stdout and node.slurm()["state"] == "IDLE"
    proc = node.run("--boot", FAKE_SLURM_DOWN="1")  # healthy at boot, Slurm not up yet: fine
    assert proc.returncode == 0 and proc.stderr == ""


def test_boot_failure_file_not_writable(node: Node) -> None:
    break_port(node)  # (rebuilds the tree)
    state = node.root / "var/lib/lingjun-slurm"
    state.mkdir(parents=True)
    (state / "health").write_text("a file where the state directory should be")
    proc = node.run("--boot", FAKE_SLURM_DOWN="1")
    assert proc.returncode == 1 and "cannot be written" in proc.stderr


def test_node_name_from_slurmd_then_hostname(node: Node) -> None:
    break_port(node)
    env = node.base_env()
    env.update(SLURMD_NODENAME=node.name)
    proc = subprocess.run(["bash", str(packaged_program()), "--root", str(node.root)], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 1 and node.slurm()["reason"] == REASON, proc.stdout + proc.stderr
    del env["SLURMD_NODENAME"]
    proc = subprocess.run(["bash", str(packaged_program()), "--root", str(node.root)], capture_output=True, text=True,
                          env=env)
    short = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    assert ["show", "node", "-o", short] in node.calls()
    assert f"lingjun-health: cannot read the state of node {short}" in proc.stderr  # not a node of this "cluster"


def test_output_lines_are_one_per_check_then_the_action(node: Node) -> None:
    break_port(node)
    out = node.run().stdout.splitlines()
    assert out[:-1] == lines(node.run("--no-drain")) and out[-1].startswith("DRAIN ")


@pytest.mark.parametrize("state,reason", [
    ("DOWN+NOT_RESPONDING", "Not responding"),  # slurmctld's view before slurmd answers
    ("IDLE+CLOUD+POWERING_UP", ""),  # a CycleCloud node being resumed
    ("IDLE+CLOUD+POWERED_DOWN", ""),
    ("UNKNOWN", ""),  # slurmctld restarted, the node not heard from yet
])
def test_boot_keeps_the_verdict_until_slurmd_registers(node: Node, state: str, reason: str) -> None:
    """At boot (cluster-init), before slurmd registered, the verdict stays on the node; slurmd's
    first HealthCheckProgram run (at slurmd start, before it registers: slurmd.c main ->
    run_script_health_check) applies it."""
    boot_file = node.root / "var/lib/lingjun-slurm/health/boot-failure"
    node.set_slurm(state, reason)
    break_port(node)
    proc = node.run("--boot")
    assert proc.returncode == 1 and node.updates() == [], proc.stdout
    why = f"slurmd has not registered yet (State={state}{', Reason=' + reason if reason else ''})"
    assert f"BOOT-FAILURE {node.name} {REASON}: {why}; the verdict is kept in {boot_file} for slurmd's first " \
           "HealthCheckProgram run" in proc.stdout
    assert boot_file.read_text().rstrip("\n").split(" ", 1)[1] == REASON
    proc = node.run()  # slurmd's first run: still not registered, and it applies the verdict
    assert proc.returncode == 1 and node.updates() == [
        ["update", f"NodeName={node.name}", "State=DRAIN", f"Reason={REASON}"]], proc.stdout
    assert node.slurm()["reason"] == REASON and "DRAIN" in node.slurm()["state"]
    assert "the boot check's verdict, kept since " in proc.stdout and " applied)" in proc.stdout
    assert not boot_file.exists()


def test_slurms_own_not_responding_is_not_someone_elses_verdict(node: Node) -> None:
    """A periodic run comes from a running slurmd: Slurm's "Not responding" (which it clears
    itself on registration, node_mgr.c) is drained over, an admin's DOWN is not."""
    node.set_slurm("DOWN+NOT_RESPONDING", "Not responding")
    break_port(node)
    proc = node.run()
    assert proc.returncode == 1 and node.slurm() == {"state": "DOWN+DRAIN+NOT_RESPONDING", "reason": REASON}
    node.set_slurm("DOWN", "Not responding")  # no NOT_RESPONDING flag: someone set it DOWN with that text
    proc = node.run()
    assert f"KEEP {node.name} DOWN by someone else: Not responding" in proc.stdout
    node.set_slurm("DOWN+NOT_RESPONDING", "Not responding")
    heal_port(node)
    proc = node.run()  # healthy: nothing of ours to resume, Slurm's state is Slurm's
    assert proc.returncode == 0 and node.slurm() == {"state": "DOWN+NOT_RESPONDING", "reason": "Not responding"}


def test_a_pending_boot_verdict_is_dropped_when_the_node_is_healthy_by_then(node: Node) -> None:
    boot_file = node.root / "var/lib/lingjun-slurm/health/boot-failure"
    node.set_slurm("IDLE+CLOUD+POWERING_UP", "")
    break_port(node)
    node.run("--boot")
    assert boot_file.exists()
    heal_in_place(node)
    node.set_slurm("IDLE+CLOUD", "")
    proc = node.run("--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["action"] == "none" and not boot_file.exists()
    assert doc["message"] == f"the boot check's failure ({REASON}) is no longer seen"
