"""enroot-space reads enroot's settings as enroot does (NVIDIA/enroot enroot.in at 8ea147d, lines 27-61).

config::init loads enroot.conf, then enroot.conf.d/*.conf; config::load refuses a file that fails
`bash -n` and reads lines with `IFS=$' \\t=' read -r key value` (so a last line without its newline
is not read); config::export is `export "$1=${!1:-$2}"`: the environment, then the first file and
line giving a value that is not empty, win; the value is `eval echo`ed (quotes and comments go).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.health.machines import Node, azure_nd_h200_v5, lines


@pytest.fixture
def ib(tmp_path: Path) -> Node:
    node = Node(tmp_path, azure_nd_h200_v5())
    node.change(nccl={"NCCL_SOCKET_IFNAME": None})
    return node


def space(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln for ln in lines(proc) if ln.split(" ", 2)[1] == "enroot-space"]


def dirs(proc: subprocess.CompletedProcess[str]) -> list[str]:
    okay = space(proc)
    assert len(okay) == 1 and okay[0].startswith("OK enroot-space free: "), okay
    return [part.split()[0] for part in okay[0].split(": ", 1)[1].split(", ")]


def conf(node: Node, text: str, name: str = "enroot.conf") -> None:
    path = node.root / "etc/enroot" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


HOME_PATHS = "ENROOT_CACHE_PATH ${XDG_CACHE_HOME}/enroot\nENROOT_DATA_PATH ${XDG_DATA_HOME}/enroot\n"


def test_the_first_line_wins(ib: Node) -> None:
    conf(ib, HOME_PATHS + "ENROOT_TEMP_PATH /mnt/resource/enroot-temp\nENROOT_TEMP_PATH /opt/tmp\n")
    assert dirs(ib.run("--no-drain")) == ["/run/enroot", "/mnt/resource/enroot-temp"]


def test_an_empty_value_does_not_count(ib: Node) -> None:
    """${!1:-$2}: a setting that came out empty is set again by a later line."""
    conf(ib, HOME_PATHS + "ENROOT_TEMP_PATH\nENROOT_TEMP_PATH=/mnt/resource/enroot-temp\n")
    assert dirs(ib.run("--no-drain")) == ["/run/enroot", "/mnt/resource/enroot-temp"]


def test_drop_ins_are_read_after_enroot_conf(ib: Node) -> None:
    conf(ib, "ENROOT_CACHE_PATH ${XDG_CACHE_HOME}/enroot\nENROOT_TEMP_PATH /mnt/resource/enroot-temp\n")
    conf(ib, "ENROOT_DATA_PATH /mnt/resource/enroot-data/user-$(id -u)\n"
             "ENROOT_TEMP_PATH /opt/tmp\n", "enroot.conf.d/50-site.conf")  # enroot.conf's temp path stays
    proc = ib.run("--no-drain")
    assert dirs(proc) == ["/run/enroot", "/mnt/resource/enroot-data", "/mnt/resource/enroot-temp"]
    (ib.root / "etc/lingjun-slurm/health.conf").write_text(
        "SKU=Standard_ND96isr_H200_v5\nKERNEL_LOG=/var/log/kern.log\nMIN_FREE_GB=999999999\n")
    fails = lines(ib.run("--no-drain"), "FAIL")
    assert [f.rsplit("(", 1)[1] for f in fails] == ["ENROOT_DATA_PATH, /etc/enroot/enroot.conf.d/50-site.conf:1)",
                                                    "ENROOT_TEMP_PATH, /etc/enroot/enroot.conf:2)"], fails
    (ib.root / "etc/enroot/enroot.conf").unlink()  # drop-ins without enroot.conf still count
    fails = lines(ib.run("--no-drain"), "FAIL")
    assert [f.rsplit("(", 1)[1] for f in fails] == ["ENROOT_DATA_PATH, /etc/enroot/enroot.conf.d/50-site.conf:1)",
                                                    "ENROOT_TEMP_PATH, /etc/enroot/enroot.conf.d/50-site.conf:2)"], fails


def test_the_environment_wins(ib: Node) -> None:
    conf(ib, HOME_PATHS + "ENROOT_TEMP_PATH /opt/tmp\n")
    assert dirs(ib.run("--no-drain", ENROOT_TEMP_PATH="/mnt/resource/enroot-temp")) == [
        "/run/enroot", "/mnt/resource/enroot-temp"]


def test_values_as_eval_echo_gives_them(ib: Node) -> None:
    conf(ib, HOME_PATHS + 'ENROOT_TEMP_PATH "/mnt/resource/enroot-temp"   # the local disk\n')
    assert dirs(ib.run("--no-drain")) == ["/run/enroot", "/mnt/resource/enroot-temp"]


def test_a_last_line_without_its_newline_is_not_read(ib: Node) -> None:
    conf(ib, HOME_PATHS + "ENROOT_TEMP_PATH /mnt/resource/enroot-temp")
    assert dirs(ib.run("--no-drain")) == ["/run/enroot", "/"]  # enroot's default ${TMPDIR:-/tmp}: / in the tree


def test_a_file_that_is_not_valid_bash_stops_enroot(ib: Node) -> None:
    conf(ib, HOME_PATHS)
    conf(ib, "ENROOT_TEMP_PATH $(\n", "enroot.conf.d/90-broken.conf")
    proc = ib.run("--no-drain")
    assert proc.returncode == 1
    assert space(proc) == [f"FAIL enroot-space {ib.root}/etc/enroot/enroot.conf.d/90-broken.conf is not valid bash "
                           "(bash -n): enroot refuses to run (Invalid configuration file)"]
