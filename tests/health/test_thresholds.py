"""The thresholds data: every SKU the tool knows resolves, every file cites its source, values match it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lingjun_slurm.nodes import health
from lingjun_slurm import network
from tests.health.machines import REPO, Node, azure_nd_h200_v5

PROGRAM_TEXT = health.program_text()


def program_keys(name: str) -> set[str]:
    """THRESHOLD_KEYS / CONFIG_KEYS as the bash program declares them."""
    found = re.search(rf'readonly {name}="([^"]*)"', PROGRAM_TEXT)
    assert found, name
    return set(found.group(1).split())


THRESHOLD_KEYS = program_keys("THRESHOLD_KEYS")
CONFIG_KEYS = program_keys("CONFIG_KEYS")


CONFS = sorted(n for n in health.threshold_texts() if n.endswith(".conf"))


@pytest.mark.parametrize("name", CONFS)
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
    for key in ("GPU_COUNT", "IB_PORT_COUNT", "IB_RATE_GBPS", "GPU_ECC_UNCORRECTED_MAX", "GPU_ECC_CORRECTED_MAX",
                "GPU_ECC_SRAM_CORRECTED_MAX", "GPU_ECC_SRAM_UNCORRECTED_MAX", "GPU_ECC_DRAM_MAX"):
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
    names = {Path(n).stem for n in CONFS}
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
    # check_gpu_ecc 20000000 10000 (azure_gpu_ecc.nhc: SRAM uncorrectable > 0 fails), per counter, no
    # summed volatile limit; check_gpu_xid: Azure's fatal list, window and report-once
    assert (conf["GPU_ECC_DRAM_MAX"], conf["GPU_ECC_SRAM_CORRECTED_MAX"], conf["GPU_ECC_SRAM_UNCORRECTED_MAX"]) == \
        ("20000000", "10000", "0")
    assert conf["GPU_ECC_CORRECTED_MAX"] == conf["GPU_ECC_UNCORRECTED_MAX"] == ""
    assert conf["GPU_XID_POLICY"] == "azure" and conf["GPU_XID_WINDOW_HOURS"] == "2"
    # check_nvlink_status in each conf; azhpc-images ndv4.sh/ndv5.sh: Fabric Manager and nvidia-peermem
    assert (conf["FABRIC_MANAGER"], conf["NVLINK"], conf["PEERMEM"]) == ("yes", "yes", "yes")
    header = health.threshold_texts()[f"{name}.conf"]
    assert "check_nvlink_status" in header and "nvidia-fabricmanager" in header and "nvidia-peermem" in header


def test_lingjun_gpu_count_from_the_instance_type_names() -> None:
    """The four Lingjun types: ".8-gu108"/".8-gu100" name 8 GPUs; the "8xlarge" ones are read the
    same way (the file says so). Ports and rate are not published: not checked."""
    text = health.threshold_texts()["lingjun.conf"]
    conf = health.parse_conf(text)
    assert conf["IB_LINK_LAYER"] == "Ethernet" and conf["IB_HCA"] == "mlx5"  # RoCE, NICs named mlx5*
    assert conf["GPU_COUNT"] == "8" and "IB_RATE_GBPS" not in conf and conf["IB_PORT_COUNT"] == "1"
    for itype in conf["INSTANCE_TYPES"].split():
        assert itype in text.split("INSTANCE_TYPES=")[0], f"{itype}: its GPU count is not explained"
    assert "not confirmed on a node" in text
    lingjun = network.get_profile("lingjun")
    assert set(conf["INSTANCE_TYPES"].split()) == set(lingjun.instance_types)
    gid = next(v.value for v in lingjun.env if v.name == "NCCL_IB_GID_INDEX")
    assert gid == "3"  # what roce-gid checks on these nodes (from /etc/nccl.conf)


def test_docs_describe_every_key_and_every_thresholds_file() -> None:
    doc = (REPO / "docs" / "health-checks.md").read_text()
    for key in sorted(THRESHOLD_KEYS | CONFIG_KEYS | {"INSTANCE_TYPES"}):
        assert f"`{key}`" in doc, key
    for name in health.threshold_texts():  # the thresholds files and the XID table
        assert f"`{name}`" in doc, name
    for check in ("gpu-count", "gpu-ecc", "gpu-xid", "gpu-fabric", "gpu-nvlink", "gpu-peermem", "ib-ports",
                  "roce-gid", "socket-if", "enroot-start", "gpu-container", "enroot-space",
                  "gpu-throttle", "gpu-bandwidth", "nccl-allreduce", "ib-write-bw", "dcgm-diag"):
        assert f"`{check}`" in doc, check


XID_TABLE = health.threshold_texts()["xid.tsv"]


def xid_catalog() -> dict[int, tuple[str, str]]:
    """NVIDIA's catalog as the XID table carries it: code -> (action, description)."""
    out = {}
    for line in XID_TABLE.splitlines():
        if line.startswith(("#", "POLICY\t")) or not line:
            continue
        code, action, _azure, text = line.split("\t")
        out[int(code)] = (action, text)
    return out


def test_the_xid_catalog_is_nvidias() -> None:
    """Spot checks against NVIDIA's catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
    "Resolution Bucket (Immediate Action)"); "Unused" codes are left out."""
    cat = xid_catalog()
    assert cat[79] == ("RESTART_BM", "GPU has fallen off the bus")
    assert cat[48] == ("WORKFLOW_XID_48", "Double Bit ECC Error")
    assert cat[119] == ("RESET_GPU", "GSP RPC Timeout") and cat[120][0] == "RESET_GPU"
    assert cat[13][0] == cat[31][0] == "RESTART_APP" and cat[43][0] == cat[63][0] == cat[92][0] == "IGNORE"
    assert all(cat[x][0] == "WORKFLOW_NVLINK5_ERR" for x in range(144, 151))
    assert 1 not in cat and all(text != "Unused" for _, text in cat.values())
    assert cat[56] == ("-", "Display Engine error")  # Azure lists it; not in the Ampere catalog
    assert "docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html" in XID_TABLE


def test_which_catalog_actions_drain_by_default() -> None:
    actions = set(re.search(r'readonly DEFAULT_XID_ACTIONS="([^"]*)"', PROGRAM_TEXT).group(1).split())  # type: ignore[union-attr]
    cat = xid_catalog()
    drains = {code for code, (action, _) in cat.items() if action in actions}
    assert {48, 62, 64, 74, 79, 95, 119, 120, 140, 143, 144, 145, 146, 147, 148, 149, 150, 151} <= drains
    assert not {8, 13, 31, 32, 43, 45, 63, 68, 69, 92, 94, 154} & drains  # application faults, informational


def test_the_xid_tables_azure_column_is_azures_list() -> None:
    """azure_gpu_xid.nhc at 0e0a1ac, line 10: XID_EC="48 56 57 58 62 63 64 65 68 69 73 74 79 80 81 92 119 120";
    the window and report-once rules on the azure POLICY line (lines 16-19, 37-49)."""
    fatal = [int(ln.split("\t")[0]) for ln in XID_TABLE.splitlines() if ln[:1].isdigit() and ln.split("\t")[2] == "fatal"]
    assert fatal == [48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120]
    policies = [ln.split("\t") for ln in XID_TABLE.splitlines() if ln.startswith("POLICY\t")]
    assert policies == [["POLICY", "nvidia", "actions", "elapsed", "every-run"],
                        ["POLICY", "azure", "fatal-list", "whole-hours", "once"]]
    assert "0e0a1ac26a64b32ac4dd7632a529638505d3314a" in XID_TABLE and "azure_gpu_xid.nhc" in XID_TABLE


# Level 2's single-VM all_reduce floor and size must be the figures the network profile cites
# for the same SKUs (presets/network_profiles.yaml nccl_tests_reference, nodes: 1).
@pytest.mark.parametrize("conf_name,profile", [("azure-nd-h100-v5.conf", "azure-nd-h100-v5"),
                                               ("azure-nd-h200-v5.conf", "azure-nd-h200-v5"),
                                               ("azure-nd-a100-v4.conf", "azure-nd-a100-v4")])
def test_level2_allreduce_floor_equals_the_network_profile(conf_name: str, profile: str) -> None:
    import yaml

    conf = health.parse_conf(health.threshold_texts()[conf_name])
    data = yaml.safe_load((REPO / "lingjun_slurm" / "presets" / "network_profiles.yaml").read_text())
    profiles = data.get("profiles", data)
    refs = [r for r in profiles[profile]["nccl_tests_reference"] if r["op"] == "all_reduce" and r["nodes"] == 1]
    assert len(refs) == 1, refs
    assert float(conf["NCCL_ALLREDUCE_MIN_GBPS"]) == float(refs[0]["busbw_gbps"])
    assert conf["NCCL_ALLREDUCE_SIZE"] == str(refs[0]["size"])
