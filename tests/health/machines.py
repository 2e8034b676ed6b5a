"""Node trees and stand-ins for running lingjun-health without GPUs, RDMA NICs or Slurm.

A `Node` is a directory tree laid out like a real machine's /sys, /proc, /etc and /var, plus a
bin/ of stand-ins for the commands that cannot run here. Real outputs from public sources are
used where they exist (tests/fixtures/health/real/, each cited in tests/fixtures/health/
SOURCES.md): the `nvidia-smi -q` dumps of an 8x H100 node and of an A10, the InfiniBand sysfs
tree of an H100 node with an Ethernet front-end bond, a kernel log with XID 119, a kernel log
with a GPU that fell off the bus, `nvidia-smi nvlink --status` of an 8x A100 and `lspci -nn` of
an NVSwitch system. The Azure ND H200 v5 and RoCE A100 machines are modelled on those dumps
(their bus ids and product names put into the real H100 dump) and on their own public sources.

Stand-ins (bin/):
- nvidia-smi: prints the machine's recorded `-q` report, `nvlink --status` and the `-L` list
  derived from the report; FAKE_SMI_FAIL: the driver error (rc 9); FAKE_SMI_HANG: hangs
  (sleep 1000, its pid in FAKE_SMI_PIDFILE), as nvidia-smi does on a broken GPU; anything
  else is an argument error (rc 2);
- scontrol: keeps one node's State/Reason in a JSON file and records every call; `show node
  -o` prints Slurm 22.05's one-line format; FAKE_SLURM_DOWN: slurmctld unreachable;
  FAKE_SLURM_HANG: hangs;
- enroot: records calls; `start` runs enroot's nvidia hook logic (conf/hooks/98-nvidia.sh: with
  NVIDIA_VISIBLE_DEVICES set it execs nvidia-container-cli configure, and a failing hook fails
  the start with "[ERROR] .../98-nvidia.sh exited with return code N") and then the command,
  with the container's /usr/bin first on PATH; FAKE_ENROOT_START_FAIL: the start fails;
- nvidia-container-cli: tests/fixtures/standins/nvidia-container-cli (modelled on
  NVIDIA/libnvidia-container src/cli); without $STANDIN_NVC it is a machine without a driver;
- systemctl: `is-active UNIT` from the machine's services (active: rc 0, else rc 3).
Everything else the program runs (df, grep, awk, sed, date, setsid) is the real thing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from calendar import timegm
from dataclasses import dataclass, field, replace
from pathlib import Path

from lingjun_slurm.nodes import health
from lingjun_slurm import network

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "health"
REAL = FIXTURES / "real"
NVC_STANDIN = REPO / "tests" / "fixtures" / "standins" / "nvidia-container-cli"
H100_Q = REAL / "nvidia-smi-q" / "gpud-535.161.08-h100x8.txt"
A10_Q = REAL / "nvidia-smi-q" / "gpud-535.129.03-a10.txt"
A100_NVLINK = REAL / "nvlink" / "gpud-a100-nvlink-status.txt"
# Azure HPC images' enroot.conf (local disk under /mnt/resource, per-user parts by $(id -u)).
ENROOT_CONF = """\
ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)
ENROOT_CACHE_PATH /mnt/resource/enroot-cache/user-$(id -u)
ENROOT_DATA_PATH /mnt/resource/enroot-data/user-$(id -u)
ENROOT_TEMP_PATH /mnt/resource/enroot-temp
ENROOT_SQUASH_OPTIONS -noI -noD -noF -noX -no-duplicates
"""


def epoch(text: str) -> int:
    """'2025-05-18T20:00:00' (UTC) -> seconds since the epoch."""
    return timegm(tuple(int(x) for x in re.split(r"[-T:]", text)) + (0, 0, 0))  # type: ignore[arg-type]


# ------------------------------------------------------------------ nvidia-smi -q text
GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)$", re.M)


def q_bus_ids(text: str) -> list[str]:
    return GPU_HEADER.findall(text)


def model_q(bus_ids: list[str], product: str, fabric: str | None = None, base: Path = H100_Q) -> str:
    """The real 8x H100 report (driver 535.161.08) with these bus ids (in order) and product name;
    fabric="N/A" turns the Fabric section to N/A (GPUs before Hopper do not report it)."""
    text = base.read_text()
    old = q_bus_ids(text)
    assert len(old) == len(bus_ids), (old, bus_ids)
    for a, b in zip(old, bus_ids):
        text = text.replace(a, b)
    text = text.replace("NVIDIA H100 80GB HBM3", product)
    if fabric is not None:
        text = re.sub(r"(\n    Fabric\n        State +: )\S.*\n(        Status +: )\S.*\n", rf"\g<1>{fabric}\n\g<2>{fabric}\n",
                      text)
    return text


def q_set(text: str, gpu: int, path: tuple[str, ...], value: str) -> str:
    """Set the field at PATH (section names, then the key) of GPU number GPU in a -q report,
    keeping the report's alignment; the field must exist."""
    out, block, stack, done = [], -1, [], False
    for line in text.splitlines(keepends=True):
        if GPU_HEADER.match(line.rstrip("\n")):
            block, stack = block + 1, []
            out.append(line)
            continue
        stripped = line.rstrip("\n")
        if block == gpu and stripped.strip():
            level = (len(stripped) - len(stripped.lstrip(" "))) // 4
            body = stripped.strip()
            key = body.split(" : ", 1)[0].strip() if " : " in stripped else body
            stack = stack[:level - 1] + [key]
            if " : " in stripped and tuple(stack) == path and not done:
                head = stripped.split(" : ", 1)[0]
                line = f"{head} : {value}\n"
                done = True
        out.append(line)
    assert done, (gpu, path)
    return "".join(out)


def q_list(text: str) -> str:
    """`nvidia-smi -L` for a -q report: "GPU i: NAME (UUID: GPU-...)"."""
    names = re.findall(r"^    Product Name +: (.*)$", text, re.M)
    uuids = re.findall(r"^    GPU UUID +: (.*)$", text, re.M)
    return "".join(f"GPU {i}: {n} (UUID: {u})\n" for i, (n, u) in enumerate(zip(names, uuids)))


def model_nvlink(q_text: str, links: int) -> str:
    """`nvidia-smi nvlink --status` in the layout of the real 8x A100 output, for the GPUs of a
    -q report, each with LINKS active links."""
    rows = []
    for i, line in enumerate(q_list(q_text).splitlines()):
        rows.append(line + "\n" + "".join(f"         Link {n}: 26.562 GB/s\n" for n in range(links)))
    return "".join(rows)


# ------------------------------------------------------------------ machines
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
    sku: str
    profile: str  # network profile whose nccl.conf the node has
    ports: list[Port]
    netdevs: dict[str, tuple[str, str]]  # name -> (operstate, carrier)
    smi_q: str  # what `nvidia-smi -q` prints
    nvlink: str = ""  # what `nvidia-smi nvlink --status` prints
    kernel_log: str = "kern/clean.log"  # under tests/fixtures/health/
    now: int = epoch("2025-05-18T20:00:00")  # LINGJUN_HEALTH_NOW for the XID window
    uptime: int = 9000  # /proc/uptime (dmesg's "[seconds since boot]")
    ib_tree: Path | None = None  # a real /sys/class/infiniband tree, copied instead of `ports`
    lspci: str | None = None  # an `lspci -nn` fixture: its devices go to /sys/bus/pci/devices
    services: dict[str, str] = field(default_factory=lambda: {"nvidia-fabricmanager": "active"})
    modules: tuple[str, ...] = ()  # loaded kernel modules (/sys/module/NAME)
    config: dict[str, str] = field(default_factory=dict)  # extra health.conf keys
    dropins: dict[str, str] = field(default_factory=dict)  # health.conf.d/NAME -> text
    nccl: dict[str, str | None] = field(default_factory=dict)  # nccl.conf overrides (None removes)
    # Interface addresses ("10.0.0.4/24", "fe80::1/64") for /proc/net/{fib_trie,route,if_inet6};
    # None: lo 127.0.0.1/8 and ::1, and each other running interface 10.N.0.4/24 (see proc_net).
    addrs: dict[str, tuple[str, ...]] | None = None
    proc_net: bool = True  # False: no /proc/net files (a kernel or container without them)

    def port(self, hca: str) -> Port:
        return next(p for p in self.ports if p.hca == hca)


ND_H200_BUS = [f"0000000{d}:00:00.0" for d in "12389ABC"]


def azure_nd_h200_v5() -> Machine:
    """Azure ND H200 v5: 8 GPUs, mlx5_ib0..7 InfiniBand at 400 Gb/s, mlx5_an0 Ethernet;
    NVSwitch (Fabric Manager running), nvidia_peermem loaded, 18 NVLinks per GPU."""
    ports = [Port(f"mlx5_ib{i}", gids={0: (f"fe80:0000:0000:0000:0015:5dff:fe34:{0x33 + i:04x}", "IB/RoCE v1")})
             for i in range(8)]
    ports.append(Port("mlx5_an0", rate="100 Gb/sec (4X EDR)", link_layer="Ethernet",
                      gids={0: ("fe80:0000:0000:0000:0222:48ff:fe65:bc8d", "IB/RoCE v1"),
                            1: ("fe80:0000:0000:0000:0222:48ff:fe65:bc8d", "RoCE v2")}))
    netdevs = {"lo": ("unknown", "1"), "eth0": ("up", "1"), "docker0": ("down", "0"),
               **{f"ib{i}": ("up", "1") for i in range(8)}}
    q = model_q(ND_H200_BUS, "NVIDIA H200")
    return Machine("Standard_ND96isr_H200_v5", "azure-nd-h200-v5", ports, netdevs, q, model_nvlink(q, 18),
                   modules=("nvidia_peermem",))


ROCE_IPV4 = ["0a00:3c03", "190b:8002", "190b:8022", "190b:8042", "190b:8062", "190b:8082", "190b:80a2",
             "190b:80c2", "190b:80e2"]
ROCE_LL = ["f820:20ff:fe28:c769", "eaeb:d3ff:fecc:c920", "eaeb:d3ff:fecc:c921", "eaeb:d3ff:fe6c:51d2",
           "eaeb:d3ff:fe6c:51d3", "eaeb:d3ff:fe33:1366", "eaeb:d3ff:fe33:1367", "eaeb:d3ff:fe6c:68ae",
           "eaeb:d3ff:fe6c:68af"]
ROCE_BUS = [f"00000000:{b}:00.0" for b in ("53", "59", "6E", "73", "8D", "92", "C9", "CF")]


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
    return Machine("ml.gu7xf.8xlarge-gu108", "lingjun", ports, netdevs,
                   model_q(ROCE_BUS, "NVIDIA A100-SXM4-80GB", fabric="N/A"), services={})


ND_A100_BUS = [f"0000000{d}:00:00.0" for d in "1234BCDE"]


def azure_nd_a100_v4() -> Machine:
    """Azure NDm A100 v4 with the real outputs of gpud's fabric-manager test data: its `lspci -nn`
    (8 A100 at PCI domains 0001-0004 and 000b-000e, six NVSwitch bridges 0005-000a, eight
    ConnectX-6 VFs, Microsoft NVMe) and its `nvidia-smi nvlink --status` (12 links per GPU at
    25 GB/s). Its -q report is modelled (the H100 report with these bus ids, Fabric N/A); the
    IB ports follow Azure's conf (mlx5_ib0..7 at 200 Gb/s HDR)."""
    ports = [Port(f"mlx5_ib{i}", rate="200 Gb/sec (4X HDR)") for i in range(8)]
    netdevs = {"lo": ("unknown", "1"), "eth0": ("up", "1"), **{f"ib{i}": ("up", "1") for i in range(8)}}
    return Machine("Standard_ND96amsr_A100_v4", "azure-nd-a100-v4", ports, netdevs,
                   model_q(ND_A100_BUS, "NVIDIA A100-SXM4-80GB", fabric="N/A"), A100_NVLINK.read_text(),
                   lspci="real/lspci/gpud-a100-lspci-nn.txt", modules=("nvidia_peermem",))


def gpud_h100() -> Machine:
    """The real H100 node of leptonai/gpud's test data: its nvidia-smi -q (8x H100, driver
    535.161.08), its /sys/class/infiniband (mlx5_0,1,4..9 InfiniBand at 400 Gb/s and the
    Ethernet front-end bond mlx5_bond_0 at 200 Gb/s) and its kernel log with XID 119 on GPU4
    (PCI 0000:9b:00) on 2025-02-23 16:24-16:30 (dmesg -T), judged the next day (12:00 UTC) unless a
    test sets another time. The SKU: the generic-ib profile (NCCL_IB_HCA=mlx5)
    with the site's counts in a drop-in, as a site would run such a node."""
    return Machine("generic-ib", "generic-ib", [], {"lo": ("unknown", "1"), "bond0": ("up", "1")},
                   H100_Q.read_text(), kernel_log="real/kern/gpud-dmesg-with-xid-119.log",
                   now=epoch("2025-02-24T12:00:00"), ib_tree=REAL / "sysfs-class-infiniband" / "gpud-h100-0",
                   dropins={"50-site.conf": "# site settings\nGPU_COUNT=8\nIB_PORT_COUNT=8\nIB_RATE_GBPS=400\n"})


def _running(oper: str, carrier: str) -> bool:
    return oper == "up" or (oper == "unknown" and carrier == "1")


def default_addrs(netdevs: dict[str, tuple[str, str]]) -> dict[str, tuple[str, ...]]:
    """lo: 127.0.0.1/8 and ::1; every other running interface, in order: 10.N.0.4/24 (no IPv6:
    as with net.ipv6.conf.*.disable_ipv6=1 there, which leaves only lo's ::1 in if_inet6)."""
    out: dict[str, tuple[str, ...]] = {}
    n = 0
    for name, (oper, carrier) in netdevs.items():
        if name == "lo":
            out[name] = ("127.0.0.1/8", "::1/128")
        elif _running(oper, carrier):
            out[name] = (f"10.{n}.0.4/24",)
            n += 1
    return out


def _v4(text: str) -> int:
    a, b, c, d = (int(x) for x in text.split("."))
    return (a << 24) | (b << 16) | (c << 8) | d


def _dotted(value: int) -> str:
    return ".".join(str((value >> s) & 255) for s in (24, 16, 8, 0))


def _le_hex(value: int) -> str:
    """A network-order word as /proc/net/route prints it on a little-endian CPU ("%08X")."""
    return f"{int.from_bytes(value.to_bytes(4, 'big'), 'little'):08X}"


def proc_net(netdevs: dict[str, tuple[str, str]], addrs: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """/proc/net/fib_trie, route and if_inet6 in the kernel's formats (SOURCES.md): each IPv4
    address a LOCAL /32 of the local table and its prefix a link route of the main table on its
    interface; a default route via .1 of the first non-loopback interface with an IPv4 address.
    The trie is drawn flat (one internal node per table); the line formats are the kernel's."""
    import ipaddress

    index = {name: i + 1 for i, name in enumerate(netdevs)}
    main: list[tuple[int, list[str]]] = []
    local: list[tuple[int, list[str]]] = []
    routes: list[str] = []
    inet6: list[str] = []
    gateway = None
    for name, items in addrs.items():
        for item in items:
            iface = ipaddress.ip_interface(item)
            if iface.version == 6:
                a = iface.ip
                scope = 0x10 if a.is_loopback else 0x20 if a.is_link_local else 0x00
                inet6.append(f"{a.exploded.replace(':', '')} {index.get(name, 1):02x} "
                             f"{iface.network.prefixlen:02x} {scope:02x} 80 {name:>8}\n")
                continue
            ip, net = int(iface.ip), iface.network
            local.append((ip, ["/32 host LOCAL"]))
            if net.prefixlen < 32:
                local.append((int(net.broadcast_address), ["/32 link BROADCAST"]))
            if name == "lo" or str(iface.ip).startswith("127."):
                local.append((int(net.network_address), [f"/{net.prefixlen} host LOCAL"]))
                continue
            main.append((int(net.network_address), [f"/{net.prefixlen} link UNICAST"]))
            mask = (0xFFFFFFFF << (32 - net.prefixlen)) & 0xFFFFFFFF
            routes.append(f"{name}\t{_le_hex(int(net.network_address))}\t00000000\t0001\t0\t0\t0\t{_le_hex(mask)}"
                          "\t0\t0\t0")
            if gateway is None:
                gateway = (name, int(net.network_address) + 1)
    if gateway is not None:
        main.append((0, ["/0 universe UNICAST"]))
        routes.insert(0, f"{gateway[0]}\t00000000\t{_le_hex(gateway[1])}\t0003\t0\t0\t100\t00000000\t0\t0\t0")

    def table(title: str, leaves: list[tuple[int, list[str]]]) -> str:
        merged: dict[int, list[str]] = {}
        for key, aliases in sorted(leaves):
            merged.setdefault(key, []).extend(aliases)
        if not merged:
            return ""
        out = [f"{title}:", f"  +-- 0.0.0.0/0 {max(1, len(merged).bit_length())} 0 0"]
        for key, aliases in merged.items():
            out.append(f"     |-- {_dotted(key)}")
            out += [f"        {a}" for a in aliases]
        return "\n".join(out) + "\n"

    header = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"
    route_text = "".join(f"{line:<127}\n" for line in [header, *routes])
    return {"fib_trie": table("Main", main) + table("Local", local), "route": route_text, "if_inet6": "".join(inet6)}


def _write(path: Path, text: str, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if mode is not None:
        path.chmod(mode)


NVIDIA_SMI = f"""#!{sys.executable}
import os, re, sys, time
from pathlib import Path
args, data = sys.argv[1:], Path(os.environ["FAKE_SMI_DIR"])
if os.environ.get("FAKE_SMI_HANG"):
    if os.environ.get("FAKE_SMI_PIDFILE"):
        Path(os.environ["FAKE_SMI_PIDFILE"]).write_text(str(os.getpid()))
    time.sleep(1000)
if os.environ.get("FAKE_SMI_FAIL"):
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
          "Make sure that the latest NVIDIA driver is installed and running.")
    sys.exit(9)
if args == ["-q"]:
    sys.stdout.write((data / "q.txt").read_text())
    sys.exit(int((data / "q.rc").read_text()) if (data / "q.rc").exists() else 0)
if args == ["--query-compute-apps=pid", "--format=csv,noheader"]:  # level 2's busy-GPU gate
    apps = data / "apps.txt"
    sys.stdout.write(apps.read_text() if apps.exists() else "")
    sys.exit(0)
if args in (["nvlink", "--status"], ["nvlink", "-s"]):
    sys.stdout.write((data / "nvlink.txt").read_text())
    sys.exit(0)
if args == ["-L"]:
    text = (data / "q.txt").read_text()
    names = re.findall(r"^    Product Name +: (.*)$", text, re.M)
    uuids = re.findall(r"^    GPU UUID +: (.*)$", text, re.M)
    sys.stdout.write("".join(f"GPU {{i}}: {{n}} (UUID: {{u}})\\n" for i, (n, u) in enumerate(zip(names, uuids))))
    sys.exit(0)
print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
sys.exit(2)
"""

SCONTROL = f"""#!{sys.executable}
import json, os, sys
from pathlib import Path
state_file, args = Path(os.environ["FAKE_SLURM_STATE"]), sys.argv[1:]
with open(os.environ["FAKE_SLURM_CALLS"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if os.environ.get("FAKE_SLURM_HANG"):
    import time
    time.sleep(1000)
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
        base = node["state"].split("+")[0]
        flags = [f for f in node["state"].split("+")[1:] if f != "DRAIN"]
        node.update(state="+".join([base if base != "UNKNOWN" else "IDLE", "DRAIN", *flags]), reason=fields["Reason"])
    elif fields["State"] == "RESUME":
        node.update(state="IDLE", reason="")
    state_file.write_text(json.dumps(nodes))
    sys.exit(0)
print(f"stand-in scontrol: unexpected {{args}}", file=sys.stderr)
sys.exit(2)
"""

ENROOT = f"""#!{sys.executable}
import json, os, subprocess, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_ENROOT_CALLS"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[:1] != ["start"]:
    sys.exit(0)
rest, env = args[1:], {{}}
while rest and rest[0] in ("-e", "--env"):
    key, _, value = rest[1].partition("=")
    env[key] = value
    rest = rest[2:]
name, command = rest[0], rest[1:]
if os.environ.get("FAKE_ENROOT_START_FAIL"):
    print(f"[ERROR] No such file or directory: /mnt/resource/enroot-data/user-0/{{name}}", file=sys.stderr)
    sys.exit(1)
rootfs = Path(os.environ["FAKE_ENROOT_DATA"]) / name
rootfs.mkdir(parents=True, exist_ok=True)
# conf/hooks/98-nvidia.sh: nothing to do unless NVIDIA_VISIBLE_DEVICES is set (and not void)
visible = env.get("NVIDIA_VISIBLE_DEVICES", "void")
if visible != "void":
    cli = ["nvidia-container-cli", "--user", "configure", "--no-cgroups", "--ldconfig=@/sbin/ldconfig"]
    if visible != "none":
        cli.append(f"--device={{visible}}")
    for cap in (env.get("NVIDIA_DRIVER_CAPABILITIES") or "utility").split(","):
        cli.append(f"--{{cap}}")
    hook = subprocess.run(cli + [str(rootfs)], capture_output=True, text=True)
    sys.stderr.write(hook.stderr)
    if hook.returncode:
        print(f"[ERROR] /etc/enroot/hooks.d/98-nvidia.sh exited with return code {{hook.returncode}}", file=sys.stderr)
        sys.exit(1)
if command == ["true"]:
    sys.exit(0)
path = f"{{rootfs}}/usr/bin:{{rootfs}}/bin"
exe = next((Path(d) / command[0] for d in path.split(":") if (Path(d) / command[0]).exists()), None)
if exe is None:
    print(f"[ERROR] Command not found: {{command[0]}}", file=sys.stderr)
    sys.exit(1)
sys.exit(subprocess.run([str(exe), *command[1:]]).returncode)
"""

SYSTEMCTL = f"""#!{sys.executable}
import json, os, sys
args = [a for a in sys.argv[1:] if a != "--quiet"]
services = json.loads(os.environ["FAKE_SERVICES"])
if args[:1] == ["is-active"] and len(args) == 2:
    state = services.get(args[1], "inactive")
    print(state)
    sys.exit(0 if state == "active" else 3)
print(f"stand-in systemctl: unexpected {{args}}", file=sys.stderr)
sys.exit(1)
"""


class Node:
    """A machine's tree under tmp/root, stand-ins in tmp/bin, and a runner for lingjun-health."""

    def __init__(self, tmp: Path, machine: Machine, name: str = "gpu-node-7",
                 standins: tuple[str, ...] = ("nvidia-smi", "scontrol", "enroot", "systemctl",
                                              "nvidia-container-cli")) -> None:
        self.tmp, self.machine, self.name, self.standins = tmp, machine, name, standins
        self.root, self.bin = tmp / "root", tmp / "bin"
        self.state_file, self.calls_file = tmp / "slurm.json", tmp / "calls.jsonl"
        self.enroot_file = tmp / "enroot.jsonl"
        self.smi_dir = tmp / "smi"
        self.env: dict[str, str] = {}
        self.build()

    # ------------------------------------------------------------------ the tree
    def build(self) -> None:
        """(Re)write the tree from self.machine; Slurm state, call logs and nvidia-smi edits are kept."""
        m, root = self.machine, self.root
        if root.exists():
            shutil.rmtree(root)
        ib = root / "sys/class/infiniband"
        if m.ib_tree is not None:
            shutil.copytree(m.ib_tree, ib)
        for p in m.ports:
            d = ib / p.hca / "ports" / str(p.port)
            for name, value in (("state", p.state), ("phys_state", p.phys_state), ("rate", p.rate),
                                ("link_layer", p.link_layer)):
                _write(d / name, value + "\n")
            for idx, (gid, kind) in p.gids.items():
                _write(d / "gids" / str(idx), gid + "\n")
                _write(d / "gid_attrs" / "types" / str(idx), kind + "\n")
        for name, (oper, carrier) in m.netdevs.items():
            _write(root / "sys/class/net" / name / "operstate", oper + "\n")
            _write(root / "sys/class/net" / name / "carrier", carrier + "\n")
            # dev->flags (include/uapi/linux/if.h): IFF_UP 0x1, IFF_LOOPBACK 0x8, IFF_MULTICAST 0x1000
            flags = 0x9 if name == "lo" else (0x1003 if _running(oper, carrier) else 0x1002)
            _write(root / "sys/class/net" / name / "flags", f"0x{flags:x}\n")
        if m.proc_net:
            addrs = default_addrs(m.netdevs) if m.addrs is None else m.addrs
            for name, text in proc_net(m.netdevs, addrs).items():
                _write(root / "proc/net" / name, text)
        if m.lspci:  # lspci -nn "DOMAIN:BUS:DEV.FN Class [cccc]: Vendor Device [vvvv:dddd]"
            for line in (FIXTURES / m.lspci).read_text().splitlines():
                found = re.match(r"^(\S+) .*\[([0-9a-f]{4})\]: .*\[([0-9a-f]{4}):([0-9a-f]{4})\]", line)
                if found:
                    addr, cls, vendor, device = found.groups()
                    d = root / "sys/bus/pci/devices" / addr
                    _write(d / "vendor", f"0x{vendor}\n")
                    _write(d / "device", f"0x{device}\n")
                    _write(d / "class", f"0x{cls}00\n")
        for module in m.modules:
            _write(root / "sys/module" / module / "initstate", "live\n")
        _write(root / "proc/uptime", f"{m.uptime}.42 {m.uptime * 90}.17\n")
        overrides = {k: v for k, v in m.nccl.items()}
        _write(root / "etc/nccl.conf",
               network.render(network.resolve(network.get_profile(m.profile), overrides), "nccl.conf"))
        _write(root / "etc/enroot/enroot.conf", ENROOT_CONF)
        for sub in ("run/enroot", "mnt/resource/enroot-cache", "mnt/resource/enroot-data", "mnt/resource/enroot-temp"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        _write(root / "var/log/kern.log", (FIXTURES / m.kernel_log).read_text())
        config = {"SKU": m.sku, "KERNEL_LOG": "/var/log/kern.log", "MIN_FREE_GB": "1", **m.config}
        _write(root / "etc/lingjun-slurm/health.conf",
               "# written by tests/health/machines.py\n" + "".join(f"{k}={v}\n" for k, v in config.items()))
        for name, text in m.dropins.items():
            _write(root / "etc/lingjun-slurm/health.conf.d" / name, text)
        self.smi_dir.mkdir(exist_ok=True)
        if not (self.smi_dir / "q.txt").exists():
            (self.smi_dir / "q.txt").write_text(m.smi_q)
            (self.smi_dir / "nvlink.txt").write_text(m.nvlink)
        for name, text in (("nvidia-smi", NVIDIA_SMI), ("scontrol", SCONTROL), ("enroot", ENROOT),
                           ("systemctl", SYSTEMCTL)):
            if name in self.standins:
                _write(self.bin / name, text, 0o755)
        if "nvidia-container-cli" in self.standins and not (self.bin / "nvidia-container-cli").exists():
            (self.bin / "nvidia-container-cli").symlink_to(NVC_STANDIN)
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

    def set_q(self, text: str, rc: int = 0) -> None:
        """Replace what `nvidia-smi -q` prints (and its exit status)."""
        (self.smi_dir / "q.txt").write_text(text)
        (self.smi_dir / "q.rc").write_text(str(rc))

    def q(self) -> str:
        return (self.smi_dir / "q.txt").read_text()

    def set_gpu_field(self, gpu: int, path: tuple[str, ...], value: str) -> None:
        self.set_q(q_set(self.q(), gpu, path, value))

    def set_nvlink(self, text: str) -> None:
        (self.smi_dir / "nvlink.txt").write_text(text)

    def nvlink(self) -> str:
        return (self.smi_dir / "nvlink.txt").read_text()

    def with_driver(self) -> None:
        """Give nvidia-container-cli a loaded driver with this machine's GPUs (from the -q report),
        and the host's nvidia-smi as the binary it mounts into containers."""
        text = self.q()
        names = re.findall(r"^    Product Name +: (.*)$", text, re.M)
        uuids = re.findall(r"^    GPU UUID +: (.*)$", text, re.M)
        gpus = [{"model": n, "brand": "Unknown", "uuid": u, "busid": b.lower(), "arch": "9.0", "minor": i}
                for i, (n, u, b) in enumerate(zip(names, uuids, q_bus_ids(text)))]
        desc = {"driver": "535.161.08", "cuda": "12.2", "gpus": gpus, "binaries": [["/usr/bin/nvidia-smi", str(self.bin / "nvidia-smi")]]}
        (self.tmp / "nvc.json").write_text(json.dumps(desc))
        self.env["STANDIN_NVC"] = str(self.tmp / "nvc.json")

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
    def base_env(self) -> dict[str, str]:
        """The stand-ins' environment (without --root and the config)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SLURM", "STANDIN_NVC"))}
        env.update(PATH=f"{self.bin}:{os.environ['PATH']}", FAKE_SMI_DIR=str(self.smi_dir),
                   FAKE_SLURM_STATE=str(self.state_file), FAKE_SLURM_CALLS=str(self.calls_file),
                   FAKE_ENROOT_CALLS=str(self.enroot_file), FAKE_ENROOT_DATA=str(self.tmp / "enroot-data"),
                   FAKE_SERVICES=json.dumps(self.machine.services), TMPDIR=str(self.tmp), TZ="UTC",
                   LINGJUN_HEALTH_NOW=str(self.machine.now))
        env.update(self.env)
        return env

    def run(self, *args: str, program: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        """lingjun-health --root ROOT --node NAME ARGS with the stand-ins first on PATH."""
        full_env = self.base_env()
        full_env.update(env)
        prog = program or packaged_program()
        return subprocess.run(["bash", str(prog), "--root", str(self.root), "--node", self.name, *args],
                              capture_output=True, text=True, env=full_env, timeout=90)


def packaged_program() -> Path:
    """The packaged program; $LINGJUN_HEALTH_TEST_PROGRAM runs the tests against another copy
    (an older revision, with its thresholds/ beside it: how the tests were shown to fail before)."""
    if os.environ.get("LINGJUN_HEALTH_TEST_PROGRAM"):
        return Path(os.environ["LINGJUN_HEALTH_TEST_PROGRAM"])
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


# ------------------------------------------------------------------ level 2 (--level 2) stand-ins
NVB_README_H2D = REAL / "nvbandwidth" / "readme-66746a3-host_to_device_memcpy_ce.txt"
NVB_README_D2D = REAL / "nvbandwidth" / "readme-66746a3-device_to_device_memcpy_write_ce.txt"
DCGM_GB10 = REAL / "dcgmi" / "glimmer-burnin-gb10-level2.json"
IB_CLIENT = FIXTURES / "modelled" / "ib_write_bw-use_cuda-client.txt"
NCCL_FIXTURES = REPO / "tests" / "fixtures" / "nccl"

# nvbandwidth: for each -t TEST, FAKE_NVB_DIR/TEST.txt; FAKE_SLOW_GPU=k divides column k by 4.
NVBANDWIDTH = f"""#!{sys.executable}
import os, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_L2_CALLS"], "a") as log:
    log.write("nvbandwidth " + " ".join(args) + "\\n")
tests = []
if "-t" in args:
    for a in args[args.index("-t") + 1:]:
        if a.startswith("-"):
            break
        tests.append(a)
slow = os.environ.get("FAKE_SLOW_GPU")
for t in tests:
    f = Path(os.environ["FAKE_NVB_DIR"]) / (t + ".txt")
    if not f.exists():
        continue
    for line in f.read_text().splitlines():
        cells = line.split()
        if slow is not None and line[:1].isdigit() and len(cells) > 1:
            k = int(slow) + 1
            if k < len(cells) and cells[k] != "N/A":
                cells[k] = "%.2f" % (float(cells[k]) / 4)
            line = cells[0].ljust(2) + "".join(c.rjust(10) for c in cells[1:])
        print(line)
print()
"""

# all_reduce_perf: prints FAKE_NCCL_OUT, exits FAKE_NCCL_RC (0).
ALL_REDUCE_PERF = f"""#!{sys.executable}
import os, sys
with open(os.environ["FAKE_L2_CALLS"], "a") as log:
    log.write("all_reduce_perf " + " ".join(sys.argv[1:]) + "\\n")
sys.stdout.write(open(os.environ["FAKE_NCCL_OUT"]).read())
sys.exit(int(os.environ.get("FAKE_NCCL_RC", "0")))
"""

# ib_write_bw (perftest): --help lists --use_cuda (perftest_parameters.c:749-751) unless
# FAKE_IB_NO_CUDA; a server (no host argument) prints nothing; a client prints the modelled
# report with BW average 391.22, or 120.55 on the HCA named by FAKE_SLOW_HCA.
IB_WRITE_BW = f"""#!{sys.executable}
import os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_L2_CALLS"], "a") as log:
    log.write("ib_write_bw " + " ".join(args) + "\\n")
if args == ["--help"]:
    print("Usage:")
    print("  ib_write_bw            start a server and wait for connection")
    if not os.environ.get("FAKE_IB_NO_CUDA"):
        print("      --use_cuda=<cuda device id> Use CUDA specific device for GPUDirect RDMA testing")
    sys.exit(0)
if args[-1].startswith("-") or args[-2] in ("-d", "-p", "-s", "-x"):
    sys.exit(0)
dev = args[args.index("-d") + 1]
text = open({str(IB_CLIENT)!r}).read()
if os.environ.get("FAKE_SLOW_HCA") == dev:
    text = text.replace("391.22", "120.55")
sys.stdout.write(text)
"""

# dcgmi: `diag -r 2 -j` prints FAKE_DCGM_OUT; FAKE_DCGM_NOENGINE: dcgmi's message when no host
# engine answers (NVIDIA/DCGM dcgmi/Command.cpp:74 at 72fa3fe).
DCGMI = f"""#!{sys.executable}
import os, sys
with open(os.environ["FAKE_L2_CALLS"], "a") as log:
    log.write("dcgmi " + " ".join(sys.argv[1:]) + "\\n")
if os.environ.get("FAKE_DCGM_NOENGINE"):
    print("Error: unable to establish a connection to the specified host: localhost")
    sys.exit(255)
sys.stdout.write(open(os.environ["FAKE_DCGM_OUT"]).read())
"""


def nvbandwidth_dir(dst: Path) -> Path:
    """The nvbandwidth stand-in's matrices: host_to_device_memcpy_ce is NVIDIA's README output
    verbatim (8 GPUs, 26 GB/s); device_to_host_memcpy_ce is that matrix under D2H's title and
    device_to_device_memcpy_read_ce the README's write_ce matrix (276 GB/s, 0.00 on the diagonal)
    under read_ce's name: both modelled (tests/fixtures/health/SOURCES.md)."""
    dst.mkdir(parents=True, exist_ok=True)
    h2d = NVB_README_H2D.read_text()
    (dst / "host_to_device_memcpy_ce.txt").write_text(h2d)
    (dst / "device_to_host_memcpy_ce.txt").write_text(
        h2d.replace("host_to_device_memcpy_ce", "device_to_host_memcpy_ce").replace("CPU(row) ->", "CPU(row) <-"))
    (dst / "device_to_device_memcpy_read_ce.txt").write_text(
        NVB_README_D2D.read_text().replace("device_to_device_memcpy_write_ce", "device_to_device_memcpy_read_ce"))
    return dst


def add_level2(node: Node, tools: tuple[str, ...] = ("nvbandwidth", "all_reduce_perf", "ib_write_bw", "dcgmi"),
               nccl_out: str = "nccl_tests_290_h100_1node_all_reduce.txt") -> None:
    """Put level 2's stand-ins in the node's bin/ and their recorded outputs in its environment;
    the calls are logged to tmp/l2-calls.txt. L2_IB_SERVER_WAIT=0 in a drop-in (no 5 s wait)."""
    texts = {"nvbandwidth": NVBANDWIDTH, "all_reduce_perf": ALL_REDUCE_PERF, "ib_write_bw": IB_WRITE_BW, "dcgmi": DCGMI}
    for name in tools:
        _write(node.bin / name, texts[name], 0o755)
    node.env.update(FAKE_L2_CALLS=str(node.tmp / "l2-calls.txt"), FAKE_NVB_DIR=str(nvbandwidth_dir(node.tmp / "nvb")),
                    FAKE_NCCL_OUT=str(NCCL_FIXTURES / nccl_out), FAKE_DCGM_OUT=str(DCGM_GB10))
    _write(node.root / "etc/lingjun-slurm/health.conf.d/90-l2-test.conf", "L2_IB_SERVER_WAIT=0\n")


def l2_calls(node: Node) -> list[str]:
    f = node.tmp / "l2-calls.txt"
    return f.read_text().splitlines() if f.exists() else []

