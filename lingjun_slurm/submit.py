"""submit and resubmit: render the chain, write the run record, queue the jobs all-or-nothing.

Slurm: every stage is submitted with afterok (or the spec's) dependencies on the job ids before
it; a stage that depends by afterok on a job of this submission waits behind it, the others are
held (`sbatch --parsable --hold`); only when the last sbatch succeeded are the held ones
released, in one `scontrol release` for a fresh chain. If any sbatch fails, every job already
queued is cancelled, the manifest says "failed" and SubmitError (exit 1) carries Slurm's error.
No stage of a failed submission ever starts.

The transport decides where: this machine, or a login node over SSH, where the run
directory is written over SFTP and sbatch runs remotely (a local mirror of the record is
kept beside the index: runs/mirror.py). Defaults from clusters.yaml that filled fields the
spec left unset are recorded in the manifest (`defaults`) and re-applied by resubmit.

One run per workdir: submit takes the workdir lock (runs/workdir_lock.py) before it writes or
queues anything, so a second submit into the same workdir is refused up front, naming the run
that holds it. For Slurm runs each job id is written into the lock as its sbatch returns, and the
chain's jobs hold it from then on; a submission that was rolled back releases it.
"""

from __future__ import annotations

import dataclasses

import os
import secrets
import shlex
import time
from dataclasses import dataclass, field
from typing import Callable, NoReturn, Optional, Sequence

from . import __version__, python_check
from .common.errors import LingjunError, SubmitError, UsageError
from .common.interrupts import signals_interrupt
from .plan import Plan, StagePlan, build_plan
from .render import render_plan
from .runs.index import RunIndex, entry_for
from .runs.workdir_lock import CKPT_STAGES, RunLocks
from .runs.manifest import (Attempt, ClusterRecord, DefaultsRecord, DependencyRecord, Manifest, SpecRecord, StageRecord,
                            TransportRecord, current_user, load_manifest, locked_manifest, save_manifest)
from .slurm.client import SlurmCLI
from .status import ACTIVE
from .spec.load import LoadedSpec
from .transport.base import Transport

Echo = Callable[[str], None]


def new_run_id(name: str, now: Optional[float] = None) -> str:
    """<name>-<YYYYmmdd>-<HHMMSS>-<6 hex>: unique, sortable, and valid as a Slurm job name prefix."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    return f"{name[:40].rstrip('.-_') or 'run'}-{stamp}-{secrets.token_hex(3)}"


def run_dir_for(workdir: str, run_id: str) -> str:
    return f"{workdir.rstrip('/')}/runs/{run_id}"


def reproduce_command(run_dir: str, run_id: str, executor: str, cluster: str = "") -> str:
    argv = ["lingjun-slurm", "render", f"{run_dir}/spec.yaml", "-o", run_dir, "--run-id", run_id]
    if executor != "slurm":
        argv += ["--executor", executor]
    if cluster:
        argv += ["--cluster", cluster]
    return shlex.join(argv)


@dataclass
class Prepared:
    loaded: LoadedSpec
    plan: Plan
    files: dict[str, str]
    run_dir: str
    defaults: DefaultsRecord = field(default_factory=DefaultsRecord)


def prepare(loaded: LoadedSpec, *, run_id: str, executor: str, defaults: Optional[DefaultsRecord] = None) -> Prepared:
    """defaults: the clusters.yaml values already merged into loaded.spec (recorded in the manifest)."""
    defaults = defaults or DefaultsRecord()
    run_dir = run_dir_for(loaded.spec.run.workdir, run_id)
    cluster = defaults.cluster if defaults.applied else ""
    plan = build_plan(loaded.spec, run_id=run_id, spec_sha256=loaded.sha256, source=loaded.source,
                      reproduce=reproduce_command(run_dir, run_id, executor, cluster), executor=executor)
    return Prepared(loaded, plan, render_plan(plan), run_dir, defaults)


def reload_spec(t: Transport, run_dir: str, manifest: Manifest) -> LoadedSpec:
    """The run's own spec.yaml with the cluster defaults it was submitted with (resubmit)."""
    from .clusters import parse_spec_with_defaults

    path = f"{run_dir}/spec.yaml"
    loaded, _applied = parse_spec_with_defaults(t.read_text(path), path, dict(manifest.defaults.applied))
    return loaded


def dependency_string(stage: StagePlan, job_ids: dict[str, list[str]],
                      after_any: Sequence[str] = ()) -> Optional[str]:
    """sbatch --dependency for a stage: afterok:1:2,afterany:3 (upstreams without a job are left out).

    after_any: more jobs that must have ended first (a resubmit waits for the jobs it replaces).
    """
    parts = []
    for dep in stage.depends_on:
        ids = job_ids.get(dep.stage) or []
        if ids:
            parts.append(":".join([dep.type, *ids]))
    if after_any:
        parts.append(":".join(["afterany", *after_any]))
    return ",".join(parts) or None


def dry_run_lines(prep: Prepared) -> list[str]:
    """What submit would do: the sbatch lines, or for the local executor what it will run on this
    machine (the commands in order, dependencies, tasks and the environment it sets)."""
    plan = prep.plan
    if plan.executor == "local":
        from .executors.local import describe

        return [f"would run {plan.run_id} ({len(plan.stages)} stages) with the local executor on this machine, "
                f"run directory {prep.run_dir}/ (no sbatch: no Slurm is involved):"] + describe(
            prep.run_dir, [(st.name, f"{prep.run_dir}/{st.script}", [d.stage for d in st.depends_on],
                            st.resources.nodes * st.resources.tasks_per_node, st.array) for st in plan.stages])
    lines = [f"would submit run {plan.run_id} ({len(plan.stages)} stages, executor {plan.executor}) "
             f"from {prep.run_dir}/:"]
    placeholder = {st.name: [f"<{st.name}>"] for st in plan.stages}
    for st in plan.stages:
        dep = dependency_string(st, placeholder)
        behind = any(d.type == "afterok" for d in st.depends_on)  # as submit_stages: behind a held job
        argv = (["sbatch", "--parsable"] + ([] if behind else ["--hold"]) + ([f"--dependency={dep}"] if dep else [])
                + [st.script])
        res = st.resources
        shape = f"{res.nodes}x{res.tasks_per_node} tasks" + (f", {res.gpus_per_node} GPU/node" if res.gpus_per_node else "")
        lines.append(f"  {st.name:<16} {' '.join(argv)}   # {shape}{', array ' + st.array if st.array else ''}")
    lines.append("  then: scontrol release <every --hold job id>")
    return lines


def write_run_dir(t: Transport, prep: Prepared, *, new: bool = False) -> None:
    """new: the run directory must not exist yet (two submits never share a run id).

    A new run directory is written whole or not at all: the files go into a hidden temporary
    directory beside it (runs/.<run-id>.tmp-<random>/), renamed to the run directory at the end,
    on the host that holds it (Transport.rename_new: os.rename here, an SFTP rename on a --host).
    A Ctrl-C or an error meanwhile removes the temporary directory and leaves no run directory;
    even a SIGKILL leaves only the hidden one, which no command reads as a run."""
    import secrets

    files: dict[str, str] = {**prep.files, "spec.yaml": prep.loaded.text,
                             "spec.sha256": f"{prep.loaded.sha256}  spec.yaml\n"}
    taken = UsageError(f"run {prep.plan.run_id} already exists in {prep.run_dir}; "
                       f"use `lingjun-slurm resubmit {prep.plan.run_id} --from STAGE`")
    if new:
        runs, _, leaf = prep.run_dir.rpartition("/")
        t.mkdir(runs)
        if t.exists(prep.run_dir):
            raise taken
        where = f"{runs}/.{leaf}.tmp-{secrets.token_hex(4)}"
        t.mkdir(where, exist_ok=False)
    else:
        where = prep.run_dir
        t.mkdir(prep.run_dir)
    try:
        t.mkdir(prep.plan.log_dir)
        for name, text in files.items():
            t.write_atomic(f"{where}/{name}", text, 0o755 if name.endswith((".sh", ".sbatch")) else 0o644)
        if new:
            try:
                t.rename_new(where, prep.run_dir)
            except FileExistsError:
                raise taken from None
    except BaseException:
        if new:
            try:
                t.remove_tree(where)
            except Exception:  # noqa: BLE001 - the original error (or Ctrl-C) matters more
                pass
        raise
    if t.kind != "local":
        from .runs import mirror

        mirror.save_files(prep.plan.run_id, dict(files))


Wheels = list[tuple[str, bytes, list[tuple[str, bytes]]]]


def code_to_ship(prep: Prepared) -> Wheels:
    """The wheels of this lingjun_slurm (+ run.ship_wheels) for built-in stages, read and checked here
    (UsageError) before the run directory is written: a bad wheel leaves nothing behind."""
    spec = prep.loaded.spec
    if not spec.run.ship_code or all(st.kind == "command" for st in prep.plan.stages):
        return []
    from .bundle import collect

    return collect(list(spec.run.ship_wheels))


def ship_code(t: Transport, prep: Prepared, wheels: Optional[Wheels] = None) -> list[str]:
    """Upload and unpack the wheels (code_to_ship's, collected now unless given) into the run directory."""
    wheels = code_to_ship(prep) if wheels is None else wheels
    if not wheels:
        return []
    from .bundle import upload

    return upload(t, prep.run_dir, wheels)


def stage_record(st: StagePlan) -> StageRecord:
    return StageRecord(name=st.name, kind=st.kind, script=st.script, job_name=st.job_name, array=st.array,
                       depends_on=[DependencyRecord(stage=d.stage, type=d.type) for d in st.depends_on],
                       nodes=st.resources.nodes, ntasks=st.resources.nodes * st.resources.tasks_per_node)


def new_manifest(t: Transport, prep: Prepared, executor: str, cluster: ClusterRecord) -> Manifest:
    now = round(time.time(), 3)
    return Manifest(
        run_id=prep.plan.run_id, name=prep.plan.name, created_at=now, updated_at=now, tool_version=__version__,
        user=current_user(), executor=executor, transport=TransportRecord(kind=t.kind, host=t.host), cluster=cluster,
        spec=SpecRecord(source=os.path.abspath(prep.loaded.source) if t.kind == "local" else prep.loaded.source,
                        sha256=prep.loaded.sha256), defaults=prep.defaults,
        run_dir=prep.run_dir, log_dir=prep.plan.log_dir, stages=[stage_record(st) for st in prep.plan.stages])


def submit_stages(sched: SlurmCLI, manifest: Manifest, stages: list[StagePlan], known: dict[str, list[str]],
                  echo: Echo, replaces: Optional[dict[str, list[str]]] = None,
                  on_job: Optional[Callable[[list[str]], None]] = None,
                  rolled_back: Optional[list[bool]] = None) -> list[str]:
    """Submit stages in order (held, or behind an afterok on a held one), then release the held
    ones; on any failure cancel what this call queued.

    The manifest is saved after every sbatch, so no job id is ever lost. Held jobs that wait
    on jobs outside this submission are released first and the roots last, so
    a failing release never lets a root start ahead of the rollback. on_job(ids so far) after
    each sbatch (the workdir lock records them); rolled_back gets True when a failure's rollback
    cancelled everything this call queued.
    """
    submitted: list[str] = []
    roots: list[str] = []
    held: list[str] = []
    # Jobs of this call that cannot start before the release: held ones, and those with an afterok on
    # one of them. A stage with an afterok on a gated job is queued without --hold: it cannot start
    # before its upstream ends, and when the rollback cancels that upstream its afterok can never be
    # met (Slurm cancels it: --kill-on-invalid-dep). So one `scontrol release` of the held jobs starts
    # the chain, not one per stage list (issue 31: 1 + 1/N calls per stage, bare sbatch is 1). Only
    # afterok gates: an afterany or afternotok would be met by the rollback's own cancel.
    gated: set[str] = set()
    job_ids = dict(known)
    current: Optional[StagePlan] = None
    with signals_interrupt():
        try:
            for st in stages:
                current = st
                dep = dependency_string(st, job_ids, (replaces or {}).get(st.name, ()))
                behind = any(j in gated for d in st.depends_on if d.type == "afterok" for j in job_ids.get(d.stage, ()))
                job_id = sched.submit(st.script, cwd=manifest.run_dir, hold=not behind, dependency=dep)
                submitted.append(job_id)
                gated.add(job_id)
                if not behind:
                    held.append(job_id)
                if dep is None:
                    roots.append(job_id)
                job_ids[st.name] = [job_id]
                rec = manifest.stage(st.name)
                rec.job_ids = [job_id]
                rec.submitted_at = round(time.time(), 3)
                rec.depends_on = [DependencyRecord(stage=d.stage, type=d.type, job_ids=job_ids.get(d.stage, []))
                                  for d in st.depends_on]
                save_manifest(sched.t, manifest)
                if on_job is not None:
                    on_job(list(submitted))
            current = None
            # Held jobs that wait on jobs outside this call (a resubmit's running upstream) first, the
            # roots last: a failing release never lets a root start ahead of the rollback. scontrol
            # goes on to the next id after a failed one (src/scontrol/update_job.c scontrol_hold,
            # slurm-22-05-8-1:245-274), so the two groups cannot share one call. A fresh chain has
            # no such jobs: one call.
            sched.release([j for j in held if j not in roots])
            sched.release(roots)
        except BaseException as exc:  # noqa: BLE001 - every failure rolls back, then is reported
            note, ok = _rollback(sched, submitted, current.job_name if current else None)
            if rolled_back is not None:
                rolled_back.append(ok)
            where = f"stage {current.name}" if current else "releasing the held jobs"
            manifest.state = "failed"
            manifest.event("submit-failed", stage=current.name if current else "release", error=str(exc),
                           cancelled=submitted)
            try:
                save_manifest(sched.t, manifest)
            except Exception:  # noqa: BLE001 - the rollback note matters more than the record
                pass
            if isinstance(exc, KeyboardInterrupt):
                echo(f"interrupted at {where}: {note}")
                raise
            detail = str(exc) if isinstance(exc, LingjunError) else f"{type(exc).__name__}: {exc}"
            raise SubmitError(f"submission of run {manifest.run_id} failed at {where}: {detail}\n{note}") from None
    return submitted


def _rollback(sched: SlurmCLI, submitted: list[str], uncertain_name: Optional[str]) -> tuple[str, bool]:
    """Cancel the held jobs; also any job the interrupted sbatch may have queued (by its unique name).
    (note for the user, whether everything was cancelled)."""
    problems = []
    if submitted:
        try:
            sched.cancel(submitted)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"could NOT cancel the held jobs {', '.join(submitted)}: {exc}; cancel them with scancel")
    if uncertain_name:
        try:
            sched.cancel_by_name(uncertain_name)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"could not check for a job named {uncertain_name}: {exc}")
    if problems:
        return "\n".join(problems), False
    if not submitted:
        return "nothing had been queued.", True
    return (f"cancelled the {len(submitted)} held job(s) already queued ({', '.join(submitted)}); none of them ran.",
            True)


def run_locks(t: Transport, prep: Prepared) -> RunLocks:
    """The workdir's lock, and the checkpoint directory's when the chain trains into it."""
    ckpt = prep.plan.host_checkpoint_dir if any(st.kind in CKPT_STAGES for st in prep.plan.stages) else None
    return RunLocks(t, prep.loaded.spec.run.workdir, prep.plan.run_id, prep.run_dir, ckpt)


def take_workdir(t: Transport, prep: Prepared, echo: Echo, force: bool = False) -> RunLocks:
    """The workdir lock for this run, and the checkpoint directory's when it trains (issue 26 item
    4), before anything is written or queued (WorkdirBusy names the holder)."""
    lock = run_locks(t, prep)
    note = lock.acquire(force=force)
    if note:
        echo(note)
    return lock


def _check_array_size(prep: Prepared, max_array_size: Optional[int]) -> None:
    """The preprocess array against the cluster's MaxArraySize: sbatch would refuse it ("Invalid job
    array specification") after the stages before it were queued; this names the spec's field."""
    from .common.errors import Issue, SpecError
    from .spec.checks import check_array_size

    loaded = prep.loaded
    issues = check_array_size(loaded.spec, max_array_size)
    if issues:
        raise SpecError(loaded.source, [Issue(i.loc, i.message, loaded.doc.line_of(i.loc)) for i in issues])


def submit_slurm(t: Transport, prep: Prepared, index: RunIndex, echo: Echo, force: bool = False) -> Manifest:
    sched = SlurmCLI(t)
    info = sched.cluster_info()
    _check_array_size(prep, info.max_array_size)  # before anything is written or queued
    cluster = ClusterRecord(name=info.name, slurm_version=info.slurm_version, accounting=info.accounting,
                            jobcomp_type=info.jobcomp_type, jobcomp_loc=info.jobcomp_loc)
    wheels = code_to_ship(prep)  # a bad run.ship_wheels stops here, before anything is written
    index.check()  # an unreadable runs.json stops here too, naming the file (runs/index.py)
    lock = take_workdir(t, prep, echo, force)
    rolled_back: list[bool] = []
    try:
        write_run_dir(t, prep, new=True)
        shipped = ship_code(t, prep, wheels)
        python_check.warn(t, prep.plan, prep.run_dir, ship_code=bool(shipped))  # a warning, never an error
        manifest = new_manifest(t, prep, "slurm", cluster)
        manifest.shipped = shipped
        save_manifest(t, manifest)
        try:
            index.add(entry_for(manifest.run_id, manifest.name, manifest.created_at, "slurm", t.kind, t.host,
                                manifest.run_dir, manifest.spec.source, cluster=prep.defaults.cluster))
        except Exception as exc:  # noqa: BLE001 - nothing is queued yet: the record says so, then the error
            _index_failed(t, manifest, index, exc)
        submit_stages(sched, manifest, list(prep.plan.stages), {}, echo, on_job=lock.record_jobs,
                      rolled_back=rolled_back)
    except BaseException:
        if all(rolled_back):  # nothing of this run is queued any more: the workdir is free again
            lock.release()
        raise
    manifest.state = "submitted"
    manifest.event("submit", stages=manifest.stage_names())
    save_manifest(t, manifest)
    return manifest


def prepare_local(t: Transport, prep: Prepared, index: RunIndex) -> Manifest:
    """Write the run record of a local run; job ids are 1..N in chain order.

    The index entry is added first: a runs.json that cannot be read or written stops the
    submit before the run directory exists, so no record marked "submitted" is left that no
    runner will ever start (status would show it PENDING forever). If writing the run
    directory fails after that, the entry is taken back out again.
    """
    manifest = new_manifest(t, prep, "local", ClusterRecord(name="local"))
    for i, rec in enumerate(manifest.stages, start=1):
        rec.job_ids = [str(i)]
        rec.submitted_at = manifest.created_at
    by_name = {rec.name: rec.job_ids for rec in manifest.stages}
    for rec in manifest.stages:
        for dep in rec.depends_on:
            dep.job_ids = list(by_name.get(dep.stage, []))
    try:
        previous = [e for e in index.entries() if e.run_id == manifest.run_id]
        index.add(entry_for(manifest.run_id, manifest.name, manifest.created_at, "local", t.kind, t.host,
                            manifest.run_dir, manifest.spec.source))
    except Exception as exc:  # noqa: BLE001 - nothing is written yet
        detail = str(exc) if isinstance(exc, LingjunError) else f"{type(exc).__name__}: {exc}"
        raise SubmitError(f"run {manifest.run_id} was not started: the run index could not be written: {detail}\n"
                          "nothing was written and nothing ran.") from None
    try:
        write_run_dir(t, prep, new=True)
        python_check.warn(t, prep.plan, prep.run_dir, ship_code=False)  # the local executor ships no code
        manifest.state = "submitted"
        manifest.event("submit", stages=manifest.stage_names())
        save_manifest(t, manifest)
    except BaseException:
        try:  # take the entry back out (and put back one it replaced)
            index.remove([manifest.run_id])
            for e in previous:
                index.add(e)
        except Exception:  # noqa: BLE001 - the original error matters more
            pass
        raise
    return manifest


def _index_failed(t: Transport, manifest: Manifest, index: RunIndex, exc: Exception) -> NoReturn:
    """The run directory is written but the index is not: mark the record failed (status then shows
    NOT_SUBMITTED, "submission failed", never PENDING forever) and say so; nothing is queued yet."""
    detail = str(exc) if isinstance(exc, LingjunError) else f"{type(exc).__name__}: {exc}"
    manifest.state = "failed"
    manifest.event("submit-failed", stage="index", error=detail, cancelled=[])
    try:
        save_manifest(t, manifest)
        marked = f"the run directory {manifest.run_dir} is marked failed"
    except Exception as save_exc:  # noqa: BLE001
        marked = f"could not mark the run directory {manifest.run_dir} failed either ({save_exc}); delete it"
    raise SubmitError(f"submission of run {manifest.run_id} failed before any job was queued: the run index "
                      f"{index.path} could not be written: {detail}\n{marked}; nothing was queued.")


def stages_from(manifest: Manifest, stage: str) -> list[str]:
    names = manifest.stage_names()
    if stage not in names:
        raise UsageError(f"run {manifest.run_id} has no stage {stage!r}; stages: {', '.join(names)}")
    return names[names.index(stage):]


def resubmit_slurm(t: Transport, run_dir: str, stage: str, state_of: Callable[[str], Optional[str]],
                   echo: Echo, force: bool = False) -> Manifest:
    """Re-render from the run's own spec.yaml and resubmit STAGE and every stage after it, same run id.

    state_of(stage) is the current state of a stage (from status). Upstream stages outside
    the resubmitted set: a COMPLETED one is no longer a dependency, a pending or running one
    stays one, a failed one refuses the resubmit. The new jobs are queued held, each with
    afterany on the job it replaces, released, and only then are the old jobs cancelled: a
    failed resubmit leaves the old jobs as they were, and old and new never run at once.

    The workdir lock: one held by this run's own jobs is taken over, and the new job ids join
    the ones still active; another run's live hold refuses the resubmit (WorkdirBusy).
    """
    manifest = load_manifest(t, run_dir)
    if manifest.executor != "slurm":
        raise UsageError(f"run {manifest.run_id} ran with the {manifest.executor} executor")
    names = stages_from(manifest, stage)
    loaded = reload_spec(t, run_dir, manifest)
    if "image" not in manifest.stage_names() and loaded.spec.container.stage == "auto":
        # A run submitted before the image stage existed (CHANGELOG.md, 0.2.0) keeps its chain:
        # its stages go on importing the image themselves.
        loaded = dataclasses.replace(loaded, spec=loaded.spec.model_copy(update={
            "container": loaded.spec.container.model_copy(update={"stage": "never"})}))
    prep = prepare(loaded, run_id=manifest.run_id, executor="slurm", defaults=manifest.defaults)
    if [st.name for st in prep.plan.stages] != manifest.stage_names():
        raise SubmitError(f"{run_dir}/spec.yaml no longer renders the stages {manifest.stage_names()}")
    known: dict[str, list[str]] = {}
    for rec in manifest.stages:
        if rec.name in names:
            continue
        state = state_of(rec.name)
        if state in ACTIVE:
            known[rec.name] = rec.job_ids
        elif state != "COMPLETED" and any(d.stage == rec.name for n in names for d in manifest.stage(n).depends_on):
            raise UsageError(f"stage {rec.name} of run {manifest.run_id} is {state or 'UNKNOWN'}, and {stage} "
                             f"depends on it: use `resubmit {manifest.run_id} --from {rec.name}`")
    active_old = {n: manifest.stage(n).job_ids for n in names if state_of(n) in ACTIVE}
    sched = SlurmCLI(t)
    wheels = code_to_ship(prep)
    lock = run_locks(t, prep)
    note = lock.acquire(force=force, same_run=True)
    if note:
        echo(note)
    still = [j for ids in [*known.values(), *active_old.values()] for j in ids]
    rolled_back: list[bool] = []
    try:
        write_run_dir(t, prep)
        shipped = ship_code(t, prep, wheels)
        python_check.warn(t, prep.plan, prep.run_dir, ship_code=bool(shipped))
        with locked_manifest(t, run_dir) as manifest:
            manifest.shipped = shipped
            now = round(time.time(), 3)
            for n in names:
                rec = manifest.stage(n)
                if rec.job_ids:
                    rec.previous.append(Attempt(job_ids=rec.job_ids, submitted_at=rec.submitted_at or now,
                                                replaced_at=now, reason=f"resubmit --from {stage}"))
                rec.job_ids = []
            submit_stages(sched, manifest, [st for st in prep.plan.stages if st.name in names], known, echo,
                          replaces=active_old, on_job=lambda ids: lock.record_jobs([*still, *ids]),
                          rolled_back=rolled_back)
            old = [j for ids in active_old.values() for j in ids]
            sched.cancel(old)
            manifest.state = "submitted"
            manifest.event("resubmit", from_stage=stage, stages=names, cancelled=old)
    except BaseException:
        if all(rolled_back) and not still:  # none of this run's jobs is queued: the workdir is free again
            lock.release()
        raise
    return manifest


def resubmit_local(t: Transport, run_dir: str, stage: str, state_of: Callable[[str], Optional[str]]) -> Manifest:
    """Local runs: re-render, give the stages from STAGE on new job ids; the caller runs them."""
    manifest = load_manifest(t, run_dir)
    names = stages_from(manifest, stage)
    for rec in manifest.stages:
        if rec.name in names:
            continue
        state = state_of(rec.name)
        needed = any(d.stage == rec.name and d.type == "afterok" for n in names for d in manifest.stage(n).depends_on)
        if needed and state != "COMPLETED":
            raise UsageError(f"stage {rec.name} of run {manifest.run_id} is {state or 'UNKNOWN'}, and {stage} "
                             f"depends on it: use `resubmit {manifest.run_id} --from {rec.name}`")
    prep = prepare(reload_spec(t, run_dir, manifest), run_id=manifest.run_id, executor="local",
                   defaults=manifest.defaults)
    write_run_dir(t, prep)
    with locked_manifest(t, run_dir) as manifest:
        now = round(time.time(), 3)
        next_id = 1 + max(int(j) for rec in manifest.stages for j in [*rec.job_ids, *(
            x for a in rec.previous for x in a.job_ids)] if j.isdigit())
        for n in names:
            rec = manifest.stage(n)
            rec.previous.append(Attempt(job_ids=rec.job_ids, submitted_at=rec.submitted_at or now, replaced_at=now,
                                        reason=f"resubmit --from {stage}"))
            rec.job_ids, rec.submitted_at = [str(next_id)], now
            next_id += 1
        ids = {rec.name: rec.job_ids for rec in manifest.stages}
        for rec in manifest.stages:
            for dep in rec.depends_on:
                dep.job_ids = list(ids.get(dep.stage, []))
        manifest.event("resubmit", from_stage=stage, stages=names)
    return manifest
