"""gpu-container: on GPU SKUs with ENROOT_IMAGE, the container starts with the GPUs and
`nvidia-smi -L` in it lists them. That runs enroot's nvidia hook (NVIDIA/enroot
conf/hooks/98-nvidia.sh: NVIDIA_VISIBLE_DEVICES set -> exec `nvidia-container-cli --user configure
--no-cgroups --ldconfig=@... --device=all --utility ROOTFS`), so a driver that
nvidia-container-cli cannot use fails the node with nvidia-container-cli's own message.
nvidia-container-cli is tests/fixtures/standins/nvidia-container-cli (modelled on
NVIDIA/libnvidia-container src/cli); without $STANDIN_NVC it behaves as on this machine: no driver.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.health.machines import NVC_STANDIN, Node, azure_nd_h200_v5, lines

NO_DRIVER = "nvidia-container-cli: initialization error: nvml error: driver not loaded"


@pytest.fixture
def ib(tmp_path: Path) -> Node:
    n = Node(tmp_path, azure_nd_h200_v5())
    n.change(config={"ENROOT_IMAGE": "health-probe"})
    return n


def test_without_a_driver_the_gpu_container_fails_with_nvidia_container_clis_message(ib: Node) -> None:
    proc = ib.run()
    assert proc.returncode == 1
    reason = f"{NO_DRIVER} (enroot start health-probe with NVIDIA_VISIBLE_DEVICES=all)"
    assert lines(proc, "FAIL") == [f"FAIL gpu-container {reason}"], proc.stdout
    assert "SKIP enroot-start the container did not start: its GPU hook failed (gpu-container)" in lines(proc)
    assert ib.slurm()["reason"] == f"lingjun-health: {reason}"
    assert ib.enroot_calls() == [["start", "--env", "NVIDIA_VISIBLE_DEVICES=all", "--env",
                                  "NVIDIA_DRIVER_CAPABILITIES=utility", "health-probe", "nvidia-smi", "-L"]]


def test_with_the_driver_the_container_sees_the_gpus(ib: Node, tmp_path: Path) -> None:
    ib.with_driver()
    ib.env["STANDIN_NVC_LOG"] = str(tmp_path / "nvc.jsonl")
    proc = ib.run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK enroot-start enroot started health-probe" in lines(proc)
    assert "OK gpu-container 8 GPUs in container health-probe (nvidia-smi -L)" in lines(proc)
    calls = [json.loads(ln) for ln in (tmp_path / "nvc.jsonl").read_text().splitlines()]
    assert calls == [["--user", "configure", "--no-cgroups", "--ldconfig=@/sbin/ldconfig", "--device=all", "--utility",
                      str(tmp_path / "enroot-data" / "health-probe")]]


def test_fewer_gpus_in_the_container(ib: Node, tmp_path: Path) -> None:
    ib.with_driver()
    seven = tmp_path / "seven-gpus"
    seven.write_text("#!/bin/sh\nfor i in 0 1 2 3 4 5 6; do echo \"GPU $i: NVIDIA H200 (UUID: GPU-$i)\"; done\n")
    seven.chmod(0o755)
    desc = json.loads(Path(ib.env["STANDIN_NVC"]).read_text())
    desc["binaries"] = [["/usr/bin/nvidia-smi", str(seven)]]
    Path(ib.env["STANDIN_NVC"]).write_text(json.dumps(desc))
    proc = ib.run("--no-drain")
    assert lines(proc, "FAIL") == ["FAIL gpu-container 7 GPUs in container health-probe (nvidia-smi -L), expected 8"]


def test_a_local_image_with_the_gpus(ib: Node) -> None:
    ib.with_driver()
    ib.change(config={"ENROOT_IMAGE": "/opt/lingjun/health.sqsh"})
    image = ib.root / "opt/lingjun/health.sqsh"
    image.parent.mkdir(parents=True)
    image.write_bytes(b"hsqs")
    proc = ib.run("--no-drain")
    assert proc.returncode == 0 and "OK gpu-container 8 GPUs in container /opt/lingjun/health.sqsh (nvidia-smi -L)" \
        in lines(proc), proc.stdout
    create, start, remove = ib.enroot_calls()
    name = create[3]
    assert create == ["create", "--force", "--name", name, str(image)] and remove == ["remove", "--force", name]
    assert start == ["start", "--env", "NVIDIA_VISIBLE_DEVICES=all", "--env", "NVIDIA_DRIVER_CAPABILITIES=utility",
                     name, "nvidia-smi", "-L"]


def nvc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(NVC_STANDIN), *args], capture_output=True, text=True, env=env or {"PATH": "/usr/bin:/bin"})


def test_the_stand_in_follows_libnvidia_containers_cli(tmp_path: Path) -> None:
    """info/list/configure print warnx's "nvidia-container-cli: initialization error: MSG" and
    exit 1 (EXIT_FAILURE) when nvc_init fails (src/cli/info.c, list.c, configure.c); argp's
    usage error exits 1 (main.c argp_err_exit_status); info's table is "%-15s %s" lines."""
    for command in (["info"], ["list"], ["--user", "configure", "--no-cgroups", "--device=all", "--utility", "/r"]):
        proc = nvc(*command)
        assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", NO_DRIVER + "\n"), command
    proc = nvc()
    assert proc.returncode == 1 and proc.stderr.startswith("Usage: nvidia-container-cli [OPTION...] COMMAND [ARG...]")
    assert nvc("frobnicate").returncode == 1
    proc = nvc("configure", "relative/rootfs", env={"PATH": "/usr/bin:/bin", "STANDIN_NVC": "/nonexistent"})
    assert proc.returncode == 1 and proc.stderr == "nvidia-container-cli: input error: invalid rootfs directory\n"
    desc = tmp_path / "nvc.json"
    desc.write_text(json.dumps({"driver": "535.161.08", "cuda": "12.2", "gpus": [
        {"model": "NVIDIA H100 80GB HBM3", "brand": "Nvidia", "uuid": "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa",
         "busid": "00000000:19:00.0", "arch": "9.0"}]}))
    proc = nvc("info", env={"PATH": "/usr/bin:/bin", "STANDIN_NVC": str(desc)})
    assert proc.returncode == 0 and proc.stdout.splitlines()[:4] == [
        "NVRM version:   535.161.08", "CUDA version:   12.2", "", "Device Index:   0"]
    proc = nvc("info", "--csv", env={"PATH": "/usr/bin:/bin", "STANDIN_NVC": str(desc)})
    assert proc.stdout.splitlines()[:2] == ["NVRM version,CUDA version", "535.161.08,12.2"]
    proc = nvc("list", env={"PATH": "/usr/bin:/bin", "STANDIN_NVC": str(desc)})
    assert "/dev/nvidiactl" in proc.stdout.splitlines() and "/dev/nvidia0" in proc.stdout.splitlines()
    proc = nvc("info", env={"PATH": "/usr/bin:/bin", "STANDIN_NVC_INIT_ERROR": "load library failed: libnvidia-ml.so.1: "
                            "cannot open shared object file: no such file or directory"})
    assert proc.stderr == ("nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1: "
                           "cannot open shared object file: no such file or directory\n")
