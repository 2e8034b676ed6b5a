"""The installer's health-check side on sandboxed nodes (tests/cluster_init/node.py): site settings
survive reruns, the jetpack/node.yaml keys for the counts, the boot check's policies, and the
slurm.conf HealthCheckProgram that keeps CPU nodearrays checked after CycleCloud's healthagent
line is replaced (cyclecloud-slurm azure-slurm-install/install.py writes HealthCheckProgram=
/sched/CLUSTER/health.sh, HealthCheckInterval=60, HealthCheckNodeState=ANY from
templates/slurm.conf.template; at 049346f6).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.cluster_init.node import SLURM_CONF, Node

DROPINS = "/etc/lingjun-slurm/health.conf.d"
THRESHOLDS = "/etc/lingjun-slurm/health/thresholds"


def changes(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if "] changed: " in line]


def test_site_settings_survive_a_rerun(make_node) -> None:
    node = make_node()
    assert node.run("execute").returncode == 0
    assert node.mode(DROPINS) == 0o755 and list(node.path(DROPINS).iterdir()) == []
    site = node.path(f"{DROPINS}/50-site.conf")
    site.write_text("# our nodes\nGPU_COUNT=8\n")
    own = node.path(f"{THRESHOLDS}/site-h100-pcie.conf")
    own.write_text("INSTANCE_TYPES=site-h100\nGPU_COUNT=4\n")
    node.config["lingjun_slurm.health.min_free_gb"] = "50"  # a change: health.conf is rewritten
    again = node.run("execute")
    assert again.returncode == 0, again.stderr
    assert "[lingjun-slurm] changed: /etc/lingjun-slurm/health.conf" in changes(again.stdout)
    assert site.read_text() == "# our nodes\nGPU_COUNT=8\n" and own.read_text() == "INSTANCE_TYPES=site-h100\nGPU_COUNT=4\n"
    assert "MIN_FREE_GB=50" in node.path("/etc/lingjun-slurm/health.conf").read_text()
    assert f"{DROPINS}/*.conf" in node.path("/etc/lingjun-slurm/health.conf").read_text().splitlines()[0]


def test_thresholds_the_project_no_longer_ships_are_removed_and_only_those(make_node) -> None:
    node = make_node()
    assert node.run("execute").returncode == 0
    shipped = node.project / "specs/execute/cluster-init/files/health/thresholds"
    manifest = node.path("/etc/lingjun-slurm/health/thresholds.installed").read_text().splitlines()
    assert manifest[1:] == sorted(p.name for p in shipped.glob("*.conf")) + ["xid.tsv"]
    # The XID table lingjun-health and crash attribution both read is installed beside them.
    assert node.path(f"{THRESHOLDS}/xid.tsv").read_bytes() == (shipped / "xid.tsv").read_bytes()
    own = node.path(f"{THRESHOLDS}/site-only.conf")
    own.write_text("GPU_COUNT=2\n")
    (shipped / "tcp.conf").unlink()  # the project stops shipping one
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert f"[lingjun-slurm] changed: {THRESHOLDS}/tcp.conf (removed)" in changes(result.stdout)
    assert not node.path(f"{THRESHOLDS}/tcp.conf").exists() and own.exists()
    assert "tcp.conf" not in node.path("/etc/lingjun-slurm/health/thresholds.installed").read_text()
    assert changes(node.run("execute").stdout) == []


def test_the_count_keys_go_to_health_conf(make_node) -> None:
    node = make_node(config={"lingjun_slurm.health.gpu_count": "8", "lingjun_slurm.health.ib_port_count": "4",
                             "lingjun_slurm.health.ib_rate_gbps": "200"})
    assert node.run("execute").returncode == 0
    conf = node.path("/etc/lingjun-slurm/health.conf").read_text().splitlines()
    assert conf[-3:] == ["GPU_COUNT=8", "IB_PORT_COUNT=4", "IB_RATE_GBPS=200"]
    by_file = make_node(config={"lingjun_slurm.health.gpu_count": "8", "lingjun_slurm.health.ib_port_count": "4",
                                "lingjun_slurm.health.ib_rate_gbps": "200", "lingjun_slurm.nccl.profile": "generic-ib"})
    assert by_file.run("execute", mode="file").returncode == 0  # node.yaml: the same keys
    assert by_file.path("/etc/lingjun-slurm/health.conf").read_text().splitlines()[-3:] == conf[-3:]
    bad = make_node(config={"lingjun_slurm.health.gpu_count": "eight"})
    result = bad.run("execute")
    assert result.returncode == 2
    assert "jetpack config lingjun_slurm.health.gpu_count: lingjun_slurm.health.gpu_count: expected a whole number " \
           "or empty" in result.stderr
    assert "Traceback" not in result.stderr and not bad.path("/usr/local/sbin/lingjun-health").exists()


def test_the_installed_program_reads_the_drop_ins(make_node) -> None:
    node = make_node(real_health=True, config={"lingjun_slurm.health.gpu_count": "8"})
    assert node.run("execute").returncode == 0
    node.path(f"{DROPINS}/50-site.conf").write_text("GPU_COUNT=4\n")
    check = subprocess.run([str(node.path("/usr/local/sbin/lingjun-health")), "--no-drain"],
                           env=node.env({"LINGJUN_HEALTH_ROOT": str(node.root)}), capture_output=True, text=True)
    assert "FAIL gpu-count 0 GPUs, expected 4" in check.stdout, check.stdout + check.stderr


def test_a_failing_boot_check_drains_and_cluster_init_goes_on(make_node) -> None:
    node = make_node()
    node.service_running("slurmd")
    result = node.run("execute", extra_env={"STANDIN_HEALTH_RC": "1"})
    assert result.returncode == 0, result.stderr
    assert "continuing (lingjun_slurm.health.boot_check is drain)" in result.stderr
    assert "lingjun-health --boot" in node.calls() and "systemctl restart slurmd" in node.calls()
    node.config["lingjun_slurm.health.boot_check"] = "fail"
    node.path("/run/lingjun-slurm/health-boot.done").unlink()
    failed = node.run("execute", extra_env={"STANDIN_HEALTH_RC": "1"})
    assert failed.returncode == 1 and "set lingjun_slurm.health.boot_check: drain" in failed.stderr


def test_warn_only_logs(make_node) -> None:
    node = make_node(config={"lingjun_slurm.health.boot_check": "warn"})
    result = node.run("execute", extra_env={"STANDIN_HEALTH_RC": "1"})
    assert result.returncode == 0 and "lingjun-health --boot --no-drain" in node.calls()
    assert "continuing (lingjun_slurm.health.boot_check is warn)" in result.stderr


def test_a_bad_health_configuration_fails_cluster_init(make_node) -> None:
    node = make_node()
    result = node.run("execute", extra_env={"STANDIN_HEALTH_RC": "2"})
    assert result.returncode == 1 and "lingjun-health --boot exited 2: bad configuration" in result.stderr


def test_boot_verdict_kept_while_slurmd_has_not_registered(make_node) -> None:
    """The real program at boot: slurmctld knows the node but slurmd has not registered (Slurm
    22.05's `scontrol show node -o` State=DOWN+NOT_RESPONDING, Reason=Not responding): the
    verdict stays on the node for slurmd's first HealthCheckProgram run, cluster-init goes on."""
    node = make_node(real_health=True)
    scontrol = node.bin / "scontrol"
    scontrol.write_text("#!/usr/bin/env bash\nprintf '%s\\n' \"scontrol $*\" >>\"$STANDIN_DIR/calls.log\"\n"
                        "[ \"$1\" = show ] || exit 0\n"
                        "echo \"NodeName=$4 Arch=x86_64 State=DOWN+NOT_RESPONDING ThreadsPerCore=1 Reason=Not responding "
                        "[slurm@2026-11-30T00:22:54]\"\n")
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert "BOOT-FAILURE " in result.stdout and "slurmd has not registered yet" in result.stdout
    assert not [c for c in node.calls() if c.startswith("scontrol update")]
    verdict = node.path("/var/lib/lingjun-slurm/health/boot-failure").read_text()
    assert verdict.split(" ", 1)[1].startswith("lingjun-health: ")


def dispatcher(node: Node, path: str) -> Path:
    conf = node.path("/etc/slurm/slurm.conf").resolve().read_text()
    block = conf[conf.index("# BEGIN lingjun-slurm health checks"):]
    assert f"HealthCheckProgram={path}\n" in block, block
    assert conf.count("\nHealthCheckProgram=") == 1, "Slurm must see one HealthCheckProgram"
    assert node.mode(path) == 0o755
    return node.path(path)


def run_dispatcher(script: Path, root: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "LINGJUN_HEALTH_ROOT": str(root), "SLURMD_NODENAME": "htc-1"}
    return subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True)


def test_cpu_nodes_keep_cyclecloud_healthagent_check(make_node) -> None:
    node = make_node()
    result = node.run("scheduler")
    assert result.returncode == 0, result.stderr
    script = dispatcher(node, "/etc/slurm/lingjun-healthcheck")
    assert "#lingjun-slurm# HealthCheckProgram=/sched/lingjun/health.sh\n" in node.path("/etc/slurm/slurm.conf").read_text()
    assert "replaced='/sched/lingjun/health.sh'" in script.read_text()
    # A CPU node without the execute spec: CycleCloud's healthagent script (a stand-in here) runs.
    tree = node.base / "cpu-node"
    agent = tree / "sched/lingjun/health.sh"
    agent.parent.mkdir(parents=True)
    agent.write_text("#!/bin/sh\necho \"healthagent for $SLURMD_NODENAME\"\nexit 0\n")
    agent.chmod(0o755)
    proc = run_dispatcher(script, tree)
    assert (proc.returncode, proc.stdout) == (0, "healthagent for htc-1\n"), proc.stderr
    # A GPU node with the execute spec: lingjun-health runs (and its status is the check's).
    program = tree / "usr/local/sbin/lingjun-health"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\necho \"lingjun-health $*\"\nexit 1\n")
    program.chmod(0o755)
    proc = run_dispatcher(script, tree)
    assert (proc.returncode, proc.stdout) == (1, "lingjun-health \n")
    # Neither: nothing to run, nothing fails.
    assert run_dispatcher(script, node.base / "empty").returncode == 0
    # The scheduler's own test names the dispatcher it recorded.
    state = node.path("/etc/lingjun-slurm/installed-scheduler.env").read_text()
    assert "HEALTH_PROGRAM=/etc/slurm/lingjun-healthcheck\n" in state
    assert changes(node.run("scheduler").stdout) == []  # idempotent
    node.config["lingjun_slurm.health.enabled"] = "false"
    off = node.run("scheduler")
    assert off.returncode == 0 and node.path("/etc/slurm/slurm.conf").read_text() == SLURM_CONF
    assert not script.exists()


def test_the_dispatcher_lives_beside_cyclecloud_shared_slurm_conf(make_node) -> None:
    node = make_node()
    link = node.share_slurm_conf()
    assert node.run("scheduler").returncode == 0
    dispatcher(node, "/sched/lingjun/lingjun-healthcheck")
    assert link.is_symlink()


def test_no_previous_health_check(make_node) -> None:
    node = make_node()
    node.path("/etc/slurm/slurm.conf").write_text("ClusterName=lingjun\nSlurmctldHost=scheduler\n")
    assert node.run("scheduler").returncode == 0
    script = dispatcher(node, "/etc/slurm/lingjun-healthcheck")
    assert "replaced=''" in script.read_text()
    assert run_dispatcher(script, node.base / "empty").returncode == 0
    node.path("/etc/slurm/slurm.conf").write_text('ClusterName=lingjun\nHealthCheckProgram=""\nHealthCheckInterval=0\n')
    assert node.run("scheduler").returncode == 0  # CycleCloud with its health checks disabled
    assert "replaced=''" in dispatcher(node, "/etc/slurm/lingjun-healthcheck").read_text()
