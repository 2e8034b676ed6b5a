"""socket-if: the interfaces NCCL's socket code can use (NVIDIA/nccl at 5067397c).

src/os/linux.cc ncclOsFindInterfaces (lines 394-419) takes the getifaddrs() entries with an IPv4
or IPv6 address of a running interface (NCCL_SOCKET_FAMILY narrows the family; an IPv6 loopback
address is skipped), and src/misc/socket.cc:198 takes NCCL_SOCKET_IFNAME only when it is longer
than one character. The addresses come from /proc/net/if_inet6 (IPv6), /proc/net/fib_trie and
/proc/net/route (IPv4); their formats and the real capture used here: tests/fixtures/health/SOURCES.md.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.health.machines import REAL, Machine, Node, azure_nd_h200_v5, default_addrs, lines

BUILD_VM = REAL / "proc-net" / "build-vm-6.18"


@pytest.fixture
def ib(tmp_path: Path) -> Node:
    return Node(tmp_path, azure_nd_h200_v5())


def socket_if(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln for ln in lines(proc) if ln.split(" ", 2)[1] == "socket-if"]


def without(machine: Machine, name: str, extra: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    addrs = default_addrs(machine.netdevs)
    addrs[name] = extra
    return addrs


def test_an_up_interface_without_an_address_fails(ib: Node) -> None:
    """eth0 up but with no address (DHCP not done, IPv6 off): NCCL finds no interface and the job's
    bootstrap fails, so the node fails the check."""
    ib.change(addrs=without(ib.machine, "eth0"))
    proc = ib.run("--no-drain")
    assert proc.returncode == 1
    assert socket_if(proc) == ["FAIL socket-if eth0 up without an IPv4 or IPv6 address (NCCL_SOCKET_IFNAME=eth0)"]
    # a link-local IPv6 address is one NCCL takes (it skips only the loopback ::1)
    ib.change(addrs=without(ib.machine, "eth0", ("fe80::222:48ff:fe65:bc8d/64",)))
    assert socket_if(ib.run("--no-drain")) == ["OK socket-if eth0 up fe80::222:48ff:fe65:bc8d (NCCL_SOCKET_IFNAME=eth0)"]
    proc = ib.run("--no-drain", NCCL_SOCKET_FAMILY="AF_INET")  # then only IPv4 counts
    assert socket_if(proc) == ["FAIL socket-if eth0 up without an IPv4 address (NCCL_SOCKET_FAMILY=AF_INET) "
                               "(NCCL_SOCKET_IFNAME=eth0)"]
    # one interface of a list with an address is enough; the others are not listed
    ib.change(addrs=without(ib.machine, "ib0"))
    assert socket_if(ib.run("--no-drain", NCCL_SOCKET_IFNAME="ib")) == [
        "OK socket-if ib1 up 10.2.0.4, ib2 up 10.3.0.4, ib3 up 10.4.0.4, ib4 up 10.5.0.4, ib5 up 10.6.0.4, "
        "ib6 up 10.7.0.4, ib7 up 10.8.0.4 (NCCL_SOCKET_IFNAME=ib)"]
    proc = ib.run("--no-drain", NCCL_SOCKET_IFNAME="=ib0,docker0")
    assert socket_if(proc) == ["FAIL socket-if docker0 down, ib0 up without an IPv4 or IPv6 address "
                               "(NCCL_SOCKET_IFNAME==ib0,docker0)"]


def test_loopback(ib: Node) -> None:
    """lo: 127.0.0.1 sits in the local table only, and ::1 is the IPv6 loopback NCCL skips."""
    assert socket_if(ib.run("--no-drain", NCCL_SOCKET_IFNAME="lo")) == ["OK socket-if lo up 127.0.0.1 (NCCL_SOCKET_IFNAME=lo)"]
    ib.change(addrs=without(ib.machine, "lo", ("::1/128",)))
    assert socket_if(ib.run("--no-drain", NCCL_SOCKET_IFNAME="lo")) == [
        "FAIL socket-if lo up without an IPv4 or IPv6 address (NCCL_SOCKET_IFNAME=lo)"]


def test_one_character_is_ignored_by_nccl(ib: Node) -> None:
    for value in ("e", "^", "="):
        proc = ib.run("--no-drain", NCCL_SOCKET_IFNAME=value)
        assert socket_if(proc) == [f"SKIP socket-if NCCL_SOCKET_IFNAME={value} is ignored by NCCL (one character: "
                                   "NCCL picks the interface itself)"], proc.stdout


def test_address_not_checked_without_the_proc_files(ib: Node) -> None:
    """Without /proc/net files the verdict is today's (up is enough), and says so."""
    ib.change(addrs=without(ib.machine, "eth0"), proc_net=False)
    proc = ib.run("--no-drain")
    assert proc.returncode == 0, proc.stdout
    assert socket_if(proc) == ["OK socket-if eth0 up (NCCL_SOCKET_IFNAME=eth0); address not checked: "
                               "no /proc/net/fib_trie and /proc/net/route, no /proc/net/if_inet6"]
    ib.change(proc_net=True)
    (ib.root / "proc/net/if_inet6").unlink()  # IPv6 off in the kernel (ipv6.disable=1): IPv4 alone proves nothing
    assert socket_if(ib.run("--no-drain")) == ["OK socket-if eth0 up (NCCL_SOCKET_IFNAME=eth0); address not checked: "
                                               "no /proc/net/if_inet6"]
    # ... unless NCCL is told to use IPv4 only
    assert socket_if(ib.run("--no-drain", NCCL_SOCKET_FAMILY="AF_INET")) == [
        "FAIL socket-if eth0 up without an IPv4 address (NCCL_SOCKET_FAMILY=AF_INET) (NCCL_SOCKET_IFNAME=eth0)"]


def test_an_address_no_main_route_places_is_not_proof(ib: Node) -> None:
    """Policy routing can keep an address's prefix out of the main table (what /proc/net/route shows):
    an address without a route could be eth0's, so a missing one is not claimed."""
    ib.change(addrs={**without(ib.machine, "eth0"), "lo": ("127.0.0.1/8", "::1/128", "192.168.7.9/32")})
    route = ib.root / "proc/net/route"
    route.write_text("".join(ln + "\n" for ln in route.read_text().splitlines()
                             if ln.split("\t")[1] != "00000000"))  # no default route
    proc = ib.run("--no-drain")
    assert socket_if(proc) == ["OK socket-if eth0 up (NCCL_SOCKET_IFNAME=eth0); address not checked: "
                               "IPv4 192.168.7.9 on no route of /proc/net/route"]


def test_the_real_proc_files_of_a_linux_vm(tmp_path: Path) -> None:
    """/proc/net/{fib_trie,route,if_inet6} captured on a Linux 6.18 VM (SOURCES.md): eth0 with
    192.0.2.2/24 and the IPv6 addresses fe80::fc:ff:fe00:1 and fd00::2, lo, ifb0 down; its main
    and local tables merged in one trie, as the kernel shows them without policy rules."""
    devs = {}
    for row in (BUILD_VM / "sys-class-net.txt").read_text().splitlines():
        name, oper, carrier, _flags = row.split()
        devs[name] = (oper, "0" if carrier == "-" else carrier)
    node = Node(tmp_path, azure_nd_h200_v5())
    node.change(netdevs=devs, proc_net=False)
    for name in ("fib_trie", "route", "if_inet6"):
        (node.root / "proc/net").mkdir(parents=True, exist_ok=True)
        shutil.copy(BUILD_VM / name, node.root / "proc/net" / name)
    for row in (BUILD_VM / "sys-class-net.txt").read_text().splitlines():
        name, _, _, flags = row.split()
        (node.root / "sys/class/net" / name / "flags").write_text(flags + "\n")
    assert socket_if(node.run("--no-drain")) == ["OK socket-if eth0 up 192.0.2.2 (NCCL_SOCKET_IFNAME=eth0)"]
    assert socket_if(node.run("--no-drain", NCCL_SOCKET_IFNAME="lo")) == ["OK socket-if lo up 127.0.0.1 (NCCL_SOCKET_IFNAME=lo)"]
    assert socket_if(node.run("--no-drain", NCCL_SOCKET_IFNAME="ifb")) == ["FAIL socket-if ifb0 down (NCCL_SOCKET_IFNAME=ifb)"]
    assert socket_if(node.run("--no-drain", NCCL_SOCKET_FAMILY="AF_INET6")) == [
        "OK socket-if eth0 up fe80::fc:ff:fe00:1 (NCCL_SOCKET_IFNAME=eth0)"]
    (node.root / "proc/net/if_inet6").write_text("")
    assert socket_if(node.run("--no-drain", NCCL_SOCKET_FAMILY="AF_INET6", NCCL_SOCKET_IFNAME="lo")) == [
        "FAIL socket-if lo up without an IPv6 address (NCCL_SOCKET_FAMILY=AF_INET6) (NCCL_SOCKET_IFNAME=lo)"]
