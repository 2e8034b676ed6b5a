"""`lingjun-slurm health`: run the node health checks on this node (docs/health-checks.md).

The checks are the packaged bash program lingjun-health (the one Slurm runs as
HealthCheckProgram); this command runs it with the same options and passes its output and
exit status through (0 healthy, 1 a check failed, 2 bad usage or configuration). Registered
in cli.py with `cli.add_command(health)`. Imports nothing heavy.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import click

from .errors import LingjunError


def health_argv(config: Optional[Path], sku: Optional[str], no_drain: bool, as_json: bool, node: Optional[str],
                root: Optional[Path], boot: bool) -> list[str]:
    """The program's arguments for these options."""
    argv: list[str] = []
    for flag, value in (("--config", config), ("--sku", sku), ("--node", node), ("--root", root)):
        if value is not None:
            argv += [flag, str(value)]
    argv += [flag for flag, on in (("--no-drain", no_drain), ("--json", as_json), ("--boot", boot)) if on]
    return argv


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
def health(config: Optional[Path], sku: Optional[str], no_drain: bool, as_json: bool, node: Optional[str],
           root: Optional[Path], boot: bool) -> None:
    """Check this node: GPUs (count, ECC, row remapping, XIDs, Fabric Manager, NVLink, peermem),
    the InfiniBand/RoCE ports NCCL would use, the RoCE v2 GID, the NCCL socket interface, enroot
    and a GPU container; drain it on failure, resume it when it drained it itself.

    One line per check (OK|FAIL|SKIP CHECK DETAIL). Exit 0 healthy, 1 a check failed,
    2 bad usage or configuration.
    """
    from . import health as pkg

    bash = shutil.which("bash")
    if bash is None:
        raise LingjunError("bash is not installed; lingjun-health needs it")
    argv = health_argv(config, sku, no_drain, as_json, node, root, boot)
    with pkg.installed_dir() as folder:
        proc = subprocess.run([bash, str(folder / pkg.PROGRAM), *argv], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)
    click.echo(proc.stdout, nl=False)
    click.echo(proc.stderr, nl=False, err=True)
    if proc.returncode:  # SystemExit, not ctx.exit: cli._run runs click in non-standalone mode
        sys.exit(proc.returncode)
