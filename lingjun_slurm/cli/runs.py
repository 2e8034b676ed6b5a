"""Commands that talk to a cluster: submit, status, logs, cancel, resubmit, list.

Arguments in, library calls, output out; the work lives in submit.py, status.py,
runs/ and executors/. RUN is a run id, a unique prefix of one, or a run directory.
Every command holds at most one connection per host (remote.Connections).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import click

from .remote import EXIT_CODES, Connections, destination, open_run, remote_options
from ..common.errors import LingjunError, UsageError

if TYPE_CHECKING:
    from ..destination import Destination
    from ..runs.index import IndexEntry
    from ..runs.manifest import Manifest, StageRecord
    from ..status import RunStatus
    from ..transport.base import Transport

EXECUTORS = ("auto", "slurm", "local")
ACTIVE_HINT = "lingjun-slurm status {run}    lingjun-slurm logs {run} [STAGE] --follow    lingjun-slurm cancel {run}"


def _pick_executor(choice: str, remote: bool) -> str:
    from ..transport import LocalTransport

    if remote:
        if choice == "local":
            raise UsageError("--executor local runs the chain on this machine; with --host/--cluster use "
                             "--executor slurm (or auto)")
        return "slurm"
    if choice != "auto":
        return choice
    return "slurm" if LocalTransport().which("sbatch") else "local"


def _check_fit(loaded: Any, plan: Any, spec_file: Path, refuse: bool) -> None:
    """A train stage that cannot fit its GPU: refused (exit 2) when every input of the estimate is
    known, else a warning; --force and --dry-run only warn (docs/planning.md)."""
    from .plan import PlanInputError, fit_warning

    warned = fit_warning(loaded.spec, plan, str(spec_file))
    if warned is None:
        return
    message, certain = warned
    if certain and refuse:
        raise PlanInputError(f"{message}; nothing submitted (--force submits anyway)")
    click.echo(f"warning: {message}", err=True)


@click.command(epilog=EXIT_CODES)
@click.argument("spec_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--executor", type=click.Choice(EXECUTORS), default="auto", show_default=True,
              help="slurm: sbatch; local: run the chain on this machine; auto: slurm when sbatch is found "
                   "(always slurm with --host/--cluster).")
@click.option("--run-id", help="Run id (default: <run.name>-<date>-<time>-<random>).")
@click.option("--dry-run", is_flag=True, help="Print what would be submitted; write and submit nothing.")
@click.option("--detach", is_flag=True, help="Local executor: run in the background (status/logs/cancel follow it).")
@click.option("--force", is_flag=True, help="Break a workdir lock whose holder cannot be checked from here (another "
                                            "host's submit, Slurm unreachable), never one whose holder is alive; "
                                            "submit a train stage that `plan` says does not fit its GPU; and run "
                                            "more tasks with the local executor than 4 per CPU of this machine.")
@remote_options
def submit(spec_file: Path, executor: str, run_id: Optional[str], dry_run: bool, detach: bool, force: bool,
           host: Optional[str], cluster: Optional[str], accept_new_host_key: bool) -> None:
    """Validate, render and submit the whole chain (all-or-nothing); print the run id.

    With --host or --cluster the scripts are rendered here, the run directory is written on
    the cluster over SFTP and sbatch runs there; the run record is kept on the cluster and
    copied to this machine (docs/remote.md). One run per workdir at a time: a second submit
    into a workdir whose run is still going is refused, naming that run (docs/submitting.md).
    """
    from .main import check_run_id
    from ..clusters import cluster_defaults, load_spec_with_defaults
    from ..runs.index import RunIndex
    from ..runs.manifest import DefaultsRecord
    from ..submit import dry_run_lines, new_run_id, prepare, prepare_local, submit_slurm, take_workdir
    from ..transport import LocalTransport
    check_run_id(run_id)
    dest = destination(host, cluster, accept_new_host_key)
    loaded, applied = load_spec_with_defaults(spec_file, cluster_defaults(dest.config))
    chosen = _pick_executor(executor, dest.remote)
    if detach and chosen != "local":
        raise UsageError("--detach is for the local executor (Slurm jobs already run in the background)")
    prep = prepare(loaded, run_id=run_id or new_run_id(loaded.spec.run.name), executor=chosen,
                   defaults=DefaultsRecord(cluster=dest.cluster, applied=applied))
    _check_fit(loaded, prep.plan, spec_file, refuse=not (dry_run or force))
    if chosen == "local":
        _check_local_tasks(loaded, prep.plan, refuse=not (dry_run or force))
        _check_local_paths(loaded, refuse=not (dry_run or force))
    if dry_run:
        click.echo("\n".join(dry_run_lines(prep)))
        if dest.remote:
            click.echo(f"  on {dest.target} over SSH" + (f" (cluster {dest.cluster})" if dest.cluster else ""))
        for path, value in applied.items():
            click.echo(f"  {path} = {value}   (from clusters.yaml, cluster {dest.cluster})")
        return
    index = RunIndex()
    with Connections(dest) as conns:
        t = conns.remote() if dest.remote else LocalTransport()
        if dest.remote and not t.which("sbatch"):
            raise SbatchMissing(f"sbatch is not on the PATH of a non-interactive SSH session on {t.host}; "
                                "put Slurm's bin directory on PATH in the shell's startup file read by "
                                "non-interactive sessions (e.g. ~/.bashrc), or submit from a host that has it")
        if t.exists(f"{prep.run_dir}/manifest.json"):
            raise UsageError(f"run {prep.plan.run_id} already exists in {prep.run_dir}; use `lingjun-slurm resubmit`")
        if chosen == "slurm":
            manifest = submit_slurm(t, prep, index, echo=click.echo, force=force)
            where = f" on {t.host}" if dest.remote else ""
            click.echo(f"submitted run {manifest.run_id} to Slurm cluster {manifest.cluster.name or '?'}{where} "
                       f"({len(manifest.stages)} stages, run directory {manifest.run_dir}):")
            for rec in manifest.stages:
                deps = ", ".join(f"{d.type}:{d.stage}" for d in rec.depends_on) or "-"
                click.echo(f"  {rec.name:<16} job {','.join(rec.job_ids):<10} after {deps}")
            for path, value in applied.items():
                click.echo(f"  {path} = {value}   (from clusters.yaml, cluster {dest.cluster})")
            click.echo(ACTIVE_HINT.format(run=manifest.run_id))
            return
    lock = take_workdir(t, prep, click.echo, force)
    try:
        manifest = prepare_local(t, prep, index)
        _run_local(manifest.run_dir, manifest.run_id, detach)
    finally:
        lock.release()  # a no-op once the runner has taken the lock over (and released it at its end)


def _check_local_paths(loaded: Any, refuse: bool) -> None:
    """The local executor runs the chain here: an input or tokenizer file missing here fails its
    stage later, so it is refused now, with file, line and field (exit 2; --force and --dry-run
    only warn). What an earlier command stage may write is a warning (spec/checks.py check_local_paths)."""
    from ..common.errors import Issue, SpecError
    from ..spec.checks import check_local_paths

    errors, warns = check_local_paths(loaded.spec, runs_here=True)
    issues = [Issue(i.loc, i.message, loaded.doc.line_of(i.loc)) for i in errors]
    if issues and refuse:
        raise SpecError(loaded.source, issues)
    for i in issues + [Issue(w.loc, w.message, loaded.doc.line_of(w.loc)) for w in warns]:
        click.echo(f"warning: {i.format(loaded.source)}", err=True)


class SbatchMissing(LingjunError):
    pass


def _task_field(loaded: Any, stage: str) -> str:
    """`FILE:LINE: FIELD` of the spec field that gives a stage its task count (the deepest one set)."""
    from ..common.errors import dotted

    doc, spec = loaded.doc, loaded.spec
    names = [c.name for c in spec.stages.commands]
    if stage in names:
        bases = [("stages", "commands", names.index(stage), "resources")]
    else:
        bases = [("cluster", "stages", stage)]
    bases.append(("cluster", "defaults"))
    for base in bases:
        for field in ("tasks_per_node", "nodes"):
            loc = base + (field,)
            if loc in doc.lines:
                return f"{loaded.source}:{doc.lines[loc]}: {dotted(loc)}"
    return f"{loaded.source}: {dotted(bases[0])}"


def _check_local_tasks(loaded: Any, plan: Any, refuse: bool) -> None:
    """The local executor runs every task of a job on this machine, one process each: a job of more
    than executors.local.max_tasks() (TASKS_PER_CPU per CPU) is refused, naming the spec field, unless
    --force (then, and with --dry-run, a warning)."""
    from ..executors.local import TASKS_PER_CPU, max_tasks

    limit = max_tasks()
    for st in plan.stages:
        tasks = st.resources.nodes * st.resources.tasks_per_node
        if tasks <= limit:
            continue
        message = (f"{_task_field(loaded, st.name)}: stage {st.name} runs {st.resources.nodes} x "
                   f"{st.resources.tasks_per_node} = {tasks} tasks, and the local executor runs every task on this "
                   f"machine as a process of its own: at most {limit} here ({TASKS_PER_CPU} per CPU, "
                   f"{os.cpu_count() or 1} CPUs)")
        if refuse:
            raise UsageError(f"{message}; lower it, or submit with --force to run them anyway")
        click.echo(f"warning: {message}", err=True)


def _run_local(run_dir: str, run_id: str, detach: bool, keep: frozenset[str] = frozenset()) -> None:
    from ..executors.local import LocalRunner, detach as start_detached

    if detach:
        if keep:
            raise UsageError("resubmit of a local run stays in the foreground")
        pid = start_detached(run_dir)
        click.echo(f"started run {run_id} with the local executor in the background (pid {pid}); "
                   f"run directory {run_dir}")
        click.echo(ACTIVE_HINT.format(run=run_id))
        return
    from contextlib import nullcontext
    from signal import SIGINT

    from . import ui
    from ..common.interrupts import Interrupted

    click.echo(f"running {run_id} with the local executor (Ctrl-C cancels); run directory {run_dir}")
    # On a terminal a live line under the state changes (ui.LocalProgress); elsewhere the lines only.
    view = ui.LocalProgress(run_id) if ui.use_rich() else None
    runner = LocalRunner(run_dir, echo=view.line if view else (lambda line: click.echo(line)), keep=keep)
    if view is not None:
        view.tasks = lambda: [(t.stage, t.state) for t in runner.state.tasks]
    with view if view is not None else nullcontext():
        rc = runner.run()
    if runner.vanished is not None:  # no run directory left to show a status from
        raise LocalRunFailed(f"run {run_id} FAILED: {runner.vanished}; its last status is kept in "
                             "this machine's copy of runs (`lingjun-slurm status`)")
    try:
        _print_status([run_id], as_json=False)
    except OSError:
        pass  # the terminal is gone (SIGHUP): the record says how the run ended
    if runner.stopped_by == SIGINT:
        raise Interrupted(f"run {run_id} cancelled (Ctrl-C); `lingjun-slurm resubmit {run_id} --from STAGE` "
                          "continues it")
    if rc != 0:
        raise LocalRunFailed(f"run {run_id} did not complete; see `lingjun-slurm logs {run_id} STAGE`")


class LocalRunFailed(LingjunError):
    pass


class Collected:
    """One status refresh: the runs, which reader served each host, and hosts that did not answer."""

    def __init__(self) -> None:
        self.runs: list["RunStatus"] = []
        self.backends: list[str] = []
        self.unreachable: list[LingjunError] = []
        self.slurm_down: list[LingjunError] = []  # hosts whose Slurm did not answer (runs shown, UNKNOWN)
        self.bad_records: list[LingjunError] = []  # named runs whose manifest cannot be read (shown, UNKNOWN)


def _collect(refs: list[str], conns: Connections) -> Collected:
    """Status of the named runs (default: the 10 newest), one batch of Slurm calls per host.

    A host that cannot be reached (exit 3) shows its runs from the local copy, marked stale.
    """
    from ..common.errors import HostUnreachable, SSHError, TransportError
    from ..runs import mirror
    from ..runs.index import RunIndex
    from ..runs.manifest import load_manifest
    from ..status import StatusCollector
    from .remote import resolve

    dest = conns.dest
    index = RunIndex()
    if refs:
        entries = [resolve(r, conns) for r in refs]
    elif dest.remote:
        entries = index.on(dest.target, dest.cluster)[-10:]
    else:
        entries = index.recent(10)
    groups: dict[tuple[str, str], list["IndexEntry"]] = {}
    for e in entries:
        # Every local-transport run shares this machine's Slurm client: one batch for all of them.
        groups.setdefault(conns.route(e), []).append(e)
    out = Collected()
    order = {e.run_id: i for i, e in enumerate(entries)}
    for (kind, host), group in groups.items():
        try:
            t = conns.get(kind, host)
            manifests = []
            unreadable = []
            for e in group:
                try:
                    manifests.append(load_manifest(t, e.run_dir))
                except SSHError:
                    raise  # the connection, not this run: unreachable is handled below, 4 and 5 end the command
                except (TransportError, UnicodeDecodeError) as exc:
                    if not e.remote and not os.path.isdir(e.run_dir):
                        kept = _kept_local(e, host)
                        if kept is not None:  # the local runner kept its last status here (workdir vanished)
                            unreadable.append(kept)
                            continue
                        if refs:
                            raise
                        click.echo(f"warning: skipping run {e.run_id}: its run directory {e.run_dir} is gone "
                                   "(deleted or moved); `lingjun-slurm forget --missing` drops every such run "
                                   "from the index", err=True)
                        continue
                    # One record that is not a record hurts its own run only: UNKNOWN, what and the fix.
                    why = str(exc) if isinstance(exc, TransportError) else f"{e.run_dir}/manifest.json: not UTF-8"
                    unreadable.append(_unreadable_run(e, host, why))
                    if refs:
                        out.bad_records.append(TransportError(unreadable[-1].record_error or why))
            collector = StatusCollector(t)
            runs = collector.collect(manifests) + unreadable
        except HostUnreachable as exc:
            out.unreachable.append(exc)
            out.runs += _stale(group, host)
            continue
        if any(m.executor == "slurm" for m in manifests):
            out.backends.append(f"{host or 'this machine'}: queue read with {collector.backend}")
            out.backends += [f"{host or 'this machine'}: {note}" for note in collector.notes]
        if collector.unavailable is not None:
            out.slurm_down.append(collector.unavailable)
        if kind != "local":
            for run in runs:
                if run.slurm_error is None:  # the local copy keeps the last status Slurm did tell
                    mirror.save_status(run.run_id, run.to_json())
        out.runs += runs
    out.runs.sort(key=lambda r: order.get(r.run_id, 0))
    return out


def _kept_local(e: "IndexEntry", host: str) -> Optional["RunStatus"]:
    """A local run whose run directory is gone: the last status its runner kept on this machine
    (<state dir>/runs/<id>/status.json, executors/local.py), with the run marked as gone; None
    when there is none (a Slurm run, or a run that never ran here)."""
    from ..runs import mirror
    from ..status import RunStatus

    seen = mirror.load_status(e.run_id) if e.executor == "local" else None
    if seen is None:
        return None
    as_of, doc = seen
    try:
        run = RunStatus.from_json(doc, e.run_dir)
    except (ValueError, KeyError, TypeError):
        return None
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(as_of))
    run.dir_gone = (f"its run directory {e.run_dir} is gone (deleted or moved); the last status its runner "
                    f"recorded on this machine, at {stamp}; `lingjun-slurm forget --missing` drops it")
    run.host = host or run.host
    return run


def _unreadable_run(e: "IndexEntry", host: str, why: str) -> "RunStatus":
    """A run whose manifest.json cannot be read: no stages, UNKNOWN, with what is wrong and the fix."""
    from ..status import RunStatus

    run = RunStatus(e.run_id, e.name, e.executor, host or e.host, run_dir=e.run_dir)
    run.record_error = (f"{why}; restore it from a backup, or `lingjun-slurm forget {e.run_id}` to drop the run "
                        "from the index (its directory is left alone)")
    return run


def _stale(entries: list["IndexEntry"], host: str) -> list["RunStatus"]:
    """The last status seen here for runs on an unreachable host (or UNKNOWN stages from the copy)."""
    from ..runs import mirror
    from ..runs.manifest import load_mirrored
    from ..status import RunStatus, StageStatus

    runs = []
    for e in entries:
        seen = mirror.load_status(e.run_id)
        m = load_mirrored(e.run_id)
        run = None
        if seen is not None:
            as_of, doc = seen
            try:
                run = RunStatus.from_json(doc, e.run_dir)
            except (ValueError, KeyError, TypeError):
                run = None  # a copy that is not a status: as if none was seen
            else:
                run.stale_as_of = as_of
                if m is not None:
                    _reconcile(run, m, as_of)
        if run is None:
            if m is None:
                click.echo(f"warning: run {e.run_id}: {host} is unreachable and there is no local copy", err=True)
                continue
            run = RunStatus(m.run_id, m.name, m.executor, host, [
                StageStatus(s.name, list(s.job_ids), "UNKNOWN", "host unreachable; no status seen here yet",
                            None, None, None, 0) for s in m.stages], m.run_dir)
            run.stale_as_of = 0.0
        run.host = host
        runs.append(run)
    return runs


def _reconcile(run: "RunStatus", m: "Manifest", as_of: float) -> None:
    """The last status seen here, less what this machine changed since (cancel, resubmit): such stages
    are UNKNOWN with the record's current job ids, never an old state under old job ids."""
    from ..status import ACTIVE, StageStatus

    later: dict[str, str] = {}
    for ev in m.events:
        try:
            at = float(ev.get("at", 0))
        except (TypeError, ValueError):
            continue
        if at > as_of and ev.get("event") in ("cancel", "resubmit"):
            for name in ev.get("stages") or []:
                later[str(name)] = str(ev["event"])
    seen = {s.name: s for s in run.stages}
    stages = []
    for rec in m.stages:
        s = seen.get(rec.name)
        changed = rec.name in later and (later[rec.name] != "cancel" or s is None or s.state in ACTIVE)
        if s is not None and s.job_ids == list(rec.job_ids) and not changed:
            stages.append(s)  # a cancel does not touch a stage that had already ended
            continue
        what = later.get(rec.name, "resubmit")
        stages.append(StageStatus(rec.name, list(rec.job_ids), "UNKNOWN",
                                  f"{what} from here after the last status seen; host unreachable",
                                  None, None, None, 0))
    run.stages = stages


def _print_status(refs: list[str], as_json: bool, conns: Optional[Connections] = None,
                  verbose: bool = False) -> list["RunStatus"]:
    from . import ui
    from ..destination import Destination
    from ..status import document, format_table

    own = conns is None
    conns = conns or Connections(Destination())
    try:
        got = _collect(refs, conns)
    finally:
        if own:
            conns.close()
    if as_json:
        click.echo(json.dumps(document(got.runs), indent=2))
    elif ui.use_rich():
        ui.print_status(got.runs)
    else:
        click.echo(format_table(got.runs), nl=False)
    if verbose:
        for line in got.backends:
            click.echo(line, err=True)
    if got.unreachable:
        raise got.unreachable[0]  # exit 3, after what the local copy knows was shown
    if got.slurm_down:
        raise got.slurm_down[0]  # exit 1, after every run that could be shown was
    if got.bad_records:
        raise got.bad_records[0]  # a named run's record cannot be read: exit 1, after every run was shown
    return got.runs


@click.command(epilog=EXIT_CODES)
@click.argument("runs", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print the versioned JSON document (schema 1).")
@click.option("--watch", is_flag=True, help="Refresh until every stage has ended (Ctrl-C stops watching).")
@click.option("--interval", type=click.FloatRange(min=1.0), default=5.0, show_default=True,
              help="Seconds between refreshes with --watch.")
@click.option("--verbose", "-v", is_flag=True, help="Also say (on stderr) how the queue was read: squeue/sacct or "
                                                   "pyslurm, and why.")
@click.option("--goodput", is_flag=True, help="Where the run's GPU-hours (CPU-hours without GPUs) went: hours per "
                                              "bucket, the waits, goodput and cost (one RUN; docs/report.md).")
@remote_options
def status(runs: tuple[str, ...], as_json: bool, watch: bool, interval: float, verbose: bool, host: Optional[str],
           cluster: Optional[str], accept_new_host_key: bool, goodput: bool = False) -> None:
    """Each stage's state, job id, elapsed time, nodes, exit code and reason (default: recent runs).

    Remote runs are read over SSH, one connection per host. When a host cannot be reached, its
    runs are shown from the local copy, marked STALE, and the command exits 3. When Slurm does not
    answer (slurmctld unreachable), every run is still shown, the stages Slurm would have to tell
    about are UNKNOWN with Slurm's message, and the command exits 1.
    """
    from . import ui
    from ..common.errors import SlurmUnavailable
    from ..status import ACTIVE

    if goodput:
        _print_goodput(runs, as_json, watch, destination(host, cluster, accept_new_host_key))
        return
    with Connections(destination(host, cluster, accept_new_host_key)) as conns:
        if watch and not as_json and ui.use_rich():
            _watch_live(list(runs), conns, interval, verbose)
            return
        while True:
            if watch and sys.stdout.isatty() and not as_json:
                click.echo("\x1b[H\x1b[2J", nl=False)
            try:
                shown = _print_status(list(runs), as_json, conns, verbose)
            except SlurmUnavailable as exc:
                if not watch:
                    raise
                # slurmctld restarts: --watch waits for it to answer again (Ctrl-C stops watching).
                click.echo(f"{exc}; watching on", err=True)
                time.sleep(interval)
                continue
            if not watch or not any(s.state in ACTIVE for r in shown for s in r.stages):
                return
            time.sleep(interval)


def _print_goodput(runs: tuple[str, ...], as_json: bool, watch: bool, dest: "Destination") -> None:
    """status --goodput RUN [--json]: the run's ledger (status.goodput; lingjun_slurm/injob/host/ledger.py)."""
    from ..injob.host import ledger
    from ..status import goodput

    if len(runs) != 1 or watch:
        raise UsageError("status --goodput takes exactly one RUN (and no --watch): lingjun-slurm status --goodput RUN "
                         "[--json]")
    with Connections(dest) as conns:
        _entry, t, m = open_run(runs[0], conns)
        doc = goodput(t, m)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(ledger.format_table(doc), nl=False)
    if doc.get("note"):
        click.echo(f"note: {doc['note']}", err=True)


def _watch_live(refs: list[str], conns: Connections, interval: float, verbose: bool) -> None:
    """status --watch on a terminal: the table redrawn in place under a header (ui.StatusWatch).
    What the plain loop prints on stderr (Slurm not answering, -v's queue readers) is in the
    header instead; an unreachable host ends the watch (exit 3) as there, after its last frame."""
    from . import ui
    from ..status import ACTIVE

    with ui.StatusWatch(interval) as view:
        while True:
            got = _collect(refs, conns)
            notes = [f"{exc}; watching on" for exc in got.slurm_down] + (got.backends if verbose else [])
            view.update(got.runs, notes)
            if got.unreachable:
                break
            if not got.slurm_down and not any(s.state in ACTIVE for r in got.runs for s in r.stages):
                return
            time.sleep(interval)
    raise got.unreachable[0]


@click.command(epilog=EXIT_CODES)
@click.argument("run")
@click.argument("stage", required=False)
@click.option("--follow", "-f", is_flag=True, help="Keep printing as the log grows, until the job ends.")
@click.option("--task", type=int, help="Array task index (the preprocess shards).")
@remote_options
def logs(run: str, stage: Optional[str], follow: bool, task: Optional[int], host: Optional[str],
         cluster: Optional[str], accept_new_host_key: bool) -> None:
    """Print a stage's Slurm log (default: the running, failed or last started stage).

    For a remote run the log is read over SFTP; --follow polls the remote file (and the
    queue, once a second) over the same connection.
    """
    from ..runs.logs import stage_logs

    with Connections(destination(host, cluster, accept_new_host_key)) as conns:
        _entry, t, m = open_run(run, conns)
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
            click.echo(f"no log yet for stage {rec.name} of run {m.run_id} "
                       f"(expected {files[0].path if files else '?'})", err=True)


def _interesting_stage(t: "Transport", m: "Manifest") -> "StageRecord":
    from ..status import FAILED, StatusCollector

    run = StatusCollector(t).collect([m])[0]
    for want in (("RUNNING",), FAILED):
        for s in run.stages:
            if s.state in want and not (s.reason or "").startswith("DependencyNeverSatisfied"):
                return m.stage(s.name)
    started = [s for s in run.stages if s.elapsed_s is not None]
    return m.stage(started[-1].name if started else run.stages[0].name)


def _follow(t: "Transport", m: "Manifest", stage: str, path: str) -> None:
    """Until the stage has ended and the file is drained. Ctrl-C stops following: exit 130 (main._run).
    On a terminal the lines go through ui.FollowView (a live line under them); elsewhere the bytes as read."""
    from . import ui
    from ..status import ACTIVE, StatusCollector

    collector = StatusCollector(t)
    view = ui.FollowView(path, stage) if ui.use_rich() else None

    def done() -> bool:
        run = collector.collect([m])[0]
        if collector.unavailable is not None:
            return False  # Slurm does not answer (restarting?): keep following
        state = next(s for s in run.stages if s.name == stage).state
        if view is not None:
            view.state = state
        return state not in ACTIVE

    if view is not None:
        with view:
            for chunk in t.follow(path, poll_s=1.0, done=done):
                view.write(chunk)
        return
    for chunk in t.follow(path, poll_s=1.0, done=done):
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()


@click.command(epilog=EXIT_CODES)
@click.argument("run")
@click.argument("stage", required=False)
@remote_options
def cancel(run: str, stage: Optional[str], host: Optional[str], cluster: Optional[str],
           accept_new_host_key: bool) -> None:
    """Cancel a run's jobs (from STAGE on, if given) in one scancel; local runs by their process ids.

    When Slurm does not answer, nothing is cancelled and the command exits 1 with Slurm's message
    (local runs are cancelled all the same). Once none of the run's jobs is left, the run's
    workdir lock is removed."""
    from ..common.errors import SlurmUnavailable
    from ..executors.local import cancel_local
    from ..runs.manifest import locked_manifest
    from ..runs.workdir_lock import release_if_over
    from ..slurm.client import SlurmCLI
    from ..submit import stages_from

    with Connections(destination(host, cluster, accept_new_host_key)) as conns:
        _entry, t, m = open_run(run, conns)
        names = stages_from(m, stage) if stage else m.stage_names()
        if m.executor == "local":
            if t.kind != "local":
                raise UsageError(f"run {m.run_id} ran with the local executor on {m.transport.host}: "
                                 "cancel it there")
            if stage:
                raise UsageError("a local run is cancelled whole: `lingjun-slurm cancel RUN` without a stage")
            from ..executors.localstate import read_state

            before = read_state(m.run_dir)
            stopped = cancel_local(m.run_dir)
            click.echo(_local_cancel_line(m, before, stopped))
        else:
            # Only jobs that squeue shows under this run's job names: a reused job id is never hit.
            from ..status import ACTIVE, StatusCollector

            collector = StatusCollector(t)
            live = {s.name: s for s in collector.collect([m])[0].stages}
            if collector.unavailable is not None:
                exc = collector.unavailable
                raise SlurmUnavailable(exc.host, exc.message, f"cannot cancel run {m.run_id}: nothing was cancelled")
            running = [j for n in names if live[n].state == "RUNNING" for j in m.stage(n).job_ids]
            # Stages that had ended before this cancel; a running job that its steps' stop ended
            # (below) was cancelled by it, not "already ended" (seen on real pyxis, issue 25).
            ended = [n for n in names if live[n].state not in ACTIVE]
            if running:
                live = _stop_steps_first(t, m, names, running)
            ids = [j for n in names if live[n].state in ACTIVE for j in m.stage(n).job_ids]
            SlurmCLI(t).cancel(ids)
            # Every stage still active when cancel came was ended by it: stopped, cancelled, or (a
            # stage waiting on a stopped one) cancelled by Slurm through --kill-on-invalid-dep.
            cancelled = [f"{j} ({n})" for n in names if n not in ended for j in m.stage(n).job_ids
                         if j in running or j in ids or live[n].state not in ACTIVE]
            click.echo(f"cancelled run {m.run_id}: jobs {', '.join(dict.fromkeys(cancelled)) or '-'}"
                       + (f"; already ended: {', '.join(ended)}" if ended else ""))
        with locked_manifest(t, m.run_dir) as rec:
            rec.event("cancel", stages=names)
        try:
            release_if_over(t, m.run_dir, m.run_id)
        except LingjunError as exc:  # the cancel is done: the next submit judges the lock itself
            click.echo(f"warning: could not check the workdir lock: {exc}", err=True)


def _local_cancel_line(m: "Manifest", before: Any, stopped: list[str]) -> str:
    """What a local cancel did, in cancel's words for Slurm runs: the jobs (and their stages) it
    cancelled, running or pending when it came, and the stages that had already ended. `before` is
    local-state.json as read just before the cancel (None: no runner ever wrote one)."""
    tasks = list(before.tasks) if before is not None else []
    live = [t for t in tasks if t.state in ("RUNNING", "PENDING")]  # cancel_local marks each CANCELLED
    jobs = list(dict.fromkeys(f"{t.job_id} ({t.stage}{', pending' if t.state == 'PENDING' else ''})"
                              for t in live))
    gone = {t.stage for t in live}
    ended = [rec.name for rec in m.stages
             if rec.name not in gone and any(t.stage == rec.name for t in tasks)
             and all(t.state not in ("RUNNING", "PENDING") for t in tasks if t.stage == rec.name)]
    line = f"cancelled run {m.run_id}: jobs {', '.join(jobs) or '-'}"
    if ended:
        line += f"; already ended: {', '.join(ended)}"
    if stopped:
        line += f" (stopped {', '.join(stopped)})"
    else:
        line += " (no process of it was running)"
    return line


# How long cancel lets running jobs end their steps and clean up before it cancels them (at
# least; a running train gets its save_grace_s to save a checkpoint first).
STEP_STOP_WAIT_S = 30.0


def _stop_steps_first(t, m, names: list[str], running: list[str]) -> dict:
    """SIGTERM to the running jobs' steps only (scancel --signal=TERM: "signals other than SIGKILL
    are not sent to the batch step", scancel(1) --full; slurmctld's _signal_job sets KILL_STEPS_ONLY):
    each batch script then ends while its job still holds its nodes, so its EXIT handler can remove
    the job's named containers (pyxis keeps them under container_scope=global) before the final
    scancel. A marker jobs/cancel-<job id> tells the train script not to requeue itself. One squeue
    per second while it waits."""
    import json
    import time

    from ..slurm.client import SlurmCLI
    from ..status import StatusCollector

    wait = STEP_STOP_WAIT_S
    if any(m.stage(n).kind == "train" for n in names):
        try:
            plan = json.loads(t.read_text(f"{m.run_dir}/plan.json"))
            wait = max(wait, float(plan["settings"]["training"]["save_grace_s"]) + 10)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    if running:  # a job squeue shows RUNNING may not have run its prelude (which makes jobs/) yet
        t.mkdir(f"{m.run_dir}/jobs", exist_ok=True)
    for job in running:
        t.write_atomic(f"{m.run_dir}/jobs/cancel-{job}", f"lingjun-slurm cancel at {time.time():.0f}\n")
    SlurmCLI(t).cancel(running, signal="TERM", state="RUNNING")
    deadline = time.monotonic() + wait
    while True:
        live = {s.name: s for s in StatusCollector(t).collect([m])[0].stages}
        still = [n for n in names if live[n].state == "RUNNING" and set(m.stage(n).job_ids) & set(running)]
        if not still or time.monotonic() >= deadline:
            return live
        time.sleep(1.0)


@click.command(epilog=EXIT_CODES)
@click.argument("run")
@click.option("--from", "from_stage", required=True, help="First stage to resubmit; later stages follow.")
@click.option("--force", is_flag=True, help="Break a workdir lock whose holder cannot be checked from here; never "
                                            "one whose holder is alive. A local run that is still running is "
                                            "stopped first (said which processes).")
@remote_options
def resubmit(run: str, from_stage: str, force: bool, host: Optional[str], cluster: Optional[str],
             accept_new_host_key: bool) -> None:
    """Re-render and resubmit STAGE and every stage after it, under the same run id.

    The spec is the run's own spec.yaml (with the clusters.yaml defaults recorded at submit);
    a remote run is re-rendered here and uploaded like a submit.
    """
    from ..common.errors import SlurmUnavailable, WorkdirBusy
    from ..executors.local import cancel_local
    from ..runs.workdir_lock import RunLocks
    from ..status import StatusCollector
    from ..submit import resubmit_local, resubmit_slurm, stages_from

    with Connections(destination(host, cluster, accept_new_host_key)) as conns:
        _entry, t, m = open_run(run, conns)
        if any(rec.kind == "doctor" for rec in m.stages):
            raise UsageError(f"run {m.run_id} is a `lingjun-slurm doctor` job: run doctor again instead "
                             f"(its spec: {m.run_dir}/spec.yaml)")
        names = stages_from(m, from_stage)
        if m.executor == "local" and t.kind != "local":
            raise UsageError(f"run {m.run_id} ran with the local executor on {m.transport.host}: resubmit it there")
        collector = StatusCollector(t)
        current = {s.name: s.state for s in collector.collect([m])[0].stages}
        if collector.unavailable is not None:
            exc = collector.unavailable
            raise SlurmUnavailable(exc.host, exc.message, f"cannot resubmit run {m.run_id}: nothing was submitted")
        if m.executor == "local":
            live = _local_live(m.run_dir)
            if live and not force:
                raise WorkdirBusy(f"run {m.run_id} is still running: {live}.\n  Wait for it to end, stop it "
                                  f"(`lingjun-slurm cancel {m.run_id}`), or `resubmit --force`, which stops it first.")
            if live:
                click.echo(f"--force: stopping run {m.run_id} first: {live}")
            stopped = cancel_local(m.run_dir)
            if live:
                click.echo(f"--force: stopped {', '.join(stopped) or 'nothing (it had ended meanwhile)'}")
            lock = RunLocks.of_run(t, m.run_dir, m.run_id)
            note = lock.acquire(force=force)
            if note:
                click.echo(note)
            try:
                resubmit_local(t, m.run_dir, from_stage, current.get)
                keep = frozenset(n for n in m.stage_names() if n not in names)
                _run_local(m.run_dir, m.run_id, detach=False, keep=keep)
            finally:
                lock.release()
            return
        new = resubmit_slurm(t, m.run_dir, from_stage, current.get, echo=click.echo, force=force)
    click.echo(f"resubmitted run {new.run_id} from stage {from_stage}:")
    for n in names:
        rec = new.stage(n)
        old = rec.previous[-1].job_ids if rec.previous else []
        click.echo(f"  {n:<16} job {','.join(rec.job_ids):<10} (was {','.join(old) or '-'})")


def _local_live(run_dir: str) -> str:
    """What of a local run still runs on this host (its runner, jobs without it), in words; "" if
    nothing does. A record that cannot be read (BadState) names no process: "" (the workdir lock,
    taken next, still refuses a live runner)."""
    import socket

    from ..executors.localstate import BadState, job_alive, read_state, runner_alive

    try:
        state = read_state(run_dir)
    except BadState:
        return ""
    if state is None or (state.host and state.host != socket.gethostname()):
        return ""
    jobs = [f"stage {t.stage} (pid {t.pid})" for t in state.tasks if t.state == "RUNNING" and job_alive(t, state)]
    if runner_alive(state):
        return (f"its local runner pid {state.runner_pid} on {state.host}"
                + (f", running {', '.join(jobs)}" if jobs else ""))
    return f"{', '.join(jobs)} on {state.host}, without its runner" if jobs else ""


@click.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.option("-n", "--limit", type=int, default=20, show_default=True, help="Newest N runs (0: all).")
@click.option("--host", metavar="[USER@]HOST[:PORT]", help="Only runs submitted to this host (as written then).")
@click.option("--cluster", metavar="NAME", help="Only runs submitted with --cluster NAME, or to its host.")
def list_runs(as_json: bool, limit: int, host: Optional[str], cluster: Optional[str]) -> None:
    """Runs in the index (~/.local/state/lingjun-slurm/runs.json), newest last. Offline: no connection."""
    from dataclasses import asdict

    from ..runs.index import RunIndex

    index = RunIndex()
    if host or cluster:
        target = host or ""
        if host:
            from ..destination import check_target
            check_target(host)
        elif cluster:
            from ..clusters import get_cluster
            try:
                target = get_cluster(cluster).target()
            except UsageError:
                pass  # no such entry (any more): the runs recorded under that cluster name still show
        entries = index.on(target, cluster or "")
    else:
        entries = index.entries()
    entries = entries[-limit:] if limit > 0 else entries
    if as_json:
        click.echo(json.dumps({"schema": 1, "runs": [asdict(e) for e in entries]}, indent=2))
        return
    if not entries:
        click.echo("no runs yet (lingjun-slurm submit SPEC)" if not (host or cluster) else "no runs on that host")
        return
    click.echo(f"{'RUN ID':<44} {'CREATED':<19} {'EXECUTOR':<8} {'HOST':<16} RUN DIR")
    for e in entries:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.created_at))
        click.echo(f"{e.run_id:<44} {created:<19} {e.executor:<8} {e.host:<16} {e.run_dir}")


@click.command()
@click.argument("runs", nargs=-1)
@click.option("--missing", is_flag=True,
              help="Also drop every run of this machine whose run directory is gone (remote runs are not checked: "
                   "forget never connects).")
def forget(runs: tuple[str, ...], missing: bool) -> None:
    """Drop runs from the index and their local copies (run directories and jobs are left alone)."""
    from ..runs import mirror
    from ..runs.index import RunIndex

    if not runs and not missing:
        raise UsageError("give RUN... to forget, or --missing to drop the runs whose run directory is gone")
    index = RunIndex()
    chosen = [index.resolve(r) for r in runs]
    for e in chosen:
        # A run that still runs here stays in the index, so that status and cancel find it by name.
        live = _local_live(e.run_dir) if e.executor == "local" and not e.remote else ""
        if live:
            raise UsageError(f"run {e.run_id} is still running ({live}): cancel it first "
                             f"(`lingjun-slurm cancel {e.run_id}`), then forget it; nothing was forgotten")
    ids = [e.run_id for e in chosen]
    if missing:
        gone = [e.run_id for e in index.entries() if not e.remote and not os.path.isdir(e.run_dir)]
        ids += [i for i in gone if i not in ids]
        if not ids:
            click.echo("no run of this machine has lost its run directory; nothing to forget")
            return
    index.remove(ids)
    for run_id in ids:
        mirror.remove(run_id)
    click.echo(f"forgot {len(ids)} run(s): {', '.join(ids)}")
    slurm = [e for e in chosen if e.executor == "slurm"]
    if slurm:  # forget never connects: a Slurm run's jobs are not checked, and stay cancellable
        click.echo("  jobs of a Slurm run are left as they are; `lingjun-slurm cancel RUN_DIR` still cancels them "
                   f"(run directory {slurm[0].run_dir}" + (f" on {slurm[0].host}" if slurm[0].remote else "") + ")")


COMMANDS = (submit, status, logs, cancel, resubmit, list_runs, forget)
