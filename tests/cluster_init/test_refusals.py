"""What the installer refuses: unverifiable or tampered artifacts, invalid configuration,
unknown NCCL profiles. Each refusal names the problem and changes nothing on the node."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.cluster_init.node import enroot_files, sha256

INSTALLED = ("/etc/enroot/enroot.conf", "/etc/nccl.conf", "/usr/lib64/slurm/spank_pyxis.so",
             "/usr/local/sbin/lingjun-health", "/etc/slurm/plugstack.conf.d/pyxis.conf")


def assert_nothing_installed(node) -> None:
    for path in INSTALLED:
        assert not node.path(path).exists(), path
    assert not [c for c in node.calls() if c.startswith(("apt-get", "dnf", "systemctl restart", "mdadm", "mount "))]


@pytest.mark.parametrize("os_family", ["ubuntu", "rhel"])
def test_missing_checksum_is_refused_before_any_change(make_node, os_family):
    deb = enroot_files(os_family)[0]
    node = make_node(os_family, missing=(deb,))
    node.add_nvme(2)
    result = node.run("execute")
    assert result.returncode == 2
    assert f"refusing to install {deb}: no published SHA-256" in result.stderr
    assert f'lingjun_slurm.checksums ("{deb}=SHA256")' in result.stderr
    assert_nothing_installed(node)
    assert not node.path("/etc/lingjun-slurm").exists()


def test_missing_pyxis_checksum_is_refused(make_node):
    node = make_node(missing=("pyxis-0.24.0.tar.gz",))
    result = node.run("login")
    assert result.returncode == 2
    assert "refusing to install pyxis-0.24.0.tar.gz: no published SHA-256" in result.stderr
    assert_nothing_installed(node)


def test_admin_supplied_checksum_is_accepted(make_node, artifacts):
    deb = enroot_files("ubuntu")[0]
    node = make_node(missing=(deb,), config={"lingjun_slurm.checksums": f"{deb}={sha256(artifacts[deb]).upper()}"})
    result = node.run("execute")
    assert result.returncode == 0, result.stderr


def test_checksum_mismatch_is_refused(make_node):
    node = make_node()
    deb = enroot_files("ubuntu")[0]
    tampered = node.project / "specs/default/cluster-init/files/artifacts" / deb
    tampered.write_bytes(tampered.read_bytes() + b"tampered")
    result = node.run("execute")
    assert result.returncode == 1
    assert f"checksum mismatch for {deb}" in result.stderr and "refusing it" in result.stderr
    assert_nothing_installed(node)
    assert not node.path(f"/var/cache/lingjun-slurm/artifacts/{deb}").exists()


def test_wrong_admin_checksum_is_refused(make_node):
    deb = enroot_files("ubuntu")[0]
    node = make_node(config={"lingjun_slurm.checksums": f"{deb}={'0' * 64}"})
    result = node.run("execute")
    assert result.returncode == 1
    assert f"checksum mismatch for {deb}" in result.stderr
    assert_nothing_installed(node)


def test_provided_plugin_with_wrong_checksum_is_refused(make_node):
    node = make_node(config={"lingjun_slurm.pyxis.mode": "provided",
                             "lingjun_slurm.pyxis.provided_plugin": "/opt/pyxis/spank_pyxis.so",
                             "lingjun_slurm.pyxis.provided_sha256": "a" * 64})
    node.path("/opt/pyxis").mkdir(parents=True)
    node.path("/opt/pyxis/spank_pyxis.so").write_text("prebuilt\n")
    result = node.run("login")
    assert result.returncode == 1
    assert "checksum mismatch for /opt/pyxis/spank_pyxis.so" in result.stderr
    assert_nothing_installed(node)


@pytest.mark.parametrize("text, line, message", [
    ("lingjun_slurm.nccl.profile: lingjun\nlingjun_slurm.enroot.mount_home: maybe\n", 2,
     'lingjun_slurm.enroot.mount_home: expected true or false, got "maybe"'),
    ("# comment\nlingjun_slurm.nccl.profle: lingjun\n", 2, "unknown key lingjun_slurm.nccl.profle"),
    ("lingjun_slurm:\n  nccl:\n    profile: lingjun\n", 2, "indented line: only flat \"key: value\" lines are supported (write nested keys dotted"),
    ("lingjun_slurm.nccl.profile: lingjun\n  lingjun_slurm.health.interval: 5\n", 2, "indented line"),
    ("lingjun_slurm.enroot.hooks: [a, b]\n", 1, "key lingjun_slurm.enroot.hooks: unsupported YAML"),
    ("lingjun_slurm.health.interval: 60\nlingjun_slurm.health.interval: 90\n", 2,
     "key lingjun_slurm.health.interval: duplicate key (first on line 1)"),
    ("lingjun_slurm.health.interval: soon\n", 1, 'lingjun_slurm.health.interval: expected a whole number'),
    ("lingjun_slurm.storage.scratch: relative/dir\n", 1, "lingjun_slurm.storage.scratch: expected an absolute path"),
    ("lingjun_slurm.pyxis.mode: compile\n", 1, "lingjun_slurm.pyxis.mode: expected one of build|provided|skip"),
    ('lingjun_slurm.pyxis.options: "unterminated\n', 1, "key lingjun_slurm.pyxis.options: unterminated quoted value"),
    ("- lingjun_slurm.nccl.profile\n", 1, "list item"),
    ("lingjun_slurm.nccl.profile:lingjun\n", 1, "key lingjun_slurm.nccl.profile: expected a space after the colon"),
])
def test_invalid_config_file_names_file_line_and_key(make_node, text, line, message):
    node = make_node()
    result = node.run("execute", mode="file", config_text=text)
    assert result.returncode == 2, result.stderr
    yaml = node.base / "node.yaml"
    assert f"{yaml}:{line}: " in result.stderr
    assert message in result.stderr
    assert_nothing_installed(node)


def test_secret_values_never_appear_in_config_errors(make_node):
    secret = "s3cr3t-Token-value"
    node = make_node()
    text = f"lingjun_slurm.enroot.credentials: machine nvcr.io login $oauthtoken password {secret}\nlingjun_slurm.bogus: {secret}\n"
    result = node.run("execute", mode="file", config_text=text)
    assert result.returncode == 2
    assert "unknown key lingjun_slurm.bogus" in result.stderr
    assert secret not in result.stderr + result.stdout + node.log()


def test_yaml_subset_values(make_node):
    text = "\n".join([
        "---",
        "# quoted and plain values, comments",
        "lingjun_slurm.nccl.profile: lingjun   # the Lingjun RoCE profile",
        "lingjun_slurm.pyxis.options: \"sbatch_support=1 # not a comment\"",
        "lingjun_slurm.health.enroot_image: '/shared/images/pytorch#24.05.sqsh'",
        "lingjun_slurm.enroot.mount_home: yes",
        "lingjun_slurm.health.min_free_gb: 100",
        "",
    ])
    node = make_node()
    result = node.run("execute", mode="file", config_text=text)
    assert result.returncode == 0, result.stderr
    assert "lingjun_slurm.pyxis.options = sbatch_support=1 # not a comment" in result.stdout
    assert "runtime_path=/tmp/enroot/pyxis container_scope=job sbatch_support=1 # not a comment\n" in \
        node.path("/etc/slurm/plugstack.conf.d/pyxis.conf").read_text()
    conf = node.path("/etc/lingjun-slurm/health.conf").read_text()
    assert "ENROOT_IMAGE=/shared/images/pytorch#24.05.sqsh\n" in conf and "MIN_FREE_GB=100\n" in conf
    assert "ENROOT_MOUNT_HOME yes\n" in node.path("/etc/enroot/enroot.conf").read_text()


def test_unknown_profile_is_a_clear_error(make_node):
    node = make_node(config={"lingjun_slurm.nccl.profile": "azure-nd-h300-v9"})
    result = node.run("execute")
    assert result.returncode == 2
    assert "unknown NCCL profile 'azure-nd-h300-v9' (known: azure-nd-a100-v4 " in result.stderr
    assert "jetpack config lingjun_slurm.nccl.profile" in result.stderr
    assert_nothing_installed(node)


def test_unknown_instance_type_is_a_clear_error(make_node):
    node = make_node()
    node.jetpack_extra = {"azure.metadata.compute.vmSize": "Standard_NC24ads_A100_v4"}
    result = node.run("execute")
    assert result.returncode == 2
    assert ("jetpack config azure.metadata.compute.vmSize: instance type 'Standard_NC24ads_A100_v4' has no NCCL profile"
            in result.stderr)
    assert "set lingjun_slurm.nccl.profile to one of: azure-nd-a100-v4" in result.stderr
    assert_nothing_installed(node)


def test_no_instance_type_without_cyclecloud_is_a_clear_error(make_node):
    node = make_node()
    result = node.run("execute", mode="file")
    assert result.returncode == 2
    assert "no NCCL profile: set lingjun_slurm.nccl.profile" in result.stderr


def test_instance_type_lookup_ignores_case(make_node):
    node = make_node(config={"lingjun_slurm.nccl.instance_type": "standard_nd96isr_h100_v5"})
    result = node.run("execute", mode="file")
    assert result.returncode == 0, result.stderr
    assert "NCCL profile: azure-nd-h100-v5" in result.stdout


def test_without_jetpack_or_config_file(make_node):
    node = make_node()
    (node.bin / "jetpack").unlink()
    result = node.run("execute")
    assert result.returncode == 2
    assert "no jetpack on PATH (not a CycleCloud node): run install.sh --config node.yaml --role ROLE" in result.stderr


def test_bad_role_and_missing_default_spec(make_node):
    node = make_node()
    script = node.project / "specs/default/cluster-init/files/install.sh"
    bad = subprocess.run(["bash", str(script), "--role", "gpu"], env=node.env(), capture_output=True, text=True)
    assert bad.returncode == 2 and "--role must be default, execute, scheduler or login" in bad.stderr
    shutil.rmtree(node.project / "specs/default")
    orphan = node.run("execute")
    assert orphan.returncode == 1
    assert "attach lingjun-slurm:default (first) to this node" in orphan.stderr


def test_instance_type_without_thresholds_falls_back_to_the_profile(make_node):
    """A VM size with no thresholds of its own, mapped to a generic profile: health.conf must name
    something lingjun-health resolves, or every health check exits 2 and never drains."""
    node = make_node(config={"lingjun_slurm.nccl.profile": "generic-ib", "lingjun_slurm.health.boot_check": "warn"},
                     real_health=True)
    node.jetpack_extra = {"azure.metadata.compute.vmSize": "Standard_NC96ads_A100_v4"}
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert "SKU=generic-ib\n" in node.path("/etc/lingjun-slurm/health.conf").read_text()
    assert "no health-check thresholds for instance type Standard_NC96ads_A100_v4: using those of NCCL profile" \
        in result.stdout
    assert "lingjun-health --boot exited 2" not in result.stderr, "health.conf rejected by lingjun-health"


def test_no_thresholds_at_all_is_refused_before_any_change(make_node):
    node = make_node(config={"lingjun_slurm.nccl.enabled": "false"})
    node.jetpack_extra = {"azure.metadata.compute.vmSize": "Standard_NC96ads_A100_v4"}
    result = node.run("execute")
    assert result.returncode == 2
    assert "no health-check thresholds for instance type 'Standard_NC96ads_A100_v4' in the execute spec's" \
        in result.stderr
    assert_nothing_installed(node)
    node.config["lingjun_slurm.nccl.instance_type"] = "cpu"  # thresholds by name, no NCCL profile needed
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert "SKU=cpu\n" in node.path("/etc/lingjun-slurm/health.conf").read_text()


@pytest.mark.parametrize("image", ["nvcr.io#nvidia/pytorch:24.05-py3", "pytorch.sqsh", "my image"])
def test_health_image_must_be_a_container_name_or_a_sqsh_path(make_node, image):
    """lingjun-health never imports from a registry: such a value would fail every check and drain every node."""
    node = make_node(config={"lingjun_slurm.health.enroot_image": image})
    result = node.run("execute")
    assert result.returncode == 2
    assert ("jetpack config lingjun_slurm.health.enroot_image: lingjun_slurm.health.enroot_image: expected the name "
            "of an enroot container created beforehand or the absolute path of a .sqsh image") in result.stderr
    assert_nothing_installed(node)
