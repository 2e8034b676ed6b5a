"""`lingjun-slurm dev-cluster up|down|status`: a real Slurm cluster on 127.0.0.1 (docs/dev-cluster.md).

Registered in cli/main.py with `cli.add_command(dev_cluster)`. Imports nothing heavy.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..devcluster import DEFAULT_ROOT, TASK_BINDINGS, DevCluster, DevClusterConfig, DevClusterError

_ROOT = click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_ROOT,
                     show_default=True, help="State directory (configs, logs, spool, PIDs).")


@click.group("dev-cluster")
def dev_cluster() -> None:
    """A real single-host Slurm cluster on 127.0.0.1 (needs root and Debian's slurm packages).

    node1..nodeN run as separate slurmd on one machine; partitions `cpu` (default) and `gpu`
    (fake GPU gres). Configured like a CycleCloud cluster (cgroups, CR_Core_Memory, PrologFlags=alloc;
    docs/dev-cluster.md). Point Slurm's commands at it with `source ROOT/env.sh`.
    """


@dev_cluster.command()
@click.option("--nodes", type=click.IntRange(2, 128), default=4, show_default=True, help="Number of slurmd nodes.")
@click.option("--cpus-per-node", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--gpus-per-node", type=click.IntRange(0, 16), default=2, show_default=True,
              help="Fake GPUs (gres gpu) per node.")
@click.option("--accounting/--no-accounting", default=False, show_default=True,
              help="Also run MariaDB + slurmdbd so sacct works (adds ~4 s).")
@click.option("--base-port", type=click.IntRange(1024, 65235), default=6817, show_default=True,
              help="slurmctld port; slurmdbd +2, MariaDB +3, slurmd +200..")
@click.option("--cgroups/--no-cgroups", default=True, show_default=True,
              help="proctrack/cgroup + task/cgroup confining cores, memory and GPUs, as in production "
                   "(needs cgroup v1 mounted read-write); --no-cgroups: proctrack/linuxproc, nothing confined.")
@click.option("--task-binding", type=click.Choice(TASK_BINDINGS), default=None,
              help="TaskPluginParam=autobind=VALUE, as on sites that pin tasks (default: Slurm's auto binding).")
@click.option("--fast-timers", is_flag=True,
              help="KillWait=5, cred_expire=5 (requeue), sched_interval=2 instead of Slurm's 30, 120, 60.")
@click.option("--max-array-size", type=click.IntRange(0, 4000001), default=4001, show_default=True,
              help="MaxArraySize in slurm.conf: array indices 0..N-1 (Slurm's default 1001 is too small "
                   "for a 1,024-task array).")
@click.option("--feature", "features", multiple=True, metavar="NODE=F1,F2",
              help="Node features (slurm.conf Features=), for --constraint; repeatable, e.g. --feature node3=ib.")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds to wait for start-up.")
@_ROOT
def up(nodes: int, cpus_per_node: int, gpus_per_node: int, accounting: bool, base_port: int, cgroups: bool,
       task_binding: str | None, fast_timers: bool, max_array_size: int, features: tuple[str, ...], timeout: float,
       root: Path) -> None:
    """Start the cluster from an empty state directory (a no-op if it is already up)."""
    node_features: dict[str, tuple[str, ...]] = {}
    for item in features:
        node, sep, names = item.partition("=")
        if not sep or not node or not names:
            raise click.BadParameter(f"{item!r}: expected NODE=FEATURE[,FEATURE...]", param_hint="--feature")
        node_features[node] = node_features.get(node, ()) + tuple(names.split(","))
    try:  # the shape is the user's input: a bad one is a usage error (exit 2), not a failure
        config = DevClusterConfig(root=root, nodes=nodes, cpus_per_node=cpus_per_node, gpus_per_node=gpus_per_node,
                                  accounting=accounting, base_port=base_port, cgroups=cgroups,
                                  task_binding=task_binding, fast_timers=fast_timers, max_array_size=max_array_size,
                                  node_features=node_features)
    except DevClusterError as exc:
        raise click.UsageError(str(exc)) from None
    cluster = DevCluster(config)
    cluster.up(timeout=timeout)
    click.echo(f"dev cluster up: {nodes} nodes, partitions cpu (default) and gpu "
               f"(gpu:{gpus_per_node} per node), accounting {'on' if accounting else 'off'}, "
               f"cgroups {'on' if cgroups else 'off'}, task binding {task_binding or 'auto'}, "
               f"job ids from {cluster.config.first_job_id}")
    click.echo(f"logs: {cluster.log_dir}")
    click.echo("point Slurm's commands at it with:")
    click.echo(f"  source {cluster.env_file()}")
    click.echo(f"  # or: export SLURM_CONF={cluster.slurm_conf}")


@dev_cluster.command()
@_ROOT
def down(root: Path) -> None:
    """Cancel every job and stop the cluster's daemons (by PID); keeps the logs."""
    cluster = DevCluster.from_root(root)
    cluster.down()
    click.echo(f"dev cluster in {cluster.root} is down")


@dev_cluster.command()
@_ROOT
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(root: Path, as_json: bool) -> None:
    """Daemons (PID, alive, log) and nodes (state, partitions)."""
    info = DevCluster.from_root(root).status()
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(f"dev cluster in {info['root']}: {'up' if info['up'] else 'down'}"
                   f" (accounting {'on' if info['accounting'] else 'off'})")
        for name, d in info["daemons"].items():
            click.echo(f"  {name:<14} pid {d['pid']:<8} {'alive' if d['alive'] else 'dead'}  {d['log']}")
        for node in info["nodes"]:
            click.echo(f"  {node['name']:<8} {node['state']:<10} {','.join(node['partitions'])}")
        if info["up"]:
            click.echo(f"  export SLURM_CONF={info['slurm_conf']}")
