"""`lingjun-slurm doctor SPEC`: the train job's pre-flight (lingjun_slurm/injob/preflight) as a job of its own.

The same two steps the train script runs before training (slurm_templates/partials/faults.sh.j2):
one task per node, `python3 -m lingjun_slurm.stages preflight`, with the train step's srun flags
(plan.fault_vars' preflight_launcher: its container flags, its --container-env), then
`preflight-judge` on the batch host, whose exit status the job ends with: 0 every node passed,
1 bad nodes (named in verdict.json's bad_nodes), 2 a job-wide problem.

The job asks for what the train stage asks for (nodes, tasks, GPUs, CPUs, memory, partition,
account, QOS, reservation, constraint, --exclusive, sbatch_extra), less what only training needs
(--requeue, --signal, a dependency), under a short time limit (DOCTOR_TIME_S, or the train
stage's when that is shorter).

It is a run of its own, with one stage `doctor` (kind "doctor"), in <workdir>/runs/<run-id>/ like
any other: spec.yaml, plan.json (the spec's plan, as the train job's pre-flight reads it), the
shipped code in site/ (always: the checks are lingjun_slurm's, whatever run.ship_code says),
doctor.sbatch, manifest.json and an index entry, so `status`, `logs` and `cancel` work on it.
It takes no workdir lock (it writes nothing a training run reads) and resubmit refuses it.

The image is never imported a second time (choose_image): a .sqsh image of the spec is used as it
is; a registry image is used through the squashfs the newest run of this spec staged into the
image cache (<run_dir>/image/sqsh, a file of the cache named sha256-<hex>.sqsh), else through the
cache's own record of that image (sha256-<hex>.json); with neither, the checks run on the hosts
without a container, and say so.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .common.errors import LingjunError, SubmitError, UsageError
from .plan import PLAN_VAR, PYTHON, Plan, StagePlan, build_plan
from .common.shell import Shell, Word
from .spec.load import LoadedSpec
from .spec.models import Spec
from .transport.base import Transport

STAGE = "doctor"
SCRIPT = "doctor.sbatch"
TEMPLATE = "doctor.sbatch.j2"
DOCTOR_TIME_S = 900  # the job's time limit: the pre-flight step itself is bounded at 10 minutes (--time=10)
# sbatch options of the train stage that the doctor job does not take: it is never requeued, is
# not signalled before its time limit to save a checkpoint, and depends on nothing.
DROPPED_OPTIONS = frozenset({"requeue", "signal", "kill-on-invalid-dep", "dependency", "array"})
SQSH_NAME_RE = re.compile(r"^sha256-[0-9a-f]{64}\.sqsh$")
META_NAME_RE = re.compile(r"^sha256-([0-9a-f]{64})\.json$")

Echo = Callable[[str], None]


class DoctorFailed(LingjunError):
    """The doctor job ended without a verdict (cancelled, timed out, the script failed before the judge)."""


@dataclass(frozen=True)
class ImageChoice:
    """What the checks run in: `image` (a .sqsh path on the cluster), or the hosts (image None)."""

    image: Optional[str]
    source: str  # "spec", "run <run-id>", "cache", "none" (container.runtime: none), "unstaged"
    spec_image: Optional[str] = None
    note: Optional[str] = None  # said on stderr: the checks do not cover the image

    def describe(self) -> str:
        if self.image is None:
            return "on the hosts (container.runtime: none)" if self.source == "none" else \
                "on the hosts, without the container"
        where = {"spec": "the spec's", "cache": "from the image cache"}.get(self.source, f"staged by {self.source}")
        return f"in the image {self.image} ({where})"


def no_staged_image_note(image: str) -> str:
    return (f"no staged image for {image}: checking the nodes without the container; submit the run first to "
            "check the image too")


def cache_dir(spec: Spec) -> str:
    return (spec.container.cache_dir or f"{spec.run.workdir}/images").rstrip("/") or "/"


def _read(t: Transport, path: str) -> Optional[str]:
    try:
        return t.read_text(path)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except (OSError, LingjunError):
        return None


def _in_cache(t: Transport, cache: str, path: str) -> bool:
    """A file the image stage put into the cache: <cache_dir>/sha256-<hex>.sqsh, and there now."""
    folder, _, name = path.rpartition("/")
    return folder == cache and bool(SQSH_NAME_RE.fullmatch(name)) and t.exists(path)


def staged_by_runs(t: Transport, spec: Spec) -> Optional[tuple[str, str]]:
    """(sqsh path, run id) of the newest run in the workdir whose plan stages this spec's image,
    when its squashfs is still in the cache; None otherwise. Only runs that staged an image
    (<run_dir>/image/sqsh) are read further (plan.json, manifest.json)."""
    image = spec.container.image
    runs = f"{spec.run.workdir.rstrip('/')}/runs"
    found: list[tuple[float, str, str]] = []
    for name in t.listdir(runs):
        run_dir = f"{runs}/{name}"
        sqsh = _read(t, f"{run_dir}/image/sqsh")
        if sqsh is None:
            continue
        try:
            plan = json.loads(_read(t, f"{run_dir}/plan.json") or "null")
            staged = ((plan or {}).get("settings") or {}).get("container") or {}
            if staged.get("image") != image:
                continue
            manifest = json.loads(_read(t, f"{run_dir}/manifest.json") or "null") or {}
            created = float(manifest.get("created_at") or 0)
        except (ValueError, TypeError, AttributeError):
            continue
        found.append((created, name, sqsh.strip()))
    if not found:
        return None
    _created, run_id, path = max(found)
    return (path, run_id) if _in_cache(t, cache_dir(spec), path) else None


def staged_in_cache(t: Transport, spec: Spec) -> Optional[str]:
    """The cache's own record of this image (sha256-<hex>.json, images/cache.py): the squashfs of
    the entry last used, if any is there."""
    cache = cache_dir(spec)
    best: Optional[tuple[float, str]] = None
    for name in t.listdir(cache):
        match = META_NAME_RE.fullmatch(name)
        if not match:
            continue
        try:
            meta = json.loads(_read(t, f"{cache}/{name}") or "null") or {}
            if meta.get("image") != spec.container.image:
                continue
            used = float(meta.get("last_used") or meta.get("created") or 0)
        except (ValueError, TypeError, AttributeError):
            continue
        path = f"{cache}/sha256-{match.group(1)}.sqsh"
        if (best is None or used > best[0]) and _in_cache(t, cache, path):
            best = (used, path)
    return best[1] if best else None


def choose_image(t: Transport, spec: Spec) -> ImageChoice:
    """The run's own image, never a second import (see the module's docstring)."""
    container = spec.container
    if container.runtime != "pyxis":
        return ImageChoice(None, "none")
    image = container.image or ""
    from .container import is_squashfs_path

    if is_squashfs_path(image):
        return ImageChoice(image, "spec", image)
    got = staged_by_runs(t, spec)
    if got is not None:
        return ImageChoice(got[0], f"run {got[1]}", image)
    cached = staged_in_cache(t, spec)
    if cached is not None:
        return ImageChoice(cached, "cache", image)
    return ImageChoice(None, "unstaged", image, note=no_staged_image_note(image))


def doctor_spec(spec: Spec, choice: ImageChoice) -> Spec:
    """The spec the doctor's plan is built from: pre-flight on, the code shipped (the checks are
    lingjun_slurm's own, in the tasks and on the batch host), and the chosen image as a .sqsh with
    no container name (pyxis removes an unnamed container at the end of its step); without an
    image, no container at all, and the host side of the checkpoint directory."""
    update: dict[str, Any] = {
        "run": spec.run.model_copy(update={"ship_code": True}),
        "training": spec.training.model_copy(update={"preflight": True}),
    }
    if choice.image is not None:
        update["container"] = spec.container.model_copy(update={"image": choice.image, "stage": "never",
                                                                "name": None})
    elif spec.container.runtime == "pyxis":
        from .container import host_side, mounts_with_workdir
        from .spec.resolve import checkpoint_dir

        on_host = host_side(checkpoint_dir(spec), mounts_with_workdir(spec.container, spec.run.workdir))
        update["container"] = spec.container.model_copy(update={"runtime": "none"})
        update["checkpoint"] = spec.checkpoint.model_copy(update={"dir": on_host})
    return spec.model_copy(update=update)


def _sbatch(train: StagePlan, job_name: str) -> tuple[tuple[str, Optional[str]], ...]:
    from .common.timefmt import format_time, parse_time

    opts = {k: v for k, v in train.sbatch if k not in DROPPED_OPTIONS}
    opts["job-name"] = job_name
    opts["no-requeue"] = None
    limit = DOCTOR_TIME_S
    if opts.get("time"):
        try:
            limit = min(limit, parse_time(str(opts["time"])))
        except ValueError:
            pass
    opts["time"] = format_time(limit)
    return tuple(sorted(opts.items()))


def _is_name_flag(word: Word) -> bool:
    text = word.expr if isinstance(word, Shell) else word
    return text.startswith("--container-name")


@dataclass
class DoctorJob:
    loaded: LoadedSpec
    plan: Plan          # the spec's plan (as doctor_spec changed it): plan.json
    stage: StagePlan    # the doctor stage (its script, job name, resources, the pre-flight's srun)
    image: ImageChoice
    run_dir: str
    files: dict[str, str] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.plan.run_id

    def verdict_dir(self, job_id: str) -> str:
        return f"{self.run_dir}/preflight/{job_id}-0"


def doctor_name(name: str) -> str:
    return f"{name}-{STAGE}"


def new_doctor_id(name: str, now: Optional[float] = None) -> str:
    from .submit import new_run_id

    return new_run_id(doctor_name(name[:32].rstrip(".-_") or "run"), now)


def prepare(loaded: LoadedSpec, *, run_id: str, choice: ImageChoice, reproduce: str) -> DoctorJob:
    """The doctor's plan, stage and files (pure: nothing is written)."""
    spec = loaded.spec
    if spec.stages.train.skip:
        line = loaded.doc.line_of(("stages", "train", "skip")) if loaded.doc is not None else None
        where = f"{loaded.source}:{line}" if line else loaded.source
        raise UsageError(f"{where}: stages.train.skip: the train stage is skipped, and doctor checks the nodes "
                         "the train stage asks for; nothing submitted")
    from .submit import run_dir_for

    plan = build_plan(doctor_spec(spec, choice), run_id=run_id, spec_sha256=loaded.sha256, source=loaded.source,
                      reproduce=reproduce, executor="slurm")
    train = plan.stage("train")
    faults = train.vars["faults"]
    launcher = tuple(w for w in faults["preflight_launcher"] if not _is_name_flag(w))
    assert launcher, "doctor_spec turns the pre-flight on"
    job_name = f"{run_id}-{STAGE}"
    stage = dataclasses.replace(
        train, name=STAGE, kind=STAGE, script=SCRIPT, job_name=job_name, sbatch=_sbatch(train, job_name),
        depends_on=(), launcher=launcher,
        commands=((PYTHON, "-m", "lingjun_slurm.stages", "preflight", "--plan", PLAN_VAR),),
        array=None, vars={"ship_code": True, "image": choice.image, "image_source": choice.source})
    job = DoctorJob(loaded, plan, stage, choice, run_dir_for(spec.run.workdir, run_id))
    job.files = {SCRIPT: render(job), "plan.json": json.dumps(plan.to_json(), indent=2) + "\n"}
    return job


def render(job: DoctorJob) -> str:
    from .render import render_template

    return render_template(TEMPLATE, plan=job.plan, stage=job.stage, sbatch=job.stage.sbatch, uses_plan=True,
                           title=f"doctor: the pre-flight checks of spec {job.loaded.source} as a job",
                           image=job.image.image, image_note=job.image.describe())


def submit(t: Transport, job: DoctorJob, *, cluster: str = "", echo: Echo = lambda line: None) -> tuple[Any, str]:
    """Write the run directory, ship the code, sbatch doctor.sbatch; (manifest, job id).

    Slurm is asked first (`scontrol show config`, as submit does): a cluster that does not answer
    stops here, before anything is written. An sbatch that fails marks the record failed."""
    from . import bundle
    from .runs.index import RunIndex, entry_for
    from .runs.manifest import ClusterRecord, DefaultsRecord, save_manifest
    from .slurm.client import SlurmCLI
    from .submit import Prepared, new_manifest, stage_record, write_run_dir

    sched = SlurmCLI(t)
    info = sched.cluster_info()
    wheels = bundle.collect([])
    index = RunIndex()
    index.check()
    # Named <run.name>-doctor in the record and the index: RUN given as the spec's run.name still
    # means its newest training run (runs/index.py resolve), `<run.name>-doctor` its newest doctor job.
    stage_plan = dataclasses.replace(job.plan, stages=(job.stage,), name=doctor_name(job.plan.name))
    prep = Prepared(job.loaded, stage_plan, dict(job.files), job.run_dir, DefaultsRecord(cluster=cluster))
    write_run_dir(t, prep, new=True)
    shipped = bundle.upload(t, job.run_dir, wheels)
    manifest = new_manifest(t, prep, "slurm", ClusterRecord(
        name=info.name, slurm_version=info.slurm_version, accounting=info.accounting,
        jobcomp_type=info.jobcomp_type, jobcomp_loc=info.jobcomp_loc))
    manifest.stages = [stage_record(job.stage)]
    manifest.shipped = shipped
    manifest.event("doctor", image=job.image.image, image_source=job.image.source)
    save_manifest(t, manifest)
    index.add(entry_for(manifest.run_id, manifest.name, manifest.created_at, "slurm", t.kind, t.host,
                        manifest.run_dir, manifest.spec.source, cluster=cluster))
    try:
        job_id = sched.submit(SCRIPT, cwd=job.run_dir, hold=False)
    except LingjunError as exc:
        manifest.state = "failed"
        manifest.event("submit-failed", stage=STAGE, error=str(exc), cancelled=[])
        save_manifest(t, manifest)
        raise SubmitError(f"doctor job of run {manifest.run_id} not submitted: {exc}") from None
    rec = manifest.stage(STAGE)
    rec.job_ids = [job_id]
    rec.submitted_at = round(time.time(), 3)
    manifest.state = "submitted"
    manifest.event("submit", stages=[STAGE])
    save_manifest(t, manifest)
    return manifest, job_id


def read_verdict(t: Transport, job: DoctorJob, job_id: str) -> Optional[dict[str, Any]]:
    text = _read(t, f"{job.verdict_dir(job_id)}/verdict.json")
    if text is None:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("exit") in (0, 1, 2) else None


def verdict_lines(verdict: dict[str, Any]) -> list[str]:
    """The judge's lines (as preflight/judge.py prints them), each bad node's further reasons under it."""
    from .injob.preflight import PREFIX
    from .injob.preflight.judge import late_lines

    lines = []
    for node, why in (verdict.get("bad_nodes") or {}).items():
        lines.append(f"{PREFIX} node {node}: {why}")
        for extra in (verdict.get("reasons") or {}).get(node, [])[1:]:
            lines.append(f"    {extra.get('check')}: {extra.get('reason')}")
    for problem in verdict.get("problems") or []:
        lines.append(f"{PREFIX} {problem}")
    lines += late_lines(verdict)
    if verdict.get("ok"):
        skew = verdict.get("skew_s")
        lines.append(f"{PREFIX} {len(verdict.get('nodes') or [])} nodes passed"
                     + (f" (clocks within {skew:.2f} s)" if isinstance(skew, (int, float)) else ""))
    return lines


def summary(verdict: dict[str, Any], job: DoctorJob, job_id: str) -> str:
    nodes = verdict.get("nodes") or []
    bad = list(verdict.get("bad_nodes") or {})
    code = verdict.get("exit")
    where = f"job {job_id}, {job.image.describe()}; {job.verdict_dir(job_id)}/verdict.json"
    if code == 0:
        return f"doctor: all {len(nodes)} nodes passed ({' '.join(nodes)}); {where}"
    if code == 1:
        return (f"doctor: {len(bad)} of {len(nodes)} nodes failed: {', '.join(bad)} (exit 1: exclude them, e.g. "
                f"sbatch --exclude={','.join(bad)}); {where}")
    return (f"doctor: a problem of the whole job, not of single nodes (exit 2: the spec, the image or the cluster's "
            f"configuration)" + (f"; also failed: {', '.join(bad)}" if bad else "") + f"; {where}")
