"""Node trees and stand-ins for running lingjun-health without GPUs, RDMA NICs or Slurm.

A `Node` is a directory tree laid out like a real machine's /sys, /etc and /var (the layouts
and their sources: tests/fixtures/health/SOURCES.md), plus a bin/ of stand-ins for the
commands that cannot run here:
- nvidia-smi: prints the recorded --query-gpu / --query-remapped-rows output of the machine,
  and rejects any other query the way nvidia-smi does (rc 2, "is not a valid field");
- scontrol: keeps one node's State/Reason in a JSON file and records every call; `show node
  -o` prints Slurm 22.05's one-line format;
- enroot: records calls; `start` fails when asked to.
Everything else the program runs (df, grep, awk, timeout) is the real thing.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from lingjun_slurm import health, network

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "health"
GPU_QUERY = ("--query-gpu=index,pci.bus_id,ecc.mode.current,ecc.errors.uncorrected.volatile.total,"
             "ecc.errors.corrected.volatile.total")
REMAP_QUERY = "--query-remapped-rows=gpu_bus_id,remapped_rows.pending,remapped_rows.failure"
CSV = "--format=csv,noheader,nounits"
# Azure HPC images' enroot.conf (local disk under /mnt/resource, per-user parts by $(id -u)).
ENROOT_CONF = """\
ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)
ENROOT_CACHE_PATH /mnt/resource/enroot-cache/user-$(id -u)
ENROOT_DATA_PATH /mnt/resource/enroot-data/user-$(id -u)
ENROOT_TEMP_PATH /mnt/resource/enroot-temp
ENROOT_SQUASH_OPTIONS -noI -noD -noF -noX -no-duplicates
"""


@dataclass
class Port:
    hca: str
    port: int = 1
    state: str = "4: ACTIVE"
    phys_state: str = "5: LinkUp"
    rate: str = "400 Gb/sec (4X NDR)"
    link_layer: str = "InfiniBand"
    gids: dict[int, tuple[str, str]] = field(default_factory=dict)  # index -> (gid, type)


@dataclass
class Machine:
    recorded: str  # tests/fixtures/health/nvidia-smi/<recorded>.{gpu,remap}.csv
    sku: str
    profile: str  # network profile whose nccl.conf the node has
    ports: list[Port]
    netdevs: dict[str, tuple[str, str]]  # name -> (operstate, carrier)
    kernel_log: str = "clean.log"
    config: dict[str, str] = field(default_factory=dict)  # extra health.conf keys
    nccl: dict[str, str | None] = field(default_factory=dict)  # nccl.conf overrides (None removes)

    def port(self, hca: str) -> Port:
        return next(p for p in self.ports if p.hca == hca)


def azure_nd_h200_v5() -> Machine:
    """Azure ND H200 v5: 8 GPUs, mlx5_ib0..7 InfiniBand at 400 Gb/s, mlx5_an0 Ethernet."""
    ports = [Port(f"mlx5_ib{i}", gids={0: (f"fe80:0000:0000:0000:0015:5dff:fe34:{0x33 + i:04x}", "IB/RoCE v1")})
             for i in range(8)]
    ports.append(Port("mlx5_an0", rate="100 Gb/sec (4X EDR)", link_layer="Ethernet",
                      gids={0: ("fe80:0000:0000:0000:0222:48ff:fe65:bc8d", "IB/RoCE v1"),
                            1: ("fe80:0000:0000:0000:0222:48ff:fe65:bc8d", "RoCE v2")}))
    netdevs = {"lo": ("unknown", "1"), "eth0": ("up", "1"), "docker0": ("down", "0"),
               **{f"ib{i}": ("up", "1") for i in range(8)}}
    return Machine("azure-nd-h200-v5", "Standard_ND96isr_H200_v5", "azure-nd-h200-v5", ports, netdevs)


ROCE_IPV4 = ["0a00:3c03", "190b:8002", "190b:8022", "190b:8042", "190b:8062", "190b:8082", "190b:80a2",
             "190b:80c2", "190b:80e2"]
ROCE_LL = ["f820:20ff:fe28:c769", "eaeb:d3ff:fecc:c920", "eaeb:d3ff:fecc:c921", "eaeb:d3ff:fe6c:51d2",
           "eaeb:d3ff:fe6c:51d3", "eaeb:d3ff:fe33:1366", "eaeb:d3ff:fe33:1367", "eaeb:d3ff:fe6c:68ae",
           "eaeb:d3ff:fe6c:68af"]


def roce_a100() -> Machine:
    """A RoCE A100 node (Baidu CCE's show_gids): mlx5_0..8 on eth0..8, RoCE v2 IPv4 GID at
    index 3; here with the Lingjun profile and SKU (RoCE, NCCL_IB_HCA=mlx5, GID index 3)."""
    ports = []
    for i, (ll, v4) in enumerate(zip(ROCE_LL, ROCE_IPV4)):
        link_local = f"fe80:0000:0000:0000:{ll}"
        mapped = f"0000:0000:0000:0000:0000:ffff:{v4}"
        ports.append(Port(f"mlx5_{i}", rate="100 Gb/sec (4X EDR)", link_layer="Ethernet",
                          gids={0: (link_local, "IB/RoCE v1"), 1: (link_local, "RoCE v2"),
                                2: (mapped, "IB/RoCE v1"), 3: (mapped, "RoCE v2")}))
    netdevs = {"lo": ("unknown", "1"), **{f"eth{i}": ("up", "1") for i in range(9)}}
    return Machine("baidu-a100-roce", "ml.gu7xf.8xlarge-gu108", "lingjun", ports, netdevs)


def _write(path: Path, text: str, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if mode is not None:
        path.chmod(mode)


NVIDIA_SMI = f"""#!{sys.executable}
import os, sys
from pathlib import Path
args, data = sys.argv[1:], Path(os.environ["FAKE_SMI_DIR"])
if os.environ.get("FAKE_SMI_FAIL"):
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
          "Make sure that the latest NVIDIA driver is installed and running.")
    sys.exit(9)
known = {{({GPU_QUERY!r}, {CSV!r}): "gpu.csv", ({REMAP_QUERY!r}, {CSV!r}): "remap.csv"}}
name = known.get(tuple(args))
if name is None or not (data / name).exists():
    print(f'Field "{{args[0].split("=", 1)[-1]}}" is not a valid field to query.', file=sys.stderr)
    sys.exit(2)
sys.stdout.write((data / name).read_text())
"""

SCONTROL = f"""#!{sys.executable}
import json, os, sys
from pathlib import Path
state_file, args = Path(os.environ["FAKE_SLURM_STATE"]), sys.argv[1:]
with open(os.environ["FAKE_SLURM_CALLS"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if os.environ.get("FAKE_SLURM_DOWN"):
    print("slurm_load_node error: Unable to contact slurm controller (connect failure)", file=sys.stderr)
    sys.exit(1)
nodes = json.loads(state_file.read_text())
if args[:3] == ["show", "node", "-o"]:
    node = nodes.get(args[3])
    if node is None:
        print(f"Node {{args[3]}} not found")
        sys.exit(1)
    reason = f" Reason={{node['reason']}} [root@2026-11-30T00:22:54]" if node["reason"] else ""
    print(f"NodeName={{args[3]}} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 "
          f"CPULoad=0.62 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 NodeAddr=127.0.0.1 "
          f"NodeHostName=vm Version=22.05.8 RealMemory=16000 AllocMem=0 Sockets=2 Boards=1 "
          f"State={{node['state']}} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
          f"Partitions=gpu CfgTRES=cpu=2,mem=16000M,billing=2 AllocTRES= CapWatts=n/a{{reason}}")
    sys.exit(0)
if args[:1] == ["update"]:
    fields = dict(a.split("=", 1) for a in args[1:])
    node = nodes[fields["NodeName"]]
    if fields["State"] == "DRAIN":
        node.update(state="IDLE+DRAIN", reason=fields["Reason"])
    elif fields["State"] == "RESUME":
        node.update(state="IDLE", reason="")
    state_file.write_text(json.dumps(nodes))
    sys.exit(0)
print(f"stand-in scontrol: unexpected {{args}}", file=sys.stderr)
sys.exit(2)
"""

ENROOT = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["FAKE_ENROOT_CALLS"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1] == "start" and os.environ.get("FAKE_ENROOT_START_FAIL"):
    print(f"[ERROR] No such file or directory: /mnt/resource/enroot-data/user-0/{{sys.argv[2]}}", file=sys.stderr)
    sys.exit(1)
"""


class Node:
    """A machine's tree under tmp/root, stand-ins in tmp/bin, and a runner for lingjun-health."""

    def __init__(self, tmp: Path, machine: Machine, name: str = "gpu-node-7",
                 standins: tuple[str, ...] = ("nvidia-smi", "scontrol", "enroot")) -> None:
        self.tmp, self.machine, self.name, self.standins = tmp, machine, name, standins
        self.root, self.bin = tmp / "root", tmp / "bin"
        self.state_file, self.calls_file = tmp / "slurm.json", tmp / "calls.jsonl"
        self.enroot_file = tmp / "enroot.jsonl"
        self.smi_dir = tmp / "smi"
        self.env: dict[str, str] = {}
        self.build()

    # ------------------------------------------------------------------ the tree
    def build(self) -> None:
        """(Re)write the tree from self.machine; Slurm state and call logs are kept."""
        m, root = self.machine, self.root
        if root.exists():
            shutil.rmtree(root)
        for p in m.ports:
            d = root / "sys/class/infiniband" / p.hca / "ports" / str(p.port)
            for name, value in (("state", p.state), ("phys_state", p.phys_state), ("rate", p.rate),
                                ("link_layer", p.link_layer)):
                _write(d / name, value + "\n")
            for idx, (gid, kind) in p.gids.items():
                _write(d / "gids" / str(idx), gid + "\n")
                _write(d / "gid_attrs" / "types" / str(idx), kind + "\n")
        for name, (oper, carrier) in m.netdevs.items():
            _write(root / "sys/class/net" / name / "operstate", oper + "\n")
            _write(root / "sys/class/net" / name / "carrier", carrier + "\n")
        overrides = {k: v for k, v in m.nccl.items()}
        _write(root / "etc/nccl.conf",
               network.render(network.resolve(network.get_profile(m.profile), overrides), "nccl.conf"))
        _write(root / "etc/enroot/enroot.conf", ENROOT_CONF)
        for sub in ("run/enroot", "mnt/resource/enroot-cache", "mnt/resource/enroot-data", "mnt/resource/enroot-temp"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        _write(root / "var/log/kern.log", (FIXTURES / "kern" / m.kernel_log).read_text())
        config = {"SKU": m.sku, "KERNEL_LOG": "/var/log/kern.log", "MIN_FREE_GB": "1", **m.config}
        _write(root / "etc/lingjun-slurm/health.conf",
               "# written by tests/health/machines.py\n" + "".join(f"{k}={v}\n" for k, v in config.items()))
        self.smi_dir.mkdir(exist_ok=True)
        for kind in ("gpu", "remap"):
            src = FIXTURES / "nvidia-smi" / f"{m.recorded}.{kind}.csv"
            if not (self.smi_dir / f"{kind}.csv").exists():
                shutil.copyfile(src, self.smi_dir / f"{kind}.csv")
        for name, text in (("nvidia-smi", NVIDIA_SMI), ("scontrol", SCONTROL), ("enroot", ENROOT)):
            if name in self.standins:
                _write(self.bin / name, text, 0o755)
        if not self.state_file.exists():
            self.set_slurm("IDLE", "")

    def change(self, **kw: object) -> None:
        """Rebuild with some Machine fields replaced."""
        self.machine = replace(self.machine, **kw)  # type: ignore[arg-type]
        self.build()

    def set_port(self, hca: str, **kw: object) -> None:
        ports = [replace(p, **kw) if p.hca == hca else p for p in self.machine.ports]  # type: ignore[arg-type]
        self.change(ports=ports)

    def drop_port(self, hca: str) -> None:
        self.change(ports=[p for p in self.machine.ports if p.hca != hca])

    def set_gpus(self, csv: str | None = None, remap: str | None = None) -> None:
        """Replace the recorded nvidia-smi output (None leaves it; "" removes remap)."""
        if csv is not None:
            (self.smi_dir / "gpu.csv").write_text(csv)
        if remap == "":
            (self.smi_dir / "remap.csv").unlink()
        elif remap is not None:
            (self.smi_dir / "remap.csv").write_text(remap)

    def gpu_csv(self) -> str:
        return (self.smi_dir / "gpu.csv").read_text()

    def remap_csv(self) -> str:
        return (self.smi_dir / "remap.csv").read_text()

    # ------------------------------------------------------------------ Slurm stand-in
    def set_slurm(self, state: str, reason: str) -> None:
        self.state_file.write_text(json.dumps({self.name: {"state": state, "reason": reason}}))

    def slurm(self) -> dict[str, str]:
        return dict(json.loads(self.state_file.read_text())[self.name])

    def calls(self) -> list[list[str]]:
        if not self.calls_file.exists():
            return []
        return [json.loads(line) for line in self.calls_file.read_text().splitlines()]

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls() if c[:1] == ["update"]]

    def enroot_calls(self) -> list[list[str]]:
        if not self.enroot_file.exists():
            return []
        return [json.loads(line) for line in self.enroot_file.read_text().splitlines()]

    # ------------------------------------------------------------------ running
    def run(self, *args: str, program: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        """lingjun-health --root ROOT --node NAME ARGS with the stand-ins first on PATH."""
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SLURM"))}
        full_env.update(PATH=f"{self.bin}:{os.environ['PATH']}", FAKE_SMI_DIR=str(self.smi_dir),
                        FAKE_SLURM_STATE=str(self.state_file), FAKE_SLURM_CALLS=str(self.calls_file),
                        FAKE_ENROOT_CALLS=str(self.enroot_file), TMPDIR=str(self.tmp))
        full_env.update(self.env)
        full_env.update(env)
        prog = program or packaged_program()
        return subprocess.run(["bash", str(prog), "--root", str(self.root), "--node", self.name, *args],
                              capture_output=True, text=True, env=full_env, timeout=60)


def packaged_program() -> Path:
    with health.installed_dir() as folder:
        return folder / health.PROGRAM


def lines(proc: subprocess.CompletedProcess[str], status: str | None = None) -> list[str]:
    """The check lines of a run (OK|FAIL|SKIP ...), optionally only one status."""
    out = [ln for ln in proc.stdout.splitlines() if ln.split(" ", 1)[0] in ("OK", "FAIL", "SKIP")]
    return [ln for ln in out if status is None or ln.startswith(status + " ")]


def statuses(proc: subprocess.CompletedProcess[str]) -> dict[str, set[str]]:
    """check name -> the statuses it reported."""
    out: dict[str, set[str]] = {}
    for ln in lines(proc):
        status, check = ln.split(" ", 2)[:2]
        out.setdefault(check, set()).add(status)
    return out


def is_executable(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IXUSR)
