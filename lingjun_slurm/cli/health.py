"""`lingjun-slurm health`: run the node health checks on this node (docs/health-checks.md).

The checks are the packaged bash program lingjun-health (the one Slurm runs as
HealthCheckProgram); this command runs it with the same options and passes its output and
exit status through (0 healthy, 1 a check failed, 2 bad usage or configuration). Registered
in cli/main.py with `cli.add_command(health)`. Imports nothing heavy.

On a node that has no configuration of its own (cluster-init never ran there: no health.conf,
no drop-ins, no --config), what the program reports is followed on stderr by `hint:` lines that
say what to install or configure (fresh_install_hints); a configured node's output is passed
through unchanged.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

import click

from ..common.errors import LingjunError


def health_argv(config: Optional[Path], sku: Optional[str], no_drain: bool, as_json: bool, node: Optional[str],
                root: Optional[Path], boot: bool, level: int = 1) -> list[str]:
    """The program's arguments for these options (--level only when it is not the default 1)."""
    argv: list[str] = []
    for flag, value in (("--config", config), ("--sku", sku), ("--node", node), ("--root", root)):
        if value is not None:
            argv += [flag, str(value)]
    argv += [flag for flag, on in (("--no-drain", no_drain), ("--json", as_json), ("--boot", boot)) if on]
    if level != 1:
        argv += ["--level", str(level)]
    return argv


HINT_NO_CONFIG = ("hint: this node has not been set up for health checks: the cluster-init project writes {path} "
                  "on every node it sets up (docs/cluster-init.md); to check it without one, name its thresholds: "
                  "lingjun-slurm health --sku NAME --no-drain (NAME: {names}; docs/health-checks.md)")
HINT_NO_SMI = ("hint: nvidia-smi not found: this is not a GPU node, or the NVIDIA driver is not installed: run health "
               "on a GPU node, with --sku cpu on a node without GPUs, or with --root DIR on a recorded tree "
               "(docs/health-checks.md)")
HINT_NO_SLURM = ("hint: Slurm could not be asked about node {node} ({why}), so nothing was drained or resumed: "
                 "run health on a node of the cluster (where slurmd runs), or add --no-drain to only check")
_STATE_RE = re.compile(r"cannot read the state of node (\S+) \((.*)\)(?:; not drained)?$")


def fresh_install_hints(stdout: str, stderr: str, names: Sequence[str], config_path: str) -> list[str]:
    """The hint lines for an unconfigured node, from what lingjun-health printed: its "no config at"
    (exit 2), its nvidia-smi check ("nvidia-smi not found", check_gpus), and its Slurm step ("cannot read
    the state of node N (WHY)", the drain/resume section). The program's own lines stay as they are."""
    hints = []
    if "lingjun-health: no config at " in stderr:
        hints.append(HINT_NO_CONFIG.format(path=config_path, names=", ".join(names)))
    if "nvidia-smi not found" in stdout:
        hints.append(HINT_NO_SMI)
    for line in stderr.splitlines():
        match = _STATE_RE.search(line)
        if match:
            why = match.group(2)
            if why == "not found":
                why = "scontrol not found: Slurm's client commands are not installed"
            elif "configuration source" in why or "configuration file" in why:
                why = f"Slurm is installed but not configured here: {why}"
            hints.append(HINT_NO_SLURM.format(node=match.group(1), why=why))
            break
    return hints


@click.command("health")
@click.option("--config", type=click.Path(dir_okay=False, path_type=Path),
              help="KEY=VALUE configuration (default /etc/lingjun-slurm/health.conf).")
@click.option("--sku", help="Instance type or thresholds name (overrides SKU= in the configuration).")
@click.option("--no-drain", is_flag=True, help="Only check: never drain or resume the node.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document instead of one line per check.")
@click.option("--node", help="Slurm node name (default $SLURMD_NODENAME, else the short host name).")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path),
              help="Prefix for every node path read or written (fixture trees in tests).")
@click.option("--boot", is_flag=True, help="Boot mode: if Slurm cannot be reached, record the failure for later.")
@click.option("--level", type=click.Choice(["1", "2"]), default="1", show_default=True,
              help="1: the periodic checks (HealthCheckProgram, 60 s). 2: the deep checks for an idle node "
                   "(GPU clock throttling, nvbandwidth, all_reduce_perf, ib_write_bw GPUDirect, dcgmi diag -r 2).")
def health(config: Optional[Path], sku: Optional[str], no_drain: bool, as_json: bool, node: Optional[str],
           root: Optional[Path], boot: bool, level: str) -> None:
    """Check this node: GPUs (count, ECC, row remapping, XIDs, Fabric Manager, NVLink, peermem),
    the InfiniBand/RoCE ports NCCL would use, the RoCE v2 GID, the NCCL socket interface, enroot
    and a GPU container; drain it on failure, resume it when it drained it itself.

    --level 2 runs the deep checks instead (minutes; for an idle node: a prolog, a maintenance
    reservation, an admin); it drains with the reason prefix lingjun-health-l2:.

    One line per check (OK|FAIL|SKIP CHECK DETAIL). Exit 0 healthy, 1 a check failed,
    2 bad usage or configuration.

    A node that the cluster-init project (docs/cluster-init.md) has not set up has no
    /etc/lingjun-slurm/health.conf: pass --sku NAME (its thresholds) and --no-drain to check
    it anyway; the output then ends with hint: lines saying what is missing.
    """
    from ..nodes import health as pkg

    bash = shutil.which("bash")
    if bash is None:
        raise LingjunError("bash not found: the node health checks (lingjun-health) are a bash program: "
                           "install bash (e.g. apt-get install bash)")
    argv = health_argv(config, sku, no_drain, as_json, node, root, boot, int(level))
    with pkg.installed_dir() as folder:
        proc = subprocess.run([bash, str(folder / pkg.PROGRAM), *argv], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)
    click.echo(proc.stdout, nl=False)
    click.echo(proc.stderr, nl=False, err=True)
    root_dir = root if root is not None else (os.environ.get("LINGJUN_HEALTH_ROOT") or None)
    if proc.returncode and not pkg.is_configured(config, root_dir):
        for hint in fresh_install_hints(proc.stdout, proc.stderr, pkg.sku_names(),
                                        str(pkg.default_config(root_dir))):
            click.echo(hint, err=True)
    if proc.returncode:  # SystemExit, not ctx.exit: main._run runs click in non-standalone mode
        sys.exit(proc.returncode)
