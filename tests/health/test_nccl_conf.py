"""/etc/nccl.conf read as NCCL reads it (NVIDIA/nccl at 5067397c).

src/misc/param.cc setEnvFile (lines 27-50): a line whose first byte is "#" and one without "="
are skipped; the name is everything before the first "=" and the value everything after it,
nothing trimmed; ncclOsSetEnv (src/os/linux.cc:106-108) is setenv(name, value, 0), so the
environment and then the FIRST line win. initEnvFunc (lines 52-67): $NCCL_CONF_FILE (else
~/.nccl.conf) before /etc/nccl.conf. And ncclLoadParam (param.cc:89-102) reads a number such as
NCCL_IB_GID_INDEX with strtoll(str, NULL, 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.health.machines import Node, azure_nd_h200_v5, lines, roce_a100


@pytest.fixture
def roce(tmp_path: Path) -> Node:
    return Node(tmp_path, roce_a100())


@pytest.fixture
def ib(tmp_path: Path) -> Node:
    return Node(tmp_path, azure_nd_h200_v5())


def nccl_conf(node: Node, text: str) -> None:
    (node.root / "etc/nccl.conf").write_text(text)


def check(proc, name: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [ln for ln in lines(proc) if ln.split(" ", 2)[1] == name]


def test_a_blank_after_the_equals_sign_is_part_of_the_value(roce: Node) -> None:
    """NCCL_IB_HCA= mlx5 is " mlx5" for NCCL: a prefix no device has, so NCCL finds no HCA."""
    nccl_conf(roce, "NCCL_IB_GID_INDEX=3\nNCCL_SOCKET_IFNAME=eth\nNCCL_IB_HCA= mlx5\n")
    proc = roce.run("--no-drain")
    assert proc.returncode == 1
    warn = "; NCCL_IB_HCA=' mlx5' (/etc/nccl.conf:3) has blanks around it, which NCCL keeps"
    assert check(proc, "ib-ports") == [
        "FAIL ib-ports 0 RDMA ports match NCCL_IB_HCA= mlx5 (Ethernet), expected 1" + warn,
        "FAIL ib-ports NCCL_IB_HCA names  mlx5, which this node does not have" + warn]


def test_a_blank_before_the_equals_sign_names_another_variable(ib: Node) -> None:
    """"NCCL_SOCKET_IFNAME = eth9" sets "NCCL_SOCKET_IFNAME " for NCCL: NCCL_SOCKET_IFNAME stays unset."""
    nccl_conf(ib, "NCCL_SOCKET_IFNAME = eth9\n")
    proc = ib.run("--no-drain")
    assert proc.returncode == 0, proc.stdout
    assert check(proc, "socket-if") == [
        "SKIP socket-if NCCL_SOCKET_IFNAME is not set; /etc/nccl.conf:1 sets 'NCCL_SOCKET_IFNAME ' "
        "(with the blanks: not NCCL_SOCKET_IFNAME for NCCL)"]


def test_the_first_line_wins_and_the_environment_over_the_file(ib: Node) -> None:
    nccl_conf(ib, "# comment\nNCCL_SOCKET_IFNAME=eth0\r\nNCCL_SOCKET_IFNAME=eth9\n")
    assert check(ib.run("--no-drain"), "socket-if") == ["OK socket-if eth0 up 10.0.0.4 (NCCL_SOCKET_IFNAME=eth0)"]
    assert check(ib.run("--no-drain", NCCL_SOCKET_IFNAME="ib0"), "socket-if") == [
        "OK socket-if ib0 up 10.1.0.4 (NCCL_SOCKET_IFNAME=ib0)"]
    # set but empty in the environment: setenv(..., 0) keeps it, and NCCL then picks an interface
    assert check(ib.run("--no-drain", NCCL_SOCKET_IFNAME=""), "socket-if") == [
        "SKIP socket-if NCCL_SOCKET_IFNAME is not set"]


def test_comments_only_in_the_first_column_and_lines_without_equals(ib: Node) -> None:
    """"#" only comments at the first byte; " #NCCL_SOCKET_IFNAME=eth9" sets a variable named
    " #NCCL_SOCKET_IFNAME"; "NCCL_SOCKET_IFNAME eth9" has no "=" and is skipped."""
    nccl_conf(ib, "#NCCL_SOCKET_IFNAME=eth9\n #NCCL_SOCKET_IFNAME=eth9\nNCCL_SOCKET_IFNAME eth9\n\n"
                  "NCCL_SOCKET_IFNAME=eth0 # the front end\n")
    proc = ib.run("--no-drain")
    # the value runs to the end of the line: the prefix "eth0 # the front end" matches nothing
    assert check(proc, "socket-if") == [
        "FAIL socket-if no interface matches NCCL_SOCKET_IFNAME=eth0 # the front end"]
    nccl_conf(ib, "NCCL_SOCKET_IFNAME=eth0 \n")  # a trailing blank: the prefix "eth0 " names no interface
    assert check(ib.run("--no-drain"), "socket-if") == [
        "FAIL socket-if no interface matches NCCL_SOCKET_IFNAME=eth0 ; NCCL_SOCKET_IFNAME='eth0 ' (/etc/nccl.conf:1) "
        "has blanks around it, which NCCL keeps"]


def test_nccl_conf_file_is_read_before_etc_nccl_conf(ib: Node) -> None:
    (ib.root / "opt").mkdir()
    (ib.root / "opt/nccl.conf").write_text("NCCL_SOCKET_IFNAME=ib1\n")
    proc = ib.run("--no-drain", NCCL_CONF_FILE="/opt/nccl.conf")
    assert check(proc, "socket-if") == ["OK socket-if ib1 up 10.2.0.4 (NCCL_SOCKET_IFNAME=ib1)"]
    home = ib.root / "home/alice"
    home.mkdir(parents=True)
    (home / ".nccl.conf").write_text("NCCL_SOCKET_IFNAME=ib2\n")  # without NCCL_CONF_FILE: ~/.nccl.conf
    assert check(ib.run("--no-drain", HOME="/home/alice"), "socket-if") == [
        "OK socket-if ib2 up 10.3.0.4 (NCCL_SOCKET_IFNAME=ib2)"]


def test_gid_index_is_read_with_strtoll(roce: Node) -> None:
    nccl_conf(roce, "NCCL_IB_HCA=mlx5\nNCCL_SOCKET_IFNAME=eth\nNCCL_IB_GID_INDEX= 3\n")
    proc = roce.run("--no-drain")
    assert proc.returncode == 0, proc.stdout
    assert check(proc, "roce-gid") == ["OK roce-gid GID 3 is RoCE v2 on 9 ports; NCCL_IB_GID_INDEX=' 3' "
                                       "(/etc/nccl.conf:3) has blanks around it, which NCCL keeps"]
    assert check(roce.run("--no-drain", NCCL_IB_GID_INDEX="0x3"), "roce-gid") == ["OK roce-gid GID 3 is RoCE v2 on 9 ports"]
    assert check(roce.run("--no-drain", NCCL_IB_GID_INDEX="03"), "roce-gid") == ["OK roce-gid GID 3 is RoCE v2 on 9 ports"]
