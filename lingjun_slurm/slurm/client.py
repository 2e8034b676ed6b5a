"""The Slurm scheduler on top of a Transport: sbatch, scontrol, scancel, squeue, sacct.

Every method is one command. Status-style reads are batched: one `squeue` (text; `--json`
where this squeue lacks a field of the text form) and at most one `sacct` cover every job
shown, however many there are (submitit's InfoWatcher).
Failures raise CommandError with the command, exit code and Slurm's raw stderr; a queue that
cannot be read (slurmctld unreachable) raises SlurmUnavailable with Slurm's own words.

With slurmctld unreachable every client command retries the connection MessageTimeout times,
1 s apart (src/common/slurm_protocol_api.c, slurm_open_controller_conn, 22.05.8:882-888): 9 s
with the default MessageTimeout=10 when the port refuses connections, measured here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from ..common.errors import CommandError, SlurmUnavailable, UsageError
from ..transport.base import Transport
from .parse import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    JobInfo,
    SlurmParseError,
    parse_sacct_parsable,
    parse_squeue_json,
    parse_squeue_text,
)

_JOB_ID_RE = re.compile(r"^[0-9]+$")

# What Slurm's commands print on a host where they are installed but find no configuration (the
# README's `apt-get install slurm-client` leaves no /etc/slurm/slurm.conf): src/common/read_config.c
# logs "Could not establish a configuration source" when neither SLURM_CONF, /etc/slurm/slurm.conf,
# the configless cache nor a DNS SRV record gives one, and "Unable to process configuration file"
# when the file named cannot be read; the same words in slurm-22-05-8-1 (read_config.c:3492, 3524,
# 3554), 23-02-0-1 (:3477, 3509, 3553), 23-11-0-1 (:3472, 3504, 3535) and 25-11-7-1 (:3227, 3240,
# 3268). Seen here with Debian's 22.05.8: `sbatch` with SLURM_CONF unset and no slurm.conf prints
# "error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host" ... "fatal: Could not
# establish a configuration source" (10 ms); with SLURM_CONF=/nonexistent it retries for 59 s
# ("s_p_parse_file: cannot stat file /nonexistent ... retrying in 1sec up to 60sec"), then
# "fatal: Unable to process configuration file".
UNCONFIGURED_MARKERS = ("Could not establish a configuration source", "Unable to process configuration file")
UNCONFIGURED_HINT = ("Slurm's commands are installed here but cannot load a cluster configuration (a slurm.conf "
                     "at $SLURM_CONF or /etc/slurm/slurm.conf, or a configless slurmd): use --executor local to run "
                     "on this machine without Slurm (submit), pass --host [USER@]HOST / --cluster NAME, or point "
                     "SLURM_CONF at the cluster's slurm.conf (or run on a login node of the cluster)")


class SlurmUnconfigured(UsageError):
    """Slurm's client is installed but has no cluster configuration (exit 2, with UNCONFIGURED_HINT)."""


def unconfigured_hint(exc: CommandError) -> str:
    """"\n" + UNCONFIGURED_HINT when the command failed for want of a Slurm configuration, else ""."""
    text = f"{exc.stderr}\n{exc.stdout}"
    return f"\n{UNCONFIGURED_HINT}" if any(m in text for m in UNCONFIGURED_MARKERS) else ""


def conf_problem(t: Transport) -> str:
    """Why Slurm's commands on this machine cannot read their configuration, found without running
    one: SLURM_CONF (local transport only) names no file, which they would retry for 60 s; "" else."""
    import os

    conf = os.environ.get("SLURM_CONF") if t.kind == "local" else None
    if conf and not os.path.isfile(conf):
        return f"SLURM_CONF={conf}: no such file"
    return ""
_NO_ACCOUNTING = ("accounting storage is disabled", "Connection refused", "Unable to contact slurm")

# The longest `--jobs=ID,ID,...` argument one sacct call gets (issue 31: status of 10,000 jobs).
# Linux refuses a single argument of more than MAX_ARG_STRLEN = 32 pages = 131072 bytes with its NUL
# (include/uapi/linux/binfmts.h; E2BIG measured here: 131072 bytes run, 131073 do not), and over
# SSH the whole command line is one argument of the remote shell's `-c`. sacct itself takes any
# number (src/sacct/options.c case 'j' -> slurm_addto_step_list, which checks each id against the
# list so far with list_find_first: quadratic in the ids of one call; slurm_protocol_defs.c
# _addto_step_list_internal, slurm-22-05-8-1:649, slurm-23-02-7-1:666), and slurmdbd turns them
# into one SQL `id_job in (...)` (as_mysql_jobacct_process.c _setup_job_cond_selected_steps,
# slurm-22-05-8-1:263). Half the kernel's limit leaves room for the other arguments and quoting.
SACCT_JOBS_BYTES = 65536


def id_chunks(ids: Sequence[str], limit: int) -> list[str]:
    """ids joined with "," into as few strings of at most limit characters as fit (one id never split)."""
    chunks: list[str] = []
    cur: list[str] = []
    size = 0
    for i in ids:
        if cur and size + 1 + len(i) > limit:
            chunks.append(",".join(cur))
            cur, size = [], 0
        size += len(i) + (1 if cur else 0)
        cur.append(i)
    if cur:
        chunks.append(",".join(cur))
    return chunks


@dataclass(frozen=True)
class ClusterInfo:
    name: str
    slurm_version: str
    accounting: bool
    jobcomp_type: str
    jobcomp_loc: str
    # MaxArraySize (`scontrol show config`; the largest array index is this less 1, 0: no arrays),
    # None when not printed. src/common/read_config.c, slurm-22-05-8-1.
    max_array_size: Optional[int] = None


# (transport kind, host[, PATH, slurm.conf and its stat for a local transport]) -> what `scontrol show
# config` said.
_CLUSTER_INFO: dict[tuple[object, ...], tuple[float, ClusterInfo]] = {}  # key -> (monotonic time read, info)
CLUSTER_INFO_TTL_S = 60.0


class SlurmCLI:
    """The Slurm commands on a transport; also the default QueueReader (slurm/queue.py)."""

    name = "cli"

    def __init__(self, transport: Transport) -> None:
        self.t = transport
        # Why the queue is read as JSON (this squeue refused the text form), for status --verbose.
        self.failed: Optional[str] = None

    def available(self) -> bool:
        return self.t.which("sbatch") is not None

    def submit(self, script: str, *, cwd: str, hold: bool = True, dependency: Optional[str] = None,
               extra: Sequence[str] = ()) -> str:
        """sbatch --parsable [--hold] [--dependency=...] SCRIPT (run in cwd) -> job id."""
        argv = ["sbatch", "--parsable"]
        if hold:
            argv.append("--hold")
        if dependency:
            argv.append(f"--dependency={dependency}")
        argv += [*extra, script]
        result = self.t.run(argv, cwd=cwd, check=True, what=f"sbatch {script} failed")
        out = result.stdout.strip()
        job_id = out.splitlines()[-1].split(";")[0].strip() if out else ""
        if not _JOB_ID_RE.match(job_id):
            raise CommandError(result.argv, result.returncode, result.stdout, result.stderr,
                               what=f"sbatch {script} printed no job id", host=self.t.host)
        return job_id

    def release(self, job_ids: Iterable[str]) -> None:
        ids = list(job_ids)
        if ids:
            self.t.run(["scontrol", "release", ",".join(ids)], check=True, what="scontrol release failed")

    def cancel(self, job_ids: Iterable[str], *, signal: Optional[str] = None, state: Optional[str] = None) -> None:
        """One scancel for every id. Jobs that already ended are not an error.

        state limits it to jobs (and array tasks) in that state: a signal other than KILL sent to
        a pending array part is refused as "try again later", which scancel retries for ~95 s
        (src/scancel/scancel.c, MAX_CANCEL_RETRY; slurmctld job_mgr.c job_str_signal)."""
        ids = list(job_ids)
        if not ids:
            return
        argv = (["scancel"] + ([f"--state={state}"] if state else []) + ([f"--signal={signal}"] if signal else [])
                + ids)
        result = self.t.run(argv)
        benign = ("Invalid job id specified" in result.stderr
                  or "already completing or completed" in result.stderr)
        if result.returncode != 0 and not benign:
            result.check("scancel failed", self.t.host)

    def cancel_by_name(self, job_name: str) -> None:
        """scancel --name: jobs of this user with that (unique, run-id-prefixed) name."""
        self.t.run(["scancel", "--me", f"--name={job_name}"], check=True, what="scancel --name failed")

    def queue(self) -> list[JobInfo]:
        """Every job of this user slurmctld still remembers: one `squeue` (callers filter by id).

        The text form (SQUEUE_ARGV: `--me --states=all --noheader --Format=<parse.SQUEUE_FORMAT>`,
        times as epoch seconds by SLURM_TIME_FORMAT=%s in the command's environment; the SSH
        transport sets it on the remote command line, `env -- NAME=VALUE`, sshcommands.command_line)
        gives the JobInfo fields `squeue --json` gives, at 0.9 MB
        and 0.10 s for 10,000 jobs where 22.05's JSON is 31 MB and 1.1 s (issue 31; the format and
        what each field prints: parse.py, "squeue text"). No -j: one call whatever the job count
        (22.05's JSON ignored -j anyway). Where this Slurm refuses a field or an option of it
        (squeue prints "Invalid job format specification: X" and exits 0, or getopt's
        "unrecognized option" and exits 1: src/squeue/opts.c, slurm-22-05-8-1:1728, 24-05-8-1:968),
        `squeue --json --me` as before, for this reader's life; `failed` says so (status --verbose).

        SlurmUnavailable when the queue cannot be read: squeue exits 1 with Slurm's error
        ("slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
        src/squeue/squeue.c _get_info: slurm_perror, slurm-22-05-8-1:231), to which one `scontrol
        ping` adds the controller's state as below. 22.05's JSON exits 0 with a
        document whose "errors" say only "slurm_load_jobs: Failed while looking for jobs"
        (src/plugins/openapi/v0.0.38/jobs.c:1079, the errno is lost): then one `scontrol ping`
        (no connection retries; 15 ms here) adds the controller's state in Slurm's words
        ("Slurmctld(primary) at vm is DOWN", src/scontrol/scontrol.c _ping_slurmctld, 22.05.8:567).
        """
        if self.failed is None:
            result = self.t.run(SQUEUE_ARGV, env=SQUEUE_ENV)
            refused = next((m for m in _TEXT_REFUSED if m in result.stderr), None)
            if refused is None:
                if result.returncode != 0:
                    said = _last_lines(result.stderr, result.stdout, result.returncode)
                    ping = self.ping() if "slurm_load_jobs" in said else ""
                    raise SlurmUnavailable(self.t.host, f"squeue: {said}" + (f"; scontrol ping: {ping}" if ping
                                                                             else ""))
                try:
                    return parse_squeue_text(result.stdout)
                except SlurmParseError as exc:
                    raise SlurmUnavailable(self.t.host, f"squeue printed what cannot be read: {exc}") from None
            said = next((ln.strip() for ln in result.stderr.splitlines() if refused in ln), refused)
            self.failed = (f"squeue --json: this squeue refused the text form's fields ({said[:200]}); "
                           "reading the queue as JSON")
        return self._queue_json()

    def _queue_json(self) -> list[JobInfo]:
        """`squeue --json --me` (`--me` honoured from 23.02; 22.05 prints every user's jobs)."""
        result = self.t.run(["squeue", "--json", "--me"])
        if result.returncode != 0:
            raise SlurmUnavailable(self.t.host, _last_lines(result.stderr, result.stdout, result.returncode))
        try:
            return parse_squeue_json(result.stdout)
        except SlurmParseError as exc:
            errors = _json_errors(result.stdout)
            if not errors:
                raise SlurmUnavailable(self.t.host, f"squeue --json printed what cannot be read: {exc}") from None
            ping = self.ping()
            raise SlurmUnavailable(self.t.host, f"squeue --json: {errors}" + (f"; scontrol ping: {ping}" if ping
                                                                                else "")) from None

    def ping(self) -> str:
        """`scontrol ping`: "Slurmctld(primary) at HOST is UP|DOWN" per controller, joined ("" if silent)."""
        result = self.t.run(["scontrol", "ping"], timeout=60)
        lines = [ln.strip() for ln in (result.stdout + result.stderr).splitlines()
                 if ln.strip() and not ln.startswith("*")]
        return "; ".join(lines)

    def accounting(self, job_ids: Iterable[str]) -> Optional[list[JobInfo]]:
        """`sacct --parsable2` for every id, one call per SACCT_JOBS_BYTES of ids (one call up to
        about 9,000 seven-digit ids); None when accounting is not available."""
        ids = sorted(set(job_ids), key=lambda j: (len(j), j))
        if not ids:
            return []
        out: list[JobInfo] = []
        for chunk in id_chunks(ids, SACCT_JOBS_BYTES):
            argv = ["sacct", "--parsable2", "--noheader", "--allocations", "--duplicates",
                    f"--format={','.join(SACCT_FIELDS)}", f"--jobs={chunk}"]
            result = self.t.run(argv)
            if result.returncode != 0:
                if any(marker in result.stderr for marker in _NO_ACCOUNTING):
                    return None
                result.check("sacct failed", self.t.host)
            out += parse_sacct_parsable(result.stdout)
        return out

    def cluster_info(self) -> ClusterInfo:
        """One `scontrol show config`: cluster name, version, accounting and jobcomp settings.

        Once per cluster per process and CLUSTER_INFO_TTL_S (_CLUSTER_INFO): a process that submits
        many chains (bench/scale_queue.py) asks once, not once per chain (issue 31). The answer is
        slurmctld's live configuration, which `scontrol reconfigure` changes without touching the
        file we can stamp (MaxArraySize: src/slurmctld/job_mgr.c _valid_array_inx, slurm-22-05-8-1),
        so an entry is also read again after the TTL."""
        import os
        import time

        key: tuple[object, ...] = (self.t.kind, self.t.host, os.environ.get("LINGJUN_SSH_CONFIG", ""))
        if self.t.kind == "local":  # which commands, which configuration file, and that file's version
            conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
            try:
                st = os.stat(conf)
                stamp: tuple[int, ...] = (st.st_ino, st.st_size, st.st_mtime_ns)
            except OSError:
                stamp = ()
            key += (os.environ.get("PATH", ""), conf, stamp)
        known = _CLUSTER_INFO.get(key)
        if known is not None and time.monotonic() - known[0] < CLUSTER_INFO_TTL_S:
            return known[1]
        info = self._read_cluster_info()
        _CLUSTER_INFO[key] = (time.monotonic(), info)
        return info

    def _read_cluster_info(self) -> ClusterInfo:
        problem = conf_problem(self.t)
        if problem:
            raise SlurmUnconfigured(f"{problem}\n{UNCONFIGURED_HINT}")
        try:
            result = self.t.run(["scontrol", "show", "config"], check=True, what="scontrol show config failed")
        except CommandError as exc:
            if unconfigured_hint(exc):  # Slurm's own lines (DNS SRV lookups) say nothing a user can act on
                fatal = [ln.strip() for ln in exc.stderr.splitlines() if "fatal:" in ln][-1:]
                raise SlurmUnconfigured("".join(f"{ln}\n" for ln in fatal) + UNCONFIGURED_HINT) from None
            raise
        conf: dict[str, str] = {}
        for line in result.stdout.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                conf[key.strip()] = value.strip()
        storage = conf.get("AccountingStorageType", "")
        jobcomp = conf.get("JobCompType", "")
        return ClusterInfo(
            name=conf.get("ClusterName", ""),
            slurm_version=conf.get("SLURM_VERSION", ""),
            accounting=storage.endswith("slurmdbd"),
            jobcomp_type=jobcomp.split("/")[-1] if jobcomp else "",
            jobcomp_loc=conf.get("JobCompLoc", ""),
            max_array_size=int(conf["MaxArraySize"]) if conf.get("MaxArraySize", "").isdigit() else None,
        )


# The queue in text (see SlurmCLI.queue), its times as epoch seconds (src/common/parse_time.c
# slurm_make_time_str, slurm-22-05-8-1:662-696: SLURM_TIME_FORMAT is any strftime format).
SQUEUE_ARGV: tuple[str, ...] = ("squeue", "--me", "--states=all", "--noheader", f"--Format={SQUEUE_FORMAT}")
SQUEUE_ENV: dict[str, str] = {"SLURM_TIME_FORMAT": "%s"}
# What an squeue that lacks a field or an option of SQUEUE_ARGV prints (src/squeue/opts.c
# parse_long_format "Invalid job format specification: %s", slurm-22-05-8-1:1728,
# slurm-24-05-8-1:968; getopt_long's "unrecognized option"; _parse_state "Invalid job state
# specified", slurm-22-05-8-1 opts.c:499).
_TEXT_REFUSED = ("Invalid job format specification", "unrecognized option", "Invalid job state specified")


def _last_lines(stderr: str, stdout: str, rc: int) -> str:
    said = stderr.strip() or stdout.strip() or f"squeue exit {rc}"
    return "; ".join(ln.strip() for ln in said.splitlines()[-3:] if ln.strip())


def _json_errors(text: str) -> str:
    """The "errors" of a Slurm JSON document, "source: description (error)" each; "" if none."""
    try:
        doc = json.loads(text)
    except (ValueError, TypeError):
        return ""
    errors = doc.get("errors") if isinstance(doc, dict) else None
    if not isinstance(errors, list):
        return ""
    out = []
    for e in errors:
        if isinstance(e, dict):
            desc = str(e.get("description") or "").strip()
            src = str(e.get("source") or "").strip()
            err = str(e.get("error") or "").strip()
            text_ = ": ".join(x for x in (src, desc) if x) or err
            if err and err != text_ and err not in text_:
                text_ += f" ({err})"
            out.append(text_)
        else:
            out.append(str(e))
    return "; ".join(x for x in out if x)
