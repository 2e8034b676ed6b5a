"""`health` and `nccl-test` on a fresh install (issue 15, item 7): no cluster-init run (no
/etc/lingjun-slurm/health.conf), no nvidia-smi, no Slurm on PATH or Slurm without a configuration,
no nccl-tests set up. Each says what is missing and how to get it, with a documented exit code and
never a traceback.

The CLI runs as a real process (the venv's console script) in a hermetic environment: PATH is a
tmp directory of links to basic tools (plus Slurm's real commands where a test says so), HOME and
the state directory are under tmp_path. Slurm's own messages come from the real sbatch/scontrol of
this machine's Slurm packages (skipped where those are missing or configured).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lingjun_slurm.nodes import health as pkg
from lingjun_slurm.cli.health import HINT_NO_SMI, fresh_install_hints
from lingjun_slurm.slurm.client import UNCONFIGURED_HINT

CLI = Path(sys.executable).parent / "lingjun-slurm"
BASIC = ("bash", "sh", "env", "cat", "grep", "sed", "awk", "head", "tail", "cut", "tr", "sort", "uniq", "wc", "date",
         "hostname", "mkdir", "rm", "mv", "cp", "ls", "timeout", "sleep", "printf", "id", "stat", "df", "readlink",
         "dirname", "basename", "mktemp", "chmod", "kill", "ps", "find", "xargs", "touch", "tee", "ln", "uname",
         "test", "expr", "flock", "getent", "od")
SLURM = ("sbatch", "scontrol", "squeue", "sacct", "scancel")
# lingjun-health appends these to PATH itself (its "PATH=" line), so a program found there counts.
SYSTEM_DIRS = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NAMES = ", ".join(pkg.sku_names())
NO_CONFIG_HINT = ("hint: this node has not been set up for health checks: the cluster-init project writes "
                  "/etc/lingjun-slurm/health.conf on every node it sets up (docs/cluster-init.md); to check it "
                  "without one, name its thresholds: lingjun-slurm health --sku NAME --no-drain "
                  f"(NAME: {NAMES}; docs/health-checks.md)")
NO_SBATCH = ("sbatch not found: nccl-test submits through Slurm: run it on a Slurm login node, pass --host "
             "[USER@]HOST or --cluster NAME to run there over SSH, or write the script with --render-only DIR and "
             "submit it yourself")

pytestmark = pytest.mark.skipif(not CLI.exists(), reason="needs the lingjun-slurm console script beside python")

no_nvidia_smi = pytest.mark.skipif(shutil.which("nvidia-smi", path=SYSTEM_DIRS) is not None,
                                   reason="this machine has nvidia-smi (lingjun-health finds it in the system dirs)")
unconfigured_slurm = pytest.mark.skipif(
    shutil.which("sbatch", path=SYSTEM_DIRS) is None or shutil.which("scontrol", path=SYSTEM_DIRS) is None
    or os.path.exists("/etc/slurm/slurm.conf") or os.path.exists("/run/slurm/conf/slurm.conf"),
    reason="needs Slurm's commands installed without a configuration (no /etc/slurm/slurm.conf, not configless)")


def fresh_env(tmp_path: Path, *, slurm: bool = False, **extra: str) -> dict[str, str]:
    bindir = tmp_path / "fresh-bin"
    if not bindir.exists():
        bindir.mkdir()
        for tool in BASIC + (SLURM if slurm else ()):
            found = shutil.which(tool, path=SYSTEM_DIRS)
            if found:
                (bindir / tool).symlink_to(found)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"PATH": str(bindir), "HOME": str(home), "LINGJUN_STATE_DIR": str(tmp_path / "state"), "LC_ALL": "C.UTF-8",
            **extra}


def cli(tmp_path: Path, env: dict[str, str], *args: str, timeout: float = 45) -> subprocess.CompletedProcess[str]:
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    proc = subprocess.run([str(CLI), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    for text in (proc.stdout, proc.stderr):
        assert "Traceback" not in text and "internal error" not in text, text
    return proc


# --- health -----------------------------------------------------------------------------------

def test_health_without_any_config_says_to_run_cluster_init_or_pass_a_sku(tmp_path: Path) -> None:
    proc = cli(tmp_path, fresh_env(tmp_path), "health")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "lingjun-health: no config at /etc/lingjun-slurm/health.conf: write SKU=<instance type> there, or pass "
        "--config FILE or --sku NAME",
        NO_CONFIG_HINT]


def test_health_under_root_names_the_path_it_read(tmp_path: Path) -> None:
    root = tmp_path / "node"
    root.mkdir()
    proc = cli(tmp_path, fresh_env(tmp_path), "health", "--root", str(root), "--no-drain")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == NO_CONFIG_HINT.replace("writes /etc/", f"writes {root}/etc/")


@no_nvidia_smi
def test_health_with_a_sku_on_a_node_without_nvidia_smi(tmp_path: Path) -> None:
    proc = cli(tmp_path, fresh_env(tmp_path), "health", "--sku", "tcp", "--no-drain")
    assert proc.returncode == 1
    assert "FAIL gpu-count nvidia-smi not found, expected some GPUs\n" in proc.stdout
    assert proc.stderr.splitlines() == [HINT_NO_SMI]
    assert HINT_NO_SMI == ("hint: nvidia-smi not found: this is not a GPU node, or the NVIDIA driver is not "
                           "installed: run health on a GPU node, with --sku cpu on a node without GPUs, or with "
                           "--root DIR on a recorded tree (docs/health-checks.md)")


@unconfigured_slurm
def test_health_that_would_drain_on_a_node_without_slurm_configured(tmp_path: Path) -> None:
    """Real scontrol, no slurm.conf: Slurm's own "Could not establish a configuration source"."""
    proc = cli(tmp_path, fresh_env(tmp_path, slurm=True), "health", "--sku", "cpu", "--node", "n1")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "lingjun-health: cannot read the state of node n1 (rc 1: scontrol: fatal: Could not establish a "
        "configuration source)",
        "hint: Slurm could not be asked about node n1 (Slurm is installed but not configured here: rc 1: scontrol: "
        "fatal: Could not establish a configuration source), so nothing was drained or resumed: run health on a "
        "node of the cluster (where slurmd runs), or add --no-drain to only check"]


@no_nvidia_smi
def test_a_configured_node_prints_what_it_printed_before(tmp_path: Path) -> None:
    """The same missing nvidia-smi on a node with a health.conf: the program's output only, no hint."""
    root = tmp_path / "node"
    (root / "etc" / "lingjun-slurm").mkdir(parents=True)
    (root / "etc" / "lingjun-slurm" / "health.conf").write_text("SKU=tcp\n")
    proc = cli(tmp_path, fresh_env(tmp_path), "health", "--root", str(root), "--no-drain")
    assert proc.returncode == 1 and "FAIL gpu-count nvidia-smi not found" in proc.stdout
    assert proc.stderr == ""
    dropin = tmp_path / "node2" / "etc" / "lingjun-slurm" / "health.conf.d"
    dropin.mkdir(parents=True)
    (dropin / "site.conf").write_text("SKU=tcp\n")
    proc = cli(tmp_path, fresh_env(tmp_path), "health", "--root", str(tmp_path / "node2"), "--no-drain")
    assert proc.returncode == 1 and proc.stderr == ""


def test_health_help_says_what_a_fresh_node_needs(tmp_path: Path) -> None:
    proc = cli(tmp_path, fresh_env(tmp_path), "health", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert ("A node that the cluster-init project (docs/cluster-init.md) has not set up has no "
            "/etc/lingjun-slurm/health.conf: pass --sku NAME (its thresholds) and --no-drain to check it anyway"
            in text)


def test_hint_for_a_node_without_scontrol() -> None:
    """lingjun-health's cmd_why says "not found" for exit 127 (no scontrol anywhere on PATH)."""
    hints = fresh_install_hints("", "lingjun-health: cannot read the state of node gpu7 (not found); not drained\n",
                                ["cpu"], "/etc/lingjun-slurm/health.conf")
    assert hints == ["hint: Slurm could not be asked about node gpu7 (scontrol not found: Slurm's client commands "
                     "are not installed), so nothing was drained or resumed: run health on a node of the cluster "
                     "(where slurmd runs), or add --no-drain to only check"]
    assert fresh_install_hints("OK gpu-count 8 GPUs\n", "", ["cpu"], "/x") == []


# --- nccl-test ----------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [("--profile", "tcp"), ("--profile", "azure-nd-h100-v5", "--no-wait"),
                                  ("--profile", "tcp", "--nodelist", "gpu[1-4]", "--bisect")])
def test_nccl_test_without_slurm_says_where_to_run_it(tmp_path: Path, args: tuple[str, ...]) -> None:
    proc = cli(tmp_path, fresh_env(tmp_path), "nccl-test", *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == NO_SBATCH + "\n"
    assert list((tmp_path / "cwd").iterdir()) == []  # no run directory left behind


def test_nccl_test_with_slurm_conf_pointing_nowhere(tmp_path: Path) -> None:
    """Slurm would retry a missing SLURM_CONF for 60 s (src/common/parse_config.c); this says so at once."""
    bindir = tmp_path / "slurm-bin"
    bindir.mkdir()
    for tool in SLURM:  # stand-ins that must never run: the check comes first
        (bindir / tool).write_text("#!/bin/sh\necho ran >&2\nexit 99\n")
        (bindir / tool).chmod(0o755)
    env = fresh_env(tmp_path, SLURM_CONF=str(tmp_path / "nowhere" / "slurm.conf"))
    env["PATH"] = f"{env['PATH']}:{bindir}"
    proc = cli(tmp_path, env, "nccl-test", "--profile", "tcp")
    assert proc.returncode == 2
    assert proc.stderr == (f"SLURM_CONF={tmp_path}/nowhere/slurm.conf: no such file (Slurm's commands would retry "
                           "it for 60 s, then fail): point SLURM_CONF at the cluster's slurm.conf, or unset it to use "
                           "/etc/slurm/slurm.conf or the configless setup\n")
    proc = cli(tmp_path, env, "nccl-test", "--profile", "tcp", "--nodelist", "gpu[1-3]", "--render-only",
               str(tmp_path / "r"))
    assert proc.returncode == 0 and "ran" not in proc.stderr
    assert proc.stderr.startswith("warning: --nodelist 'gpu[1-3]' not counted: SLURM_CONF=")
    assert (tmp_path / "r" / "nccl-test.sbatch").exists()


@unconfigured_slurm
def test_nccl_test_with_slurm_installed_but_not_configured(tmp_path: Path) -> None:
    """Real sbatch without any slurm.conf: its fatal error, then what to do about it; exit 1 (Slurm failed)."""
    proc = cli(tmp_path, fresh_env(tmp_path, slurm=True), "nccl-test", "--profile", "tcp", "--outdir",
               str(tmp_path / "out"), "--no-chart")
    assert proc.returncode == 1
    assert "sbatch: fatal: Could not establish a configuration source" in proc.stderr
    assert proc.stderr.endswith("\n" + UNCONFIGURED_HINT + "\n")
    proc = cli(tmp_path, fresh_env(tmp_path, slurm=True), "nccl-test", "--profile", "tcp", "--nodelist", "gpu[1-4]",
               "--bisect", "--outdir", str(tmp_path / "out2"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("--nodelist 'gpu[1-4]': scontrol show hostnames failed (exit 1)")
    assert proc.stderr.endswith("\n" + UNCONFIGURED_HINT + "\n")
