"""Files for node_exporter's textfile collector: the Prometheus text exposition format, no timestamps.

One file per job and node, lingjun-slurm_<job>_<node>.prom (file_name), written only by the hang
watchdog (lingjun_slurm/injob/host/watchdog.py Exporter) into the directory that
monitoring.textfile_dir names (docs/monitoring.md), on the batch host, at every poll: its own
series together with those the builtin trainer's rank 0 (lingjun_slurm/injob/train/metrics.py
PromFile) stages in the run directory (<run_dir>/textfile/lingjun-slurm_<job>_<node>.json, shared
storage the container already mounts; Stage, read_staged). The trainer stages samples (name,
labels, value) as JSON, not a .prom file: the watchdog merges them with its own at sample level and
renders the whole file once (render), so a family both carry (lingjun_metrics_updated_timestamp_seconds:
the trainer's sample has rank="0", the watchdog's none) gets one HELP and one TYPE line. Two text
blocks of one family in one file would not parse: the text parser node_exporter v1.5.0 uses
(prometheus/common expfmt/text_parse.go at v0.37.0, the version node_exporter v1.5.0's go.mod pins;
commit 49b36038) fails on "second HELP line for metric name" (readingHelp, :496) and "second TYPE
line for metric name %q, or TYPE reported after samples" (readingType, :511), and node_exporter then
skips the whole file. The trainer does not write into textfile_dir itself: that would need a
container mount of it, and pyxis bind-mounts a host path that must exist on every node
(NVIDIA/pyxis args.c:294 at v0.24.0, "x-create=auto,rbind": x-create makes only the target inside
the container), so one node without the directory would fail the whole step. Standard library
only: the watchdog runs on the batch host, outside the container.

What node_exporter accepts (prometheus/node_exporter collector/textfile.go, at v1.5.0, Debian 12's
prometheus-node-exporter 1.5.0, and at a7dcc3a0 (2026-08-08), Update/processFile/hasTimestamps):
- only files whose name ends in ".prom" are read (`strings.HasSuffix(f.Name(), ".prom")`): the
  temporary file is named ".<name>.<random>.tmp" (".lingjun-slurm_<job>_<node>.prom.<random>.tmp",
  common/atomicfile.py) so a half-written file is never read, then
  os.replace()d onto its name (rename(2) within one directory is atomic);
- a file with any sample that carries a timestamp is skipped whole ("contains unsupported
  client-side timestamps, skipping entire file"): no sample here has one;
- a file that does not parse is skipped and node_textfile_scrape_error becomes 1 (processFile:
  `parser.TextToMetricFamilies(f)`, textfile.go v1.5.0:275-276);
- families of one name in several files are merged; from v1.8.0 (not at v1.5.0) a different
  HELP text for the same name in two files is an error (metricsNamesToHelpTexts), so every
  family's HELP comes from FAMILIES below; the same series (name and labels) twice is a duplicate
  that client_golang's registry rejects, and render refuses it;
- a label missing from some samples of a family is added to them as "" (convertMetricFamily).
The format itself (prometheus/docs docs/instrumenting/exposition_formats.md at c105550a, "Text
format details"): lines end in "\\n", the last one too; `# HELP name text` with "\\\\" and "\\n"
escaped; `# TYPE name gauge` before the first sample; label values escape backslash, double
quote and line feed as \\\\, \\" and \\n; values as Go's ParseFloat reads them, NaN, +Inf, -Inf.

Labels: run, stage, slurm_job, node, and rank where a series is one rank's. Not "job" (nor
"instance"): Prometheus attaches those to every scraped series itself, and with the default
honor_labels: false a scraped label of that name is renamed "exported_job" (prometheus/prometheus
docs/configuration/configuration.md, scrape_config honor_labels; seen with Debian's prometheus
2.42.0 in tests/integration/test_prometheus.py). Every label set is bounded: one run, stage, job
and node per file, a bucket or state name from a fixed list.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Callable, Iterable, Mapping, Optional, Union

from lingjun_slurm.common.atomicfile import atomic_write

NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")  # exposition_formats.md: metric_name (legacy set)
LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # label_name; names starting "__" are reserved
PREFIX = "lingjun-slurm"  # every file this tool writes: lingjun-slurm_<job>_<node>.prom, its staged .json
Number = Union[int, float]

# name -> (type, HELP). One table: the one HELP of a family (and what node_exporter 1.8.0+ wants
# across files, see above); a staged sample of a name not here is refused (read_staged).
FAMILIES: dict[str, tuple[str, str]] = {
    "lingjun_train_iteration": ("gauge", "Last training iteration finished."),
    "lingjun_train_loss": ("gauge", "Training loss (lm loss) at the last iteration written."),
    "lingjun_train_learning_rate": ("gauge", "Learning rate at the last iteration written."),
    "lingjun_train_tokens_per_second": ("gauge", "Training tokens per second at the last iteration written."),
    "lingjun_train_step_seconds": ("gauge", "Seconds per iteration (elapsed time per iteration)."),
    "lingjun_train_tflops_per_gpu": ("gauge", "Model TFLOP/s per GPU at the last iteration written."),
    "lingjun_train_mfu_ratio": ("gauge", "Model FLOPs utilisation (0-1) at the last iteration written."),
    "lingjun_train_memory_peak_bytes": ("gauge", "Peak GPU memory allocated by the rank (torch max_memory_allocated)."),
    "lingjun_checkpoint_iteration": ("gauge", "Iteration of the last checkpoint saved."),
    "lingjun_checkpoint_age_seconds": ("gauge", "Seconds since the last checkpoint was saved, when written."),
    "lingjun_checkpoint_saved_timestamp_seconds": ("gauge", "UNIX time the last checkpoint was saved."),
    "lingjun_watchdog_state": ("gauge", "The hang watchdog's state: 1 for the current one of "
                                        "startup, training, hang."),
    "lingjun_watchdog_idle_seconds": ("gauge", "Seconds since the last iteration or activity."),
    "lingjun_watchdog_timeout_seconds": ("gauge", "The hang timeout in force."),
    "lingjun_goodput_seconds": ("gauge", "This job's allocation so far per goodput bucket (GPU-seconds, or "
                                         "CPU-seconds for jobs without GPUs)."),
    "lingjun_metrics_updated_timestamp_seconds": ("gauge", "UNIX time the series were last updated: the "
                                                           "watchdog's when it wrote the file, rank 0's "
                                                           "(rank label) when the trainer staged its numbers."),
}


class PromError(ValueError):
    pass


def escape_label_value(value: str) -> str:
    """exposition_formats.md: backslash, double-quote and line feed as \\\\, \\" and \\n."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """HELP text: backslash and line feed only."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: Number) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PromError(f"not a number: {value!r}")
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)  # shortest round-trip text; Go's ParseFloat reads it ("1e-05", "0.1")


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    parts = []
    for key in sorted(labels):
        if not LABEL.match(key) or key.startswith("__"):
            raise PromError(f"bad label name {key!r}")
        parts.append(f'{key}="{escape_label_value(str(labels[key]))}"')
    return "{" + ",".join(parts) + "}"


Sample = tuple[str, Mapping[str, str], Optional[Number]]  # (family name, labels, value or None)


def render(samples: Iterable[Sample]) -> str:
    """The text format: per family HELP, TYPE, then its samples; families in first-seen order.
    A sample whose value is None is left out (unknown is no sample, not a 0)."""
    order: list[str] = []
    by_name: dict[str, list[str]] = {}
    seen: set[tuple[str, str]] = set()
    for name, labels, value in samples:
        if value is None:
            continue
        if not NAME.match(name):
            raise PromError(f"bad metric name {name!r}")
        text = _labels(labels)
        if (name, text) in seen:
            raise PromError(f"two samples of {name}{text}")  # the collector would fail the whole scrape
        seen.add((name, text))
        if name not in by_name:
            order.append(name)
            by_name[name] = []
        by_name[name].append(f"{name}{text} {format_value(value)}\n")
    out = []
    for name in order:
        kind, help_text = FAMILIES.get(name, ("untyped", ""))
        if help_text:
            out.append(f"# HELP {name} {escape_help(help_text)}\n")
        out.append(f"# TYPE {name} {kind}\n")
        out.extend(by_name[name])
    return "".join(out)


_UNSAFE = re.compile(r"[^A-Za-z0-9.-]")


def _key(job: str, node: str) -> str:
    return f"{PREFIX}_{_UNSAFE.sub('-', job)}_{_UNSAFE.sub('-', node)}"


def file_name(job: str, node: str) -> str:
    """lingjun-slurm_<job>_<node>.prom: the one file of a job on a node (the watchdog's, with the
    trainer's staged series); the batch script removes lingjun-slurm_<job>_*.prom at the job's end.
    Characters other than [A-Za-z0-9.-] become '-'."""
    return f"{_key(job, node)}.prom"


def staged_name(job: str, node: str) -> str:
    """lingjun-slurm_<job>_<node>.json: the trainer's staged samples in <run_dir>/textfile (Stage)."""
    return f"{_key(job, node)}.json"


def write_atomic(path: str, text: str) -> None:
    """common/atomicfile.atomic_write: a temporary ".<name>.<random>.tmp" (not *.prom: the collector
    skips it) renamed onto path, so a scrape sees the old file or the new one, never half of one.
    Mode 0644: node_exporter runs as its own user. No fsync: rewritten every 2 s, worthless after a crash."""
    atomic_write(path, text, mode=0o644, durable=False)


def job_prefix(job: str) -> str:
    """The start of every file name of this job (file_name, staged_name), and what the batch script removes."""
    return f"{PREFIX}_{_UNSAFE.sub('-', job)}_"


def _staged_sample(item: object, where: str) -> Sample:
    if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and isinstance(item[1], dict)):
        raise PromError(f"{where}: not a [name, labels, value] sample: {item!r}")
    name, labels, value = item
    if name not in FAMILIES:
        raise PromError(f"{where}: {name!r} is not a family of promfile.FAMILIES")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise PromError(f"{where}: {name}: label names and values must be strings")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise PromError(f"{where}: {name}: not a number: {value!r}")
    return name, labels, value


def read_staged(staging: str, job: str) -> list[Sample]:
    """The samples the trainer staged for this job in `staging` (<run_dir>/textfile, Stage): every
    lingjun-slurm_<job>_*.json there (rank 0's node, which need not be the batch host), in name order,
    each {"samples": [[name, {label: value}, number], ...]}. Empty when there is none (not started
    yet, or it stopped and removed it). Raises PromError for a file that is not that (file named), OSError."""
    start = job_prefix(job)
    try:
        names = sorted(n for n in os.listdir(staging) if n.startswith(start) and n.endswith(".json"))
    except FileNotFoundError:
        return []
    out: list[Sample] = []
    for name in names:
        path = os.path.join(staging, name)
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)  # NaN, Infinity: Python's json writes and reads them
        except FileNotFoundError:  # removed between listdir and open: the trainer stopped
            continue
        except ValueError as exc:
            raise PromError(f"{path}: not JSON: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("samples"), list):
            raise PromError(f"{path}: no \"samples\" list")
        out += [_staged_sample(item, path) for item in doc["samples"]]
    return out


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def node_name() -> str:
    """Slurm's name for this node (slurmd sets SLURMD_NODENAME in every task and the batch script),
    else the host name."""
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


class _OwnFile:
    """One file this process owns (path); remove() deletes it, silently (a metrics file is never worth
    an error at a job's end)."""

    path: str

    def remove(self) -> None:
        try:
            remove(self.path)
        except OSError:
            pass


class Writer(_OwnFile):
    """The file of a job on a node in node_exporter's directory (file_name), the watchdog's: write()
    renders its own samples (base labels added) together with `extra` ones (the trainer's staged
    samples, already labelled) and replaces the file. Errors are said once and never stop the caller."""

    def __init__(self, directory: str, job: str, node: str, base_labels: Mapping[str, str],
                 warn: Optional[Callable[[str], None]] = None) -> None:
        self.path = os.path.join(directory, file_name(job, node))
        self.base = dict(base_labels)
        self.failed: Optional[str] = None
        self.extra_failed: Optional[str] = None
        self._warn = warn

    def _say(self, text: str) -> None:
        if self._warn is not None:
            self._warn(text)

    def write(self, samples: Iterable[Sample], extra: Iterable[Sample] = ()) -> bool:
        own = [(n, {**self.base, **labels}, v) for n, labels, v in samples]
        staged = list(extra)
        try:
            text = render(own)
            if staged:
                try:
                    text = render(own + staged)
                except PromError as exc:
                    # The staged samples clash with the watchdog's own (or one another): its own still go.
                    if self.extra_failed is None:
                        self._say(f"the trainer's staged series left out of {self.path}: {exc}")
                    self.extra_failed = str(exc)
            write_atomic(self.path, text)
            return True
        except (OSError, PromError) as exc:
            if self.failed is None:
                self._say(f"cannot write {self.path}: {exc}")
            self.failed = str(exc)
            return False


class Stage(_OwnFile):
    """The trainer's staged samples (staged_name, in <run_dir>/textfile): JSON the watchdog merges into
    the job's file at sample level (read_staged), written with write_atomic. write() checks them with
    render first, so a bad sample is said here, by the trainer. Errors are said once, never raised."""

    def __init__(self, directory: str, job: str, node: str, base_labels: Mapping[str, str],
                 warn: Optional[Callable[[str], None]] = None) -> None:
        self.path = os.path.join(directory, staged_name(job, node))
        self.base = dict(base_labels)
        self.failed: Optional[str] = None
        self._warn = warn

    def write(self, samples: Iterable[Sample]) -> bool:
        try:
            staged = [[n, {**self.base, **labels}, v] for n, labels, v in samples if v is not None]
            render((n, labels, v) for n, labels, v in staged)  # refuses a bad name, label or a duplicate
            write_atomic(self.path, json.dumps({"samples": staged}, allow_nan=True) + "\n")
            return True
        except (OSError, PromError) as exc:
            if self.failed is None and self._warn is not None:
                self._warn(f"cannot write {self.path}: {exc}")
            self.failed = str(exc)
            return False

