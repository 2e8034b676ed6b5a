"""lingjun-health --only: a subset of the checks (the job pre-flight's NCCL checks), on the real
H100 node tree (tests/fixtures/health/real/sysfs-class-infiniband/gpud-h100-0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.health.machines import Node, gpud_h100, lines, roce_a100, statuses


@pytest.fixture
def h100(tmp_path: Path) -> Node:
    return Node(tmp_path, gpud_h100())


def test_only_reports_the_checks_asked_for(h100: Node) -> None:
    proc = h100.run("--no-drain", "--only", "ib-ports,roce-gid,socket-if")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(statuses(proc)) == {"ib-ports", "roce-gid", "socket-if"}
    assert h100.calls() == []  # no scontrol at all


def test_only_still_fails_on_what_it_checks(h100: Node) -> None:
    (h100.root / "sys/class/infiniband/mlx5_5/ports/1/state").write_text("1: DOWN\n")
    proc = h100.run("--no-drain", "--json", "--only=ib-ports")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["healthy"] is False
    assert [(c["status"], c["check"], c["detail"]) for c in doc["checks"]] == [
        ("FAIL", "ib-ports", "mlx5_5 port 1 DOWN")]
    # the failure is outside the subset: the subset passes
    assert h100.run("--no-drain", "--only", "socket-if").returncode == 0


def test_only_runs_what_a_check_depends_on_without_reporting_it(tmp_path: Path) -> None:
    """roce-gid judges the ports check_ib_ports selects: asked alone it still sees them."""
    node = Node(tmp_path, roce_a100())
    proc = node.run("--no-drain", "--only", "roce-gid")
    assert lines(proc) == ["OK roce-gid GID 3 is RoCE v2 on 9 ports"], proc.stdout + proc.stderr
    proc = node.run("--no-drain", "--only", "roce-gid", NCCL_IB_GID_INDEX="2")
    assert proc.returncode == 1
    assert lines(proc, "FAIL")[0] == "FAIL roce-gid mlx5_0 port 1 GID 2 is IB/RoCE v1, not RoCE v2"


def test_gpu_xid_alone_uses_the_gpu_inventory(h100: Node) -> None:
    from tests.health.machines import epoch

    proc = h100.run("--no-drain", "--only", "gpu-xid", LINGJUN_HEALTH_NOW=str(epoch("2025-02-23T17:00:00")))
    assert lines(proc) == ["FAIL gpu-xid GPU 4 XID 119 GSP RPC Timeout (NVIDIA: RESET_GPU)"], proc.stdout


@pytest.mark.parametrize("args, message", [
    (("--only", "ib-ports"), "--only needs --no-drain"),
    (("--no-drain", "--only", "ib-port"), "--only: unknown check 'ib-port'"),
    (("--no-drain", "--only", ","), "--only needs at least one check name"),
    (("--no-drain", "--boot", "--only", "ib-ports"), "--only cannot be used with --boot"),
    (("--no-drain", "--only"), "--only needs a value"),
])
def test_bad_only_is_a_usage_error(h100: Node, args: tuple[str, ...], message: str) -> None:
    proc = h100.run(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert h100.updates() == []


def test_without_only_every_check_still_reports(h100: Node) -> None:
    assert len(statuses(h100.run("--no-drain"))) == 12


@pytest.mark.parametrize("hca, missing", [
    ("=mlx5_0,mlx5_99", "mlx5_99"),  # exact list, one name this node lacks
    ("mlx5_0:1,mlx5_9:2", "mlx5_9 port 2"),  # the device is there, the port is not
    ("ib_", "ib_"),  # a prefix no device has
])
def test_every_device_an_nccl_ib_hca_list_names_must_exist(h100: Node, hca: str, missing: str) -> None:
    """NCCL uses the devices of the list it finds and ignores the rest silently."""
    proc = h100.run("--no-drain", "--only", "ib-ports", NCCL_IB_HCA=hca)
    assert proc.returncode == 1
    assert f"FAIL ib-ports NCCL_IB_HCA names {missing}, which this node does not have" in lines(proc), proc.stdout


def test_an_exclusion_list_names_nothing_that_must_exist(h100: Node) -> None:
    proc = h100.run("--no-drain", "--only", "ib-ports", NCCL_IB_HCA="^mlx5_99")
    assert proc.returncode == 0, proc.stdout
