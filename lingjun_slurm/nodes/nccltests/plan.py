"""What one nccl-tests job runs, checked, and its sbatch script (pure: no Slurm call here).

Every value a user gives is validated here with an error naming its option. Values that land on
`#SBATCH` lines or in pyxis lists (partition, account, out dir, image, mounts) are restricted to
characters that need no quoting there; the rest (tests directory) only reaches argv words, which
the template quotes.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any, Optional

from lingjun_slurm.container import format_mount, lint_image, parse_mount, pyxis_flags
from lingjun_slurm.common.errors import UsageError
from lingjun_slurm.network import EnvVar, NetworkEnv
from lingjun_slurm.render import render_template
from lingjun_slurm.common.shell import Word
from lingjun_slurm.spec.models import NAME_RE, SAFE_PATH_RE, ContainerSpec
from lingjun_slurm.common.timefmt import format_time
from .sizes import nccl_size
from .verdict import OPS

DEFAULT_IMAGE = "nvcr.io#nvidia/pytorch:25.06-py3"  # NGC PyTorch ships the nccl-tests MPI builds (<op>_perf_mpi)
SCRIPT = "nccl-test.sbatch"
_SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9._+-]+(,[A-Za-z0-9._+-]+)*$")  # partition lists, accounts, QOS
HOSTLIST_RE = re.compile(r"^[A-Za-z0-9._\[\],-]+$")
_MPI_RE = re.compile(r"^[a-z0-9_]+$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
# Runs in each task (inside the container when there is one). User values arrive as $1 (the tests
# directory, '' for PATH) and $2 (the op): never part of this text.
TASK_SCRIPT = (
    'dir=$1 op=$2; shift 2; '
    'for name in "${op}_perf_mpi" "${op}_perf"; do '
    'if [ -n "$dir" ]; then bin="$dir/$name"; [ -x "$bin" ] || continue; '
    'else bin=$(command -v "$name") || continue; fi; '
    'exec "$bin" "$@"; '
    'done; '
    'echo "nccl-test: neither ${op}_perf_mpi nor ${op}_perf in ${dir:-PATH} on $(hostname)" >&2; exit 127'
)


@dataclass(frozen=True)
class NcclJob:
    """One sbatch job of nccl-tests. nodes is None only for --nodelist without Slurm to count it."""

    job_name: str
    out_dir: str
    network: NetworkEnv
    nodes: Optional[int] = 2
    nodelist: Optional[str] = None
    gpus_per_node: int = 8
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    reservation: Optional[str] = None
    time_s: int = 1800
    exclusive: bool = True
    image: Optional[str] = DEFAULT_IMAGE  # None: no container, the binaries run on the hosts
    mounts: tuple[str, ...] = ()
    tests_dir: str = ""
    mpi: str = "pmix"
    ops: tuple[str, ...] = ("all_reduce", "all_gather")
    min_bytes: int = 8
    max_bytes: int = 16 << 30
    step_factor: int = 2
    iters: int = 20
    warmup_iters: int = 5
    reproduce: tuple[str, ...] = ()  # argv of the command that renders this script (for its header)

    @property
    def tasks_per_node(self) -> int:
        """One task per GPU (nccl-tests -g 1); one per node when the partition has no GPUs."""
        return max(1, self.gpus_per_node)

    def shape(self) -> str:
        """'2 nodes x 8 GPUs', '4 nodes x 1 task (no GPUs)', 'the nodes gpu[1-4] x 8 GPUs'."""
        nodes = (f"{self.nodes} node{'' if self.nodes == 1 else 's'}" if self.nodes
                 else f"the nodes {self.nodelist}")
        if self.gpus_per_node:
            return f"{nodes} x {self.gpus_per_node} GPU{'' if self.gpus_per_node == 1 else 's'}"
        return f"{nodes} x 1 task (no GPUs)"


def with_options(argv: tuple[str, ...], **options: str) -> tuple[str, ...]:
    """argv with `--name value` pairs replaced (or appended): name_with_underscores=value."""
    out = list(argv)
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if flag in out[:-1]:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return tuple(out)


def check(job: NcclJob) -> None:
    """Raise UsageError naming the option for anything that cannot be rendered safely."""
    def safe_name(value: Optional[str], option: str) -> None:
        if value is not None and not _SLURM_NAME_RE.match(value):
            raise UsageError(f"{option} {value!r}: use letters, digits and . _ + - (commas between names) only")

    if not re.fullmatch(NAME_RE, job.job_name):
        raise UsageError(f"--job-name {job.job_name!r}: use letters, digits, '.', '_' and '-' only (at most 63)")
    if not re.fullmatch(SAFE_PATH_RE, job.out_dir):
        raise UsageError(f"--outdir {job.out_dir!r}: an absolute path of letters, digits and . _ + @ = / - only "
                         "(it lands on an #SBATCH line and in the container's mount list)")
    for value, option in ((job.partition, "--partition"), (job.account, "--account"), (job.qos, "--qos"),
                          (job.reservation, "--reservation")):
        safe_name(value, option)
    if job.nodelist is not None and not HOSTLIST_RE.match(job.nodelist):
        raise UsageError(f"--nodelist {job.nodelist!r}: a Slurm host list such as node[1-4],gpu7")
    if job.nodes is not None and not 1 <= job.nodes <= 4096:
        raise UsageError(f"--nodes {job.nodes}: must be 1..4096")
    if not 0 <= job.gpus_per_node <= 64:
        raise UsageError(f"--gpus-per-node {job.gpus_per_node}: must be 0..64")
    if not _MPI_RE.match(job.mpi):
        raise UsageError(f"--mpi {job.mpi!r}: an srun --mpi type such as pmix, pmi2 or none")
    if job.image is not None:
        problem = lint_image(job.image)
        if problem:
            raise UsageError(f"--image {job.image!r}: {problem}")
    for raw in job.mounts:
        try:
            parse_mount(raw)
        except ValueError as exc:
            raise UsageError(f"--mount {raw!r}: {exc}") from None
    if job.tests_dir and (not job.tests_dir.startswith("/") or _CONTROL_RE.search(job.tests_dir)):
        raise UsageError(f"--tests-dir {job.tests_dir!r}: an absolute path (without control characters)")
    bad = [op for op in job.ops if op not in OPS]
    if not job.ops or bad:
        raise UsageError(f"--ops: unknown test(s) {', '.join(bad) or '(none given)'}; known: {', '.join(OPS)}")
    if job.min_bytes > job.max_bytes:
        raise UsageError(f"--min-bytes {job.min_bytes} is larger than --max-bytes {job.max_bytes}")
    if job.step_factor < 2:
        raise UsageError(f"--step-factor {job.step_factor}: must be at least 2")
    if job.iters < 1 or job.warmup_iters < 0:
        raise UsageError("--iters must be at least 1 and --warmup-iters at least 0")


def sbatch_options(job: NcclJob) -> tuple[tuple[str, Optional[str]], ...]:
    opts: dict[str, Optional[str]] = {
        "job-name": job.job_name,
        "output": f"{job.out_dir}/%x-%j.out",
        "ntasks-per-node": str(job.tasks_per_node),
        "time": format_time(job.time_s),
        "no-requeue": None,
    }
    if job.nodes:
        opts["nodes"] = str(job.nodes)
    if job.nodelist:
        opts["nodelist"] = job.nodelist
    if job.gpus_per_node:
        opts["gpus-per-node"] = str(job.gpus_per_node)
    if job.exclusive:
        opts["exclusive"] = None
    for key in ("partition", "account", "qos", "reservation"):
        value = getattr(job, key)
        if value:
            opts[key] = value
    return tuple(sorted(opts.items()))


def launcher(job: NcclJob) -> tuple[Word, ...]:
    words: list[Word] = ["srun", f"--mpi={job.mpi}", "--kill-on-bad-exit=1"]
    if job.image is not None:
        mounts = list(job.mounts)
        have = {parse_mount(m).dst for m in mounts}
        mounts += [m for m in job.network.mounts if parse_mount(m).dst not in have]
        spec = ContainerSpec(image=job.image, mounts=[format_mount(parse_mount(m)) for m in mounts])
        words += pyxis_flags(spec, job.out_dir, job.network.names()).flags
    return tuple(words)


def test_args(job: NcclJob) -> tuple[str, ...]:
    return ("-b", nccl_size(job.min_bytes), "-e", nccl_size(job.max_bytes), "-f", str(job.step_factor),
            "-g", "1", "-n", str(job.iters), "-w", str(job.warmup_iters))


def render(job: NcclJob) -> str:
    """The sbatch script of the job (deterministic)."""
    check(job)
    plan = _HeaderPlan(run_id=job.job_name, reproduce=shlex.join(job.reproduce))
    stage = _PreludeStage(name="nccl-test", env=(), network=job.network, vars={"ship_code": False})
    return render_template(
        "nccl-test.sbatch.j2", plan=plan, stage=stage, sbatch=sbatch_options(job), uses_plan=False,
        title=f"nccl-tests {', '.join(job.ops)} ({job.job_name})", ops=job.ops, shape=job.shape(),
        out_dir=job.out_dir, launcher=launcher(job), task=("bash", "-c", TASK_SCRIPT, "nccl-task", job.tests_dir),
        test_args=test_args(job))


@dataclass(frozen=True)
class _HeaderPlan:
    """What the shared header and prelude partials read from a plan (no spec here)."""

    run_id: str
    reproduce: str


@dataclass(frozen=True)
class _PreludeStage:
    name: str
    env: tuple[EnvVar, ...]
    network: Optional[NetworkEnv]
    vars: dict[str, Any]
