"""NCCL_IB_HCA / NCCL_SOCKET_IFNAME as NCCL reads them (NVIDIA/nccl at 5067397c).

src/misc/utils.cc parseStringList: entries split on "," (empty ones skipped), each
"name[:port[:rail[:plane]]]", an empty name skipped, an empty or absent port = every port (-1),
at most maxList entries (MAX_IB_DEVS 32, MAX_IFS 16); matchIf: a prefix, or with "=" the exact
name; matchPort: -1 on either side matches; matchIfList: an empty list matches everything.
src/transport/net_ib/init.cc ncclIbInit strips "^" (exclude) first, then "=" (exact), and keeps a
port when matchIfList(...) XOR exclude; src/os/linux.cc does the same for sockets with port -1.
docs/userguide/source/env.rst documents the forms and that "mlx5_1" also selects mlx5_10..19.

The tree: the real H100 InfiniBand sysfs (mlx5_0, 1, 4..9 and mlx5_bond_0, Ethernet) plus two
modelled HCAs, mlx5_10 and a two-port mlx5_2. Every InfiniBand port is DOWN, so each port the
list selects shows up as one "PORT DOWN" failure: the set of failures is the selection.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.health.machines import Node, Port, gpud_h100, lines

IB = ["mlx5_0:1", "mlx5_1:1", "mlx5_10:1", "mlx5_2:1", "mlx5_2:2"] + [f"mlx5_{i}:1" for i in range(4, 10)]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Node:
    m = gpud_h100()
    n = Node(tmp_path_factory.mktemp("nccl"), m)
    n.change(ports=[Port("mlx5_10"), Port("mlx5_2", 1), Port("mlx5_2", 2)],
             dropins={"50-site.conf": "GPU_COUNT=8\nIB_PORT_COUNT=1\n"}, kernel_log="kern/clean.log")
    for d in (n.root / "sys/class/infiniband").glob("*/ports/*"):
        if (d / "link_layer").read_text().strip() == "InfiniBand":
            (d / "state").write_text("1: DOWN\n")
    return n


def selected(node: Node, spec: str) -> list[str]:
    proc = node.run("--no-drain", NCCL_IB_HCA=spec)
    fails = [ln.split(" ", 2)[2] for ln in lines(proc, "FAIL") if ln.startswith("FAIL ib-ports ")]
    # the entries that name no device here (x0.., "^mlx5_0" as an exact name) are reported too
    fails = [f for f in fails if not f.endswith(", which this node does not have")]
    if fails == [f"0 RDMA ports match NCCL_IB_HCA={spec} (InfiniBand), expected 1"]:
        return []
    assert all(f.endswith(" DOWN") for f in fails), fails
    return sorted(f.replace(" port ", ":").removesuffix(" DOWN") for f in fails)


ALL = sorted(IB)


@pytest.mark.parametrize("spec,want", [
    ("mlx5", ALL),
    ("mlx5_1", ["mlx5_1:1", "mlx5_10:1"]),  # a prefix: mlx5_10 too (env.rst)
    ("=mlx5_1", ["mlx5_1:1"]),
    ("^=mlx5_1,mlx5_4", sorted(set(ALL) - {"mlx5_1:1", "mlx5_4:1"})),
    ("^mlx5_1", sorted(set(ALL) - {"mlx5_1:1", "mlx5_10:1"})),
    ("=mlx5_2:2", ["mlx5_2:2"]),
    ("=mlx5_2", ["mlx5_2:1", "mlx5_2:2"]),
    ("=mlx5_2::0:0", ["mlx5_2:1", "mlx5_2:2"]),  # an empty port before rail:plane: every port
    ("=mlx5_2:1:0:1", ["mlx5_2:1"]),  # rail and plane do not select
    ("mlx5_4,,mlx5_5,", ["mlx5_4:1", "mlx5_5:1"]),  # empty entries skipped
    (":1", ALL),  # an entry without a name is skipped: no entries, everything
    ("^", []),  # exclude nothing listed... of an empty list: matchIfList true, XOR exclude: nothing
    ("=^mlx5_0", []),  # "^" only counts first: an exact name "^mlx5_0"
    ("^mlx5_bond", ALL),
    (",".join(f"x{i}" for i in range(32)) + ",mlx5_0", []),  # only 32 entries are read
    (",".join(f"x{i}" for i in range(31)) + ",mlx5_0", ["mlx5_0:1"]),
])
def test_nccl_ib_hca_selection(node: Node, spec: str, want: list[str]) -> None:
    assert selected(node, spec) == sorted(want)


def test_socket_ifname_reads_at_most_16_entries(tmp_path: Path) -> None:
    n = Node(tmp_path, gpud_h100())
    n.change(netdevs={"lo": ("unknown", "1"), "bond0": ("up", "1")}, kernel_log="kern/clean.log")
    many = ",".join(f"x{i}" for i in range(16))
    proc = n.run("--no-drain", NCCL_SOCKET_IFNAME=many + ",bond0")
    assert f"FAIL socket-if no interface matches NCCL_SOCKET_IFNAME={many},bond0" in lines(proc)
    proc = n.run("--no-drain", NCCL_SOCKET_IFNAME=",".join(f"x{i}" for i in range(15)) + ",bond0")
    assert any(ln.startswith("OK socket-if bond0 up") for ln in lines(proc)), proc.stdout
    proc = n.run("--no-drain", NCCL_SOCKET_IFNAME="=bond")
    assert "FAIL socket-if no interface matches NCCL_SOCKET_IFNAME==bond" in lines(proc)
