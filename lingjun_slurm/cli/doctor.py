"""`lingjun-slurm doctor SPEC`: the train job's pre-flight checks, submitted as a job of their own.

Arguments in, library calls (lingjun_slurm/doctor.py), output out. Registered in cli/main.py's LAZY_COMMANDS.

Exit codes: the judge's when the job gave a verdict: 0 every node passed, 1 bad nodes, 2 a problem of
the whole job; otherwise the CLI's (1 Slurm or the job failed without a verdict, 2 invalid spec or usage,
3/4/5 the SSH failures of --host/--cluster). --no-wait: 0 once the job is queued.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, Optional

import click

from .remote import Connections, destination, remote_options

EXIT_CODES = ("Exit codes: 0 every node passed, 1 bad nodes (or a run-time failure: Slurm, the job ended "
              "without a verdict), 2 a problem of the whole job (or invalid input or usage), 3 host unreachable, "
              "4 SSH authentication failed, 5 SSH host key unknown, changed or revoked, 130 interrupted by Ctrl-C.")
LOG_TAIL_LINES = 20


def _progress(line: str) -> None:
    click.echo(f"doctor: {line}", err=True)


def _reproduce(spec_file: Path, host: Optional[str], cluster: Optional[str]) -> str:
    argv = ["lingjun-slurm", "doctor", str(spec_file)]
    if host:
        argv += ["--host", host]
    if cluster:
        argv += ["--cluster", cluster]
    return shlex.join(argv)


@click.command(epilog=EXIT_CODES)
@click.argument("spec_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--no-wait", is_flag=True, help="Submit, print the job id and exit 0 (`status`/`logs` RUN follow it).")
@click.option("--json", "as_json", is_flag=True, help="Print the judge's verdict.json (with --no-wait: the job's "
                                                      "run id, job id and where verdict.json will be).")
@click.option("--poll-interval", type=click.FloatRange(0.1, 600), default=5.0, show_default=True,
              help="Seconds between queue polls (one squeue per poll).")
@remote_options
def doctor(spec_file: Path, no_wait: bool, as_json: bool, poll_interval: float, host: Optional[str],
           cluster: Optional[str], accept_new_host_key: bool) -> None:
    """Run the train stage's pre-flight checks on nodes like its own, as a job of their own.

    The job asks for the train stage's nodes, GPUs, partition and account and runs the checks a
    train job runs before training (GPUs, the NCCL environment against each node's sysfs, shared
    workdir and checkpoint directory, free space, clocks), in the run's staged image when there
    is one (never a second import; else on the hosts, said on stderr). It waits, prints one line
    per bad node and exits with the verdict: 0 all passed, 1 bad nodes, 2 a job-wide problem.
    With --host/--cluster it is submitted there over SSH, as `submit` is.
    """
    from ..clusters import cluster_defaults, load_spec_with_defaults
    from ..transport import LocalTransport

    dest = destination(host, cluster, accept_new_host_key)
    loaded, _applied = load_spec_with_defaults(spec_file, cluster_defaults(dest.config))
    with Connections(dest) as conns:
        t = conns.remote() if dest.remote else LocalTransport()
        _run(t, loaded, spec_file, dest, no_wait, as_json, poll_interval, host, cluster)


def _run(t: Any, loaded: Any, spec_file: Path, dest: Any, no_wait: bool, as_json: bool, poll_interval: float,
         host: Optional[str], cluster: Optional[str]) -> None:
    from .. import doctor as lib
    from .runs import SbatchMissing

    if not t.which("sbatch"):
        where = f"a non-interactive SSH session on {t.host}" if dest.remote else "this machine"
        raise SbatchMissing(f"sbatch is not on the PATH of {where}: doctor submits a Slurm job"
                            + ("; use --host [USER@]HOST or --cluster NAME" if not dest.remote else ""))
    choice = lib.choose_image(t, loaded.spec)
    job = lib.prepare(loaded, run_id=lib.new_doctor_id(loaded.spec.run.name), choice=choice,
                      reproduce=_reproduce(spec_file, host, cluster))
    if choice.note:
        click.echo(choice.note, err=True)
    manifest, job_id = lib.submit(t, job, cluster=dest.cluster)
    where = f" on {t.host}" if dest.remote else ""
    verdict_path = f"{job.verdict_dir(job_id)}/verdict.json"
    if no_wait:
        if as_json:
            click.echo(json.dumps({"run_id": job.run_id, "job_id": job_id, "run_dir": job.run_dir,
                                   "verdict": verdict_path}, indent=2))
        else:
            click.echo(job_id)
        _progress(f"submitted job {job_id}{where} (run {job.run_id}), {choice.describe()}; follow it with "
                  f"`lingjun-slurm status {job.run_id}` and `lingjun-slurm logs {job.run_id}`; the verdict: "
                  f"{verdict_path}")
        return
    _progress(f"submitted job {job_id}{where} (run {job.run_id}, {job.stage.resources.nodes} node(s)), "
              f"{choice.describe()}; waiting (Ctrl-C cancels it)")
    end = _wait(t, job, job_id, poll_interval)
    verdict = lib.read_verdict(t, job, job_id)
    if verdict is None:
        _log_tail(t, manifest)
        code = f", exit {end.exit_code}" if end.exit_code is not None else ""
        raise lib.DoctorFailed(f"doctor job {job_id} ended {end.state}{code} without a verdict ({verdict_path}): "
                               f"see `lingjun-slurm logs {job.run_id}`")
    if as_json:
        click.echo(json.dumps(verdict, indent=2))
    else:
        for line in lib.verdict_lines(verdict):
            click.echo(line)
        click.echo(lib.summary(verdict, job, job_id))
    code = int(verdict["exit"])
    if code:
        sys.exit(code)


def _wait(t: Any, job: Any, job_id: str, poll_interval: float) -> Any:
    """Until the job has ended: one squeue per poll, sacct or the job's end marker once it left
    the queue (nccltests/run.Waiter); Ctrl-C cancels the job."""
    from ..nodes.nccltests.run import Job, Waiter
    from ..slurm.client import SlurmCLI

    waiter = Waiter(t, SlurmCLI(t), poll_s=poll_interval, progress=_progress)
    return waiter.wait([Job(job_id, "doctor", job.run_dir)])[job_id]


def _log_tail(t: Any, manifest: Any) -> None:
    """The end of the job's log on stderr, when it ended without a verdict."""
    from ..runs.logs import stage_logs

    try:
        files = stage_logs(t, manifest, manifest.stages[0])
        text = t.read_text(files[0].path) if files else ""
    except Exception:  # noqa: BLE001 - the error below says where to look
        return
    lines = text.rstrip("\n").splitlines()[-LOG_TAIL_LINES:]
    if lines:
        click.echo(f"doctor: the end of {files[0].path}:", err=True)
        for line in lines:
            click.echo(f"  {line}", err=True)
