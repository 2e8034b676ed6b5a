"""The Azure profiles equal the upstream files they cite, at the commits they name
(tests/fixtures/network/SOURCES.md), and what those sources set for nccl-tests only stays out of training."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lingjun_slurm.nodes import clusterinit_gen
from lingjun_slurm import network
from lingjun_slurm.cli.main import main
from tests.conftest import render_scenario, scenario_files

REPO = Path(__file__).resolve().parents[2]
AZURE = REPO / "tests" / "fixtures" / "network" / "azure"
HOPPER = ("azure-nd-h100-v5", "azure-nd-h200-v5")
# azhpc-images' /etc/nccl.conf names a link to the topology file the profiles (and hopper.conf) name.
TOPO_LINKS = {"/opt/microsoft/ndv5/topo.xml": "/opt/microsoft/ndv5-topo.xml",
              "/opt/microsoft/ndv4/topo.xml": "/opt/microsoft/ndv4-topo.xml"}

# hopper.conf variables that training jobs do not get, and why (docs/network-profiles.md says the same).
HOPPER_NCCL_TESTS_ONLY = {
    "NCCL_P2P_NET_CHUNKSIZE": "2 MiB is hopper.conf's benchmark value; the training examples keep 512 KiB",
    "OMPI_MCA_coll_hcoll_enable": "read by Open MPI: only the nccl-tests MPI binaries; training starts with torchrun",
    "UCX_TLS": "read by UCX (MPI's transport): nccl-tests only",
    "UCX_NET_DEVICES": "read by UCX (MPI's transport): nccl-tests only",
    "NCCL_COLLNET_ENABLE": "SHARP: on in hopper.conf, off by default in the training example (USE_SHARP=0)",
    "SHARP_SMX_UCX_INTERFACE": "SHARP, with NCCL_COLLNET_ENABLE",
    "SHARP_COLL_ENABLE_SAT": "SHARP, with NCCL_COLLNET_ENABLE",
    "SHARP_COLL_LOG_LEVEL": "SHARP, with NCCL_COLLNET_ENABLE",
    "SHARP_COLL_ENABLE_PCI_RELAXED_ORDERING": "SHARP, with NCCL_COLLNET_ENABLE",
}
# The training example's values the profile does not take for training jobs, and why.
TRAINING_DIFFERS = {"NCCL_DEBUG": "WARN for every profile; the example logs at INFO"}
# azhpc-images' NDv4 nccl-tests run: what the nccl-test job does not take.
NDV4_TEST_NOT_CARRIED = {"LD_LIBRARY_PATH": "a host path of the Azure HPC image, not a container's"}
A100_NCCL_TESTS_ONLY = {"NCCL_NET_GDR_LEVEL", "OMPI_MCA_coll_hcoll_enable", "UCX_TLS"}


def values(name: str) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in (AZURE / name).read_text().splitlines() if line and line[0] != "#"]
    out = {k: TOPO_LINKS.get(v, v) for k, v in pairs}
    assert len(out) == len(pairs), f"{name}: a variable twice"
    return out


def env(profile: str, scope: str = "jobs") -> dict[str, str]:
    return {v.name: v.value for v in network.resolve(network.get_profile(profile), scope=scope).vars}


@pytest.mark.parametrize("profile", HOPPER)
def test_hopper_nccl_test_job_equals_hopper_conf_at_its_revision(profile: str) -> None:
    assert env(profile, "nccl-tests") == values("hopper.conf.env")
    assert env(profile, "nccl-tests")["NCCL_P2P_NET_CHUNKSIZE"] == str(2 * 1024 * 1024)


@pytest.mark.parametrize("profile", HOPPER)
def test_hopper_training_gets_what_azure_sets_for_training_too(profile: str) -> None:
    hopper, train, jobs = values("hopper.conf.env"), values("megatron-gpt175b-train.env"), env(profile)
    prof = network.get_profile(profile)
    assert {v.name for v in prof.nccl_tests_env} == set(HOPPER_NCCL_TESTS_ONLY)
    assert set(jobs) == set(hopper) - (set(HOPPER_NCCL_TESTS_ONLY) - {"NCCL_P2P_NET_CHUNKSIZE"})
    for name, value in jobs.items():
        assert name in train, f"{name}: kept for training but Azure's training example does not set it"
        if name in TRAINING_DIFFERS:
            assert value == hopper[name] != train[name]
        else:
            assert value == train[name], name
    assert jobs["NCCL_P2P_NET_CHUNKSIZE"] == "524288"
    assert values("azhpc-ndv5-nccl.conf").items() <= jobs.items()


def test_a100_equals_azhpc_images_nccl_conf_and_nccl_tests_run() -> None:
    conf, test = values("azhpc-ndv4-nccl.conf"), values("azhpc-ndv4-nccl-test.env")
    jobs, tests = env("azure-nd-a100-v4"), env("azure-nd-a100-v4", "nccl-tests")
    assert tests == {**conf, **{k: v for k, v in test.items() if k not in NDV4_TEST_NOT_CARRIED}}
    assert set(tests) - set(jobs) == A100_NCCL_TESTS_ONLY
    assert conf.items() <= jobs.items()


@pytest.mark.parametrize("profile", ["azure-nd-h100-v5", "azure-nd-h200-v5", "azure-nd-a100-v4"])
def test_azure_profiles_name_their_revisions(profile: str) -> None:
    prof = network.get_profile(profile)
    assert prof.revisions
    for rev in prof.revisions:
        assert re.fullmatch(r"Azure/[A-Za-z0-9._-]+", rev.repo) and rev.path and rev.used_for
        assert re.fullmatch(r"[0-9a-f]{40}", rev.commit) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", rev.date)
    sources = (REPO / "tests" / "fixtures" / "network" / "SOURCES.md").read_text()
    assert all(rev.commit in sources and rev.path in sources for rev in prof.revisions)


def test_nccl_tests_scope_replaces_in_place_and_unknown_scopes_fail() -> None:
    prof = network.get_profile("azure-nd-h100-v5")
    jobs, tests = [v.name for v in prof.env_for()], [v.name for v in prof.env_for("nccl-tests")]
    assert tests[:len(jobs)] == jobs
    with pytest.raises(network.UsageError):
        prof.env_for("train")


@pytest.mark.parametrize("scenario,profile", [("azure-h100-builtin", "azure-nd-h100-v5"),
                                              ("azure-a100-instance", "azure-nd-a100-v4")])
def test_nccl_tests_only_variables_stay_out_of_training_stages(scenario: str, profile: str) -> None:
    only = {v.name: v.value for v in network.get_profile(profile).nccl_tests_env}
    files = render_scenario(scenario, scenario_files()[scenario])
    assert "train.sbatch" in files
    for name, text in files.items():
        for var, value in only.items():
            if var in env(profile):
                assert f"{var}={value}" not in text, (name, var)
            else:
                assert var not in text, (name, var)
    if profile in HOPPER:
        assert "export NCCL_P2P_NET_CHUNKSIZE=524288" in files["train.sbatch"]


@pytest.mark.parametrize("profile", ["azure-nd-h100-v5", "azure-nd-a100-v4"])
def test_nccl_test_job_exports_them_into_the_container(capsys, tmp_path: Path, profile: str) -> None:
    try:
        main(["nccl-test", "--render-only", str(tmp_path), "--profile", profile, "--nodes", "2"])
    except SystemExit as exc:
        assert not exc.code, capsys.readouterr().err
    script = (tmp_path / "nccl-test.sbatch").read_text()
    container_env = re.search(r"--container-env=([A-Za-z0-9_,]+)", script)
    assert container_env, "no --container-env in the nccl-test script"
    for var in network.get_profile(profile).nccl_tests_env:
        assert f"export {var.name}={network.quote(var.value)}" in script
        assert var.name in container_env.group(1).split(",")
    assert "export NCCL_P2P_NET_CHUNKSIZE=524288" not in script


def test_cluster_init_nccl_conf_has_no_nccl_tests_only_values() -> None:
    nccl = REPO / "cluster_init" / clusterinit_gen.NCCL_DIR
    for profile in ("azure-nd-h100-v5", "azure-nd-h200-v5", "azure-nd-a100-v4"):
        text = (nccl / f"{profile}.conf").read_text()
        for var in network.get_profile(profile).nccl_tests_env:
            if var.name not in env(profile):
                assert f"{var.name}=" not in text, (profile, var.name)
        assert ("NCCL_P2P_NET_CHUNKSIZE=524288" in text) == (profile in HOPPER)
