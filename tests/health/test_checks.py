"""lingjun-health against node trees of an Azure ND H200 v5 (InfiniBand) and a RoCE A100 node, healthy and with each failure.

The trees (tests/health/machines.py) follow public dumps of those machines; their `nvidia-smi -q`
reports are the real H100 report of tests/fixtures/health/real/ with their bus ids (sources in
tests/fixtures/health/SOURCES.md). Real outputs on their own: test_real_outputs.py. nvidia-smi,
scontrol, enroot, systemctl and nvidia-container-cli are stand-ins (no GPU exists here); the
program itself, df, grep, awk, sed and date are real.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from lingjun_slurm.nodes import health
from tests.health.machines import (REPO, Node, azure_nd_h200_v5, is_executable, lines, q_set, roce_a100,
                                   statuses)


@pytest.fixture
def ib(tmp_path: Path) -> Node:
    return Node(tmp_path, azure_nd_h200_v5())


@pytest.fixture
def roce(tmp_path: Path) -> Node:
    return Node(tmp_path, roce_a100())


def first_failure(proc: subprocess.CompletedProcess[str]) -> str:
    fails = lines(proc, "FAIL")
    assert fails, proc.stdout + proc.stderr
    return fails[0].split(" ", 2)[2]


def test_program_is_shellcheck_clean_at_style_severity(shellcheck: str) -> None:
    program = REPO / "lingjun_slurm" / "nodes" / "health" / health.PROGRAM
    proc = subprocess.run([shellcheck, "--severity=style", "--shell=bash", str(program)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout
    assert is_executable(program)
    text = program.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    code = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in code if "python" in ln.lower() or ln.lstrip().startswith(("source ", ". "))]


def test_healthy_infiniband_node(ib: Node) -> None:
    proc = ib.run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert lines(proc) == [
        "OK gpu-count 8 GPUs",
        "OK gpu-ecc ECC counts within limits (SRAM correctable <= 10000, SRAM uncorrectable <= 0, DRAM <= 20000000, "
        "volatile and aggregate), no pending, failed or excess row remapping, no reset required",
        "OK gpu-xid no XIDs in the kernel log within 2 h",
        "OK gpu-fabric nvidia-fabricmanager active, 8 GPUs fabric state Completed",
        "OK gpu-nvlink 144 links active",
        "OK gpu-peermem nvidia_peermem loaded",
        "OK ib-ports 8 ports ACTIVE, LinkUp, >= 400 Gb/s, InfiniBand (IB_PORTS, all HCAs)",
        "SKIP roce-gid NCCL_IB_GID_INDEX is not set (NCCL chooses the GID)",
        "OK socket-if eth0 up 10.0.0.4 (NCCL_SOCKET_IFNAME=eth0)",
        "SKIP enroot-start no ENROOT_IMAGE configured",
        "SKIP gpu-container no ENROOT_IMAGE configured",
    ] + [ln for ln in lines(proc) if ln.startswith("OK enroot-space free: /run/enroot ")]
    assert ib.updates() == [] and ib.slurm() == {"state": "IDLE", "reason": ""}


def test_healthy_roce_node(roce: Node) -> None:
    proc = roce.run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = statuses(proc)
    assert got == {"gpu-count": {"OK"}, "gpu-ecc": {"OK"}, "gpu-xid": {"OK"}, "gpu-fabric": {"SKIP"},
                   "gpu-nvlink": {"SKIP"}, "gpu-peermem": {"SKIP"}, "ib-ports": {"OK"}, "roce-gid": {"OK"},
                   "socket-if": {"OK"}, "enroot-start": {"SKIP"}, "gpu-container": {"SKIP"}, "enroot-space": {"OK"}}
    assert "OK ib-ports 9 ports ACTIVE, LinkUp, Ethernet (NCCL_IB_HCA=mlx5)" in lines(proc)
    assert "OK roce-gid GID 3 is RoCE v2 on 9 ports" in lines(proc)
    assert "SKIP gpu-fabric no NVSwitch on the PCI bus and no GPU fabric state: no Fabric Manager needed" in lines(proc)


def gid_type(node: Node, hca: str, index: int, kind: str) -> None:
    gids = dict(node.machine.port(hca).gids)
    gids[index] = (gids[index][0], kind)
    node.set_port(hca, gids=gids)


def drop_gids(node: Node, hca: str, keep: int) -> None:
    """Only GIDs 0..keep-1 set (an address missing on the netdev leaves the entries empty)."""
    node.set_port(hca, gids={i: g for i, g in node.machine.port(hca).gids.items() if i < keep})


def drop_gpu(node: Node, index: int) -> None:
    """The -q report without GPU INDEX's block (a GPU the driver no longer lists)."""
    text = node.q()
    heads = [i for i, ln in enumerate(text.splitlines(keepends=True)) if ln.startswith("GPU 0000")]
    all_lines = text.splitlines(keepends=True)
    end = heads[index + 1] if index + 1 < len(heads) else len(all_lines)
    node.set_q("".join(all_lines[:heads[index]] + all_lines[end:]))


def link_inactive(node: Node, gpu: int, link: int) -> None:
    out, current = [], -1
    for ln in node.nvlink().splitlines(keepends=True):
        if ln.startswith("GPU "):
            current += 1
        elif current == gpu and ln.strip().startswith(f"Link {link}:"):
            ln = f"         Link {link}: <inactive>\n"
        out.append(ln)
    node.set_nvlink("".join(out))


def gpu_container(node: Node) -> None:
    node.change(config={"ENROOT_IMAGE": "health-probe"})
    node.with_driver()


SMI_DRIVER_ERROR = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                    "Make sure that the latest NVIDIA driver is installed and running.")
VOLATILE = ("ECC Errors", "Volatile")

# Each failure: how to prepare the healthy tree (None: nothing), how to break it, and the exact
# drain reason it must produce.
FAILURES: list[tuple[str, str, Callable[[Node], object] | None, Callable[[Node], object], str]] = [
    ("ib", "missing-port", None, lambda n: n.drop_port("mlx5_ib3"), "mlx5_ib3 port 1 missing"),
    ("ib", "port-down", None, lambda n: n.set_port("mlx5_ib2", state="1: DOWN", phys_state="2: Polling"),
     "mlx5_ib2 port 1 DOWN"),
    ("ib", "port-init", None, lambda n: n.set_port("mlx5_ib6", state="2: INIT"), "mlx5_ib6 port 1 INIT"),
    ("ib", "phys-not-linkup", None, lambda n: n.set_port("mlx5_ib1", phys_state="6: LinkErrorRecovery"),
     "mlx5_ib1 port 1 phys_state LinkErrorRecovery"),
    ("ib", "wrong-rate", None, lambda n: n.set_port("mlx5_ib5", rate="200 Gb/sec (4X HDR)"),
     "mlx5_ib5 port 1 at 200 Gb/s, expected 400"),
    ("ib", "wrong-link-layer", None, lambda n: n.set_port("mlx5_ib0", link_layer="Ethernet"),
     "mlx5_ib0 port 1 link layer Ethernet, expected InfiniBand"),
    ("roce", "roce-port-down", None, lambda n: n.set_port("mlx5_2", state="1: DOWN", phys_state="3: Disabled"),
     "mlx5_2 port 1 DOWN"),
    ("roce", "gid-roce-v1", None, lambda n: gid_type(n, "mlx5_1", 3, "IB/RoCE v1"),
     "mlx5_1 port 1 GID 3 is IB/RoCE v1, not RoCE v2"),
    ("roce", "gid-unset", None, lambda n: drop_gids(n, "mlx5_4", 2), "mlx5_4 port 1 GID 3 not set"),
    ("roce", "no-roce-port", None, lambda n: n.change(ports=[]),
     "0 RDMA ports match NCCL_IB_HCA=mlx5 (Ethernet), expected 1"),
    ("ib", "ifname-down", None, lambda n: n.change(netdevs={**n.machine.netdevs, "eth0": ("down", "0")}),
     "eth0 down (NCCL_SOCKET_IFNAME=eth0)"),
    ("ib", "ifname-missing", None,
     lambda n: n.change(netdevs={k: v for k, v in n.machine.netdevs.items() if k != "eth0"}),
     "no interface matches NCCL_SOCKET_IFNAME=eth0"),
    ("ib", "gpu-count-low", None, lambda n: drop_gpu(n, 7), "7 GPUs, expected 8"),
    ("roce", "gpu-lost", None,  # the driver lost GPU 4: nvidia-smi reports the others, and fails
     lambda n: (drop_gpu(n, 4), n.set_q(n.q() + "Unable to determine the device handle for GPU0000:8D:00.0: "
                                         "Unknown Error\n", rc=15)),
     "7 GPUs, expected 8 (nvidia-smi rc 15: Unable to determine the device handle for GPU0000:8D:00.0: Unknown Error)"),
    ("ib", "nvidia-smi-fails", None, lambda n: n.env.update(FAKE_SMI_FAIL="1"),  # the message, cut at 120 characters
     f"nvidia-smi failed (rc 9: {SMI_DRIVER_ERROR[:120]}), expected 8 GPUs"),
    # Outside Azure (the Lingjun thresholds): the volatile counts summed, no uncorrected error.
    ("roce", "ecc-uncorrected", None, lambda n: n.set_gpu_field(3, VOLATILE + ("DRAM Uncorrectable",), "2"),
     "GPU 3 2 uncorrected ECC errors"),
    ("roce", "ecc-sram-uncorrected", None,
     lambda n: n.set_gpu_field(0, VOLATILE + ("SRAM Uncorrectable SEC-DED",), "1"), "GPU 0 1 uncorrected ECC errors"),
    # On Azure: each counter against Azure's limit (test_azure_policy.py has every rule).
    ("ib", "ecc-corrected", None, lambda n: n.set_gpu_field(6, VOLATILE + ("DRAM Correctable",), "20000001"),
     "GPU 6 20000001 DRAM correctable ECC errors (volatile), limit 20000000"),
    ("ib", "row-remap-pending", None, lambda n: n.set_gpu_field(5, ("Remapped Rows", "Pending"), "Yes"),
     "GPU 5 row remapping pending (reset the GPU)"),
    ("ib", "row-remap-failed", None,
     lambda n: n.set_gpu_field(1, ("Remapped Rows", "Remapping Failure Occurred"), "Yes"), "GPU 1 row remapping failed"),
    ("ib", "row-remap-uncorrectable", None,
     lambda n: n.set_gpu_field(2, ("Remapped Rows", "Uncorrectable Error"), "513"),
     "GPU 2 513 rows remapped for uncorrectable errors, limit 512"),
    ("ib", "reset-required", None, lambda n: n.set_gpu_field(4, ("GPU Reset Status", "Reset Required"), "Yes"),
     "GPU 4 needs a reset (nvidia-smi: Reset Required)"),
    ("ib", "xid-79", None, lambda n: n.change(kernel_log="kern/xid79.log"),
     "GPU 3 XID 79 GPU has fallen off the bus (Azure: fatal; NVIDIA: RESTART_BM)"),
    # NVIDIA's catalog (outside Azure; Azure's list has no NVLink5 XID). The log's GPU is not one
    # of this machine's bus ids.
    ("roce", "xid-149-nvlink5", None, lambda n: n.change(kernel_log="kern/nvlink5.log"),
     "GPU PCI:0008:00:00 XID 149 NVLINK: NETIR Error (NVIDIA: WORKFLOW_NVLINK5_ERR)"),
    ("ib", "fabric-manager-inactive", None, lambda n: n.change(services={"nvidia-fabricmanager": "inactive"}),
     "nvidia-fabricmanager is inactive (NVSwitch system: Fabric Manager must run)"),
    ("ib", "fabric-state", None, lambda n: (n.set_gpu_field(2, ("Fabric", "State"), "In Progress"),
                                            n.set_gpu_field(2, ("Fabric", "Status"), "N/A")),
     "GPU 2 fabric state In Progress (Fabric Manager)"),
    ("ib", "nvlink-inactive", None, lambda n: link_inactive(n, 1, 5), "GPU 1 NVLink 5 inactive"),
    ("ib", "peermem-not-loaded", None, lambda n: n.change(modules=()),
     "nvidia_peermem not loaded (GPUDirect RDMA: modprobe nvidia-peermem)"),
    ("ib", "low-free-space", None, lambda n: n.change(config={"MIN_FREE_GB": "999999999"}),
     "/mnt/resource/enroot-cache"),
    ("ib", "enroot-start-fails", gpu_container, lambda n: n.env.update(FAKE_ENROOT_START_FAIL="1"),
     "enroot start health-probe failed (rc 1: [ERROR] No such file or directory: "
     "/mnt/resource/enroot-data/user-0/health-probe)"),
    ("ib", "gpu-container-no-driver", gpu_container, lambda n: n.env.pop("STANDIN_NVC"),
     "nvidia-container-cli: initialization error: nvml error: driver not loaded "
     "(enroot start health-probe with NVIDIA_VISIBLE_DEVICES=all)"),
]


@pytest.mark.parametrize("kind,name,prepare,breaker,reason", FAILURES, ids=[f[1] for f in FAILURES])
def test_each_failure_drains_with_its_precise_reason(tmp_path: Path, kind: str, name: str,
                                                     prepare: Callable[[Node], object] | None,
                                                     breaker: Callable[[Node], object], reason: str) -> None:
    node = Node(tmp_path, azure_nd_h200_v5() if kind == "ib" else roce_a100())
    if prepare:
        prepare(node)
    healthy = node.run("--no-drain")
    assert healthy.returncode == 0, "the tree must be healthy before breaking it:\n" + healthy.stdout + healthy.stderr
    breaker(node)
    proc = node.run()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    if name == "low-free-space":  # the free figure is the real disk's
        assert first_failure(proc).startswith(reason + " ") and \
            "GB free, need 999999999 GB (ENROOT_CACHE_PATH, /etc/enroot/enroot.conf:2)" in first_failure(proc)
        reason = first_failure(proc)
    else:
        assert first_failure(proc) == reason
    more = len(lines(proc, "FAIL")) - 1
    want = f"lingjun-health: {reason}" + (f" (+{more} more)" if more else "")
    assert node.updates() == [["update", f"NodeName={node.name}", "State=DRAIN", f"Reason={want}"]]
    assert node.slurm() == {"state": "IDLE+DRAIN", "reason": want}
    assert f"DRAIN {node.name} {want}" in proc.stdout


def test_application_xids_do_not_drain_and_the_list_is_data(ib: Node) -> None:
    ib.change(kernel_log="kern/xid13.log")  # NVIDIA's catalog: XID 13, RESTART_APP
    proc = ib.run("--no-drain")
    assert proc.returncode == 0 and "OK gpu-xid no XIDs that drain (others seen: 13)" in lines(proc), proc.stdout
    ib.change(config={"GPU_FATAL_XIDS": "13 79"})  # a site may add XIDs (e.g. Azure's list)
    assert first_failure(ib.run("--no-drain")) == "GPU 0 XID 13 Graphics Engine Exception (NVIDIA: RESTART_APP)"
    ib.change(config={"GPU_XID_POLICY": "nvidia", "GPU_XID_ACTIONS": "RESTART_APP"})  # or the catalog actions
    assert first_failure(ib.run("--no-drain")) == "GPU 0 XID 13 Graphics Engine Exception (NVIDIA: RESTART_APP)"


def test_a_nonfatal_nvlink5_event_does_not_drain(ib: Node) -> None:
    log = ib.root / "var/log/kern.log"
    ib.change(kernel_log="kern/nvlink5.log")
    log.write_text("".join(ln for ln in log.read_text().splitlines(keepends=True) if " 144, " in ln))
    proc = ib.run("--no-drain")
    assert proc.returncode == 0 and "OK gpu-xid no XIDs that drain (others seen: 144)" in lines(proc), proc.stdout


def test_several_failures_give_the_first_and_a_count(ib: Node) -> None:
    ib.set_port("mlx5_ib2", state="1: DOWN", phys_state="2: Polling")
    ib.set_port("mlx5_ib4", state="1: DOWN", phys_state="2: Polling")
    ib.change(kernel_log="kern/xid79.log")
    proc = ib.run()
    assert proc.returncode == 1
    xid = "GPU 3 XID 79 GPU has fallen off the bus (Azure: fatal; NVIDIA: RESTART_BM)"
    assert lines(proc, "FAIL") == [f"FAIL gpu-xid {xid}", "FAIL ib-ports mlx5_ib2 port 1 DOWN",
                                   "FAIL ib-ports mlx5_ib4 port 1 DOWN"]
    assert ib.slurm()["reason"] == f"lingjun-health: {xid} (+2 more)"


def test_nccl_ib_hca_selects_the_ports_checked(roce: Node) -> None:
    roce.set_port("mlx5_0", state="1: DOWN", phys_state="3: Disabled")  # the front-end NIC
    assert first_failure(roce.run("--no-drain")) == "mlx5_0 port 1 DOWN"  # NCCL_IB_HCA=mlx5 includes it
    exact = "=mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7,mlx5_8"  # Baidu's advice: mlx5_1..8
    roce.change(nccl={"NCCL_IB_HCA": exact})
    proc = roce.run("--no-drain")
    assert proc.returncode == 0 and f"OK ib-ports 8 ports ACTIVE, LinkUp, Ethernet (NCCL_IB_HCA={exact})" in lines(proc)
    proc = roce.run("--no-drain", NCCL_IB_HCA="^mlx5_0")  # the environment overrides nccl.conf
    assert proc.returncode == 0 and "OK ib-ports 8 ports ACTIVE, LinkUp, Ethernet (NCCL_IB_HCA=^mlx5_0)" in lines(proc)
    proc = roce.run("--no-drain", NCCL_IB_HCA="mlx5_1:2")  # port 2 does not exist
    assert first_failure(proc) == "0 RDMA ports match NCCL_IB_HCA=mlx5_1:2 (Ethernet), expected 1"
    proc = roce.run("--no-drain", NCCL_IB_HCA="=mlx5")  # exact: no device is called just mlx5
    assert first_failure(proc) == "0 RDMA ports match NCCL_IB_HCA==mlx5 (Ethernet), expected 1"


def test_gid_index_minus_one_lets_nccl_choose(roce: Node) -> None:
    """NCCL_IB_GID_INDEX=-1 is NCCL's default since 2.21 (automatic RoCE v2 GID): not a config error."""
    proc = roce.run("--no-drain", NCCL_IB_GID_INDEX="-1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SKIP roce-gid NCCL_IB_GID_INDEX=-1 (NCCL chooses the GID)" in lines(proc)
    assert first_failure(roce.run("--no-drain", NCCL_IB_GID_INDEX="-2")) == "NCCL_IB_GID_INDEX=-2 is not a number"


def test_ib_ports_of_the_sku_ignore_other_hcas(ib: Node) -> None:
    ib.set_port("mlx5_an0", state="1: DOWN", phys_state="3: Disabled")  # not NCCL's: not in IB_PORTS
    assert ib.run("--no-drain").returncode == 0
    proc = ib.run("--no-drain", NCCL_IB_HCA="mlx5_ib0,mlx5_ib1")  # NCCL_IB_HCA narrows IB_PORTS
    assert "OK ib-ports 2 ports ACTIVE, LinkUp, >= 400 Gb/s, InfiniBand (IB_PORTS, NCCL_IB_HCA=mlx5_ib0,mlx5_ib1)" \
        in lines(proc)


def test_socket_ifname_prefix_exclusion_and_virtual_interfaces(roce: Node) -> None:
    devs = {"lo": ("unknown", "1"), "eth0": ("down", "0"), "eth1": ("down", "0"), "bond0": ("up", "1")}
    roce.change(netdevs=devs)
    assert first_failure(roce.run("--no-drain")) == "eth0 down, eth1 down (NCCL_SOCKET_IFNAME=eth)"
    proc = roce.run("--no-drain", NCCL_SOCKET_IFNAME="^lo,docker")
    assert "OK socket-if bond0 up 10.0.0.4 (NCCL_SOCKET_IFNAME=^lo,docker)" in lines(proc)
    roce.change(netdevs={**devs, "tun0": ("unknown", "1")})  # no link state: carrier decides
    assert "OK socket-if tun0 up 10.1.0.4 (NCCL_SOCKET_IFNAME=tun)" in lines(roce.run("--no-drain", NCCL_SOCKET_IFNAME="tun"))


def test_enroot_start_with_a_container_and_a_local_image(ib: Node) -> None:
    ib.change(sku="cpu", nccl={"NCCL_SOCKET_IFNAME": None}, config={"ENROOT_IMAGE": "health-probe"})
    proc = ib.run("--no-drain")
    assert proc.returncode == 0 and "OK enroot-start enroot started health-probe" in lines(proc), proc.stdout
    assert "SKIP gpu-container SKU cpu expects no GPUs" in lines(proc)
    assert ib.enroot_calls() == [["start", "health-probe", "true"]]
    ib.change(config={"ENROOT_IMAGE": "/opt/lingjun/health.sqsh"})
    assert first_failure(ib.run("--no-drain")) == "image /opt/lingjun/health.sqsh not found"
    image = ib.root / "opt/lingjun/health.sqsh"
    image.parent.mkdir(parents=True)
    image.write_bytes(b"hsqs")
    proc = ib.run("--no-drain")
    assert proc.returncode == 0, proc.stdout
    calls = ib.enroot_calls()[1:]
    name = calls[0][3]
    assert name.startswith("lingjun-health-") and calls == [
        ["create", "--force", "--name", name, str(image)], ["start", name, "true"], ["remove", "--force", name]]


def test_enroot_paths_come_from_enroot_conf(ib: Node) -> None:
    conf = ib.root / "etc/enroot/enroot.conf"
    conf.write_text("#ENROOT_DATA_PATH ${XDG_DATA_HOME}/enroot\nENROOT_DATA_PATH /mnt/scratch/$(id -un)/enroot/data\n"
                    "ENROOT_CACHE_PATH ${XDG_CACHE_HOME}/enroot\n")
    proc = ib.run("--no-drain")
    # runtime: enroot's default ${XDG_RUNTIME_DIR}/enroot -> /run/enroot; data: cut at $(id -un) and
    # climbed to the nearest existing directory (/mnt); cache in users' homes: not checked;
    # temp: enroot's default ${TMPDIR:-/tmp}, which does not exist in the tree -> /.
    okay = next(ln for ln in lines(proc) if ln.startswith("OK enroot-space "))
    assert [part.split()[0] for part in okay.split(": ", 1)[1].split(", ")] == ["/run/enroot", "/mnt", "/"]
    # Two settings on one directory: the larger requirement applies (temp: MIN_FREE_GB, not the
    # runtime path's MIN_FREE_RUNTIME_GB).
    conf.write_text("ENROOT_RUNTIME_PATH /mnt/resource/enroot-temp\nENROOT_TEMP_PATH /mnt/resource/enroot-temp\n"
                    "ENROOT_DATA_PATH ${XDG_DATA_HOME}/enroot\nENROOT_CACHE_PATH ${XDG_CACHE_HOME}/enroot\n")
    proc = ib.run("--no-drain")
    assert proc.returncode == 0 and lines(proc)[-1].startswith("OK enroot-space free: /mnt/resource/enroot-temp ")
    (ib.root / "etc/lingjun-slurm/health.conf").write_text(
        "SKU=Standard_ND96isr_H200_v5\nKERNEL_LOG=/var/log/kern.log\nMIN_FREE_GB=999999999\n")
    fails = lines(ib.run("--no-drain"), "FAIL")
    assert len(fails) == 1 and fails[0].endswith(
        " GB free, need 999999999 GB (ENROOT_TEMP_PATH, /etc/enroot/enroot.conf:2)"), fails
    conf.unlink()
    assert any(ln.startswith("SKIP enroot-space no enroot config at ") for ln in lines(ib.run("--no-drain")))


def test_skips_for_a_cpu_node(tmp_path: Path) -> None:
    node = Node(tmp_path, azure_nd_h200_v5())
    node.change(sku="cpu", nccl={"NCCL_SOCKET_IFNAME": None})
    proc = node.run()
    assert proc.returncode == 0, proc.stdout
    got = statuses(proc)
    for check in ("gpu-count", "gpu-ecc", "gpu-xid", "gpu-fabric", "gpu-nvlink", "gpu-peermem", "ib-ports",
                  "roce-gid", "socket-if"):
        assert got[check] == {"SKIP"}, check
    assert "SKIP gpu-count SKU cpu expects no GPUs" in lines(proc)


def test_xid_needs_a_kernel_log_under_root(ib: Node) -> None:
    ib.change(config={"KERNEL_LOG": ""})
    assert "SKIP gpu-xid no kernel log under --root (set KERNEL_LOG)" in lines(ib.run("--no-drain"))
    ib.change(config={"KERNEL_LOG": "/var/log/missing.log"})
    assert first_failure(ib.run("--no-drain")) == f"cannot read kernel log {ib.root}/var/log/missing.log"


def test_xid_window(ib: Node) -> None:
    """XIDs are judged within GPU_XID_WINDOW_HOURS (default 2, Azure's check_gpu_xid window) of
    their last occurrence; empty judges the whole log (this boot). The log: 19:02:39 (syslog)."""
    ib.change(kernel_log="kern/xid79.log")
    assert first_failure(ib.run("--no-drain")).startswith("GPU 3 XID 79 ")  # the machine's clock: 20:00
    later = str(int(ib.machine.now) + 3 * 3600)
    proc = ib.run("--no-drain", LINGJUN_HEALTH_NOW=later)
    assert proc.returncode == 0 and "OK gpu-xid no XIDs in the kernel log within 2 h; older than 2 h, not judged: " \
        "XID 79" in lines(proc), proc.stdout
    ib.change(dropins={"90-xid.conf": "GPU_XID_WINDOW_HOURS=\n"})
    assert first_failure(ib.run("--no-drain", LINGJUN_HEALTH_NOW=later)).startswith("GPU 3 XID 79 ")
    ib.change(dropins={"90-xid.conf": "GPU_XID_WINDOW_HOURS=4\n"})
    assert first_failure(ib.run("--no-drain", LINGJUN_HEALTH_NOW=later)).startswith("GPU 3 XID 79 ")


def test_xid_relative_stamps_use_the_uptime(roce: Node) -> None:
    """dmesg's "[  8211.93]" counts from boot: /proc/uptime places it (uptime 9000 s: 13 min ago)."""
    roce.change(kernel_log="kern/nvlink5.log")
    assert first_failure(roce.run("--no-drain")).startswith("GPU PCI:0008:00:00 XID 149 ")
    roce.change(uptime=8102 + 3 * 3600)
    proc = roce.run("--no-drain")
    assert proc.returncode == 0 and "older than 2 h, not judged: XID 144 149" in lines(proc)[2], proc.stdout


def test_json_document(ib: Node) -> None:
    ib.set_port("mlx5_ib2", state="1: DOWN", phys_state="2: Polling")
    proc = ib.run("--json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["node"] == ib.name and doc["sku"] == "Standard_ND96isr_H200_v5" and doc["mode"] == "periodic"
    assert doc["thresholds"].endswith("thresholds/azure-nd-h200-v5.conf") and doc["healthy"] is False
    assert {"status": "FAIL", "check": "ib-ports", "detail": "mlx5_ib2 port 1 DOWN"} in doc["checks"]
    assert [c["check"] for c in doc["checks"]][:3] == ["gpu-count", "gpu-ecc", "gpu-xid"]
    assert doc["action"] == "drain" and doc["reason"] == "lingjun-health: mlx5_ib2 port 1 DOWN"
    assert isinstance(doc["seconds"], int)
    ib.change(nccl={"NCCL_SOCKET_IFNAME": 'e"th\\0'})  # quotes and backslashes survive
    doc = json.loads(ib.run("--json", "--no-drain").stdout)
    assert {"status": "FAIL", "check": "socket-if", "detail": 'no interface matches NCCL_SOCKET_IFNAME=e"th\\0'} \
        in doc["checks"] and doc["action"] == "none"


def test_thresholds_resolve_by_name_instance_type_and_case(ib: Node) -> None:
    for sku, conf in (("standard_nd96isr_h200_v5", "azure-nd-h200-v5"), ("AZURE-ND-H200-V5", "azure-nd-h200-v5"),
                      ("Standard_ND96amsr_A100_v4", "azure-nd-a100-v4"), ("ml.gu8xf.8xlarge-gu108", "lingjun")):
        doc = json.loads(ib.run("--json", "--no-drain", "--sku", sku).stdout)
        assert Path(doc["thresholds"]).name == f"{conf}.conf", sku
    site = ib.root / "etc/lingjun-slurm/health/thresholds"  # a node's own directory wins
    site.mkdir(parents=True)
    (site / "standard_nd96isr_h200_v5.conf").write_text("GPU_COUNT=4\n")
    assert first_failure(ib.run("--no-drain")) == "8 GPUs, expected 4"


def test_config_overrides_thresholds(roce: Node) -> None:
    roce.change(config={"GPU_COUNT": "8", "IB_PORT_COUNT": "10", "IB_RATE_GBPS": "200"})
    fails = [ln.split(" ", 2)[2] for ln in lines(roce.run("--no-drain"), "FAIL")]
    assert fails[0] == "mlx5_0 port 1 at 100 Gb/s, expected 200" and fails[-1] == \
        "9 RDMA ports match NCCL_IB_HCA=mlx5 (Ethernet), expected 10"


def test_site_drop_ins_override_the_config_in_name_order(roce: Node) -> None:
    """health.conf.d/*.conf (the installer never touches them) come after health.conf, in name
    order: a site's GPU_COUNT survives the installer rewriting health.conf."""
    roce.change(config={"GPU_COUNT": "8"}, dropins={"10-site.conf": "GPU_COUNT=4\n", "20-later.conf": "# nothing\n",
                                                    "README": "not a .conf: never read\nnot=KEY VALUE\n"})
    assert first_failure(roce.run("--no-drain")) == "8 GPUs, expected 4"
    roce.change(dropins={"10-site.conf": "GPU_COUNT=4\n", "20-later.conf": "GPU_COUNT=\n"})
    assert roce.run("--no-drain").returncode == 0  # empty: GPUs present, count unchecked
    drop_gpu_all = roce.q().split("\nGPU 0000")[0] + "\n"
    roce.set_q(drop_gpu_all)
    assert first_failure(roce.run("--no-drain")) == "0 GPUs, expected at least 1"
    roce.change(dropins={"30-typo.conf": "GPU_COUNTS=8\n"})
    proc = roce.run("--no-drain")
    assert proc.returncode == 2 and "health.conf.d/30-typo.conf:1: unknown key GPU_COUNTS" in proc.stderr
    roce.change(dropins={"30-bad.conf": "# site\nIB_RATE_GBPS=fast\n"})
    proc = roce.run("--no-drain")
    assert proc.returncode == 2 and "health.conf.d/30-bad.conf:2: IB_RATE_GBPS=fast: must be a whole number" \
        in proc.stderr, proc.stderr


def test_drop_ins_alone_are_a_config(roce: Node) -> None:
    (roce.root / "etc/lingjun-slurm/health.conf").unlink()
    roce.change(dropins={"site.conf": "SKU=ml.gu7xf.8xlarge-gu108\nKERNEL_LOG=/var/log/kern.log\nMIN_FREE_GB=1\n"})
    (roce.root / "etc/lingjun-slurm/health.conf").unlink()
    proc = roce.run("--no-drain", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert Path(json.loads(proc.stdout)["thresholds"]).name == "lingjun.conf"


@pytest.mark.parametrize("args,config,message", [
    (["--bogus"], None, "unknown argument '--bogus'"),
    (["--config"], None, "--config needs a value"),
    ([], "SKU=Standard_ND96isr_H200_v5\nGPU_COUNTS=8\n", "health.conf:2: unknown key GPU_COUNTS"),
    ([], "SKU=Standard_ND96isr_H200_v5\nthis is not a setting\n", "health.conf:2: expected KEY=VALUE"),
    ([], "SKU=Standard_ND99_unknown\n", "no thresholds for SKU 'Standard_ND99_unknown'"),
    ([], "KERNEL_LOG=/var/log/kern.log\n", "SKU is not set"),
    ([], "SKU=cpu\nMIN_FREE_GB=lots\n", "health.conf:2: MIN_FREE_GB=lots: must be a whole number"),
    ([], "SKU=cpu\nIB_PORTS=mlx5_ib0\n", "IB_PORTS: 'mlx5_ib0' is not HCA:PORT"),
    ([], "SKU=cpu\nIB_LINK_LAYER=RoCE\n", "IB_LINK_LAYER=RoCE: use InfiniBand or Ethernet"),
    ([], "SKU=cpu\nTHRESHOLDS_DIR=/nowhere\n", "THRESHOLDS_DIR"),
    ([], "SKU=cpu\nFABRIC_MANAGER=maybe\n", "health.conf:2: FABRIC_MANAGER=maybe: use yes, no or auto"),
    ([], "SKU=cpu\nGPU_XID_ACTIONS=reset gpu\n", "GPU_XID_ACTIONS: 'reset' is not an action of NVIDIA's XID catalog"),
    ([], "SKU=cpu\nTIME_BUDGET=5\n", "health.conf:2: TIME_BUDGET=5: must be more than 9 seconds"),
])
def test_bad_usage_and_config_exit_2(ib: Node, args: list[str], config: str | None, message: str) -> None:
    if config is not None:
        (ib.root / "etc/lingjun-slurm/health.conf").write_text(config)
    proc = ib.run(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert ib.calls() == [] and proc.stdout == ""
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


def test_missing_config_needs_sku(ib: Node) -> None:
    (ib.root / "etc/lingjun-slurm/health.conf").unlink()
    proc = ib.run()
    assert proc.returncode == 2 and "no config at" in proc.stderr
    proc = ib.run("--sku", "Standard_ND96isr_H200_v5", "--no-drain")
    assert proc.returncode == 0 and "SKIP gpu-xid no kernel log under --root (set KERNEL_LOG)" in lines(proc)


def test_config_is_parsed_never_sourced(ib: Node, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    (ib.root / "etc/lingjun-slurm/health.conf").write_text(
        f'SKU="cpu"\nKERNEL_LOG=/var/log/kern.log\nENROOT_IMAGE=$(touch {marker})\n')
    proc = ib.run("--no-drain")
    assert not marker.exists()
    assert f"OK enroot-start enroot started $(touch {marker})" in proc.stdout


def test_root_from_environment(ib: Node) -> None:
    env = {"LINGJUN_HEALTH_ROOT": str(ib.root)}
    proc = ib.run("--no-drain", **env)
    assert proc.returncode == 0
    full = ib.base_env()
    full.update(env)
    proc = subprocess.run(["bash", str(REPO / "lingjun_slurm/nodes/health/lingjun-health"), "--no-drain", "--node", "n1"],
                          capture_output=True, text=True, env=full)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_xid_from_dmesg_without_root(ib: Node, tmp_path: Path) -> None:
    """Without --root and KERNEL_LOG the kernel log is `dmesg` (a stand-in here: the host's ring
    buffer holds no XIDs); only the GPU checks apply (the host has no RDMA or NCCL config)."""
    dmesg = ib.bin / "dmesg"
    dmesg.write_text(f"#!/bin/sh\ncat {ib.root / 'var/log/kern.log'}\n")
    dmesg.chmod(0o755)
    config = tmp_path / "health.conf"
    config.write_text(f"SKU=Standard_ND96isr_H200_v5\nIB_PORTS=\nIB_PORT_COUNT=0\nNCCL_CONF={tmp_path}/none\n"
                      f"ENROOT_CONF={tmp_path}/none\nSTATE_DIR={tmp_path}/state\nPEERMEM=no\n")
    env = ib.base_env()
    argv = ["bash", str(REPO / "lingjun_slurm/nodes/health/lingjun-health"), "--config", str(config), "--no-drain"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "OK gpu-xid no XIDs in the kernel log within 2 h" in lines(proc), \
        proc.stdout + proc.stderr
    ib.change(kernel_log="kern/xid79.log")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and lines(proc, "FAIL") == [
        "FAIL gpu-xid GPU 3 XID 79 GPU has fallen off the bus (Azure: fatal; NVIDIA: RESTART_BM)"], proc.stdout
    dmesg.write_text("#!/bin/sh\necho 'dmesg: read kernel buffer failed: Operation not permitted' >&2\nexit 1\n")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert lines(proc, "FAIL") == ["FAIL gpu-xid cannot read the kernel log (dmesg rc 1: dmesg: read kernel buffer "
                                   "failed: Operation not permitted)"]


def test_q_set_changes_one_field_of_one_gpu() -> None:
    """The test helper itself: one field of one GPU, alignment kept, the rest untouched."""
    text = azure_nd_h200_v5().smi_q
    changed = q_set(text, 3, ("ECC Errors", "Volatile", "DRAM Uncorrectable"), "2")
    diff = [(a, b) for a, b in zip(text.splitlines(), changed.splitlines()) if a != b]
    assert diff == [("            DRAM Uncorrectable            : 0", "            DRAM Uncorrectable            : 2")]
    assert os.linesep == "\n"
