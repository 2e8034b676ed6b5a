"""A spec's `unset` against the node's /etc/nccl.conf.

NCCL applies /etc/nccl.conf to every variable the job has not set, with setenv(name, value, 0)
(NVIDIA/nccl src/misc/param.cc:27-67, src/os/linux.cc:106-108 at 5067397c2676). `nccl_file_applied`
below is that rule, line for line (skip `#` lines and lines without `=`, split at the first `=`,
never replace a variable that is set, the empty string included). NCCL itself cannot run here (no
GPU, no libnccl); the values NCCL reads as "not set" are cited per variable in
lingjun_slurm/presets/nccl_unset.yaml.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lingjun_slurm import network
from lingjun_slurm.common.errors import UsageError


def nccl_file_applied(environ: dict[str, str], conf_text: str) -> dict[str, str]:
    """What NCCL's setEnvFile leaves in the environment after reading one nccl.conf."""
    env = dict(environ)
    for line in conf_text.splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        env.setdefault(name[:1023], value[:1023])  # setenv(name, value, 0)
    return env


def job_environment(block: str, tmp: Path) -> dict[str, str]:
    """The environment a job has after its rendered NCCL block, by running it in bash."""
    script = tmp / "block.sh"
    script.write_text(block + "\nenv -0\n")
    out = subprocess.run(["env", "-i", "bash", "--noprofile", "--norc", str(script)], capture_output=True,
                         check=True).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def conf_pairs(text: str) -> dict[str, str]:
    """KEY=VALUE lines of an env or nccl.conf rendering."""
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#") and "=" in line)


def _all_node_file_names() -> set[str]:
    return {name for prof in network.profiles().values() for name in network.node_file_names(prof)}


def test_every_variable_a_node_file_sets_has_a_rule() -> None:
    """A profile that adds an NCCL variable to /etc/nccl.conf must say how a job undoes it."""
    missing = _all_node_file_names() - set(network.unset_rules())
    assert not missing, f"add these to lingjun_slurm/presets/nccl_unset.yaml: {sorted(missing)}"


def test_rules_cite_nccl_source() -> None:
    for name, rule in network.unset_rules().items():
        assert name.startswith("NCCL_") and "src/" in rule.source, name
        assert (rule.value is None) == bool(rule.instead), name


@pytest.mark.parametrize("profile", sorted(network.profiles()))
def test_unset_survives_the_node_file(profile: str, tmp_path: Path) -> None:
    """For every variable each profile writes to /etc/nccl.conf: after the job's block and NCCL's
    reading of the file, the variable holds the value NCCL reads as not set, never the file's."""
    prof = network.get_profile(profile)
    node_conf = network.render(network.resolve(prof), "nccl.conf")
    rules = network.unset_rules()
    names = sorted(n for n in network.node_file_names(prof) if rules[n].value is not None)
    if not names:
        pytest.skip(f"profile {profile} writes no variable a job can undo")
    env = network.resolve(prof, {n: None for n in names})
    after = nccl_file_applied(job_environment(network.render(env, "sh"), tmp_path), node_conf)
    for name in names:
        assert after[name] == rules[name].value, (name, after.get(name))
    # what a plain `unset` did: the file's value came back
    plain = nccl_file_applied({}, node_conf)
    assert all(plain[n] == conf_pairs(node_conf)[n] != rules[n].value for n in names)


def test_a_variable_the_node_file_does_not_set_is_simply_unset(tmp_path: Path) -> None:
    env = network.resolve(network.get_profile("lingjun"), {"NCCL_ALGO": None})
    sh = network.render(env, "sh")
    assert "unset NCCL_ALGO" in sh and env.cleared == ()
    assert "NCCL_ALGO" not in job_environment(sh, tmp_path)


def test_values_that_cannot_mean_unset_are_refused() -> None:
    with pytest.raises(UsageError, match="cannot unset NCCL_NET: .*give the network by name"):
        network.resolve(network.get_profile("tcp"), {"NCCL_NET": None})
    # where no node file sets it, nothing comes back and a plain unset is right
    env = network.resolve(network.get_profile("generic-ib"), {"NCCL_NET": None})
    assert env.unset == ("NCCL_NET",) and env.cleared == ()


def test_json_and_env_formats_carry_the_cleared_values() -> None:
    env = network.resolve(network.get_profile("azure-nd-h100-v5"), {"NCCL_TOPO_FILE": None, "NCCL_IB_PCI_RELAXED_ORDERING": None})
    doc = json.loads(network.render(env, "json"))
    assert sorted(doc["unset"]) == ["NCCL_IB_PCI_RELAXED_ORDERING", "NCCL_TOPO_FILE"]
    assert {c["name"]: c["value"] for c in doc["cleared"]} == {
        "NCCL_TOPO_FILE": "/var/run/nvidia-topologyd/virtualTopology.xml", "NCCL_IB_PCI_RELAXED_ORDERING": ""}
    pairs = conf_pairs(network.render(env, "env"))
    assert pairs["NCCL_IB_PCI_RELAXED_ORDERING"] == "" and pairs["NCCL_TOPO_FILE"].endswith("virtualTopology.xml")
    conf = network.render(env, "nccl.conf")
    assert "NCCL_TOPO_FILE=" not in conf and "NCCL_IB_PCI_RELAXED_ORDERING=" not in conf
