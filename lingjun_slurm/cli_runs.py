"""Commands that talk to a cluster: submit, status, logs, cancel, resubmit, list.

Arguments in, library calls, output out; the work lives in submit.py, status.py,
runs/ and executors/. RUN is a run id, a unique prefix of one, or a run directory.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import click

from .errors import LingjunError, UsageError

EXECUTORS = ("auto", "slurm", "local")
ACTIVE_HINT = "lingjun-slurm status {run}    lingjun-slurm logs {run} [STAGE] --follow    lingjun-slurm cancel {run}"


def _open(ref: str):  # type: ignore[no-untyped-def]
    """RUN -> (index entry, transport, manifest)."""
    from .runs.index import RunIndex
    from .runs.manifest import load_manifest
    from .transport import open_transport

    entry = RunIndex().resolve(ref)
    t = open_transport(entry.transport, entry.host)
    return entry, t, load_manifest(t, entry.run_dir)


def _pick_executor(choice: str) -> str:
    from .transport import LocalTransport

    if choice != "auto":
        return choice
    return "slurm" if LocalTransport().which("sbatch") else "local"


@click.command()
@click.argument("spec_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--executor", type=click.Choice(EXECUTORS), default="auto", show_default=True,
              help="slurm: sbatch; local: run the chain on this machine; auto: slurm when sbatch is found.")
@click.option("--run-id", help="Run id (default: <run.name>-<date>-<time>-<random>).")
@click.option("--dry-run", is_flag=True, help="Print what would be submitted; write and submit nothing.")
@click.option("--detach", is_flag=True, help="Local executor: run in the background (status/logs/cancel follow it).")
def submit(spec_file: Path, executor: str, run_id: Optional[str], dry_run: bool, detach: bool) -> None:
    """Validate, render and submit the whole chain (all-or-nothing); print the run id."""
    from .runs.index import RunIndex
    from .spec import load_spec
    from .cli import check_run_id
    from .submit import dry_run_lines, new_run_id, prepare, prepare_local, submit_slurm
    from .transport import LocalTransport
    check_run_id(run_id)
    loaded = load_spec(spec_file)
    chosen = _pick_executor(executor)
    if detach and chosen != "local":
        raise UsageError("--detach is for the local executor (Slurm jobs already run in the background)")
    prep = prepare(loaded, run_id=run_id or new_run_id(loaded.spec.run.name), executor=chosen)
    if dry_run:
        click.echo("\n".join(dry_run_lines(prep)))
        return
    t = LocalTransport()
    index = RunIndex()
    if t.exists(f"{prep.run_dir}/manifest.json"):
        raise UsageError(f"run {prep.plan.run_id} already exists in {prep.run_dir}; use `lingjun-slurm resubmit`")
    if chosen == "slurm":
        manifest = submit_slurm(t, prep, index, echo=click.echo)
        click.echo(f"submitted run {manifest.run_id} to Slurm cluster {manifest.cluster.name or '?'} "
                   f"({len(manifest.stages)} stages, run directory {manifest.run_dir}):")
        for rec in manifest.stages:
            deps = ", ".join(f"{d.type}:{d.stage}" for d in rec.depends_on) or "-"
            click.echo(f"  {rec.name:<16} job {','.join(rec.job_ids):<10} after {deps}")
        click.echo(ACTIVE_HINT.format(run=manifest.run_id))
        return
    manifest = prepare_local(t, prep, index)
    _run_local(manifest.run_dir, manifest.run_id, detach)


def _run_local(run_dir: str, run_id: str, detach: bool, keep: frozenset[str] = frozenset()) -> None:
    from .executors.local import LocalRunner, detach as start_detached

    if detach:
        if keep:
            raise UsageError("resubmit of a local run stays in the foreground")
        pid = start_detached(run_dir)
        click.echo(f"started run {run_id} with the local executor in the background (pid {pid}); "
                   f"run directory {run_dir}")
        click.echo(ACTIVE_HINT.format(run=run_id))
        return
    click.echo(f"running {run_id} with the local executor (Ctrl-C cancels); run directory {run_dir}")
    rc = LocalRunner(run_dir, echo=lambda line: click.echo(line), keep=keep).run()
    _print_status([run_id], as_json=False)
    if rc != 0:
        raise LocalRunFailed(f"run {run_id} did not complete; see `lingjun-slurm logs {run_id} STAGE`")


class LocalRunFailed(LingjunError):
    pass


def _collect(refs: list[str]):  # type: ignore[no-untyped-def]
    """Status of the named runs (default: the 10 newest), one batch of Slurm calls per transport."""
    from .errors import TransportError
    from .runs.index import RunIndex
    from .runs.manifest import load_manifest
    from .status import StatusCollector
    from .transport import open_transport

    index = RunIndex()
    entries = [index.resolve(r) for r in refs] if refs else index.recent(10)
    groups: dict[tuple[str, str], list] = {}
    for e in entries:
        # Every local-transport run shares this machine's Slurm client: one batch for all of them.
        groups.setdefault((e.transport, "" if e.transport == "local" else e.host), []).append(e)
    runs = []
    order = {e.run_id: i for i, e in enumerate(entries)}
    for (kind, host), group in groups.items():
        t = open_transport(kind, host)
        manifests = []
        for e in group:
            try:
                manifests.append(load_manifest(t, e.run_dir))
            except TransportError as exc:
                if refs:
                    raise
                click.echo(f"warning: skipping run {e.run_id}: {exc} (`lingjun-slurm forget {e.run_id}` drops it)",
                           err=True)
        runs += StatusCollector(t).collect(manifests)
    return sorted(runs, key=lambda r: order.get(r.run_id, 0))


def _print_status(refs: list[str], as_json: bool) -> list:  # type: ignore[type-arg]
    from .status import document, format_table

    runs = _collect(refs)
    if as_json:
        click.echo(json.dumps(document(runs), indent=2))
    else:
        click.echo(format_table(runs), nl=False)
    return runs


@click.command()
@click.argument("runs", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print the versioned JSON document (schema 1).")
@click.option("--watch", is_flag=True, help="Refresh until every stage has ended (Ctrl-C stops watching).")
@click.option("--interval", type=click.FloatRange(min=1.0), default=5.0, show_default=True,
              help="Seconds between refreshes with --watch.")
def status(runs: tuple[str, ...], as_json: bool, watch: bool, interval: float) -> None:
    """Each stage's state, job id, elapsed time, nodes, exit code and reason (default: recent runs)."""
    from .status import ACTIVE

    while True:
        if watch and sys.stdout.isatty() and not as_json:
            click.echo("\x1b[H\x1b[2J", nl=False)
        shown = _print_status(list(runs), as_json)
        if not watch or not any(s.state in ACTIVE for r in shown for s in r.stages):
            return
        time.sleep(interval)


@click.command()
@click.argument("run")
@click.argument("stage", required=False)
@click.option("--follow", "-f", is_flag=True, help="Keep printing as the log grows, until the job ends.")
@click.option("--task", type=int, help="Array task index (the preprocess shards).")
def logs(run: str, stage: Optional[str], follow: bool, task: Optional[int]) -> None:
    """Print a stage's Slurm log (default: the running, failed or last started stage)."""
    from .runs.logs import stage_logs

    _entry, t, m = _open(run)
    rec = m.stage(stage) if stage and stage in m.stage_names() else None
    if stage and rec is None:
        raise UsageError(f"run {m.run_id} has no stage {stage!r}; stages: {', '.join(m.stage_names())}")
    if rec is None:
        rec = _interesting_stage(t, m)
    files = stage_logs(t, m, rec, task)
    if follow:
        if len(files) != 1:
            raise UsageError(f"stage {rec.name} is an array of {len(files)} tasks: pick one with --task N")
        _follow(t, m, rec.name, files[0].path)
        return
    shown = 0
    for f in files:
        try:
            data = t.read_bytes(f.path)
        except FileNotFoundError:
            continue
        if len(files) > 1:
            click.echo(f"==> {f.path} <==")
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        shown += 1
    if not shown:
        click.echo(f"no log yet for stage {rec.name} of run {m.run_id} (expected {files[0].path if files else '?'})",
                   err=True)


def _interesting_stage(t, m):  # type: ignore[no-untyped-def]
    from .status import FAILED, StatusCollector

    run = StatusCollector(t).collect([m])[0]
    for want in (("RUNNING",), FAILED):
        for s in run.stages:
            if s.state in want and not (s.reason or "").startswith("DependencyNeverSatisfied"):
                return m.stage(s.name)
    started = [s for s in run.stages if s.elapsed_s is not None]
    return m.stage(started[-1].name if started else run.stages[0].name)


def _follow(t, m, stage: str, path: str) -> None:  # type: ignore[no-untyped-def]
    from .status import ACTIVE, StatusCollector

    collector = StatusCollector(t)

    def done() -> bool:
        run = collector.collect([m])[0]
        return next(s for s in run.stages if s.name == stage).state not in ACTIVE

    try:
        for chunk in t.follow(path, poll_s=1.0, done=done):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass


@click.command()
@click.argument("run")
@click.argument("stage", required=False)
def cancel(run: str, stage: Optional[str]) -> None:
    """Cancel a run's jobs (from STAGE on, if given) in one scancel; local runs by their process ids."""
    from .executors.local import cancel_local
    from .runs.manifest import locked_manifest
    from .slurm.client import SlurmCLI
    from .submit import stages_from

    _entry, t, m = _open(run)
    names = stages_from(m, stage) if stage else m.stage_names()
    if m.executor == "local":
        if stage:
            raise UsageError("a local run is cancelled whole: `lingjun-slurm cancel RUN` without a stage")
        stopped = cancel_local(m.run_dir)
        click.echo(f"cancelled local run {m.run_id}: " + (", ".join(stopped) if stopped else "nothing was running"))
    else:
        # Only jobs that squeue shows under this run's job names: a reused job id is never hit.
        from .status import ACTIVE, StatusCollector

        live = {s.name: s for s in StatusCollector(t).collect([m])[0].stages}
        ids = [j for n in names if live[n].state in ACTIVE for j in m.stage(n).job_ids]
        SlurmCLI(t).cancel(ids)
        ended = [n for n in names if live[n].state not in ACTIVE]
        click.echo(f"cancelled run {m.run_id}: jobs {', '.join(ids) or '-'}"
                   + (f"; already ended: {', '.join(ended)}" if ended else ""))
    with locked_manifest(t, m.run_dir) as rec:
        rec.event("cancel", stages=names)


@click.command()
@click.argument("run")
@click.option("--from", "from_stage", required=True, help="First stage to resubmit; later stages follow.")
def resubmit(run: str, from_stage: str) -> None:
    """Re-render and resubmit STAGE and every stage after it, under the same run id."""
    from .executors.local import cancel_local
    from .status import StatusCollector
    from .submit import resubmit_local, resubmit_slurm, stages_from

    _entry, t, m = _open(run)
    names = stages_from(m, from_stage)
    current = {s.name: s.state for s in StatusCollector(t).collect([m])[0].stages}
    if m.executor == "local":
        cancel_local(m.run_dir)
        resubmit_local(t, m.run_dir, from_stage, current.get)
        keep = frozenset(n for n in m.stage_names() if n not in names)
        _run_local(m.run_dir, m.run_id, detach=False, keep=keep)
        return
    new = resubmit_slurm(t, m.run_dir, from_stage, current.get, echo=click.echo)
    click.echo(f"resubmitted run {new.run_id} from stage {from_stage}:")
    for n in names:
        rec = new.stage(n)
        old = rec.previous[-1].job_ids if rec.previous else []
        click.echo(f"  {n:<16} job {','.join(rec.job_ids):<10} (was {','.join(old) or '-'})")


@click.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.option("-n", "--limit", type=int, default=20, show_default=True, help="Newest N runs (0: all).")
def list_runs(as_json: bool, limit: int) -> None:
    """Runs in the index (~/.local/state/lingjun-slurm/runs.json), newest last."""
    from dataclasses import asdict

    from .runs.index import RunIndex

    entries = RunIndex().entries()
    entries = entries[-limit:] if limit > 0 else entries
    if as_json:
        click.echo(json.dumps({"schema": 1, "runs": [asdict(e) for e in entries]}, indent=2))
        return
    if not entries:
        click.echo("no runs yet (lingjun-slurm submit SPEC)")
        return
    click.echo(f"{'RUN ID':<44} {'CREATED':<19} {'EXECUTOR':<8} {'HOST':<16} RUN DIR")
    for e in entries:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.created_at))
        click.echo(f"{e.run_id:<44} {created:<19} {e.executor:<8} {e.host:<16} {e.run_dir}")


@click.command()
@click.argument("runs", nargs=-1, required=True)
def forget(runs: tuple[str, ...]) -> None:
    """Drop runs from the index (their run directories and jobs are left alone)."""
    from .runs.index import RunIndex

    index = RunIndex()
    ids = [index.resolve(r).run_id for r in runs]
    index.remove(ids)
    click.echo(f"forgot {len(ids)} run(s): {', '.join(ids)}")


COMMANDS = (submit, status, logs, cancel, resubmit, list_runs, forget)
