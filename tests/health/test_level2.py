"""lingjun-health --level 2: the deep checks for an idle node (docs/health-checks.md, "Level 2").

The stand-ins (tests/health/machines.py add_level2) replay recorded outputs: NVIDIA's nvbandwidth
README matrices (commit 66746a3), nccl-tests issue 290's 8x H100 all_reduce (avg busbw 439.369),
a real `dcgmi diag -r 2 -j` of DCGM 4.5.2 (one "Fail": persistence mode) and an ib_write_bw
client report modelled on perftest's format strings; FAKE_SLOW_GPU / FAKE_SLOW_HCA slow one GPU
or HCA. Sources: tests/fixtures/health/SOURCES.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from lingjun_slurm.cli.health import health_argv
from tests.health.machines import (DCGM_GB10, Node, add_level2, azure_nd_h200_v5, l2_calls, lines,
                                   packaged_program, statuses)

L2_CHECKS = ["gpu-throttle", "gpu-bandwidth", "nccl-allreduce", "ib-write-bw", "dcgm-diag"]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    n = Node(tmp_path, azure_nd_h200_v5())
    add_level2(n)
    return n


def conf(node: Node, **keys: str) -> None:
    (node.root / "etc/lingjun-slurm/health.conf.d/95-test.conf").write_text(
        "".join(f"{k}={v}\n" for k, v in keys.items()))


def detail(proc: subprocess.CompletedProcess[str], check: str) -> tuple[str, str]:
    found = [ln.split(" ", 2) for ln in lines(proc) if ln.split(" ", 2)[1] == check]
    assert len(found) == 1, proc.stdout + proc.stderr
    return found[0][0], found[0][2]


def l2(node: Node, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return node.run("--level", "2", "--no-drain", *args, **env)


# ---------------------------------------------------------------- this machine (no GPU, no tools)
def test_on_this_machine_every_level2_check_skips_with_its_reason(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SLURM", "LINGJUN_HEALTH"))}
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.run(["bash", str(packaged_program()), "--level", "2", "--no-drain", "--sku", "azure-nd-h100-v5"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [ln.split(" ", 2)[1] for ln in lines(proc)] == L2_CHECKS
    tools = {"gpu-throttle": "nvidia-smi", "gpu-bandwidth": "nvbandwidth", "nccl-allreduce": "all_reduce_perf",
             "ib-write-bw": "ib_write_bw", "dcgm-diag": "dcgmi"}
    for check, tool in tools.items():
        status, why = detail(proc, check)
        assert status == "SKIP" and why, proc.stdout
        if shutil.which(tool) is None:
            assert why.startswith(f"{tool} not found"), why


def test_level_usage_errors(node: Node) -> None:
    for args in (["--level", "3"], ["--level", "2", "--no-drain", "--only", "gpu-ecc"], ["--level", "2", "--boot"]):
        proc = node.run(*args)
        assert proc.returncode == 2 and "lingjun-health:" in proc.stderr, (args, proc.stderr)


def test_cli_passes_level_through() -> None:
    assert health_argv(None, "cpu", True, False, None, None, False, 2) == ["--sku", "cpu", "--no-drain", "--level", "2"]
    assert health_argv(None, "cpu", True, False, None, None, False) == ["--sku", "cpu", "--no-drain"]


def test_json_says_which_level_ran(node: Node) -> None:
    import json

    deep = json.loads(l2(node, "--json").stdout)
    assert deep["level"] == 2 and [c["check"] for c in deep["checks"]] == L2_CHECKS, deep
    plain = json.loads(node.run("--no-drain", "--json").stdout)
    assert plain["level"] == 1 and "gpu-throttle" not in [c["check"] for c in plain["checks"]], plain


# ---------------------------------------------------------------- busy GPUs
def test_busy_gpus_skip_every_check_and_run_nothing(node: Node) -> None:
    (node.smi_dir / "apps.txt").write_text("4242\n4243\n")
    proc = l2(node)
    assert proc.returncode == 0, proc.stdout
    for check in L2_CHECKS:
        assert detail(proc, check) == ("SKIP", "GPUs busy: 2 processes (nvidia-smi --query-compute-apps=pid)")
    assert l2_calls(node) == []


# ---------------------------------------------------------------- gpu-throttle
def test_throttle_lists_active_reasons_and_passes_by_default(node: Node) -> None:
    status, why = detail(l2(node), "gpu-throttle")  # the real H100 dump: HW (Power Brake) Slowdown Active
    assert status == "OK"
    assert why == ("active: HW Slowdown (GPU 0,1,2,3,4,5,6,7); HW Power Brake Slowdown (GPU 0,1,2,3,4,5,6,7); "
                   "none in GPU_THROTTLE_FAIL")


def test_throttle_fails_for_a_reason_named_in_gpu_throttle_fail(node: Node) -> None:
    conf(node, GPU_THROTTLE_FAIL="SW Thermal Slowdown, hw power brake slowdown")
    status, why = detail(l2(node), "gpu-throttle")
    assert status == "FAIL" and why.startswith("active: GPU 0 HW Power Brake Slowdown, GPU 1 HW Power Brake"), why


def test_throttle_skips_without_nvidia_smi(node: Node) -> None:
    conf(node, NVIDIA_SMI="nvidia-smi-absent")
    assert detail(l2(node), "gpu-throttle") == ("SKIP", "nvidia-smi-absent not found")


# ---------------------------------------------------------------- gpu-bandwidth
def test_bandwidth_ok_skips_the_diagonal(node: Node) -> None:
    conf(node, GPU_HOST_BW_MIN_GBPS="21", GPU_P2P_MIN_GBPS="238")  # ND A100 v4's figures; README's 0.00 diagonal
    proc = l2(node)
    status, why = detail(proc, "gpu-bandwidth")
    assert status == "OK", why
    assert why == ("H2D min 25.94 GB/s (GPU 1, floor 21); D2H min 25.94 GB/s (GPU 1, floor 21); "
                   "D2D min 274.89 GB/s (GPU 6<-GPU 0, floor 238)")
    assert "nvbandwidth -t host_to_device_memcpy_ce device_to_host_memcpy_ce device_to_device_memcpy_read_ce -i 10" \
        in l2_calls(node)


def test_bandwidth_fails_on_one_slow_gpu(node: Node) -> None:
    conf(node, GPU_HOST_BW_MIN_GBPS="21", GPU_P2P_MIN_GBPS="238")
    status, why = detail(l2(node, FAKE_SLOW_GPU="3"), "gpu-bandwidth")
    assert status == "FAIL" and why.startswith("below the floor (GB/s): H2D GPU 3 6.50, D2H GPU 3 6.50, D2D GPU 0<-GPU 3 69.03"), why


def test_bandwidth_h200_figures_fail_the_readme_machine(node: Node) -> None:
    status, why = detail(l2(node), "gpu-bandwidth")  # 48 GB/s host floor vs the README's 26 GB/s
    assert status == "FAIL" and "H2D GPU 0 26.03" in why and "(+" in why


def test_bandwidth_skips_without_nvbandwidth(node: Node) -> None:
    (node.bin / "nvbandwidth").unlink()
    assert detail(l2(node), "gpu-bandwidth")[0] == "SKIP"


# ---------------------------------------------------------------- nccl-allreduce
def test_allreduce_ok_on_the_h200_floor(node: Node) -> None:
    status, why = detail(l2(node), "nccl-allreduce")
    assert (status, why) == ("OK", "all_reduce 16G on 8 GPUs: avg busbw 439.369 GB/s (floor 431.0)")
    assert "all_reduce_perf -b 16G -e 16G -f 2 -g 8 -c 1" in l2_calls(node)


def test_allreduce_fails_below_the_h100_floor(node: Node) -> None:
    conf(node, NCCL_ALLREDUCE_MIN_GBPS="460.0")
    status, why = detail(l2(node), "nccl-allreduce")
    assert status == "FAIL" and why.startswith("all_reduce 16G on 8 GPUs: avg busbw 439.369 GB/s < 460.0"), why


def test_allreduce_fails_on_a_failed_line(tmp_path: Path) -> None:
    node = Node(tmp_path, azure_nd_h200_v5())
    add_level2(node, nccl_out="nccl_tests_369_gh200_wrong_elements.txt")
    status, why = detail(l2(node), "nccl-allreduce")
    assert status == "FAIL" and "FAILED" in why, why


def test_allreduce_skips_without_the_tool(node: Node) -> None:
    (node.bin / "all_reduce_perf").unlink()
    assert detail(l2(node), "nccl-allreduce")[0] == "SKIP"


# ---------------------------------------------------------------- ib-write-bw
def test_ib_write_bw_ok_runs_each_hca_with_its_gpu(node: Node) -> None:
    status, why = detail(l2(node), "ib-write-bw")
    assert (status, why) == ("OK", "ib_write_bw GPUDirect loopback: 8 HCAs, min 391.22 Gb/s (mlx5_ib0), floor 360")
    calls = l2_calls(node)
    assert ("ib_write_bw -p 18513 -s 8388608 -x 0 -F --report_gbits --perform_warm_up --use_cuda=3 -d mlx5_ib3 "
            "127.0.0.1") in calls
    assert not any("mlx5_an0" in c for c in calls)  # Ethernet: not an InfiniBand HCA


def test_ib_write_bw_fails_on_one_slow_hca(node: Node) -> None:
    status, why = detail(l2(node, FAKE_SLOW_HCA="mlx5_ib5"), "ib-write-bw")
    assert status == "FAIL" and why.startswith("ib_write_bw GPUDirect loopback: mlx5_ib5 120.55 Gb/s"), why


def test_ib_write_bw_skips_without_cuda_or_hca(node: Node) -> None:
    assert detail(l2(node, FAKE_IB_NO_CUDA="1"), "ib-write-bw") == (
        "SKIP", "ib_write_bw was built without CUDA (--help lists no --use_cuda): no GPUDirect RDMA test")
    shutil.rmtree(node.root / "sys/class/infiniband")
    assert detail(l2(node), "ib-write-bw") == ("SKIP", "no InfiniBand HCA in /sys/class/infiniband")


# ---------------------------------------------------------------- dcgm-diag
def test_dcgm_diag_fails_on_the_real_fail(node: Node) -> None:
    assert detail(l2(node), "dcgm-diag") == ("FAIL", "dcgmi diag -r 2: Fail in software (DCGM 4.5.2)")


def test_dcgm_diag_ok_and_skip_without_host_engine(node: Node, tmp_path: Path) -> None:
    passed = tmp_path / "pass.json"  # the real document with its Fail turned to Pass (modelled)
    passed.write_text(DCGM_GB10.read_text().replace('"Fail"', '"Pass"'))
    assert detail(l2(node, FAKE_DCGM_OUT=str(passed)), "dcgm-diag") == (
        "OK", "dcgmi diag -r 2: 3 tests, none Fail (DCGM 4.5.2)")
    status, why = detail(l2(node, FAKE_DCGM_NOENGINE="1"), "dcgm-diag")
    assert status == "SKIP" and why.startswith("DCGM host engine unreachable: Error: unable to establish"), why


# ---------------------------------------------------------------- drain prefix
def test_level2_drains_with_its_own_prefix_and_level1_never_resumes_it(node: Node, tmp_path: Path) -> None:
    proc = node.run("--level", "2")
    assert proc.returncode == 1
    reason = node.slurm()["reason"]
    assert reason.startswith("lingjun-health-l2: "), reason
    one = node.run()  # level 1, healthy: leaves level 2's drain alone
    assert "KEEP" in one.stdout and node.slurm()["reason"] == reason, one.stdout + one.stderr
    passed = tmp_path / "pass.json"
    passed.write_text(DCGM_GB10.read_text().replace('"Fail"', '"Pass"'))
    conf(node, GPU_HOST_BW_MIN_GBPS="21", GPU_P2P_MIN_GBPS="238")
    two = node.run("--level", "2", FAKE_DCGM_OUT=str(passed))
    assert two.returncode == 0 and two.stdout.splitlines()[-1].startswith("RESUME"), two.stdout
