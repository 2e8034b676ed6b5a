"""Network profiles: the Lingjun block equals the PAI seed, overrides, and every format."""

from __future__ import annotations

import json
import re

import pytest

from lingjun_slurm import network
from tests.unit.clirun import run_cli
from lingjun_slurm.common.errors import UsageError

# Seeds 000/001 (Alibaba PAI, "RDMA: high-performance networks for distributed training"):
# the preset for Lingjun instance types, in the documented order.
SEED_BLOCK = [
    ("NCCL_IB_TC", "136"), ("NCCL_IB_SL", "5"), ("NCCL_IB_GID_INDEX", "3"), ("NCCL_SOCKET_IFNAME", "eth"),
    ("NCCL_DEBUG", "INFO"), ("NCCL_IB_HCA", "mlx5"), ("NCCL_IB_TIMEOUT", "22"),
    ("NCCL_IB_QPS_PER_CONNECTION", "8"), ("NCCL_NET_PLUGIN", "none"),
]
LINGJUN_TYPES = ["ml.gu7xf.c96m1600.8-gu108", "ml.gu7xf.8xlarge-gu108", "ml.gu7ef.c96m1600.8-gu100",
                 "ml.gu8xf.8xlarge-gu108"]


def pairs(text: str, fmt: str) -> list[tuple[str, str]]:
    """KEY=VALUE pairs of a rendered block, in order, comments skipped."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if fmt == "sh":
            assert line.startswith("export "), line
            line = line[len("export "):]
        key, _, value = line.partition("=")
        out.append((key, value))
    return out


@pytest.mark.parametrize("instance_type", LINGJUN_TYPES)
@pytest.mark.parametrize("fmt", ["sh", "env", "nccl.conf"])
def test_lingjun_instance_types_equal_the_seed_block(capsys, instance_type: str, fmt: str) -> None:
    code, out, err = run_cli(capsys, "nccl-env", "--instance-type", instance_type, "--format", fmt)
    assert code == 0, err
    assert pairs(out, fmt) == SEED_BLOCK


@pytest.mark.parametrize("instance_type", LINGJUN_TYPES)
def test_lingjun_json_format(capsys, instance_type: str) -> None:
    code, out, _ = run_cli(capsys, "nccl-env", "--instance-type", instance_type, "--format", "json")
    doc = json.loads(out)
    assert doc["profile"] == "lingjun"
    assert [(e["name"], e["value"]) for e in doc["env"]] == SEED_BLOCK
    assert all(e["reason"] for e in doc["env"])


def test_every_variable_has_a_one_line_reason_rendered_as_comment() -> None:
    for prof in network.profiles().values():
        text = network.render(network.resolve(prof), "sh")
        lines = text.splitlines()
        for var in prof.env:
            i = lines.index(f"export {var.name}={network.quote(var.value)}")
            assert lines[i - 1] == f"# {var.reason}" and "\n" not in var.reason


def test_overrides_replace_add_and_unset() -> None:
    env = network.resolve(network.get_profile("lingjun"),
                          {"NCCL_DEBUG": "WARN", "NCCL_IB_TC": None, "NCCL_ALGO": "Ring"})
    names = [v.name for v in env.vars]
    assert "NCCL_IB_TC" not in names and env.unset == ("NCCL_IB_TC",)
    assert names[-1] == "NCCL_ALGO"
    assert env.names() == names + ["NCCL_IB_TC"]  # exported as cleared: --container-env lists it too
    assert dict((v.name, v.value) for v in env.vars)["NCCL_DEBUG"] == "WARN"
    sh = network.render(env, "sh")
    # /etc/nccl.conf sets NCCL_IB_TC on lingjun nodes: `unset` would let it back (tests/unit/test_nccl_unset.py)
    assert "unset NCCL_IB_TC" not in sh and "export NCCL_IB_TC=''" in sh and "profile lingjun: INFO" in sh
    assert [v.name for v in env.cleared] == ["NCCL_IB_TC"]


def test_cli_set_and_unset(capsys) -> None:
    code, out, _ = run_cli(capsys, "nccl-env", "--profile", "lingjun", "--format", "env",
                           "--set", "NCCL_DEBUG=WARN", "--unset", "NCCL_IB_TC", "--unset", "NCCL_ALGO")
    assert code == 0
    got = dict(pairs(out, "env"))
    assert got["NCCL_DEBUG"] == "WARN" and got["NCCL_IB_TC"] == "" and "NCCL_ALGO" not in got
    code, out, err = run_cli(capsys, "nccl-env", "--profile", "lingjun", "--unset", "NCCL_NET_PLUGIN")
    assert code == 2 and out == "" and "cannot unset NCCL_NET_PLUGIN" in err and "libnccl-net-X.so" in err


def test_nccl_conf_keeps_only_nccl_parameters() -> None:
    env = network.resolve(network.get_profile("azure-nd-h100-v5"))
    text = network.render(env, "nccl.conf")
    keys = [k for k, _ in pairs(text, "nccl.conf")]
    assert "CUDA_DEVICE_ORDER" not in keys and all(k.startswith("NCCL_") for k in keys)
    assert "NCCL_TOPO_FILE" in keys


@pytest.mark.parametrize("vm,profile", [("Standard_ND96isr_H100_v5", "azure-nd-h100-v5"),
                                        ("Standard_ND96isr_H200_v5", "azure-nd-h200-v5"),
                                        ("Standard_ND96asr_v4", "azure-nd-a100-v4"),
                                        ("Standard_ND96amsr_A100_v4", "azure-nd-a100-v4")])
def test_azure_vm_sizes_select_their_profile(vm: str, profile: str) -> None:
    prof = network.profile_for_instance(vm)
    assert prof.name == profile
    assert "/opt/microsoft:/opt/microsoft:ro" in prof.mounts
    assert any(v.name == "NCCL_TOPO_FILE" for v in prof.env)


def test_usage_errors_exit_2(capsys) -> None:
    assert run_cli(capsys, "nccl-env", "--profile", "nope")[0] == 2
    assert run_cli(capsys, "nccl-env", "--instance-type", "ml.unknown")[0] == 2
    assert run_cli(capsys, "nccl-env")[0] == 2
    assert run_cli(capsys, "nccl-env", "--profile", "tcp", "--format", "yaml")[0] == 2
    code, _, err = run_cli(capsys, "nccl-env", "--profile", "tcp", "--format", "env", "--set", "NCCL_X=a\nb")
    assert code == 2 and "newline" in err


def test_profile_names_and_keys_are_well_formed() -> None:
    for prof in network.profiles().values():
        assert re.fullmatch(r"[a-z0-9-]+", prof.name)
        for scoped in (prof.env, prof.nccl_tests_env):
            names = [v.name for v in scoped]
            assert len(names) == len(set(names)), prof.name
            assert all(re.fullmatch(r"[A-Z][A-Z0-9_]*", n, re.IGNORECASE) for n in names), prof.name
    with pytest.raises(UsageError):
        network.render(network.resolve(network.get_profile("tcp")), "toml")


@pytest.mark.parametrize("args", [["--set", "A$(touch x)=1"], ["--set", "A,B=1"], ["--set", "=1"],
                                  ["--unset", "A;touch x"], ["--unset", "1A"]])
def test_nccl_env_refuses_names_that_are_not_variable_names(capsys, tmp_path, monkeypatch, args) -> None:
    """Names reach `export NAME=...` lines that users source: only variable names pass."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "nccl-env", "--profile", "lingjun", *args)
    assert code == 2 and out == "" and args[0] in err
    assert list(tmp_path.iterdir()) == []
