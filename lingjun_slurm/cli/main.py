"""The command line: parse arguments, call the library, print. No logic lives here.

Exit codes: 0 success, 1 a failure at run time (a job, Slurm, a dropped connection), 2
invalid input or usage, 3 host unreachable, 4 SSH authentication failed, 5 SSH host key
unknown, changed or revoked (errors.py; every LingjunError carries its exit_code). Heavy
modules are imported inside the commands, and the commands of cli/'s other modules only when
named (LAZY_COMMANDS), so `validate`, `render` and `status` load only what they use
(tests/unit/test_startup_imports.py; bench/cli_startup.py times them). No command here ever
imports torch or megatron.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional

import click

from .. import __version__
from ..common.errors import EXIT_FAILURE, LingjunError, UsageError

if TYPE_CHECKING:
    from ..spec.models import Spec


def _fail(exc: LingjunError) -> NoReturn:
    click.echo(str(exc), err=True)
    sys.exit(exc.exit_code)


# Subcommands that live in other modules, imported only when the command line names them (or
# when --help lists them): `validate`, `render` and `status` then load none of the others'
# modules (issue 15: devcluster, nccl-test, checkpoint, health, image cost ~60 ms at start-up).
# NAME -> "module:attribute"; tests/unit/test_startup_imports.py checks it against the modules.
LAZY_COMMANDS = {
    "submit": "runs:submit",
    "status": "runs:status",
    "logs": "runs:logs",
    "cancel": "runs:cancel",
    "resubmit": "runs:resubmit",
    "list": "runs:list_runs",
    "forget": "runs:forget",
    "checkpoint": "checkpoint:checkpoint",
    "dev-cluster": "devcluster:dev_cluster",
    "doctor": "doctor:doctor",
    "health": "health:health",
    "image": "image:image",
    "nccl-test": "nccltest:nccl_test",
    "plan": "plan:plan",
    "report": "report:report",
}


def _lazy_command(name: str) -> click.Command:
    import importlib

    module, _, attr = LAZY_COMMANDS[name].partition(":")
    command = getattr(importlib.import_module(f".{module}", __package__), attr)
    if command.name != name:  # a renamed command must be renamed here too
        raise RuntimeError(f"LAZY_COMMANDS[{name!r}] is {LAZY_COMMANDS[name]}, whose name is {command.name!r}")
    return command


class _LazyGroup(click.Group):
    """click.Group whose LAZY_COMMANDS are imported on first use (click's documented pattern:
    override list_commands/get_command, https://click.palletsprojects.com/en/stable/complex/)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            self.add_command(_lazy_command(cmd_name))
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[Optional[str], Optional[click.Command],
                                                                            list[str]]:
        # An unknown name: click's "Did you mean ...?" picks from self.commands (click 8.5
        # core.py Group.resolve_command, `NoSuchCommand(cmd_name, possibilities=self.commands)`),
        # so load them all first, as the eager group had them.
        if args and args[0] not in self.commands and args[0] not in LAZY_COMMANDS:
            for name in LAZY_COMMANDS:
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog="Exit codes: 0 success, 1 a run-time failure (Slurm, a job, a dropped connection), 2 invalid "
                    "input or usage, 3 host unreachable, 4 SSH authentication failed, 5 SSH host key unknown, "
                    "changed or revoked, 130 interrupted by Ctrl-C.")
@click.version_option(__version__, prog_name="lingjun-slurm")
def cli() -> None:
    """Megatron GPT training chains on Slurm + pyxis clusters with RDMA networks.

    One YAML spec describes a run: data preprocessing, multi-node training and checkpoint
    handling. `validate` checks it, `render` writes the sbatch scripts, `nccl-env` prints
    a network profile, `doctor` runs the train job's pre-flight checks as a job of their own.
    submit, status, logs, cancel, resubmit, doctor and nccl-test also work on a remote
    cluster over SSH: --host [USER@]HOST[:PORT] or --cluster NAME (docs/remote.md).
    """


@cli.command()
@click.argument("spec_file", type=click.Path(dir_okay=False, path_type=Path))
def validate(spec_file: Path) -> None:
    """Check a spec; print every problem with file, line and field (exit 2 if any). SPEC_FILE `-`
    reads standard input; a pipe such as <(envsubst < spec.yaml) works too (at most 1 MiB)."""
    from ..plan import build_plan
    from ..spec import load_spec

    from ..common.errors import Issue, SpecError
    from ..spec.checks import check_local_paths

    loaded = load_spec(spec_file)
    # The files the stages read, looked up here: a warning, since validate cannot know where the
    # chain will run (a spec for --host is validated on a laptop); `submit --executor local`, which
    # does know, refuses a missing one (runs._check_local_paths; docs/status-reasons.md).
    errors, warns = check_local_paths(loaded.spec, runs_here=False)
    if errors:
        raise SpecError(loaded.source, [Issue(i.loc, i.message, loaded.doc.line_of(i.loc)) for i in errors])
    plan = build_plan(loaded.spec, spec_sha256=loaded.sha256, source=loaded.source)
    names = " -> ".join(st.name for st in plan.stages)
    click.echo(f"{loaded.source}: valid; stages: {names}")
    for w in warns:
        click.echo(f"warning: {Issue(w.loc, w.message, loaded.doc.line_of(w.loc)).format(loaded.source)}", err=True)
    if loaded.spec.planning.gpu or any(st.network is not None for st in plan.stages):
        from .plan import fit_warning

        warned = fit_warning(loaded.spec, plan, loaded.source)
        if warned:
            click.echo(f"warning: {warned[0]}", err=True)


def check_run_id(run_id: Optional[str]) -> None:
    """--run-id becomes job names and a directory name: NAME_RE only (no quoting is possible there)."""
    from ..spec.models import NAME_RE

    if run_id is not None and not re.fullmatch(NAME_RE, run_id):
        raise UsageError(f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-' only (at most 63)")


def _reproduce(spec_file: Path, outdir: Optional[Path], run_id: Optional[str], executor: str = "slurm",
               cluster: Optional[str] = None) -> str:
    argv = ["lingjun-slurm", "render", str(spec_file)]
    if outdir is not None:
        argv += ["-o", str(outdir)]
    if run_id:
        argv += ["--run-id", run_id]
    if executor != "slurm":
        argv += ["--executor", executor]
    if cluster:
        argv += ["--cluster", cluster]
    return shlex.join(argv)


@cli.command()
@click.argument("spec_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the scripts, plan.json and submit.sh (on shared storage if jobs read it).")
@click.option("--stage", "stage_name", help="Print one stage's script to stdout instead of writing files.")
@click.option("--run-id", help="Run id for job names (<run-id>-<stage>); default: run.name.")
@click.option("--executor", type=click.Choice(["slurm", "local"]), default="slurm", show_default=True,
              help="local: scripts for the local executor (no container, a local launcher instead of srun).")
@click.option("--cluster", metavar="NAME", help="Fill what the spec leaves unset (workdir, partition, account, "
                                                "network profile) from clusters.yaml; connects to nothing.")
def render(spec_file: Path, outdir: Optional[Path], stage_name: Optional[str], run_id: Optional[str],
           executor: str, cluster: Optional[str]) -> None:
    """Write every stage's sbatch script, plan.json and submit.sh for people who run sbatch."""
    from ..clusters import cluster_defaults, get_cluster, load_spec_with_defaults
    from ..plan import build_plan
    from ..render import render_plan, render_stage, write_files
    check_run_id(run_id)
    if outdir is None and stage_name is None:
        raise UsageError("give -o DIR to write the scripts, or --stage NAME to print one")
    loaded, _applied = load_spec_with_defaults(spec_file, cluster_defaults(get_cluster(cluster) if cluster else None))
    plan = build_plan(loaded.spec, run_id=run_id, spec_sha256=loaded.sha256, source=loaded.source,
                      reproduce=_reproduce(spec_file, outdir, run_id, executor, cluster), executor=executor)
    if stage_name is not None:
        try:
            stage = plan.stage(stage_name)
        except KeyError:
            raise UsageError(f"no stage {stage_name!r} in this run; stages: "
                             f"{', '.join(st.name for st in plan.stages)}") from None
        click.echo(render_stage(plan, stage), nl=False)
        return
    assert outdir is not None
    write_files(render_plan(plan), outdir)
    unreachable = plan_unreachable_in_container(loaded.spec, outdir)
    if unreachable:
        click.echo(f"warning: {unreachable}", err=True)
    click.echo(f"rendered run {plan.run_id} into {outdir}/ ({len(plan.stages)} stages):")
    for st in plan.stages:
        res = st.resources
        deps = ", ".join(f"{d.type}:{d.stage}" for d in st.depends_on) or "-"
        shape = f"{res.nodes}x{res.tasks_per_node} tasks" + (f", {res.gpus_per_node} GPU/node" if res.gpus_per_node else "")
        array = f", array {st.array}" if st.array else ""
        click.echo(f"  {st.script:<24} {st.job_name:<36} after {deps:<24} {shape}{array}")
    click.echo(f"submit with: bash {shlex.quote(str(outdir / 'submit.sh'))}")


def plan_unreachable_in_container(spec: "Spec", outdir: Path) -> Optional[str]:
    """Built-in stages in a container read plan.json from the render directory: is it mounted?"""
    from ..container import mounts_with_workdir

    if spec.container.runtime != "pyxis":
        return None
    where = str(outdir.resolve())
    for mount in mounts_with_workdir(spec.container, spec.run.workdir):
        same_path = mount.src == mount.dst
        if same_path and (where == mount.dst or where.startswith(mount.dst.rstrip("/") + "/")):
            return None
    return (f"{where} is not inside run.workdir or a container mount, so built-in stages running in the "
            f"container cannot read {where}/plan.json; render into {spec.run.workdir} (shared storage) instead")


@cli.command()
def schema() -> None:
    """Print the spec's JSON Schema (for editor completion and validation)."""
    from ..spec.models import Spec

    click.echo(json.dumps(Spec.model_json_schema(), indent=2))


@cli.command("nccl-env")
@click.option("--profile", help="Profile name.")
@click.option("--instance-type", help="Instance type / VM size that selects a profile.")
@click.option("--format", "fmt", type=click.Choice(["sh", "env", "nccl.conf", "json"]), default="sh",
              show_default=True)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override or add a variable.")
@click.option("--unset", "unsets", multiple=True, metavar="KEY", help="Leave a profile variable out.")
@click.option("--list", "list_", is_flag=True, help="List the profiles and their instance types.")
def nccl_env(profile: Optional[str], instance_type: Optional[str], fmt: str, sets: tuple[str, ...],
             unsets: tuple[str, ...], list_: bool) -> None:
    """Print a network profile's NCCL variables (the block jobs and /etc/nccl.conf use)."""
    from .. import network

    if list_:
        for prof in network.profiles().values():
            types = ", ".join(prof.instance_types) or "-"
            click.echo(f"{prof.name:<18} {prof.description}\n{'':<18} instance types: {types}")
        return
    if bool(profile) == bool(instance_type):
        raise UsageError("give exactly one of --profile NAME or --instance-type TYPE (see --list)")
    prof = network.get_profile(profile) if profile else network.profile_for_instance(instance_type or "")
    from ..spec.models import ENV_NAME_RE

    overrides: dict[str, Optional[str]] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(ENV_NAME_RE, key):
            raise UsageError(f"--set {item!r}: expected KEY=VALUE with KEY an environment variable name")
        overrides[key] = value
    for key in unsets:
        if not re.fullmatch(ENV_NAME_RE, key):
            raise UsageError(f"--unset {key!r}: expected an environment variable name")
        overrides[key] = None
    click.echo(network.render(network.resolve(prof, overrides), fmt), nl=False)


def _run(fn: Callable[..., Any], args: Optional[list[str]], prog_name: str = "lingjun-slurm") -> None:
    """Run a click command or group: usage errors, LingjunError, Ctrl-C and anything unexpected end
    in one message and an exit code, never a traceback (the command groups that also run on their
    own, such as `python -m lingjun_slurm.cli.checkpoint`, come through here too)."""
    try:
        fn.main(args=args, prog_name=prog_name, standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort as exc:
        # click turns a KeyboardInterrupt into Abort (click/core.py, Command.main): Ctrl-C exits 130.
        if isinstance(exc.__cause__, KeyboardInterrupt):
            from ..common.interrupts import interrupted_exit
            interrupted_exit(exc.__cause__)
        click.echo("aborted", err=True)
        sys.exit(EXIT_FAILURE)
    except KeyboardInterrupt as exc:
        from ..common.interrupts import interrupted_exit
        interrupted_exit(exc)
    except LingjunError as exc:
        _fail(exc)
    except BrokenPipeError:
        sys.exit(EXIT_FAILURE)
    except Exception as exc:  # never a traceback for users, unless they ask for one
        if os.environ.get("LINGJUN_DEBUG"):
            raise
        click.echo(f"lingjun-slurm: internal error: {type(exc).__name__}: {exc} "
                   "(set LINGJUN_DEBUG=1 for a traceback)", err=True)
        sys.exit(EXIT_FAILURE)


_PYDANTIC_LOADER = "pydantic.plugin._loader"


def _no_pydantic_plugin_discovery() -> None:
    """Run this process's pydantic without plugins, as PYDANTIC_DISABLE_PLUGINS=__all__ would,
    unless the user set PYDANTIC_DISABLE_PLUGINS themselves (to anything: '' keeps every plugin),
    and without touching the environment, which jobs and child processes inherit.

    Why not the variable itself: pydantic's loader module imports importlib.metadata at its top
    (pydantic 2.14.4 plugin/_loader.py:6, `from importlib.metadata import entry_points`), which
    imports email, zipfile, csv and importlib.resources, and every first validator build imports
    that module (plugin/_schema_validator.py:37-38, `from ._loader import get_plugins`, inside
    create_schema_validator) before it reads the variable (_loader.py:29-34). That import is
    30-60 ms of `validate`, `render` and `status` (issue 15 item 9); with the variable set only
    the entry-point scan (~8 ms) goes. So the module is stood in for by one whose get_plugins
    returns no plugins, the answer _loader.py:33-34 gives when the variable says __all__. Any
    other name asked of it loads pydantic's real module (module __getattr__, PEP 562), so a
    pydantic that uses more of _loader works unchanged. The CLI only: a program importing
    lingjun_slurm as a library keeps pydantic's own loader.
    """
    if "PYDANTIC_DISABLE_PLUGINS" in os.environ or _PYDANTIC_LOADER in sys.modules:
        return
    import types

    stand_in = types.ModuleType(_PYDANTIC_LOADER, "lingjun-slurm's stand-in: no pydantic plugins (cli/main.py).")

    def get_plugins() -> tuple[()]:
        return ()

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):  # the import system's own probes (`from ._loader import x` asks for __path__)
            raise AttributeError(name)
        if sys.modules.get(_PYDANTIC_LOADER) is stand_in:
            del sys.modules[_PYDANTIC_LOADER]
        import importlib

        return getattr(importlib.import_module(_PYDANTIC_LOADER), name)

    stand_in.get_plugins = get_plugins  # type: ignore[attr-defined]
    stand_in.__getattr__ = __getattr__  # type: ignore[attr-defined]
    sys.modules[_PYDANTIC_LOADER] = stand_in


def main(args: Optional[list[str]] = None) -> None:
    _no_pydantic_plugin_discovery()
    _run(cli, args)


if __name__ == "__main__":
    main()
