"""lingjun-health judged on real outputs of real machines (tests/fixtures/health/real/, each cited
in tests/fixtures/health/SOURCES.md): an H100 node's InfiniBand sysfs with an Ethernet front-end
bond, `nvidia-smi -q` of 8x H100 and of an A10 that needs a reset, a kernel log with XID 119, a
kernel log with a GPU that fell off the bus, `nvidia-smi nvlink --status` and `lspci -nn` of an
NVSwitch A100 system. Where a case changes a real output, it says how.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.health.machines import (A10_Q, FIXTURES, REAL, REPO, Machine, Node, azure_nd_a100_v4, epoch, gpud_h100,
                                   lines, statuses)


def first_failure(proc) -> str:  # type: ignore[no-untyped-def]
    fails = lines(proc, "FAIL")
    assert fails, proc.stdout + proc.stderr
    return fails[0].split(" ", 2)[2]


@pytest.fixture
def h100(tmp_path: Path) -> Node:
    return Node(tmp_path, gpud_h100())


def test_a_healthy_h100_node_with_an_ethernet_bond_passes(h100: Node) -> None:
    """NCCL_IB_HCA=mlx5 (the generic-ib profile) also selects mlx5_bond_0, whose link layer is
    Ethernet: NCCL cannot mix it with the InfiniBand ports in one connection, so it is not the
    fabric this node is judged on; the eight InfiniBand ports are."""
    proc = h100.run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK gpu-count 8 GPUs" in lines(proc)
    assert "OK ib-ports 8 ports ACTIVE, LinkUp, >= 400 Gb/s, InfiniBand (NCCL_IB_HCA=mlx5); not judged: " \
           "mlx5_bond_0:1 (Ethernet)" in lines(proc), proc.stdout
    assert "OK gpu-fabric nvidia-fabricmanager active, 8 GPUs fabric state Completed" in lines(proc)
    assert h100.updates() == []


def test_the_bond_is_judged_when_nccl_would_use_only_it(h100: Node) -> None:
    (h100.root / "sys/class/infiniband/mlx5_bond_0/ports/1/state").write_text("1: DOWN\n")
    assert h100.run("--no-drain").returncode == 0  # not the fabric: not judged
    proc = h100.run("--no-drain", NCCL_IB_HCA="=mlx5_bond_0")  # the only device NCCL would use now
    assert first_failure(proc) == "0 RDMA ports match NCCL_IB_HCA==mlx5_bond_0 (InfiniBand), expected 8"


def test_a_down_infiniband_port_of_the_real_tree_drains(h100: Node) -> None:
    (h100.root / "sys/class/infiniband/mlx5_7/ports/1/state").write_text("1: DOWN\n")
    proc = h100.run()
    assert proc.returncode == 1 and first_failure(proc) == "mlx5_7 port 1 DOWN"
    assert h100.slurm()["reason"] == "lingjun-health: mlx5_7 port 1 DOWN"


def test_xid_119_drains_within_the_window_and_a_recovered_node_resumes(h100: Node) -> None:
    """The real log: XID 119 (GSP RPC timeout) on PCI 0000:9b:00 = GPU 4 of the real report, last
    at 16:30:13 on 2025-02-23. NVIDIA's catalog: RESET_GPU. Half an hour later it drains; the next
    day (no new XID) the node is healthy again and its own drain is resumed: no reboot needed."""
    proc = h100.run(LINGJUN_HEALTH_NOW=str(epoch("2025-02-23T17:00:00")))
    assert proc.returncode == 1 and first_failure(proc) == "GPU 4 XID 119 GSP RPC Timeout (NVIDIA: RESET_GPU)"
    assert h100.slurm() == {"state": "IDLE+DRAIN", "reason": "lingjun-health: GPU 4 XID 119 GSP RPC Timeout "
                                                             "(NVIDIA: RESET_GPU)"}
    proc = h100.run()  # 2025-02-24 12:00
    assert proc.returncode == 0, proc.stdout
    assert "OK gpu-xid no XIDs in the kernel log within 2 h; older than 2 h, not judged: XID 119" in lines(proc)
    assert h100.slurm() == {"state": "IDLE", "reason": ""} and "RESUME gpu-node-7 " in proc.stdout


def test_xids_since_boot_when_the_site_asks(h100: Node) -> None:
    h100.change(dropins={**h100.machine.dropins, "90-xid.conf": "GPU_XID_WINDOW_HOURS=\n"})
    assert first_failure(h100.run("--no-drain")) == "GPU 4 XID 119 GSP RPC Timeout (NVIDIA: RESET_GPU)"


def test_a_reset_gpu_xid_past_the_window_stops_draining_without_a_reset(h100: Node) -> None:
    """The window does not know whether the GPU was reset: the real report says "Reset Required: No"
    (the driver sets it only for some errors), so the next day the node passes although XID 119's
    RESET_GPU was never done (docs/health-checks.md). A larger window keeps it drained."""
    assert "        Reset Required                    : No" in h100.q()
    assert h100.run("--no-drain").returncode == 0  # 2025-02-24 12:00, 19.5 h after the XID
    h100.change(dropins={**h100.machine.dropins, "90-xid.conf": "GPU_XID_WINDOW_HOURS=48\n"})
    assert first_failure(h100.run("--no-drain")) == "GPU 4 XID 119 GSP RPC Timeout (NVIDIA: RESET_GPU)"


def test_a_gpu_that_fell_off_the_bus_without_an_xid_line_fails(h100: Node) -> None:
    """gpud's real log of a GPU lost at PCI 0000:91:00: the driver printed both "NVRM: Xid (...): 79"
    and "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus." Without the Xid line (it is
    rate-limited and may be missing, or the log may only keep the second line) the second line
    alone is XID 79. The stamps count from boot: uptime 60 s past the last line."""
    real = (REAL / "kern/gpud-sxid-readme-xid79.log").read_text()
    h100.change(kernel_log="real/kern/gpud-sxid-readme-xid79.log", uptime=6781753 + 60)
    reason = "GPU PCI:0000:91:00 XID 79 GPU has fallen off the bus (NVIDIA: RESTART_BM)"
    proc = h100.run("--no-drain")
    assert lines(proc, "FAIL") == [f"FAIL gpu-xid {reason}"], proc.stdout  # both lines: one failure
    log = h100.root / "var/log/kern.log"
    log.write_text("".join(ln for ln in real.splitlines(keepends=True) if "Xid (" not in ln))  # the Xid line dropped
    assert "Xid" not in log.read_text() and "fallen off the bus" in log.read_text()
    proc = h100.run("--no-drain")
    assert lines(proc, "FAIL") == [f"FAIL gpu-xid {reason}"], proc.stdout


def test_a_gpu_that_fell_off_the_bus_at_driver_load(h100: Node) -> None:
    """The driver's probe message over three lines (the lines of gpud's xid component test,
    components/accelerator/nvidia/xid/component_test.go, with GPU 4's bus id and the H100's PCI
    id): the bus id on the first, "fallen off the bus" on the third. Uptime 9000 s."""
    (h100.root / "var/log/kern.log").write_text(
        "[ 8935.101010] NVRM: The NVIDIA GPU 0000:9b:00.0\n"
        "[ 8935.101011] NVRM: (PCI ID: 10de:2330) installed in this system has\n"
        "[ 8935.101012] NVRM: fallen off the bus and is not responding to commands.\n")
    assert first_failure(h100.run("--no-drain")) == "GPU 4 XID 79 GPU has fallen off the bus (NVIDIA: RESTART_BM)"


def a10(tmp_path: Path) -> Node:
    """The real A10 report on a GPU node without RDMA (tcp thresholds: at least one GPU)."""
    return Node(tmp_path, Machine("tcp", "tcp", [], {"lo": ("unknown", "1"), "eth0": ("up", "1")}, A10_Q.read_text(),
                                  services={}))


def test_the_real_a10_report_needs_a_reset(tmp_path: Path) -> None:
    """Remapped Rows: Uncorrectable Error 4, Pending Yes: a row remap waits for a GPU reset. Four
    rows are far below Azure's 512; the pending remap fails."""
    node = a10(tmp_path)
    proc = node.run()
    assert proc.returncode == 1 and first_failure(proc) == "GPU 0 row remapping pending (reset the GPU)", proc.stdout
    assert lines(proc, "FAIL") == ["FAIL gpu-ecc GPU 0 row remapping pending (reset the GPU)"]
    assert "OK gpu-count 1 GPUs" in lines(proc)
    assert "SKIP gpu-fabric no NVSwitch on the PCI bus and no GPU fabric state: no Fabric Manager needed" in lines(proc)
    node.set_gpu_field(0, ("Remapped Rows", "Pending"), "No")  # after the reset
    assert node.run().returncode == 0
    node.set_gpu_field(0, ("Remapped Rows", "Uncorrectable Error"), "600")  # past Azure's 512
    assert first_failure(node.run("--no-drain")) == "GPU 0 600 rows remapped for uncorrectable errors, limit 512"


def test_an_a10_without_nvlink(tmp_path: Path) -> None:
    node = a10(tmp_path)
    node.set_nvlink((REAL / "nvlink/gpud-a10-nvlink-status.txt").read_text())  # real: empty
    node.set_gpu_field(0, ("Remapped Rows", "Pending"), "No")
    proc = node.run("--no-drain")
    assert "SKIP gpu-nvlink no NVLink reported by nvidia-smi nvlink --status" in lines(proc)
    node.change(config={"NVLINK": "yes"})
    assert first_failure(node.run("--no-drain")) == "no NVLink reported by nvidia-smi nvlink --status (NVLINK=yes)"


@pytest.fixture
def a100(tmp_path: Path) -> Node:
    return Node(tmp_path, azure_nd_a100_v4())


def test_the_real_nvswitch_a100_system(a100: Node) -> None:
    proc = a100.run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK gpu-nvlink 96 links active" in lines(proc)
    assert "OK gpu-fabric nvidia-fabricmanager active, 6 NVSwitches" in lines(proc)  # A100: no GPU fabric state
    assert "OK gpu-peermem nvidia_peermem loaded" in lines(proc)


def test_an_inactive_link_in_the_real_nvlink_status(a100: Node) -> None:
    rows = a100.nvlink().splitlines(keepends=True)
    start = next(i for i, ln in enumerate(rows) if ln.startswith("GPU 3: "))
    rows[start + 8] = "         Link 7: <inactive>\n"  # GPU 3's link 7
    rows[start + 12] = "         Link 11: <inactive>\n"
    a100.set_nvlink("".join(rows))
    assert first_failure(a100.run("--no-drain")) == "GPU 3 NVLinks 7, 11 inactive"


def test_fabric_manager_required_where_an_nvswitch_is_on_the_bus(a100: Node) -> None:
    """FABRIC_MANAGER=auto (the generic and Lingjun thresholds): the real lspci's NVSwitch bridges
    make Fabric Manager required; without NVSwitches, nothing is required."""
    a100.change(services={"nvidia-fabricmanager": "inactive"})
    assert first_failure(a100.run("--no-drain")) == \
        "nvidia-fabricmanager is inactive (NVSwitch system: Fabric Manager must run)"
    a100.change(config={"FABRIC_MANAGER": "auto"})
    assert first_failure(a100.run("--no-drain")) == \
        "nvidia-fabricmanager is inactive (NVSwitch system: Fabric Manager must run)"
    a100.change(lspci=None)
    proc = a100.run("--no-drain")
    assert "SKIP gpu-fabric no NVSwitch on the PCI bus and no GPU fabric state: no Fabric Manager needed" in lines(proc)


def test_hopper_fabric_state_from_the_real_report(h100: Node) -> None:
    """No NVSwitch in this tree's PCI listing (none recorded), but the real H100 report says each
    GPU's fabric registration completed: Fabric Manager did its job and must keep running."""
    h100.change(services={"nvidia-fabricmanager": "failed"})
    assert first_failure(h100.run("--no-drain")) == "nvidia-fabricmanager is failed (NVSwitch system: Fabric Manager must run)"
    h100.change(services={"nvidia-fabricmanager": "active"})
    h100.set_gpu_field(6, ("Fabric", "State"), "Not Started")
    assert first_failure(h100.run("--no-drain")) == "GPU 6 fabric state Not Started, status Success (Fabric Manager)"


def test_real_outputs_are_verbatim_and_cited() -> None:
    sources = (FIXTURES / "SOURCES.md").read_text()
    for path in sorted(p for p in REAL.rglob("*") if p.is_file()):
        rel = path.relative_to(FIXTURES)
        top = rel.parts[:3] if rel.parts[1] == "sysfs-class-infiniband" else rel.parts
        assert "/".join(top) in sources, rel
    shared = REPO.parent / "shared" / "reference" / "real-samples" / "health"
    if shared.is_dir():  # the project brief's copies: ours must be the same bytes
        assert (REAL / "nvidia-smi-q/gpud-535.161.08-h100x8.txt").read_bytes() == \
            (shared / "nvidia-smi-q/gpud_nvidia-smi-query.535.161.08.out.0.valid.txt").read_bytes()
        assert (REAL / "kern/gpud-dmesg-with-xid-119.log").read_bytes() == \
            (shared / "kern/gpud_dmesg-with-xid-119.log").read_bytes()


def test_every_check_reports_on_the_real_node(h100: Node) -> None:
    got = statuses(h100.run("--no-drain"))
    assert set(got) == {"gpu-count", "gpu-ecc", "gpu-xid", "gpu-fabric", "gpu-nvlink", "gpu-peermem", "ib-ports",
                        "roce-gid", "socket-if", "enroot-start", "gpu-container", "enroot-space"}
