"""`lingjun-slurm nccl-test`: render/submit NVIDIA nccl-tests across N nodes, wait, and report busbw by
message size (table, PNG chart, pass/fail where a figure is published), or bisect node pairs to
find a slow node. Registered in cli/main.py. The work lives in lingjun_slurm/nodes/nccltests/; docs/nccl-tests.md.

Exit codes: 0 pass (or measurements without a verdict), 1 a verdict failed or a job failed, 2 bad input,
3/4/5 the SSH failures of --host/--cluster (unreachable, authentication, host key).

With --host/--cluster the job is rendered here, its directory (--outdir, or <clusters.yaml workdir>/nccl-tests/...)
is on the cluster, sbatch/squeue run there over one SSH connection, and the outputs are read back; the chart is
drawn here and uploaded beside them (a --chart PATH is a path on this machine).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import click

from .remote import EXIT_CODES, Connections, destination, remote_options
from ..common.errors import EXIT_FAILURE, UsageError

if TYPE_CHECKING:
    from ..nodes.nccltests.plan import NcclJob
    from ..nodes.nccltests.report import Report


def _size(value: str, option: str) -> int:
    from ..nodes.nccltests.sizes import parse_size

    try:
        return parse_size(value)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _network(profile: Optional[str], instance_type: Optional[str], sets: tuple[str, ...],
             unsets: tuple[str, ...], required: bool) -> tuple[Any, Any]:
    """(Profile or None, resolved NetworkEnv or None) from --profile/--instance-type/--set/--unset."""
    from .. import network

    if profile and instance_type:
        prof = network.get_profile(profile)
        if instance_type not in prof.instance_types:
            raise UsageError(f"--instance-type {instance_type!r} is not one of profile {profile!r}'s instance types")
    elif not profile and not instance_type:
        if required:
            raise UsageError("give --profile NAME or --instance-type TYPE (see `lingjun-slurm nccl-env --list`; "
                             "'tcp' or 'generic-ib' for other clusters): the NCCL settings decide what is measured")
        return None, None
    prof = network.get_profile(profile) if profile else network.profile_for_instance(instance_type or "")
    overrides: dict[str, Optional[str]] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE")
        _env_name(key, f"--set {item!r}")
        overrides[key] = value
    for key in unsets:
        _env_name(key, f"--unset {key!r}")
        overrides[key] = None
    return prof, network.resolve(prof, overrides, scope="nccl-tests")


def _env_name(key: str, option: str) -> None:
    """The name lands unquoted on `export NAME=...`/`unset NAME` lines and in pyxis' comma-separated
    --container-env list: an environment variable name only."""
    from ..spec.models import ENV_NAME_RE

    if not re.fullmatch(ENV_NAME_RE, key):
        raise UsageError(f"{option}: {key!r} is not an environment variable name (letters, digits and '_', "
                         "not starting with a digit)")


def _references(prof: Any, expects: tuple[str, ...]) -> list[Any]:
    from ..nodes.nccltests.verdict import parse_expect, profile_references

    refs = []
    for text in expects:
        try:
            refs.append(parse_expect(text))
        except ValueError as exc:
            raise UsageError(f"--expect: {exc}") from None
    return refs + (profile_references(prof) if prof else [])


def _reproduce(params: dict[str, Any], out_dir: str) -> tuple[str, ...]:
    """The command that renders the same script (for the script's header)."""
    argv = ["lingjun-slurm", "nccl-test", "--render-only", out_dir]
    for name in ("profile", "instance_type", "nodes", "nodelist", "gpus_per_node", "partition", "account", "qos",
                 "reservation", "time", "image", "tests_dir", "mpi", "ops", "min_bytes", "max_bytes", "step_factor",
                 "iters", "warmup_iters", "job_name"):
        value = params.get(name)
        if value is not None and value != "":
            argv += [f"--{name.replace('_', '-')}", str(value)]
    argv += [f"--set={s}" for s in params["sets"]] + [f"--unset={u}" for u in params["unsets"]]
    argv += [f"--mount={m}" for m in params["mounts"]]
    argv += [] if params["exclusive"] else ["--no-exclusive"]
    argv += ["--no-container"] if params["no_container"] else []
    return tuple(argv)


def _echo_progress(line: str) -> None:
    click.echo(f"nccl-test: {line}", err=True)


def _emit(report: "Report", as_json: bool) -> None:
    from ..nodes.nccltests.report import format_plain, to_json

    if as_json:
        click.echo(json.dumps(to_json(report), indent=2))
        return
    try:
        import rich  # noqa: F401
        fancy = sys.stdout.isatty()
    except ImportError:
        fancy = False
    if fancy:
        print_rich(report)
    else:
        click.echo(format_plain(report), nl=False)


def _chart_target(t: Any, chart_path: Optional[str], default: str) -> tuple[str, Optional[str]]:
    """(where to draw the PNG on this machine, where to upload it on the host or None)."""
    if chart_path:
        return chart_path, None
    if t.kind == "local":
        return default, None
    import tempfile

    return os.path.join(tempfile.mkdtemp(prefix="lingjun-chart-"), "busbw.png"), default


def _publish_chart(t: Any, report: Any, drawn: str, upload: Optional[str]) -> None:
    """Copy a chart drawn here to the host; report.chart then names HOST:PATH."""
    if upload is None:
        return
    import shutil

    try:
        if report.chart:
            t.put(Path(drawn), upload, 0o644)
            report.chart = f"{t.host}:{upload}"
    finally:
        shutil.rmtree(os.path.dirname(drawn), ignore_errors=True)


def _chart(report: "Report", path: str) -> None:
    from ..nodes.nccltests.chart import Threshold, series_of, write_chart

    series = [s for o in report.ops if o.output.result is not None
              for s in [series_of(o.output.op, o.output.result)] if s is not None]
    if not series:
        return
    thresholds = tuple(Threshold(f"{o.verdict.reference.describe()}", o.verdict.reference.busbw_gbps)
                       for o in report.ops if o.verdict.reference is not None)
    report.chart = _write_chart(write_chart, path, series, title=report.title, thresholds=thresholds)


def _write_chart(write: Callable[..., str], path: str, *args: Any, **kwargs: Any) -> Optional[str]:
    """The chart, or a warning when it cannot be written: the report (and its verdict) still comes."""
    from ..common.errors import LingjunError

    try:
        return write(path, *args, **kwargs)
    except UsageError:
        raise
    except LingjunError as exc:
        click.echo(f"warning: no chart: {exc}", err=True)
        return None


@click.command("nccl-test", epilog=EXIT_CODES)
@click.argument("report_paths", nargs=-1, metavar="[FILE|DIR]...")
@click.option("--profile", help="Network profile (its NCCL block, and its published busbw figure if any).")
@click.option("--instance-type", help="Instance type / VM size that selects the profile.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override or add an NCCL variable.")
@click.option("--unset", "unsets", multiple=True, metavar="KEY", help="Leave a profile variable out.")
@click.option("--nodes", type=int, help="Number of nodes (default 2; the size of --nodelist when given).")
@click.option("--nodelist", help="Slurm host list to run on, e.g. gpu[01-04] (needed by --bisect).")
@click.option("--gpus-per-node", type=int, default=8, show_default=True,
              help="GPUs (= tasks, nccl-tests -g 1) per node; 0: no GPU request, one task per node.")
@click.option("--partition", help="Slurm partition.")
@click.option("--account", help="Slurm account.")
@click.option("--qos", help="Slurm QOS.")
@click.option("--reservation", help="Slurm reservation.")
@click.option("--time", "time_limit", default="00:30:00", show_default=True, help="Time limit of each job.")
@click.option("--exclusive/--no-exclusive", default=True, show_default=True, help="Whole nodes (--exclusive).")
@click.option("--image", default=None, help="pyxis image with nccl-tests [default: nvcr.io#nvidia/pytorch:25.06-py3, "
                                            "whose <op>_perf_mpi binaries are on PATH].")
@click.option("--no-container", is_flag=True, help="Run the binaries on the hosts (no pyxis).")
@click.option("--mount", "mounts", multiple=True, metavar="SRC:DST[:FLAGS]", help="Extra container mount.")
@click.option("--tests-dir", default="", help="Directory of the nccl-tests binaries (default: PATH), e.g. "
                                              "/opt/nccl-tests/build.")
@click.option("--mpi", default="pmix", show_default=True, help="srun --mpi type matching the binaries' MPI.")
@click.option("--ops", default="all_reduce,all_gather", show_default=True, help="Comma-separated tests.")
@click.option("--min-bytes", default="8", show_default=True, help="nccl-tests -b.")
@click.option("--max-bytes", default="16G", show_default=True, help="nccl-tests -e.")
@click.option("--step-factor", type=int, default=2, show_default=True, help="nccl-tests -f.")
@click.option("--iters", type=int, default=20, show_default=True, help="nccl-tests -n.")
@click.option("--warmup-iters", type=int, default=5, show_default=True, help="nccl-tests -w.")
@click.option("--expect", "expects", multiple=True, metavar="OP=GBPS[@SIZE]",
              help="Your own expected busbw (peak, or at SIZE) for a verdict, e.g. all_reduce=350@16G.")
@click.option("--job-name", default=None, help="Job name [default: nccl-test, nccl-bisect].")
@click.option("--outdir", type=click.Path(file_okay=False), help="Run directory on storage the nodes share "
                                                                 "[default: ./nccl-test-<date>-<time>-<6 hex>].")
@click.option("--render-only", "render_dir", type=click.Path(file_okay=False),
              help="Write DIR/nccl-test.sbatch and exit (submit it yourself, then --report DIR).")
@click.option("--no-wait", is_flag=True, help="Submit, print the job id and exit.")
@click.option("--report", "report_mode", is_flag=True, help="Report on existing outputs (FILE|DIR...), submit nothing.")
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False), help="PNG path [default: <outdir>/busbw.png].")
@click.option("--no-chart", is_flag=True, help="Write no chart (no matplotlib needed).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (report.json, schema 2).")
@click.option("--report-json", "report_json", type=click.Path(dir_okay=False),
              help="With --report: where to write report.json [default: beside the outputs, as the chart].")
@click.option("--bisect", is_flag=True, help="Find slow nodes of --nodelist with 2-node all_reduce pairs.")
@click.option("--poll-interval", type=click.FloatRange(0.1, 600), default=5.0, show_default=True,
              help="Seconds between queue polls (one squeue covers every job).")
@remote_options
def nccl_test(report_paths: tuple[str, ...], **params: Any) -> None:
    """Run nccl-tests (all_reduce_perf, all_gather_perf) across nodes; report busbw and a verdict.

    Renders an sbatch script (pyxis container or host binaries, the profile's NCCL block), submits
    it, waits, then prints busbw by message size, writes a PNG chart and gives PASS/FAIL against
    the profile's published figure (Azure ND: Azure's own health-check threshold) or --expect;
    other profiles are measured without a verdict. Exit 0 pass or no verdict, 1 fail, 2 bad input.
    With --host/--cluster everything runs on that cluster over one SSH connection; --partition,
    --account and --profile default to the cluster's entry in clusters.yaml.
    """
    dest = destination(params.pop("host"), params.pop("cluster"), params.pop("accept_new_host_key"))
    cfg = dest.config
    if cfg is not None:  # the command line wins over clusters.yaml
        params["partition"] = params["partition"] or cfg.partition
        params["account"] = params["account"] or cfg.account
        if not params["profile"] and not params["instance_type"]:
            params["profile"] = cfg.network_profile
    with Connections(dest) as conns:
        if params["report_mode"]:
            _report_mode(list(report_paths), params, conns)
            return
        if report_paths:
            raise UsageError(f"unexpected argument(s) {' '.join(report_paths)}: files are read only with --report")
        _run_mode(params, conns)


def _report_mode(paths: list[str], p: dict[str, Any], conns: Connections) -> None:
    from ..nodes.nccltests.report import build
    from ..nodes.nccltests.results import load_paths
    from ..nodes.nccltests.verdict import Shape
    from ..transport import LocalTransport

    if not paths:
        raise UsageError("--report needs the output file(s) or run directory(ies) to read")
    remote = conns.dest.remote
    if remote and any(not x.startswith("/") for x in paths):
        raise UsageError("--report with --host/--cluster: give absolute paths on the cluster")
    t = conns.remote() if remote else LocalTransport()
    missing = [x for x in paths if not (t.exists(x) if remote else os.path.exists(x))]
    if missing:
        raise UsageError(f"--report: no such file or directory{' on ' + t.host if remote else ''}: "
                         f"{', '.join(missing)}")
    prof, _ = _network(p["profile"], p["instance_type"], (), (), required=False)
    refs = _references(prof, p["expects"])
    if not p["no_chart"]:
        from ..nodes.nccltests.chart import require_matplotlib
        require_matplotlib()
    outputs = load_paths(t, paths if remote else [os.path.abspath(x) for x in paths])
    expected = Shape(p["nodes"], max(1, p["gpus_per_node"])) if p["nodes"] else None
    title = f"nccl-tests report: {paths[0]}" + (f" and {len(paths) - 1} more" if len(paths) > 1 else "")
    report = build(outputs, title=title, expected=expected, references=refs,
                   profile=prof.name if prof else None)
    # The chart and report.json go beside the outputs: into the run directory, or the first file's directory.
    if remote:
        first = paths[0].rstrip("/")
        directory = first if t.listdir(first) else first.rsplit("/", 1)[0] or "/"
    else:
        first = os.path.abspath(paths[0])
        directory = first if os.path.isdir(first) else os.path.dirname(first)
    if not p["no_chart"]:
        drawn, upload = _chart_target(t, p["chart_path"], f"{directory.rstrip('/')}/busbw.png")
        _chart(report, drawn)
        _publish_chart(t, report, drawn, upload)
    if p["report_json"]:  # a path on this machine, as --chart is
        _write_report_json(LocalTransport(), report, p["report_json"])
    else:
        target = t if remote else LocalTransport()
        path = f"{directory.rstrip('/')}/report.json"
        report.jobs = _jobs_of_run(target, path)  # a run's own report.json keeps its job ends
        _write_report_json(target, report, path)
    _emit(report, p["as_json"])
    if not report.ok:
        sys.exit(EXIT_FAILURE)


def _jobs_of_run(t: Any, path: str) -> list[Any]:
    """The job ends that a run (`nccl-test` without --report) recorded in its report.json, so that
    reporting on its directory again neither drops them nor forgets a failed job."""
    from ..common.errors import LingjunError
    from ..nodes.nccltests.run import JobEnd

    try:
        doc = json.loads(t.read_text(path)) if t.exists(path) else {}
        jobs = doc.get("jobs") if isinstance(doc, dict) else None
        return [JobEnd(str(j["job_id"]), str(j["state"]), j.get("exit_code"), j.get("reason"), j.get("nodes"))
                for j in jobs or [] if isinstance(j, dict) and "job_id" in j and "state" in j]
    except (LingjunError, ValueError, TypeError):
        return []


def _write_report_json(t: Any, report: "Report", path: str) -> None:
    """report.json (schema 2, docs/nccl-tests.md) for the run report and other readers. A path that
    cannot be written (a read-only directory of outputs) is a warning, as for the chart: the report
    on stdout and the exit code still come."""
    from ..common.errors import LingjunError
    from ..nodes.nccltests.report import to_json

    try:
        t.write_atomic(path, json.dumps(to_json(report), indent=2) + "\n")
    except LingjunError as exc:
        click.echo(f"warning: no report.json: {exc}", err=True)
        return
    report.json_path = path if t.kind == "local" else f"{t.host}:{path}"


def _job(p: dict[str, Any], prof: Any, net: Any, out_dir: str, nodes: Optional[int]) -> "NcclJob":
    from ..nodes.nccltests.plan import DEFAULT_IMAGE, NcclJob
    from ..common.timefmt import parse_time

    try:
        time_s = parse_time(p["time_limit"])
    except ValueError as exc:
        raise UsageError(f"--time: {exc}") from None
    if p["no_container"] and (p["image"] or p["mounts"]):
        raise UsageError("--no-container runs on the hosts: drop --image and --mount")
    ops = tuple(op.strip() for op in p["ops"].split(",") if op.strip())
    params = dict(p, time=p["time_limit"], ops=",".join(ops), nodes=nodes, out_dir=out_dir)
    return NcclJob(
        job_name=p["job_name"] or ("nccl-bisect" if p["bisect"] else "nccl-test"), out_dir=out_dir, network=net,
        nodes=nodes, nodelist=p["nodelist"], gpus_per_node=p["gpus_per_node"], partition=p["partition"],
        account=p["account"], qos=p["qos"], reservation=p["reservation"], time_s=time_s, exclusive=p["exclusive"],
        image=None if p["no_container"] else (p["image"] or DEFAULT_IMAGE), mounts=tuple(p["mounts"]),
        tests_dir=p["tests_dir"], mpi=p["mpi"], ops=ops, min_bytes=_size(p["min_bytes"], "--min-bytes"),
        max_bytes=_size(p["max_bytes"], "--max-bytes"), step_factor=p["step_factor"], iters=p["iters"],
        warmup_iters=p["warmup_iters"], reproduce=_reproduce(params, out_dir))


def _out_dir(p: dict[str, Any], conns: Connections) -> str:
    """The job's directory: --render-only/--outdir, else ./nccl-test-<stamp> (remote: under the cluster's workdir)."""
    # The default is unique: two runs started in the same second must not share their outputs.
    stamp = f"nccl-test-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    given = p["render_dir"] or p["outdir"]
    dest = conns.dest
    if not dest.remote:
        return str(Path(given or stamp).expanduser().absolute())
    if given:
        if not given.startswith("/"):
            raise UsageError(f"--outdir {given!r}: with --host/--cluster give an absolute directory on the cluster's "
                             "shared storage")
        return given.rstrip("/") or "/"
    if dest.config is not None and dest.config.workdir:
        return f"{dest.config.workdir.rstrip('/')}/nccl-tests/{stamp}"
    raise UsageError("with --host, give --outdir DIR: an absolute directory on storage the cluster's nodes share "
                     "(or use --cluster with a workdir in clusters.yaml)")


def _run_mode(p: dict[str, Any], conns: Connections) -> None:
    from ..nodes.nccltests.plan import check
    from ..transport import LocalTransport

    if p["report_json"]:
        raise UsageError("--report-json is for --report: a run writes <outdir>/report.json")
    prof, net = _network(p["profile"], p["instance_type"], p["sets"], p["unsets"], required=True)
    refs = _references(prof, p["expects"])
    if p["render_dir"] and (p["outdir"] or p["no_wait"] or p["bisect"]):
        raise UsageError("--render-only writes the script and exits: it takes no --outdir, --no-wait or --bisect "
                         "(bisection rounds depend on the results of the previous round)")
    if p["bisect"] and not p["nodelist"]:
        raise UsageError("--bisect needs --nodelist (the nodes to test, at least 3)")
    if p["bisect"] and p["no_wait"]:
        raise UsageError("--bisect takes no --no-wait: each round is chosen from the results of the one before")
    out_dir = _out_dir(p, conns)
    t = conns.remote() if conns.dest.remote else LocalTransport()
    nodes = p["nodes"] if p["nodes"] is not None else (None if p["nodelist"] else 2)
    names: list[str] = []
    if not p["render_dir"]:
        # A fresh host: say what to install or configure first, before scontrol runs, matplotlib is
        # asked for or anything is written (session.submit is told, and does not ask again).
        from ..nodes.nccltests.session import require_slurm
        require_slurm(t, ("sbatch", "scontrol") if p["nodelist"] else ("sbatch",))
    if p["nodelist"] and (not p["render_dir"] or t.which("scontrol")):
        from ..nodes.nccltests.session import expand_nodelist, slurm_conf_problem
        try:
            if slurm_conf_problem(t):  # --render-only: not worth Slurm's 60 s of retries
                raise UsageError(f"--nodelist {p['nodelist']!r} not counted: {slurm_conf_problem(t)}")
            names = expand_nodelist(t, p["nodelist"])
        except UsageError as exc:
            if not p["render_dir"]:
                raise
            # Rendering needs no count: Slurm sizes the job from the list. Say why it is missing.
            click.echo(f"warning: {exc} (the script has no --nodes line)", err=True)
        if names and p["nodes"] is not None and p["nodes"] != len(names):
            raise UsageError(f"--nodes {p['nodes']} but --nodelist {p['nodelist']!r} has {len(names)} node(s)")
        nodes = len(names) or nodes
    job = _job(p, prof, net, out_dir, nodes)
    check(job)
    _check_expects(job, [r for r in refs if r.nodes is None], ("all_reduce",) if p["bisect"] else job.ops)
    if p["render_dir"]:
        _render_only(t, job)
        return
    if not p["no_chart"]:
        from ..nodes.nccltests.chart import require_matplotlib
        require_matplotlib()
    if p["bisect"]:
        _bisect(t, job, names, refs, p)
        return
    _submit_and_report(t, job, prof, refs, p)


def _check_expects(job: "NcclJob", mine: list[Any], ops: tuple[str, ...]) -> None:
    """An --expect the job cannot answer is refused before anything is submitted: its op is not run,
    or its size is not one of the sizes nccl-tests measures (-b, -b*f, -b*f^2, ... up to -e)."""
    from ..nodes.nccltests.sizes import human_size, nccl_size

    sizes = []
    size = job.min_bytes
    while size <= job.max_bytes:
        sizes.append(size)
        size *= job.step_factor
    for ref in mine:
        if ref.op not in ops:
            raise UsageError(f"--expect {ref.op}=...: {ref.op} is not tested (the tests run: {', '.join(ops)})")
        if ref.size_bytes is not None and ref.size_bytes not in sizes:
            raise UsageError(f"--expect {ref.op}={ref.busbw_gbps:g}@{nccl_size(ref.size_bytes)}: "
                             f"{human_size(ref.size_bytes)} is not measured: --min-bytes {nccl_size(job.min_bytes)}, "
                             f"--max-bytes {nccl_size(job.max_bytes)} and --step-factor {job.step_factor} measure "
                             f"{human_size(sizes[0])}..{human_size(sizes[-1])} (x{job.step_factor})")


def _render_only(t: Any, job: "NcclJob") -> None:
    from ..nodes.nccltests.session import write_script

    path = write_script(t, job)
    click.echo(f"wrote {path}")
    click.echo(f"submit with: cd {shlex.quote(job.out_dir)} && sbatch nccl-test.sbatch")
    click.echo(f"then report with: lingjun-slurm nccl-test --report {shlex.quote(job.out_dir)} "
               f"--profile {shlex.quote(job.network.profile)}")


def _waiter(t: Any, p: dict[str, Any], progress: Callable[[str], None]) -> Any:
    from ..nodes.nccltests.run import Waiter
    from ..slurm.client import SlurmCLI

    return Waiter(t, SlurmCLI(t), poll_s=p["poll_interval"], progress=progress)


def _submit_and_report(t: Any, job: "NcclJob", prof: Any, refs: list[Any], p: dict[str, Any]) -> None:
    from ..nodes.nccltests import session
    from ..nodes.nccltests.report import build, to_json
    from ..nodes.nccltests.verdict import Shape

    waiter = _waiter(t, p, _echo_progress)
    if p["no_wait"]:
        submitted = session.submit(t, waiter.sched, job, checked=True)
        click.echo(submitted.job_id)
        _echo_progress(f"submitted job {submitted.job_id}; when it has ended: lingjun-slurm nccl-test --report "
                       f"{shlex.quote(job.out_dir)} --profile {shlex.quote(prof.name)}")
        return
    ends, outputs = session.run(t, waiter, job, progress=_echo_progress, checked=True)
    title = (f"nccl-tests on {job.shape()}, profile {prof.name}, job {ends[0].job_id} "
             f"({ends[0].state}), {job.out_dir}")
    report = build(outputs, title=title, expected=Shape(job.nodes, job.tasks_per_node), references=refs,
                   profile=prof.name, jobs=ends)
    report.log = f"{job.out_dir}/{job.job_name}-{ends[0].job_id}.out"
    if not p["no_chart"]:
        drawn, upload = _chart_target(t, p["chart_path"], f"{job.out_dir}/busbw.png")
        _chart(report, drawn)
        _publish_chart(t, report, drawn, upload)
    t.write_atomic(f"{job.out_dir}/report.json", json.dumps(to_json(report), indent=2) + "\n")
    report.json_path = f"{job.out_dir}/report.json" if t.kind == "local" else f"{t.host}:{job.out_dir}/report.json"
    _emit(report, p["as_json"])
    if not report.ok:
        sys.exit(EXIT_FAILURE)


def _bisect(t: Any, job: "NcclJob", names: list[str], refs: list[Any], p: dict[str, Any]) -> None:
    from ..nodes.nccltests.bisect_run import bisect_json, format_bisect, run_bisection
    from ..nodes.nccltests.chart import Threshold, series_of, write_chart
    from ..nodes.nccltests.results import load_op

    if len(names) < 3:
        raise UsageError(f"--bisect needs at least 3 nodes; --nodelist {p['nodelist']!r} has {len(names)}")
    mine = [r for r in refs if r.op == "all_reduce" and r.nodes is None]
    reference = mine[0] if mine else None  # published figures are for 1 node; pairs are 2 nodes
    t.mkdir(job.out_dir)
    report = run_bisection(t, _waiter(t, p, _echo_progress), job, names, reference=reference,
                           progress=_echo_progress)
    o = report.outcome
    if not p["no_chart"]:
        series = []
        for r in o.results:
            out = load_op(t, report.directories[r.nodes], "all_reduce")
            s = series_of("+".join(r.nodes), out.result, highlight=any(n in o.slow for n in r.nodes)) \
                if out.result is not None else None
            if s is not None:
                series.append(s)
        if series:
            th = (Threshold(o.rule, o.threshold),) if o.threshold is not None else ()
            drawn, upload = _chart_target(t, p["chart_path"], f"{job.out_dir}/busbw.png")
            report.chart = _write_chart(write_chart, drawn, series,
                                        title=f"all_reduce bisection of {p['nodelist']}", thresholds=th)
            _publish_chart(t, report, drawn, upload)
    doc = bisect_json(report)
    t.write_atomic(f"{job.out_dir}/report.json", json.dumps(doc, indent=2) + "\n")
    if p["as_json"]:
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(format_bisect(report), nl=False)
    if not report.ok:
        sys.exit(EXIT_FAILURE)


def print_rich(report: "Report") -> None:
    """The same content with rich (used when rich is installed and stdout is a terminal)."""
    from rich.console import Console
    from rich.table import Table

    from ..nodes.nccltests.report import table, verdict_lines

    header, body = table(report)
    console = Console()
    tab = Table(title=report.title, caption="GB/s, out-of-place")
    for name in header:
        tab.add_column(name, justify="right")
    for row in body:
        tab.add_row(*row)
    if body:
        console.print(tab)
    else:
        console.print(report.title)
    styles = {"PASS": "bold green", "FAIL": "bold red"}
    for o, line in zip(report.ops, verdict_lines(report)):
        console.print(line, style=styles.get(o.verdict.status, "yellow"), markup=False, highlight=False)
    for line in verdict_lines(report)[len(report.ops):]:
        console.print(line, style="red", markup=False, highlight=False)
    if report.chart:
        console.print(f"chart: {report.chart}", markup=False, highlight=False)
    if report.json_path:
        console.print(f"report.json: {report.json_path}", markup=False, highlight=False)
