"""The thresholds data: every SKU the tool knows resolves, every file cites its source, values match it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lingjun_slurm import health, network
from tests.health.machines import REPO, Node, azure_nd_h200_v5

PROGRAM_TEXT = health.program_text()


def program_keys(name: str) -> set[str]:
    """THRESHOLD_KEYS / CONFIG_KEYS as the bash program declares them."""
    found = re.search(rf'readonly {name}="([^"]*)"', PROGRAM_TEXT)
    assert found, name
    return set(found.group(1).split())


THRESHOLD_KEYS = program_keys("THRESHOLD_KEYS")
CONFIG_KEYS = program_keys("CONFIG_KEYS")


@pytest.mark.parametrize("name", sorted(health.threshold_texts()))
def test_each_file_parses_with_known_keys_and_says_where_its_figures_come_from(name: str) -> None:
    text = health.threshold_texts()[name]
    conf = health.parse_conf(text)
    assert set(conf) <= THRESHOLD_KEYS | {"INSTANCE_TYPES"}, set(conf) - THRESHOLD_KEYS
    header = "\n".join(ln for ln in text.splitlines() if ln.startswith("#"))
    assert "lingjun-health thresholds:" in header
    if name.startswith("azure-"):
        assert re.search(r"Azure/azurehpc-health-checks conf/\S+\.conf \(commit [0-9a-f]{40}\)", header), header
    else:
        assert re.search(r"Source:|No vendor figures|GPU and RDMA checks are skipped", header), header
    for key in ("GPU_COUNT", "IB_PORT_COUNT", "IB_RATE_GBPS", "GPU_ECC_UNCORRECTED_MAX", "GPU_ECC_CORRECTED_MAX"):
        assert conf.get(key, "") == "" or conf[key].isdigit(), (name, key)


def test_every_instance_type_of_every_network_profile_has_thresholds(tmp_path: Path) -> None:
    """The program's own lookup (INSTANCE_TYPES), for each instance type the network profiles
    list: it lands in the thresholds file named after that profile."""
    node = Node(tmp_path, azure_nd_h200_v5())
    itypes = {t: p.name for p in network.profiles().values() for t in p.instance_types}
    assert itypes
    for itype, profile in itypes.items():
        proc = node.run("--json", "--no-drain", "--sku", itype)
        assert proc.returncode in (0, 1), proc.stderr
        assert Path(json.loads(proc.stdout)["thresholds"]).name == f"{profile}.conf", itype


def test_every_network_profile_name_is_a_thresholds_name() -> None:
    """cluster-init may write SKU=<profile> when the VM size is unknown: that must resolve too."""
    names = {Path(n).stem for n in health.threshold_texts()}
    assert set(network.profiles()) <= names, set(network.profiles()) - names


# The published figures (Azure/azurehpc-health-checks conf files, cited in each file).
AZURE = {
    "azure-nd-h100-v5": ("8", "400", 8),
    "azure-nd-h200-v5": ("8", "400", 8),
    "azure-nd-a100-v4": ("8", "200", 8),
}


@pytest.mark.parametrize("name", sorted(AZURE))
def test_azure_figures(name: str) -> None:
    conf = health.parse_conf(health.threshold_texts()[f"{name}.conf"])
    gpus, rate, ports = AZURE[name]
    assert conf["GPU_COUNT"] == gpus and conf["IB_RATE_GBPS"] == rate and conf["IB_LINK_LAYER"] == "InfiniBand"
    assert conf["IB_PORTS"].split() == [f"mlx5_ib{i}:1" for i in range(ports)]
    assert conf["GPU_ECC_CORRECTED_MAX"] == "20000000" and conf["GPU_ECC_UNCORRECTED_MAX"] == "0"


def test_lingjun_checks_only_what_is_published() -> None:
    conf = health.parse_conf(health.threshold_texts()["lingjun.conf"])
    assert conf["IB_LINK_LAYER"] == "Ethernet" and conf["IB_HCA"] == "mlx5"  # RoCE, NICs named mlx5*
    assert conf["GPU_COUNT"] == "" and "IB_RATE_GBPS" not in conf and conf["IB_PORT_COUNT"] == "1"
    lingjun = network.get_profile("lingjun")
    assert set(conf["INSTANCE_TYPES"].split()) == set(lingjun.instance_types)
    gid = next(v.value for v in lingjun.env if v.name == "NCCL_IB_GID_INDEX")
    assert gid == "3"  # what roce-gid checks on these nodes (from /etc/nccl.conf)


def test_docs_describe_every_key_and_every_thresholds_file() -> None:
    doc = (REPO / "docs" / "health-checks.md").read_text()
    for key in sorted(THRESHOLD_KEYS | CONFIG_KEYS | {"INSTANCE_TYPES"}):
        assert f"`{key}`" in doc, key
    for name in health.threshold_texts():
        assert f"`{name}`" in doc, name
    for check in ("gpu-count", "gpu-ecc", "gpu-xid", "ib-ports", "roce-gid", "socket-if", "enroot-start",
                  "enroot-space"):
        assert f"`{check}`" in doc, check
