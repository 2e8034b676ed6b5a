"""The cluster-init installer on sandboxed fresh nodes: what each role installs, with which
modes, and that a second run changes nothing (no "changed:" line, no mtime moves, slurmd
restarted only the first time)."""

from __future__ import annotations

import subprocess

import pytest

from tests.cluster_init.node import ENROOT_VERSION, PROJECT, PYXIS_VERSION, SLURM_CONF, Node


def changes(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if "] changed: " in line]


def node_test(node: Node, role: str) -> subprocess.CompletedProcess[str]:
    """The spec's own CycleCloud node test, run against the sandboxed node."""
    script = node.project / f"specs/{role}/cluster-init/tests/test_{role}.sh"
    return subprocess.run(["bash", str(script)], env=node.env(), capture_output=True, text=True, timeout=30)


def assert_idempotent(node: Node, role: str) -> subprocess.CompletedProcess[str]:
    before = node.snapshot()
    node.clear_calls()
    again = node.run(role)
    assert again.returncode == 0, again.stderr
    assert changes(again.stdout) == []
    assert f"done ({role}): 0 change(s)" in again.stdout
    after = node.snapshot()
    moved = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert moved == [], f"second run touched: {moved}"
    calls = node.calls()
    assert not [c for c in calls if c.startswith(("apt-get", "dnf", "yum", "mdadm", "mkfs", "mount ", "scontrol"))]
    assert "systemctl restart slurmd" not in calls
    return again


@pytest.mark.parametrize("os_family", ["ubuntu", "rhel"])
def test_execute_fresh_node_then_nothing_changes(make_node, os_family):
    node = make_node(os_family)
    node.service_running("slurmd")
    first = node.run("execute")
    assert first.returncode == 0, first.stderr
    calls = node.calls()
    installer = "apt-get install" if os_family == "ubuntu" else "dnf install"
    pkg = "enroot+caps_" if os_family == "ubuntu" else "enroot+caps-"
    assert any(c.startswith(installer) and pkg in c for c in calls)
    assert calls.count("systemctl restart slurmd") == 1
    assert "lingjun-health --boot" in calls

    modes = {"/etc/enroot/enroot.conf": 0o644, "/etc/enroot/hooks.d/50-slurm-pmi.sh": 0o755,
             "/etc/enroot/hooks.d/50-slurm-pytorch.sh": 0o755, "/etc/enroot/environ.d/50-lingjun-mellanox.env": 0o644,
             "/usr/lib64/slurm/spank_pyxis.so": 0o644, "/etc/slurm/plugstack.conf.d/pyxis.conf": 0o644,
             "/etc/nccl.conf": 0o644, "/usr/local/sbin/lingjun-health": 0o755,
             "/etc/lingjun-slurm/health.conf": 0o644, "/tmp/enroot/data": 0o1777, "/tmp/enroot/pyxis": 0o755}
    for path, mode in modes.items():
        assert node.mode(path) == mode, path
    assert node.path("/usr/bin/enroot").is_file(), "the package's files were not installed"

    enroot_conf = node.path("/etc/enroot/enroot.conf").read_text()
    assert "ENROOT_DATA_PATH /tmp/enroot/data/user-$(id -u)\n" in enroot_conf
    assert "ENROOT_SQUASH_OPTIONS -noI -noD -noF -noX -no-duplicates\n" in enroot_conf
    assert "ENROOT_CONFIG_PATH" not in enroot_conf
    assert node.path("/etc/slurm/plugstack.conf.d/pyxis.conf").read_text().endswith(
        "required /usr/lib64/slurm/spank_pyxis.so runtime_path=/tmp/enroot/pyxis container_scope=job\n")
    plugin = node.path("/usr/lib64/slurm/spank_pyxis.so").read_text()
    assert '-DPYXIS_VERSION=\\"0.24.0\\"' in plugin, "CPPFLAGS must reach make through the environment"
    assert "spank.h of Slurm 23.11" in plugin, "built against the node's Slurm headers"
    expected_nccl = node.project / "specs/execute/cluster-init/files/nccl/azure-nd-h100-v5.conf"
    assert node.path("/etc/nccl.conf").read_text() == expected_nccl.read_text()
    health = node.path("/etc/lingjun-slurm/health.conf").read_text().splitlines()
    assert health[1:] == ["SKU=Standard_ND96isr_H100_v5", "THRESHOLDS_DIR=/etc/lingjun-slurm/health/thresholds",
                          "NCCL_CONF=/etc/nccl.conf", "ENROOT_CONF=/etc/enroot/enroot.conf", "ENROOT_IMAGE=",
                          "MIN_FREE_GB=20"]
    thresholds = sorted(p.name for p in (node.project / "specs/execute/cluster-init/files/health/thresholds").glob("*") if p.suffix in (".conf", ".tsv"))
    assert sorted(p.name for p in node.path("/etc/lingjun-slurm/health/thresholds").iterdir()) == thresholds

    check = node_test(node, "execute")
    assert check.returncode == 0, check.stdout
    assert "FAIL" not in check.stdout
    assert_idempotent(node, "execute")


def test_execute_makes_the_textfile_directory_writable_by_jobs(make_node):
    """monitoring.textfile_dir: a directory of the jobs' own becomes 1777 (sticky, as /tmp) so jobs can
    keep their .prom files there; Debian's system directory, where prometheus-node-exporter-collectors
    writes as root, stays root-owned 0755 even when the key names it (a world-writable one would let
    any user fake node metrics or break the scrape; docs/monitoring.md)."""
    node = make_node()
    node.service_running("slurmd")
    assert node.run("execute").returncode == 0
    own = "/var/lib/prometheus/node-exporter-lingjun-slurm"
    system = "/var/lib/prometheus/node-exporter"
    assert not node.path(own).exists(), "no key: no directory"
    node.path(system).mkdir(parents=True, mode=0o755)
    node.path(system).chmod(0o755)
    node.config["lingjun_slurm.monitoring.textfile_dir"] = system
    refused = node.run("execute")
    assert refused.returncode == 0, refused.stderr
    assert node.mode(system) == 0o755
    assert "system textfile directory: left as it is" in refused.stderr
    assert not any(system in line for line in changes(refused.stdout))
    node.config["lingjun_slurm.monitoring.textfile_dir"] = own
    again = node.run("execute")
    assert again.returncode == 0, again.stderr
    assert node.mode(own) == 0o1777
    assert node.mode(system) == 0o755
    assert any(own in line for line in changes(again.stdout))
    assert_idempotent(node, "execute")


def test_scheduler_gets_pyxis_and_the_health_check_settings(make_node):
    node = make_node()
    node.service_running("slurmctld")
    first = node.run("scheduler")
    assert first.returncode == 0, first.stderr
    conf = node.path("/etc/slurm/slurm.conf").read_text()
    assert "#lingjun-slurm# HealthCheckProgram=/sched/lingjun/health.sh\n" in conf
    assert "#lingjun-slurm# HealthCheckInterval=60\n" in conf
    block = conf[conf.index("# BEGIN lingjun-slurm health checks"):]
    assert "HealthCheckProgram=/etc/slurm/lingjun-healthcheck\nHealthCheckInterval=300\nHealthCheckNodeState=IDLE\n" in block
    assert node.calls().count("scontrol reconfigure") == 1
    assert node.mode("/usr/lib64/slurm/spank_pyxis.so") == 0o644
    assert "runtime_path=/run/pyxis" in node.path("/etc/slurm/plugstack.conf.d/pyxis.conf").read_text()
    assert not node.path("/etc/enroot").exists(), "the scheduler needs no enroot"
    assert not node.path("/etc/nccl.conf").exists()
    check = node_test(node, "scheduler")
    assert check.returncode == 0, check.stdout
    assert_idempotent(node, "scheduler")

    node.config["lingjun_slurm.health.enabled"] = "false"
    off = node.run("scheduler")
    assert off.returncode == 0, off.stderr
    assert node.path("/etc/slurm/slurm.conf").read_text() == SLURM_CONF, "disabling restores the original settings"


def test_scheduler_writes_through_cyclecloud_symlink(make_node):
    node = make_node()
    link = node.share_slurm_conf()
    shared = node.path("/sched/lingjun/slurm.conf")
    result = node.run("scheduler")
    assert result.returncode == 0, result.stderr
    assert link.is_symlink(), "CycleCloud's link to /sched must stay a link"
    assert "HealthCheckProgram=/sched/lingjun/lingjun-healthcheck" in shared.read_text()
    assert "scontrol reconfigure" not in node.calls(), "slurmctld is not running here"


def test_login_gets_pyxis_only(make_node):
    node = make_node()
    result = node.run("login")
    assert result.returncode == 0, result.stderr
    assert node.mode("/usr/lib64/slurm/spank_pyxis.so") == 0o644
    assert node.path("/etc/slurm/slurm.conf").read_text() == SLURM_CONF
    assert not node.path("/etc/enroot").exists()
    check = node_test(node, "login")
    assert check.returncode == 0, check.stdout
    assert_idempotent(node, "login")


def test_default_spec_checks_the_configuration(make_node):
    node = make_node()
    result = node.run("default")
    assert result.returncode == 0, result.stderr
    assert "lingjun_slurm.enroot.version = " + ENROOT_VERSION in result.stdout
    assert node_test(node, "default").returncode == 0
    assert_idempotent(node, "default")


def test_plugstack_include_is_added_once(make_node):
    node = make_node()
    node.path("/etc/slurm/plugstack.conf").write_text("optional /usr/lib64/slurm/other.so\n")
    assert node.run("login").returncode == 0
    assert node.path("/etc/slurm/plugstack.conf").read_text() == (
        "optional /usr/lib64/slurm/other.so\n"
        "# Added by lingjun-slurm cluster-init: SPANK plugins such as pyxis\n"
        "include /etc/slurm/plugstack.conf.d/*\n")
    assert_idempotent(node, "login")


def test_file_mode_gives_the_same_node_as_jetpack_mode(make_node):
    config = {"lingjun_slurm.nccl.instance_type": "ml.gu7xf.8xlarge-gu108",
              "lingjun_slurm.pyxis.container_scope": "global",
              "lingjun_slurm.pyxis.options": "sbatch_support=1",
              "lingjun_slurm.health.enroot_image": "/shared/images/pytorch-24.05.sqsh"}
    by_jetpack, by_file = make_node(config=config), make_node(config=config)
    for node in (by_jetpack, by_file):
        node.service_running("slurmd")
    a = by_jetpack.run("execute")
    b = by_file.run("execute", mode="file")
    assert a.returncode == 0, a.stderr
    assert b.returncode == 0, b.stderr
    assert by_jetpack.tree() == by_file.tree()
    assert "NCCL_IB_GID_INDEX=3" in by_file.path("/etc/nccl.conf").read_text()
    assert "SKU=ml.gu7xf.8xlarge-gu108" in by_file.path("/etc/lingjun-slurm/health.conf").read_text()
    assert changes(by_file.run("execute", mode="file").stdout) == []
    assert [c for c in by_file.calls() if c.startswith("jetpack")] == []


def test_changed_config_is_applied_and_restarts_slurmd_again(make_node):
    node = make_node()
    node.service_running("slurmd")
    assert node.run("execute").returncode == 0
    node.clear_calls()
    node.config["lingjun_slurm.pyxis.options"] = "sbatch_support=1"
    node.config["lingjun_slurm.nccl.profile"] = "generic-ib"
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert sorted(changes(result.stdout)) == sorted([
        "[lingjun-slurm] changed: /etc/lingjun-slurm/pyxis-plugstack.env",
        "[lingjun-slurm] changed: /etc/slurm/plugstack.conf.d/pyxis.conf",
        "[lingjun-slurm] changed: /etc/nccl.conf",
        "[lingjun-slurm] changed: /etc/lingjun-slurm/installed-execute.env"])
    assert "systemctl restart slurmd" in node.calls()
    assert "lingjun-health --boot" not in node.calls(), "the boot check runs once per boot"


def test_a_hook_dropped_from_the_config_is_disabled_again(make_node):
    node = make_node()
    admin_hook = node.path("/etc/enroot/hooks.d/10-site.sh")
    admin_hook.parent.mkdir(parents=True)
    admin_hook.write_text("#!/bin/sh\n# the site's own hook\n")
    assert node.run("execute").returncode == 0
    hooks = node.path("/etc/enroot/hooks.d")
    assert sorted(p.name for p in hooks.iterdir()) == ["10-site.sh", "50-slurm-pmi.sh", "50-slurm-pytorch.sh"]
    node.config["lingjun_slurm.enroot.hooks"] = "50-slurm-pmi.sh"
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert "[lingjun-slurm] changed: /etc/enroot/hooks.d/50-slurm-pytorch.sh (removed)" in changes(result.stdout)
    assert sorted(p.name for p in hooks.iterdir()) == ["10-site.sh", "50-slurm-pmi.sh"]
    assert_idempotent(node, "execute")
    node.config["lingjun_slurm.enroot.hooks"] = ""
    assert node.run("execute").returncode == 0
    assert sorted(p.name for p in hooks.iterdir()) == ["10-site.sh"], "hooks it never enabled are left alone"
    assert_idempotent(node, "execute")


def test_boot_check_names_the_cyclecloud_node(make_node):
    """CycleCloud starts slurmd as `slurmd -N <CycleCloud node name>`, which need not be the host name."""
    node = make_node()
    node.jetpack_extra["cyclecloud.node.name"] = "lingjun-gpu-3"
    assert node.run("execute").returncode == 0
    assert "lingjun-health --boot --node lingjun-gpu-3" in node.calls()


def test_slurmd_not_running_is_left_alone(make_node):
    node = make_node()
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert "systemctl restart slurmd" not in node.calls()
    assert "slurmd is not running" in result.stdout


def test_pyxis_rebuilt_when_the_slurm_headers_change(make_node):
    node = make_node()
    assert node.run("login").returncode == 0
    node.path("/usr/include/slurm/spank.h").write_text("/* spank.h of Slurm 24.05 (stand-in) */\n")
    result = node.run("login")
    assert result.returncode == 0, result.stderr
    assert "changed: /usr/lib64/slurm/spank_pyxis.so" in result.stdout
    assert "Slurm 24.05" in node.path("/usr/lib64/slurm/spank_pyxis.so").read_text()


def test_pyxis_builds_without_slurm_version_h(make_node):
    node = make_node()
    node.path("/usr/include/slurm/slurm_version.h").unlink()
    result = node.run("login")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert "spank.h of Slurm 23.11" in node.path("/usr/lib64/slurm/spank_pyxis.so").read_text()
    assert_idempotent(node, "login")


def test_project_in_a_directory_with_spaces(make_node):
    """install.sh --config runs from wherever the project was copied (no CycleCloud there)."""
    node = make_node()
    moved = node.base / "cluster init" / "lingjun-slurm"
    moved.parent.mkdir()
    node.project.rename(moved)
    node.project = moved
    for role in ("execute", "login"):
        result = node.run(role)
        assert result.returncode == 0, result.stderr
        assert f"fetched pyxis-{PYXIS_VERSION}.tar.gz from {moved}/specs/default/cluster-init/files/artifacts/" \
            in node.log()
        assert_idempotent(node, role)


def test_provided_pyxis_build(make_node):
    node = make_node(config={"lingjun_slurm.pyxis.mode": "provided",
                             "lingjun_slurm.pyxis.provided_plugin": "/shared/pyxis/spank_pyxis.so"})
    prebuilt = node.path("/shared/pyxis/spank_pyxis.so")
    prebuilt.parent.mkdir(parents=True)
    prebuilt.write_bytes(b"\x7fELF prebuilt pyxis " + PYXIS_VERSION.encode())
    result = node.run("login")
    assert result.returncode == 0, result.stderr
    assert node.path("/usr/lib64/slurm/spank_pyxis.so").read_bytes() == prebuilt.read_bytes()
    assert not [c for c in node.calls() if "make" in c]
    assert_idempotent(node, "login")


def test_failed_boot_health_check_fails_cluster_init_unless_warn(make_node):
    node = make_node(config={"lingjun_slurm.health.boot_check": "fail"})
    node.service_running("slurmd")
    failed = node.run("execute", extra_env={"STANDIN_HEALTH_RC": "1"})
    assert failed.returncode == 1
    assert "the boot health check failed" in failed.stderr
    assert "systemctl restart slurmd" not in node.calls(), "a failed node is not restarted into service"
    node.config["lingjun_slurm.health.boot_check"] = "warn"
    node.clear_calls()
    warned = node.run("execute", extra_env={"STANDIN_HEALTH_RC": "1"})
    assert warned.returncode == 0, warned.stderr
    assert "continuing (lingjun_slurm.health.boot_check is warn)" in warned.stderr
    assert "systemctl restart slurmd" in node.calls(), "the restart the failed run owed is done now"
    node.clear_calls()
    assert node.run("execute").returncode == 0
    assert "systemctl restart slurmd" not in node.calls()


GENERATED_HEALTH = PROJECT / "specs/execute/cluster-init/files/health/lingjun-health"


@pytest.mark.skipif(not GENERATED_HEALTH.is_file(), reason="the generated health checks are not in cluster_init/ yet")
def test_generated_health_program_accepts_the_installed_config(make_node):
    """The real lingjun-health, installed by the execute spec, reads the health.conf the
    installer wrote (no usage error, exit 2) and runs its checks against the sandboxed node:
    without GPUs they fail, so it drains the node through scontrol (a stand-in here)."""
    node = make_node(real_health=True)
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert node.path("/usr/local/sbin/lingjun-health").read_bytes() == GENERATED_HEALTH.read_bytes()
    assert node.mode("/usr/local/sbin/lingjun-health") == 0o755
    assert "lingjun-health --boot exited 2" not in result.stderr, "health.conf or thresholds rejected"
    assert "the boot health check failed (lingjun-health --boot exited 1)" in result.stderr
    assert [c for c in node.calls() if c.startswith("scontrol update") and "State=DRAIN Reason=lingjun-health: " in c]
    check = subprocess.run([str(node.path("/usr/local/sbin/lingjun-health")), "--no-drain"],
                           env=node.env({"LINGJUN_HEALTH_ROOT": str(node.root)}), capture_output=True, text=True)
    assert check.returncode == 1, check.stderr
    assert "FAIL gpu-count 0 GPUs, expected 8" in check.stdout, "thresholds found from SKU= in health.conf"
    space = [line for line in check.stdout.splitlines() if " enroot-space " in line]
    assert space and "/tmp/enroot/" in space[0], "enroot's paths are read from ENROOT_CONF"


def test_node_tests_fail_on_a_broken_node(make_node):
    """The specs' CycleCloud node tests are real checks: a plugin with the wrong mode, a missing
    plugstack entry, or a role that never ran, each fail."""
    node = make_node()
    assert node_test(node, "login").returncode == 1, "the role never ran"
    assert node.run("login").returncode == 0
    node.path("/usr/lib64/slurm/spank_pyxis.so").chmod(0o600)
    node.path("/etc/slurm/plugstack.conf.d/pyxis.conf").write_text("")
    check = node_test(node, "login")
    assert check.returncode == 1
    assert "FAIL pyxis plugin /usr/lib64/slurm/spank_pyxis.so (0644)" in check.stdout
    assert "FAIL pyxis enabled in /etc/slurm/plugstack.conf.d/pyxis.conf" in check.stdout
    assert "FAIL pyxis container_scope=job" in check.stdout
    assert "FAIL exactly one pyxis entry in /etc/slurm/plugstack.conf.d/*" in check.stdout
    assert "4 check(s) failed" in check.stdout


# -- what another installer put on the node (issue 14, items 1 and 3) --------------------------

def cyclecloud_pyxis(node: Node, version: str) -> bytes:
    """cyclecloud-slurm 4.0.x's pyxis: built into /opt/pyxis/spank_pyxis.so (chmod +x) and named in
    plugstack.conf.d/pyxis.conf (Azure/cyclecloud-slurm 4.0.9 ubuntu.sh:155-163, install.py:990-997).
    The stand-in carries the string a real build logs at slurmd start ("pyxis: version v" PYXIS_VERSION,
    NVIDIA/pyxis pyxis_slurmd.c:28)."""
    so = node.path("/opt/pyxis/spank_pyxis.so")
    so.parent.mkdir(parents=True, exist_ok=True)
    data = b"\x7fELF stand-in for cyclecloud-slurm's pyxis build\x00pyxis: version v" + version.encode() + b"\x00"
    so.write_bytes(data)
    so.chmod(0o755)
    node.path("/etc/slurm/plugstack.conf.d/pyxis.conf").write_text(
        "required /opt/pyxis/spank_pyxis.so runtime_path=/mnt/enroot/enroot-runtime")
    return data


def test_cyclecloud_pyxis_below_the_floor_is_replaced_by_our_build(make_node):
    node = make_node()
    cyclecloud_pyxis(node, "0.21.0")
    result = node.run("login")
    assert result.returncode == 0, result.stderr
    assert ("pyxis: pyxis 0.21.0 at /opt/pyxis/spank_pyxis.so is below the floor 0.24.0 "
            "(lingjun_slurm.pyxis.min_version and the plugstack options): building 0.24.0 instead") in result.stdout
    assert "fake spank_pyxis.so" in node.path("/usr/lib64/slurm/spank_pyxis.so").read_text(errors="replace")
    assert node.path("/etc/slurm/plugstack.conf.d/pyxis.conf").read_text().endswith(
        "\nrequired /usr/lib64/slurm/spank_pyxis.so runtime_path=/run/pyxis container_scope=job\n")
    assert node_test(node, "login").returncode == 0
    assert_idempotent(node, "login")


def test_cyclecloud_pyxis_at_the_floor_is_adopted(make_node):
    node = make_node(config={"lingjun_slurm.pyxis.min_version": "0.21.0"})
    node.service_running("slurmd")
    theirs = cyclecloud_pyxis(node, "0.21.0")
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert ("pyxis: adopting pyxis 0.21.0 found at /opt/pyxis/spank_pyxis.so: at least 0.21.0 "
            "(lingjun_slurm.pyxis.min_version and the plugstack options), so 0.24.0 is not built") in result.stdout
    assert "run: make" not in node.log()
    assert node.path("/usr/lib64/slurm/spank_pyxis.so").read_bytes() == theirs
    assert node.mode("/usr/lib64/slurm/spank_pyxis.so") == 0o644
    assert "adopted_from=/opt/pyxis/spank_pyxis.so\n" in node.path("/var/lib/lingjun-slurm/pyxis.stamp").read_text()
    assert node.path("/etc/slurm/plugstack.conf.d/pyxis.conf").read_text().endswith(
        "required /usr/lib64/slurm/spank_pyxis.so runtime_path=/tmp/enroot/pyxis container_scope=job\n")
    check = node_test(node, "execute")
    assert check.returncode == 0, check.stdout
    assert_idempotent(node, "execute")

    # an option pyxis 0.21.0 does not know (use_squashfuse, config.c since v0.22.0) raises the floor
    node.config["lingjun_slurm.pyxis.options"] = "use_squashfuse=1"
    rebuilt = node.run("execute")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "pyxis 0.21.0 at /opt/pyxis/spank_pyxis.so is below the floor 0.22.0" in rebuilt.stdout
    assert "changed: /usr/lib64/slurm/spank_pyxis.so" in rebuilt.stdout
    assert "fake spank_pyxis.so" in node.path("/usr/lib64/slurm/spank_pyxis.so").read_text(errors="replace")
    assert_idempotent(node, "execute")


def test_rhel_enroot_at_the_floor_is_adopted(make_node):
    node = make_node("rhel", config={"lingjun_slurm.enroot.min_version": "4.0.1"})
    node.preinstall(("enroot", "enroot+caps"), "4.0.1")
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert "enroot: adopting the installed enroot 4.0.1, enroot+caps 4.0.1: at least 4.0.1" in result.stdout
    assert not [c for c in node.calls() if c.startswith("dnf install") and "enroot" in c]
    assert node.pkg_version("enroot") == "4.0.1"


def test_rhel_enroot_below_the_floor_is_upgraded(make_node):
    node = make_node("rhel")
    node.preinstall(("enroot", "enroot+caps"), "4.0.1")
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert "enroot: installing the pinned 4.2.1 (found enroot 4.0.1, enroot+caps 4.0.1; floor 4.2.1)" in result.stdout
    assert node.pkg_version("enroot") == "4.2.1"


def test_a_newer_enroot_is_kept_not_downgraded(make_node):
    node = make_node()
    node.preinstall(("enroot", "enroot+caps"), "4.3.0", hold=True)
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert "enroot: adopting the installed enroot 4.3.0 (held), enroot+caps 4.3.0 (held): at least 4.2.1" in result.stdout
    assert not [c for c in node.calls() if c.startswith("apt-get install") and "enroot" in c]


def test_nvidia_container_cli_required_but_missing_is_refused_before_any_change(make_node):
    node = make_node(config={"lingjun_slurm.enroot.nvidia_container_cli": "require"})
    node.remove_nvcli()
    result = node.run("execute")
    assert result.returncode == 1
    assert ("enroot cannot start GPU containers on this node: its 98-nvidia.sh hook needs nvidia-container-cli "
            "from libnvidia-container-tools 1.16.2 or later, found none.") in result.stderr
    assert "lingjun_slurm.enroot.nvidia_container_cli to install" in result.stderr
    assert not [c for c in node.calls() if c.startswith(("apt-get", "dnf"))]
    assert not node.path("/etc/enroot/enroot.conf").exists()


def test_nvidia_container_cli_required_and_present_is_kept(make_node):
    node = make_node(config={"lingjun_slurm.enroot.nvidia_container_cli": "require"})
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert "nvidia-container-cli: keeping libnvidia-container-tools 1.17.8 (held) (at least 1.16.2" in result.stdout


def test_nvidia_container_cli_off_checks_nothing(make_node):
    node = make_node(config={"lingjun_slurm.enroot.nvidia_container_cli": "off"})
    node.remove_nvcli()
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert "nvidia-container-cli: not checked (lingjun_slurm.enroot.nvidia_container_cli is off)" in result.stdout
    assert not [c for c in node.calls() if c.startswith("apt-get install") and "libnvidia" in c]


@pytest.mark.parametrize("os_family", ["ubuntu", "rhel"])
def test_nvidia_container_cli_installed_pinned_when_missing(make_node, os_family):
    node = make_node(os_family)
    node.remove_nvcli()
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    installer = "apt-get install" if os_family == "ubuntu" else "dnf install"
    assert [c for c in node.calls() if c.startswith(installer) and "libnvidia-container-tools" in c]
    assert node.pkg_version("libnvidia-container-tools") == ("1.20.1-1" if os_family == "ubuntu" else "1.20.1")
    assert node.mode("/usr/bin/nvidia-container-cli") == 0o755
    assert_idempotent(node, "execute")


def test_nvidia_container_cli_checksum_missing_is_refused(make_node):
    from tests.cluster_init.node import nvcli_files
    deb = nvcli_files("ubuntu")[1]
    node = make_node(missing=(deb,))
    node.remove_nvcli()
    result = node.run("execute")
    assert result.returncode == 2
    assert f"refusing to install {deb}: no published SHA-256" in result.stderr
    assert not [c for c in node.calls() if c.startswith("apt-get")]


@pytest.mark.parametrize("version, kept", [("1.17.0", True), ("1.15.0", False)])
def test_nvidia_container_cli_not_from_a_package(make_node, version, kept):
    """Built from source into /usr/local/bin: its version comes from `nvidia-container-cli --version`."""
    from tests.cluster_init.node import NVCLI_SCRIPT
    node = make_node()
    node.remove_nvcli()
    cli = node.path("/usr/local/bin/nvidia-container-cli")
    cli.parent.mkdir(parents=True, exist_ok=True)
    cli.write_text(NVCLI_SCRIPT.replace("{v}", version))
    cli.chmod(0o755)
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    seen = f"/usr/local/bin/nvidia-container-cli {version}, not from a package"
    if kept:
        assert f"nvidia-container-cli: keeping {seen} (at least 1.16.2" in result.stdout
        assert not [c for c in node.calls() if c.startswith("apt-get install") and "libnvidia" in c]
    else:
        assert f"installing the pinned libnvidia-container 1.20.1 (found {seen}; floor 1.16.2)" in result.stdout
        assert "whichever comes first on PATH is the one enroot runs" in result.stderr
        assert node.pkg_version("libnvidia-container-tools") == "1.20.1-1"


def test_a_bad_floor_is_a_configuration_error(make_node):
    node = make_node(config={"lingjun_slurm.enroot.min_version": "4.9.9", "lingjun_slurm.nccl.profile": "generic-ib"})
    result = node.run("execute", mode="file")
    assert result.returncode == 2
    assert "lingjun_slurm.enroot.min_version: the floor 4.9.9 is above lingjun_slurm.enroot.version 4.2.1" in result.stderr
    node.config["lingjun_slurm.enroot.min_version"] = "latest"
    result = node.run("execute", mode="file")
    assert result.returncode == 2
    assert 'lingjun_slurm.enroot.min_version: expected a version like 1.2.3 (or nothing), got "latest"' in result.stderr
    assert "node.yaml:" in result.stderr
