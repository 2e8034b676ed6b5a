"""Read the queue through pyslurm (libslurm in this process) instead of forking squeue/sacct.

UNVERIFIED against a real pyslurm: PyPI has no pyslurm for Debian's Slurm 22.05, so this
adapter was written against pyslurm's documented API (23.x+: `pyslurm.Jobs.load()`,
`pyslurm.db.Jobs.load(pyslurm.db.JobFilter(ids=...))`, Job attributes `id name state
state_reason exit_code exit_code_signal array_id array_task_id array_tasks_waiting
start_time end_time run_time/elapsed_time allocated_nodes/nodelist requeue_count`) and
tested with stand-in packages only. Any exception from pyslurm at run time switches the
status refresh to squeue/sacct (FallbackReader), so a wrong guess costs one fork, never a
wrong answer.

The guard, `detect()`: `import pyslurm` aborts the whole process when libslurm finds no
slurm.conf, so pyslurm is first imported in a child process, with SLURM_CONF set and a
timeout; only when that child succeeds and reports a version whose major.minor is the
cluster's Slurm major.minor (pyslurm 22.5.x <-> Slurm 22.05) is it imported here.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Iterable, Optional

from .parse import JobInfo, _build, _merge_runs
from .reader import QueueReader

PROBE_TIMEOUT_S = 10.0
DEFAULT_CONFS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf")
# Runs in the child: the only place pyslurm is imported before it is known to be safe.
# It prints the version and the file it imported: `python -c` puts the working directory first on
# sys.path, so the child could import another pyslurm than this process would (checked in _detect).
PROBE = ("import sys\n"
         "import pyslurm\n"
         "v = getattr(pyslurm, 'version', None)\n"
         "v = v() if callable(v) else getattr(pyslurm, '__version__', '')\n"
         "sys.stdout.write(str(v).replace('\\n', ' ') + '\\n' + str(getattr(pyslurm, '__file__', '') or ''))\n")
_VERSION_RE = re.compile(r"^\s*(\d+)\.(\d+)")


@dataclass(frozen=True)
class Detection:
    ok: bool
    reason: str
    version: str = ""


_cache: dict[tuple[str, str, str], Detection] = {}


def major_minor(version: str) -> Optional[tuple[int, int]]:
    """"23.02.7" -> (23, 2); pyslurm's "23.2.2" -> (23, 2); None when unreadable."""
    match = _VERSION_RE.match(version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def slurm_conf() -> Optional[str]:
    """SLURM_CONF when set, else the first default slurm.conf that exists."""
    if os.environ.get("SLURM_CONF"):
        return os.environ["SLURM_CONF"]
    return next((p for p in DEFAULT_CONFS if os.path.isfile(p)), None)


def _describe_exit(rc: int, stderr: str) -> str:
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"`import pyslurm` killed the probe process ({name})"
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "no message")
    return f"`import pyslurm` failed in the probe process (exit {rc}: {last[:200]})"


def detect(cluster_version: str, *, python: Optional[str] = None, timeout: float = PROBE_TIMEOUT_S) -> Detection:
    """May status use pyslurm for a cluster running Slurm cluster_version? Never imports it here."""
    conf = slurm_conf() or ""
    key = (python or sys.executable, cluster_version, conf)
    if key not in _cache:
        _cache[key] = _detect(cluster_version, conf, python or sys.executable, timeout)
    return _cache[key]


def _here() -> Optional[str]:
    """The file `import pyslurm` would load in this process (without importing it), or None."""
    loaded = sys.modules.get("pyslurm")
    if loaded is not None:
        return getattr(loaded, "__file__", None) or ""
    try:
        spec = importlib.util.find_spec("pyslurm")
    except (ImportError, ValueError):
        return None
    return None if spec is None else (spec.origin or "")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _detect(cluster_version: str, conf: str, python: str, timeout: float) -> Detection:
    here = _here()
    if here is None:
        return Detection(False, "pyslurm is not installed")
    want = major_minor(cluster_version)
    if want is None:
        return Detection(False, "the cluster's Slurm version is unknown (no `scontrol show config` record)")
    if not conf:
        return Detection(False, "SLURM_CONF is unset and there is no /etc/slurm/slurm.conf "
                                "(`import pyslurm` would abort the process)")
    try:
        proc = subprocess.run([python, "-c", PROBE], env={**os.environ, "SLURM_CONF": conf}, capture_output=True,
                              text=True, timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired:
        return Detection(False, f"`import pyslurm` did not finish within {timeout:g} s in the probe process")
    except OSError as exc:
        return Detection(False, f"cannot start the probe process ({exc.strerror})")
    if proc.returncode != 0:
        return Detection(False, _describe_exit(proc.returncode, proc.stderr))
    version, _, probed = proc.stdout.partition("\n")
    version, probed = version.strip(), probed.strip()
    if not (here and probed and _same_file(here, probed)):
        return Detection(False, f"the probe process imported pyslurm from {probed or '?'}, but this process "
                                f"would import {here or '?'} (a pyslurm in the working directory?)")
    got = major_minor(version)
    if got is None:
        return Detection(False, f"pyslurm reports no readable version ({version[:40]!r})")
    if got != want:
        return Detection(False, f"pyslurm {version} is built for Slurm {got[0]}.{got[1]:02d}, "
                                f"the cluster runs Slurm {cluster_version}")
    return Detection(True, f"matches Slurm {cluster_version}", version)


def import_pyslurm() -> ModuleType:
    """Import pyslurm here; only after detect() said ok (SLURM_CONF is set first, as in the probe)."""
    conf = slurm_conf()
    if conf:
        os.environ.setdefault("SLURM_CONF", conf)
    return importlib.import_module("pyslurm")


# ---------------------------------------------------------------------------------- records


def _int(value: Any) -> Optional[int]:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _epoch(value: Any) -> Optional[float]:
    number = _int(value)
    return float(number) if number and 0 < number < 0xFFFFFFFE else None


def job_info(job: Any, source: str) -> JobInfo:
    """A pyslurm Job (slurmctld) or db.Job (slurmdbd) -> JobInfo, as the squeue/sacct parsers build it."""
    job_id = str(_int(getattr(job, "id", None)))
    array = _int(getattr(job, "array_id", None)) or None
    task = _int(getattr(job, "array_task_id", None))
    task = task if task is not None and task < 0xFFFFFFFE else None
    waiting = re.sub(r"%\d+$", "", str(getattr(job, "array_tasks_waiting", None) or "").strip()) or None
    pending = None
    if array is not None:
        if task is not None:
            job_id = f"{array}_{task}"
        elif waiting and waiting.isdigit():
            task, job_id = int(waiting), f"{array}_{waiting}"
        elif waiting:
            pending, job_id = waiting, f"{array}_[{waiting}]"
    code, sig = _int(getattr(job, "exit_code", None)), _int(getattr(job, "exit_code_signal", None))
    exit_status = (None, sig) if sig else ((code, 0) if code is not None else (None, None))
    elapsed = _int(getattr(job, "elapsed_time", None))
    if elapsed is None:
        elapsed = _int(getattr(job, "run_time", None)) if _epoch(getattr(job, "end_time", None)) else None
    nodes = getattr(job, "allocated_nodes", None) or getattr(job, "nodelist", None)
    return _build(job_id=job_id, array_job_id=str(array) if array else None, array_task_id=task, pending=pending,
                  name=str(getattr(job, "name", "") or ""), state_raw=getattr(job, "state", None),
                  reason=getattr(job, "state_reason", None), exit_status=exit_status,
                  start=_epoch(getattr(job, "start_time", None)), end=_epoch(getattr(job, "end_time", None)),
                  elapsed_s=elapsed, nodes=nodes, restarts=_int(getattr(job, "requeue_count", 0)) or 0,
                  source=source)


def _jobs(collection: Any) -> Iterable[Any]:
    values = getattr(collection, "values", None)
    return list(values()) if callable(values) else list(collection)


class PyslurmReader:
    """QueueReader over pyslurm: one slurm_load_jobs RPC, at most one slurmdbd query."""

    name = "pyslurm"

    def __init__(self, version: str) -> None:
        self.version = version
        self._mod: Optional[ModuleType] = None

    def _pyslurm(self) -> ModuleType:
        if self._mod is None:
            self._mod = import_pyslurm()
        return self._mod

    def queue(self) -> list[JobInfo]:
        return [job_info(j, "pyslurm") for j in _jobs(self._pyslurm().Jobs.load())]

    def accounting(self, job_ids: Iterable[str]) -> Optional[list[JobInfo]]:
        ids = sorted({int(j) for j in job_ids if str(j).isdigit()})
        if not ids:
            return []
        mod = self._pyslurm()
        records = mod.db.Jobs.load(mod.db.JobFilter(ids=ids))
        return _merge_runs(job_info(j, "pyslurm-db") for j in _jobs(records))


class FallbackReader:
    """pyslurm first; on any error, squeue/sacct for the rest of the command (note says why)."""

    def __init__(self, primary: QueueReader, fallback: QueueReader) -> None:
        self.primary = primary
        self.fallback = fallback
        self.failed: Optional[str] = None

    @property
    def name(self) -> str:
        return self.fallback.name if self.failed else self.primary.name

    def _note(self, what: str, exc: Exception) -> None:
        self.failed = f"pyslurm {what} failed ({type(exc).__name__}: {str(exc)[:200]}); used squeue/sacct"
        print(f"warning: {self.failed}", file=sys.stderr)

    def queue(self) -> list[JobInfo]:
        if not self.failed:
            try:
                return self.primary.queue()
            except Exception as exc:  # noqa: BLE001 - any libslurm trouble: the CLI still answers
                self._note("Jobs.load()", exc)
        return self.fallback.queue()

    def accounting(self, job_ids: Iterable[str]) -> Optional[list[JobInfo]]:
        ids = list(job_ids)
        if not self.failed:
            try:
                return self.primary.accounting(ids)
            except Exception as exc:  # noqa: BLE001
                self._note("db.Jobs.load()", exc)
        return self.fallback.accounting(ids)
