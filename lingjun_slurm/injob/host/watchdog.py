"""The hang watchdog: beside a training step, end it when no new iteration appears for too long.

    python3 -m lingjun_slurm.injob.host.watchdog --format builtin|megatron --progress FILE --timeout S
        --startup-timeout S --log-interval N --pid SRUN_PID --stacks-dir DIR --record FILE
        [--grace S] [--ntasks N] [--executor slurm|local] [--job ID] [--poll S] [--floor-factor F]
        [--scancel PATH] [--run-dir DIR]
        [--textfile-dir DIR --textfile-staging DIR --run-id RUN --stage NAME --job-key KEY --seq-length N]
        [--straggler-action off|log|exclude|requeue --straggler-threshold X --straggler-windows N
         --straggler-window-s S --steps FILE --straggler-record FILE --iterations N --pipeline N
         --jobs-file FILE --metrics FILE --plan plan.json]

Stragglers (lingjun_slurm/injob/host/straggler.py; docs/fault-tolerance.md "Stragglers"): with
--straggler-action other than off, every poll also feeds the straggler detector: the builtin
trainer's per-rank step times (--steps, <run_dir>/steps/<attempt>.jsonl, read from its start) or,
for --format megatron, the same job log lines (`--timing-log-option all` blocks, `--log-straggler`
lines). A named straggler is said on stderr, recorded in --straggler-record and left for `status`;
for `requeue`, when the time it would save beats this run's measured restart cost, the step is
asked to save and exit as at the time limit (Actions.request_save), and the watchdog stops
watching for hangs (a save is no hang, as on_time_limit says). --plan gives the detector
Megatron-LM's parallel sizes, rank order and overlap flags (straggler.layout_from_plan). A detector
error never stops the hang watchdog.

Metrics for Prometheus (--textfile-dir; docs/monitoring.md): every poll the watchdog rewrites the
job's one file for node_exporter's textfile collector on this node, lingjun-slurm_<job>_<node>.prom
(promfile.py): its state, the last checkpoint's iteration and age, this job's goodput buckets so far
(ledger.py job_buckets, at most every GOODPUT_EVERY_S), for --format megatron the training numbers of
the log lines it follows (Exporter), and the builtin trainer's numbers: rank 0 stages them as samples
in --textfile-staging (<run_dir>/textfile/lingjun-slurm_<job>_<node>.json, in the container through
the run directory's own mount) and the watchdog merges them with its own at sample level into the
one file (promfile.read_staged, render); without a staged file, its own series only. No container
mounts the textfile directory (a pyxis mount of a path missing on one node fails the step:
promfile.py). The file goes when the watchdog ends, except after a hang.

Started by the batch script in the background, on the batch host, after srun (its pid is --pid).
It follows FILE from its current end (what an earlier attempt wrote is only used to learn the
step time): for --format builtin the train stage's metrics.jsonl ("train" records are
iterations; "save", "eval", "start", "stop" records are activity), for --format megatron the
job's stdout log (Megatron-LM's training_log line ' iteration N/ M | ... elapsed time per
iteration (ms): T |', anywhere in a line so `srun -l` "0: " prefixes and pyxis output do not
matter; its "saving checkpoint at iteration", "successfully saved checkpoint" and "validation
... loss at" lines are activity). Activity restarts the clock without being an iteration (a
checkpoint save or an evaluation can be longer than a step). A file that is missing, truncated
or replaced (rotated) is waited for and read again from its start.

Timeouts: until the first iteration of this attempt, --startup-timeout (image start, imports,
checkpoint load, the first step's compilation). After it, the larger of --timeout and a floor:
Megatron-LM prints only every --log-interval iterations (training.py training_log: `if
iteration % args.log_interval == 0 or is_first_iteration`), so the floor is log interval x the
newest step time seen x --floor-factor (default 3); for the builtin format the interval is 1
(one record per iteration). When the floor raises --timeout the watchdog says so once on stderr.

On a hang: one line on stderr, the JSON record (below) written to --record, SIGUSR2 to the
step's tasks (each dumps every thread's Python stack into --stacks-dir, lingjun_slurm.injob.stacks),
up to --grace seconds for the dumps (less with --ntasks N once N files grew), the record
rewritten with the stack files, then the step ended, and exit 3. The one line `status` shows as the
train stage's REASON ("hang: no iteration for 900 s at iteration 1200; the watchdog ended the step")
goes to <run dir>/stage-notes/train.txt (stagenotes.py) for this job.
  slurm: SIGUSR2 to srun, which forwards it to the tasks of its step (srun/signals.c), falling back
         to `scancel --signal=USR2 JOB` (every step but the batch one: job_mgr.c _signal_job
         KILL_STEPS_ONLY, slurmd req.c _kill_all_active_steps; the extern step too). The step is ended by SIGTERM to srun,
         which srun turns into SIGKILL for every task ("forcing job termination",
         srun/signals.c), then SIGKILL to srun if it is still there after --grace. Never
         `scancel --signal=KILL JOB`: on a running job that cancels the whole job (job_mgr.c
         job_signal: SIGKILL without KILL_STEPS_ONLY / KILL_JOB_BATCH -> CANCELLED,
         deallocate_nodes), so the batch script could not requeue.
  local: SIGUSR2 to the launcher (lingjun_slurm.executors.launch forwards it to its tasks); the
         launcher's tasks (its child processes and theirs) get SIGKILL, so the launcher exits
         128+9 like srun; the launcher itself gets SIGKILL if it is still there after --grace.

Record (one JSON object, written atomically, schema 1):
  {"type": "hang", "schema": 1, "job": "123"|null, "restart": 0, "phase": "startup"|"training",
   "last_iteration": 1200|null, "last_iteration_time": UNIX|null, "since": UNIX, "detected": UNIX,
   "idle_s": 901.2, "timeout_s": 900.0, "requested_timeout_s": 900.0, "step_time_s": 1.2|null,
   "log_interval": 10, "format": "megatron", "progress": FILE, "stacks_dir": DIR,
   "signal": "scancel --signal=USR2 123", "stacks": [{"path", "node", "rank", "pid", "bytes"}],
   "states": [{"node", "rank", "pid", "state"}] (read before any signal; see Actions.probe),
   "step_ended": true}
Exit status: 0 when --pid ended (the step ended by itself) or on SIGTERM/SIGINT; 3 after a hang
was handled; 2 on bad arguments. It never signals anything while iterations keep appearing.
Standard library only: it runs on the batch host, outside the container.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from lingjun_slurm.common.jsonobj import json_object

PREFIX = "lingjun-slurm: watchdog:"
HANG_EXIT = 3
SCHEMA = 1
CHUNK = 1 << 20  # bytes read at a time; what an earlier attempt wrote is calibrated from its last CHUNK

# Megatron-LM training_log (megatron/training/training.py, core_v0.16.1:2033-2041, main d98e8a6:3567-3576):
#  " [2025-01-01 12:00:00.000000] iteration       10/     500 | consumed samples: ... |
#   elapsed time per iteration (ms): 1234.5 | ..."
MEGATRON_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
MEGATRON_STEP_MS = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9]+(?:\.[0-9]*)?)")
# checkpointing.py save_checkpoint (core_v0.16.1:529, :727) and evaluate_and_print_results (training.py).
MEGATRON_ACTIVITY = re.compile(r"saving checkpoint at iteration|successfully saved checkpoint|validation\S* loss at ")
BUILTIN_ACTIVITY = ("save", "eval", "start", "stop")
STACKS_NAME = re.compile(r"^(?P<node>.+)-rank(?P<rank>\d+|x)-pid(?P<pid>\d+)\.txt$")


@dataclass(frozen=True)
class Event:
    kind: str  # "iteration" | "activity"
    iteration: Optional[int] = None
    step_time_s: Optional[float] = None


def parse_megatron(line: str) -> Optional[Event]:
    m = MEGATRON_ITERATION.search(line)
    if m:
        t = MEGATRON_STEP_MS.search(line, m.end())
        return Event("iteration", int(m.group(1)), float(t.group(1)) / 1000.0 if t else None)
    if MEGATRON_ACTIVITY.search(line):
        return Event("activity")
    return None


def parse_builtin(line: str) -> Optional[Event]:
    rec = json_object(line)
    if rec is None:
        return None
    kind = rec.get("type")
    if kind == "train" and isinstance(rec.get("iteration"), int):
        step = rec.get("step_time_s")
        ok = isinstance(step, (int, float)) and not isinstance(step, bool) and step == step and step >= 0
        return Event("iteration", rec["iteration"], float(step) if ok else None)
    if kind in BUILTIN_ACTIVITY:
        return Event("activity")
    return None


PARSERS: dict[str, Callable[[str], Optional[Event]]] = {"builtin": parse_builtin, "megatron": parse_megatron}


class Follower:
    """New complete lines of a file that may not exist yet, be truncated, or be replaced."""

    def __init__(self, path: str, from_end: bool = True) -> None:
        self.path = path
        self._fh: Any = None
        self._ino: Optional[tuple[int, int]] = None
        self._buf = b""
        self.initial: list[str] = []  # the tail of what was there at start (calibration only)
        if from_end and self._open():
            size = os.fstat(self._fh.fileno()).st_size
            self._fh.seek(max(0, size - CHUNK))
            *complete, partial = self._fh.read(size - self._fh.tell()).split(b"\n")
            self.initial = [b.decode("utf-8", "replace") for b in complete[1 if size > CHUNK else 0:]]
            self._fh.seek(size - len(partial))  # a line being written is read whole, later

    def _open(self) -> bool:
        try:
            fh = open(self.path, "rb")
        except OSError:
            return False
        st = os.fstat(fh.fileno())
        self._close()
        self._fh, self._ino, self._buf = fh, (st.st_dev, st.st_ino), b""
        return True

    def _close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh = None

    def lines(self) -> list[str]:
        try:
            st = os.stat(self.path)
        except OSError:
            return self._drain()  # gone: what the open file still has; wait for a new one
        if self._fh is None or (st.st_dev, st.st_ino) != self._ino:
            out = self._drain()  # the rest of the old file, then the new one from its start
            return out + (self._drain() if self._open() else [])
        if st.st_size < self._fh.tell():  # truncated in place: read again from its start
            self._fh.seek(0)
            self._buf = b""
        return self._drain()

    def _drain(self) -> list[str]:
        if self._fh is None:
            return []
        out: list[str] = []
        while True:
            try:
                data = self._fh.read(CHUNK)
            except OSError:
                break
            if not data:
                break
            self._buf += data
            *complete, self._buf = self._buf.split(b"\n")
            out += [b.decode("utf-8", "replace") for b in complete]
        return out


@dataclass
class State:
    """What the watchdog knows: pure, driven by feed() and due() with explicit clocks (tests)."""

    timeout: float
    startup_timeout: float
    log_interval: int
    floor_factor: float = 3.0
    started: float = 0.0  # monotonic
    last_activity: float = 0.0
    last_iteration: Optional[int] = None
    last_iteration_wall: Optional[float] = None
    step_time_s: Optional[float] = None
    raised_said: bool = False
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.last_activity = self.started

    def calibrate(self, event: Optional[Event]) -> None:
        if event is not None and event.step_time_s is not None:
            self.step_time_s = event.step_time_s

    def feed(self, event: Optional[Event], now: float, wall: float) -> None:
        if event is None:
            return
        self.calibrate(event)
        self.last_activity = now
        if event.kind == "iteration":
            self.last_iteration, self.last_iteration_wall = event.iteration, wall

    @property
    def phase(self) -> str:
        return "startup" if self.last_iteration is None else "training"

    def floor(self) -> float:
        if self.step_time_s is None:
            return 0.0
        return self.log_interval * self.step_time_s * self.floor_factor

    def effective_timeout(self) -> float:
        if self.phase == "startup":
            return self.startup_timeout
        floor = self.floor()
        if floor > self.timeout:
            if not self.raised_said:
                self.raised_said = True
                self.notes.append(
                    f"{PREFIX} hang timeout raised from {self.timeout:g} s to {floor:.0f} s: progress shows every "
                    f"{self.log_interval} iteration(s) of {self.step_time_s:.3g} s (x{self.floor_factor:g} margin)")
            return floor
        return self.timeout

    def due(self, now: float) -> bool:
        return now - self.last_activity > self.effective_timeout()


def parse_stacks_name(path: str) -> dict[str, Any]:
    m = STACKS_NAME.match(os.path.basename(path))
    if not m:
        return {"node": None, "rank": None, "pid": None}
    rank = m.group("rank")
    return {"node": m.group("node"), "rank": int(rank) if rank.isdigit() else None, "pid": int(m.group("pid"))}


def stack_sizes(directory: str) -> dict[str, int]:
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    out = {}
    for name in names:
        if name.endswith(".txt"):
            try:
                out[os.path.join(directory, name)] = os.stat(os.path.join(directory, name)).st_size
            except OSError:
                pass
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"  # a zombie has ended
    except (OSError, IndexError):
        return True


def descendants(pid: int) -> list[int]:
    """Every process below pid (Linux /proc), children before grandchildren."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(0), []):
            out.append(child)
            todo.append(child)
    return out


def _kill(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


class Actions:
    """How the step's tasks are signalled and ended; tests pass stand-ins."""

    def __init__(self, executor: str, pid: int, job: Optional[str], scancel: str = "scancel") -> None:
        self.executor, self.pid, self.job, self.scancel = executor, pid, job, scancel

    def signal_tasks(self) -> str:
        """SIGUSR2 to every task of the step; says how. srun forwards it to the tasks of its own step
        (srun/signals.c), and so does the local launcher. `scancel --signal=USR2 JOB` only when srun
        is gone: it signals every step but the batch one, the extern step too, whose `sleep` dies of
        it in Slurm 22.05-24.11 (slurmstepd mgr.c), ending pam_slurm_adopt's sessions."""
        if _kill(self.pid, signal.SIGUSR2):
            return f"kill -USR2 {self.pid}"
        if self.executor == "slurm" and self.job:
            cmd = [self.scancel, "--signal=USR2", self.job]
            try:
                if subprocess.run(cmd, timeout=60, stdin=subprocess.DEVNULL).returncode == 0:
                    return " ".join(cmd)
            except (OSError, subprocess.SubprocessError) as exc:
                print(f"{PREFIX} {' '.join(cmd)}: {exc}", file=sys.stderr, flush=True)
        return "none (the step's launcher is gone)"

    def probe(self, stacks_dir: str) -> list[dict[str, Any]]:
        """Each rank's process state (Linux /proc/PID/stat: R running, S sleeping, D uninterruptible,
        T stopped, Z zombie, gone) read on its own node, before anything is signalled: a stopped or
        uninterruptible rank is the one that holds the others up (a dump cannot always tell: on
        the test cluster (proctrack/linuxproc) even a SIGSTOPped rank answered SIGUSR2, its stop
        undone on the way; under proctrack/cgroup only SIGKILL resumes a stopped cgroup). Ranks are the stack files' <node>-rank<R>-pid<P>.txt names;
        on Slurm one host task per node reads them (`srun --overlap`: beside the hung step)."""
        paths = sorted(p for p in stack_sizes(stacks_dir) if parse_stacks_name(p)["pid"] is not None)
        ranks = [(p, parse_stacks_name(p)) for p in paths]
        if not ranks:
            return []
        if self.executor == "slurm" and self.job:
            script = ('for f in "$1"/"$SLURMD_NODENAME"-rank*-pid*.txt; do [ -e "$f" ] || continue; '
                      'pid=${f##*-pid}; pid=${pid%.txt}; st=gone; '
                      'if [ -r "/proc/$pid/stat" ]; then read -r line < "/proc/$pid/stat" || true; '
                      'rest=${line##*) }; st=${rest%% *}; fi; echo "${f##*/} $st"; done')
            nodes = sorted({str(r["node"]) for _, r in ranks})
            # Exactly those nodes, one task each: without --ntasks, 22.05 takes the job's SLURM_NTASKS
            # and ignores --ntasks-per-node (libsrun/opt.c, 22.05).
            # --mem=0: under SelectTypeParameters=CR_*_Memory (CycleCloud's CR_Core_Memory) the probe
            # inherits the batch script's SLURM_MEM_PER_CPU and asks for memory the hung step holds:
            # "Memory required by task is not available" (seen on the production-like test cluster,
            # 22.05). Zero is "all available job memory to new job steps" (doc/man/man1/srun.1, --mem).
            cmd = ["srun", "--overlap", f"--jobid={self.job}", f"--nodelist={','.join(nodes)}",
                   f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1", "--time=1",
                   "--mem=0", "--kill-on-bad-exit=0", "bash", "-c", script, "probe", stacks_dir]
            states: dict[str, str] = {}
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
                states = dict(line.rsplit(" ", 1) for line in proc.stdout.splitlines() if " " in line)
            except (OSError, subprocess.SubprocessError) as exc:
                print(f"{PREFIX} could not read the ranks' states: {exc}", file=sys.stderr, flush=True)
            return [{**r, "state": states.get(os.path.basename(p))} for p, r in ranks]
        out = []
        for _, r in ranks:
            try:
                with open(f"/proc/{r['pid']}/stat", "rb") as fh:
                    state = fh.read().rsplit(b")", 1)[1].split()[0].decode()
            except (OSError, IndexError):
                state = "gone"
            out.append({**r, "state": state})
        return out

    def end_step(self) -> None:
        if self.executor == "slurm":
            _kill(self.pid, signal.SIGTERM)  # srun: SIGKILL to every task of its step
        else:
            for child in descendants(self.pid):
                _kill(child, signal.SIGKILL)

    def force(self) -> None:
        _kill(self.pid, signal.SIGKILL)

    def request_save(self) -> str:
        """Ask the step's tasks to save a checkpoint and exit, as the batch script's on_time_limit
        does: `scancel --signal=TERM JOB` on Slurm (every step but the batch one; SIGTERM to srun
        itself would become SIGKILL for the tasks, srun/signals.c), SIGTERM to the local launcher,
        which forwards it."""
        if self.executor == "slurm" and self.job:
            cmd = [self.scancel, "--signal=TERM", self.job]
            try:
                if subprocess.run(cmd, timeout=60, stdin=subprocess.DEVNULL).returncode == 0:
                    return " ".join(cmd)
            except (OSError, subprocess.SubprocessError) as exc:
                print(f"{PREFIX} {' '.join(cmd)}: {exc}", file=sys.stderr, flush=True)
            return "none: scancel failed"
        return f"kill -TERM {self.pid}" if _kill(self.pid, signal.SIGTERM) else "none (the launcher is gone)"


# Metrics for node_exporter's textfile collector (--textfile-dir; docs/monitoring.md). For --format
# megatron the training numbers come from the same log lines: training_log's fields (training.py
# core_v0.16.1:2034-2075: ' learning rate: {:.6E} |', ' global batch size: {:5d} |', ' lm loss: {:.6E} |',
# ' throughput per GPU (TFLOP/s/GPU): {:.1f} |'), report_memory (utils.py core_v0.16.1:279-291:
# "[Rank N] ... memory (MB) | allocated: A | max allocated: M | ..."), and save_checkpoint's
# "successfully saved checkpoint from iteration {:7d} to ..." (checkpointing.py core_v0.16.1:727).
_FLOAT = r"([-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|nan|inf))"
MEGATRON_FIELDS = (
    ("loss", re.compile(r"\blm loss:\s*" + _FLOAT, re.IGNORECASE)),
    ("lr", re.compile(r"\blearning rate:\s*" + _FLOAT)),
    ("tflops_per_gpu", re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*" + _FLOAT)),
    ("global_batch", re.compile(r"global batch size:\s*([0-9]+)")),
)
MEGATRON_MEMORY = re.compile(r"\[Rank (\d+)\] .*memory \(MB\) \| allocated: [0-9.]+ \| max allocated: ([0-9.]+)")
MEGATRON_SAVED = re.compile(r"successfully saved checkpoint from iteration\s+(\d+)")
GOODPUT_EVERY_S = 15.0  # the ledger reads this job's records: not every poll


class Exporter:
    """The job's one file on this node for node_exporter's textfile collector
    (lingjun_slurm/injob/host/promfile.py, file_name): its state, the last checkpoint (iteration, age),
    this job's goodput buckets so far (helper module lingjun_slurm.injob.host.ledger, job_buckets),
    for --format megatron the training numbers from the log lines it follows, and the samples the
    builtin trainer's rank 0 stages in `staging` (injob/train/metrics.py PromFile; promfile.read_staged),
    merged with its own at sample level and rendered once: a family both carry gets one HELP and TYPE
    (expfmt text_parse.go v0.37.0 fails a file with a second one). The trainer's carry rank="0" and
    the watchdog writes no training series for --format builtin, so no series is in both."""

    def __init__(self, directory: str, fmt: str, run: str, stage: str, job: str, node: str,
                 run_dir: Optional[str] = None, seq_length: Optional[int] = None,
                 clock: Callable[[], float] = time.time, staging: Optional[str] = None) -> None:
        from . import promfile

        self.fmt, self.run_dir, self.job, self.seq_length, self.clock = fmt, run_dir, job, seq_length, clock
        self.directory, self.staging = directory, staging
        self._staged_failed = False
        self.writer = promfile.Writer(directory, job, node,
                                      {"run": run, "stage": stage, "slurm_job": job, "node": node},
                                      warn=lambda text: print(f"{PREFIX} metrics for Prometheus: {text}",
                                                              file=sys.stderr, flush=True))
        self.train: dict[str, float] = {}
        self.memory: dict[str, float] = {}  # rank -> bytes
        self.ckpt_iteration: Optional[int] = None
        self.ckpt_time: Optional[float] = None
        self.goodput: dict[str, float] = {}
        self._goodput_at: Optional[float] = None
        self._ledger: Any = None
        self.goodput_note: Optional[str] = None

    def feed(self, line: str, event: Optional[Event], wall: Optional[float]) -> None:
        """One line of the progress file; wall None for what an earlier attempt wrote (time unknown)."""
        if self.fmt == "builtin":
            rec = json_object(line)
            if rec is not None and rec.get("type") == "save" and isinstance(rec.get("iteration"), int):
                t = rec.get("time")
                self.ckpt_iteration = rec["iteration"]
                self.ckpt_time = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else wall
            return
        m = MEGATRON_SAVED.search(line)
        if m:
            self.ckpt_iteration, self.ckpt_time = int(m.group(1)), wall
            return
        m = MEGATRON_MEMORY.search(line)
        if m:
            self.memory[m.group(1)] = float(m.group(2)) * 1024 * 1024
            return
        if event is None or event.kind != "iteration":
            return
        train: dict[str, float] = {"iteration": float(event.iteration or 0)}
        if event.step_time_s:
            train["step_time_s"] = event.step_time_s
        for key, rx in MEGATRON_FIELDS:
            fm = rx.search(line)
            if fm:
                try:
                    train[key] = float(fm.group(1))
                except ValueError:
                    pass
        if self.seq_length and event.step_time_s and "global_batch" in train:
            train["tokens_per_s"] = train["global_batch"] * self.seq_length / event.step_time_s
        train.pop("global_batch", None)
        self.train = train

    def _poll_goodput(self, now: float) -> None:
        if not self.run_dir or (self._goodput_at is not None and now - self._goodput_at < GOODPUT_EVERY_S):
            return
        self._goodput_at = now
        if self._ledger is None:
            try:
                from . import ledger  # helper A's module (issue 30): the buckets of this job so far
                self._ledger = ledger
            except ImportError as exc:
                self._ledger = False
                self.goodput_note = f"no goodput series: {exc}"
                print(f"{PREFIX} metrics for Prometheus: {self.goodput_note}", file=sys.stderr, flush=True)
        if not self._ledger:
            return
        try:
            buckets = self._ledger.job_buckets(self.run_dir, self.job, now)
            self.goodput = {str(k): float(v) for k, v in buckets.items()}
        except Exception as exc:  # noqa: BLE001 - metrics are extra: the hang watchdog goes on
            if self.goodput_note is None:
                self.goodput_note = f"goodput buckets not read: {type(exc).__name__}: {exc}"
                print(f"{PREFIX} metrics for Prometheus: {self.goodput_note}", file=sys.stderr, flush=True)

    def write(self, state: State, now_mono: float, hang: bool = False) -> None:
        now = self.clock()
        self._poll_goodput(now)
        current = "hang" if hang else state.phase
        samples: list[tuple[str, dict[str, str], Any]] = [
            ("lingjun_watchdog_state", {"state": name}, 1 if name == current else 0)
            for name in ("startup", "training", "hang")]
        samples += [("lingjun_watchdog_idle_seconds", {}, round(max(0.0, now_mono - state.last_activity), 3)),
                    ("lingjun_watchdog_timeout_seconds", {}, round(state.effective_timeout(), 3))]
        if self.fmt == "megatron":
            names = {"iteration": "lingjun_train_iteration", "loss": "lingjun_train_loss",
                     "lr": "lingjun_train_learning_rate", "tokens_per_s": "lingjun_train_tokens_per_second",
                     "step_time_s": "lingjun_train_step_seconds", "tflops_per_gpu": "lingjun_train_tflops_per_gpu"}
            for key, value in self.train.items():
                samples.append((names[key], {}, int(value) if key == "iteration" else value))
            samples += [("lingjun_train_memory_peak_bytes", {"rank": rank}, value)
                        for rank, value in sorted(self.memory.items())]
            if self.ckpt_iteration is not None:
                samples.append(("lingjun_checkpoint_iteration", {}, self.ckpt_iteration))
        if self.ckpt_time is not None:
            samples.append(("lingjun_checkpoint_age_seconds", {}, round(max(0.0, now - self.ckpt_time), 3)))
        samples += [("lingjun_goodput_seconds", {"bucket": b}, round(v, 3)) for b, v in sorted(self.goodput.items())]
        samples.append(("lingjun_metrics_updated_timestamp_seconds", {}, round(now, 3)))
        self.writer.write(samples, self.staged())

    def staged(self) -> list[Any]:
        """The trainer's staged samples (promfile.read_staged), none without them; a bad staged file
        is said once and left out (the watchdog's own series still go)."""
        if not self.staging:
            return []
        from . import promfile

        try:
            return promfile.read_staged(self.staging, self.job)
        except (OSError, promfile.PromError) as exc:
            if not self._staged_failed:
                print(f"{PREFIX} metrics for Prometheus: the trainer's staged series left out: {exc}",
                      file=sys.stderr, flush=True)
            self._staged_failed = True
            return []

    def remove(self) -> None:
        """The job's file (the trainer removes its staged file itself; the batch script, at the job's end,
        whatever is left)."""
        self.writer.remove()


STOPPED_DUMP_WAIT_S = 5.0  # _handle_hang: how long a stopped rank's dump is waited for


@dataclass
class Options:
    format: str
    progress: str
    timeout: float
    startup_timeout: float
    log_interval: int
    pid: int
    stacks_dir: str
    record: str
    grace: float = 20.0
    ntasks: Optional[int] = None
    poll: float = 2.0
    floor_factor: float = 3.0
    job: Optional[str] = None
    restart: int = 0
    hold_signals: bool = False  # the command: ignore SIGTERM/SIGINT while a hang is being handled
    run_dir: Optional[str] = None  # the hang's one line for `status` goes to <run_dir>/stage-notes/train.txt
    straggler: Any = None  # straggler.Watch, or None (straggler_action off)
    steps: Optional[str] = None  # the builtin trainer's steps/<attempt>.jsonl
    exporter: Any = None  # Exporter (--textfile-dir), or None


def _iso(wall: Optional[float]) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(wall)) if wall is not None else "none"


def hang_note(last_iteration: Optional[int], timeout: float) -> str:
    """The REASON `status` shows for the train stage after a hang (docs/status-reasons.md)."""
    where = (f"at iteration {last_iteration}" if last_iteration is not None
             else "since the step started (startup timeout)")
    return f"hang: no iteration for {timeout:.0f} s {where}; the watchdog ended the step"


def note_hang(run_dir: Optional[str], last_iteration: Optional[int], timeout: float) -> None:
    """<run_dir>/stage-notes/train.txt (lingjun_slurm/injob/host/stagenotes.py) for this job; never fatal."""
    if not run_dir:
        return
    from . import stagenotes

    try:
        stagenotes.write_note(run_dir, "train", hang_note(last_iteration, timeout))
    except OSError as exc:
        print(f"{PREFIX} cannot record the hang for `status` in {run_dir}: {exc}", file=sys.stderr, flush=True)


def write_record(path: str, record: dict[str, Any]) -> None:
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        print(f"{PREFIX} cannot write {path}: {exc}", file=sys.stderr, flush=True)


def watch(opts: Options, actions: Actions, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> int:
    parse = PARSERS[opts.format]
    interval = opts.log_interval if opts.format == "megatron" else 1
    start_wall = time.time()
    state = State(opts.timeout, opts.startup_timeout, max(1, interval), opts.floor_factor, started=clock())
    follower = Follower(opts.progress, from_end=True)
    for line in follower.initial:
        event = parse(line)
        state.calibrate(event)
        if opts.exporter is not None:
            opts.exporter.feed(line, event, None)  # the last checkpoint an earlier attempt saved
    steps = Follower(opts.steps, from_end=False) if opts.straggler is not None and opts.steps else None
    while True:
        now, wall = clock(), time.time()
        lines = follower.lines()
        for line in lines:
            event = parse(line)
            state.feed(event, now, wall)
            if opts.exporter is not None:
                opts.exporter.feed(line, event, wall)
        if opts.exporter is not None:
            _poll_exporter(opts, state, now)
        if opts.straggler is not None:
            _poll_straggler(opts, steps.lines() if steps is not None else lines, state.last_iteration)
            if opts.straggler is not None and opts.straggler.stop_requested:
                # As on_time_limit does (train.sbatch): a save asked for is no hang; one longer than the
                # hang timeout would otherwise be taken for one (stacks, the node blamed).
                print(f"{PREFIX} the straggler action asked the step to save and exit: a save is no hang, "
                      f"the watchdog stops watching", file=sys.stderr, flush=True)
                return 0
        due = state.due(now)
        for note in state.notes:
            print(note, file=sys.stderr, flush=True)
        state.notes.clear()
        if not pid_alive(opts.pid):
            return 0
        if due:
            return _handle_hang(opts, actions, state, start_wall, clock, sleep)
        sleep(opts.poll)


def _poll_exporter(opts: Options, state: State, now: float, hang: bool = False) -> None:
    try:
        opts.exporter.write(state, now, hang)
    except Exception as exc:  # noqa: BLE001 - metrics are extra: the hang watchdog goes on
        print(f"{PREFIX} metrics for Prometheus stopped: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        opts.exporter = None


def _poll_straggler(opts: Options, lines: list[str], last_iteration: Optional[int]) -> None:
    try:
        opts.straggler.poll(lines, last_iteration)
    except Exception as exc:  # noqa: BLE001 - the detector is extra: the hang watchdog goes on
        print(f"{PREFIX} straggler detection stopped: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        opts.straggler = None


def _handle_hang(opts: Options, actions: Actions, state: State, start_wall: float,
                 clock: Callable[[], float], sleep: Callable[[float], None]) -> int:
    # From here the batch script may see the step end (we end it) and stop us with SIGTERM: the
    # command (main) finishes the record first (bounded: the probe's 60 s, then twice --grace).
    if opts.hold_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
    now, wall = clock(), time.time()
    idle = now - state.last_activity
    since = wall - idle
    timeout = state.effective_timeout()
    if state.last_iteration is None:
        last = f"last: none since the start at {_iso(start_wall)}"
    else:
        last = f"last: {state.last_iteration} at {_iso(state.last_iteration_wall)}"
    print(f"{PREFIX} no new iteration for {idle:.0f} s ({last}): collecting stack traces and ending the step",
          file=sys.stderr, flush=True)
    note_hang(opts.run_dir, state.last_iteration, timeout)
    if opts.exporter is not None:
        _poll_exporter(opts, state, now, hang=True)
    record: dict[str, Any] = {
        "type": "hang", "schema": SCHEMA, "job": opts.job, "restart": opts.restart, "phase": state.phase,
        "last_iteration": state.last_iteration,
        "last_iteration_time": round(state.last_iteration_wall, 3) if state.last_iteration_wall else None,
        "since": round(since, 3), "detected": round(wall, 3), "idle_s": round(idle, 1),
        "timeout_s": round(timeout, 1), "requested_timeout_s": opts.startup_timeout if state.phase == "startup"
        else opts.timeout, "step_time_s": state.step_time_s, "log_interval": opts.log_interval,
        "format": opts.format, "progress": opts.progress, "stacks_dir": opts.stacks_dir,
        "signal": None, "stacks": [], "step_ended": False}
    record["states"] = actions.probe(opts.stacks_dir)
    write_record(opts.record, record)
    before = stack_sizes(opts.stacks_dir)
    record["signal"] = actions.signal_tasks()
    signalled = clock()
    deadline = signalled + opts.grace
    # Stopped ranks (T/t: SIGSTOP, a tracer) run no handler until continued: under proctrack/cgroup
    # nothing continues them, so their dumps never come. Once every other rank has dumped, they get
    # STOPPED_DUMP_WAIT_S, not the whole grace (where the launcher does continue them, as seen on a
    # proctrack/linuxproc test cluster, their dump came within it).
    stopped = sum(1 for st in record["states"] if st.get("state") in ("T", "t"))
    grown: dict[str, int] = {}
    stable_since = clock()
    while clock() < deadline:
        sleep(min(opts.poll, 0.5))
        sizes = stack_sizes(opts.stacks_dir)
        now_grown = {p: s for p, s in sizes.items() if s > before.get(p, 0)}
        if now_grown != grown:
            grown, stable_since = now_grown, clock()
        if opts.ntasks and clock() - stable_since >= 1.0:
            if len(grown) >= opts.ntasks:
                break
            if stopped and len(grown) >= opts.ntasks - stopped and clock() - signalled >= STOPPED_DUMP_WAIT_S:
                break
    record["stacks"] = [{"path": p, **parse_stacks_name(p), "bytes": s} for p, s in sorted(grown.items())]
    actions.end_step()
    end_deadline = clock() + max(opts.grace, 5.0)
    while pid_alive(opts.pid) and clock() < end_deadline:
        sleep(0.2)
    if pid_alive(opts.pid):
        print(f"{PREFIX} the step did not end after {max(opts.grace, 5.0):g} s: SIGKILL to {opts.pid}",
              file=sys.stderr, flush=True)
        actions.force()
        sleep(0.5)
    record["step_ended"] = not pid_alive(opts.pid)
    write_record(opts.record, record)
    return HANG_EXIT


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text}")
    return value


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m lingjun_slurm.injob.host.watchdog", description=__doc__.splitlines()[0])
    p.add_argument("--format", choices=sorted(PARSERS), required=True)
    p.add_argument("--progress", required=True, help="metrics.jsonl (builtin) or the job's stdout log (megatron)")
    p.add_argument("--timeout", type=_positive, required=True, help="seconds without a new iteration")
    p.add_argument("--startup-timeout", type=_positive, required=True, help="seconds until the first iteration")
    p.add_argument("--log-interval", type=int, default=1, help="Megatron-LM's --log-interval (builtin: ignored)")
    p.add_argument("--pid", type=int, required=True, help="srun's (or the local launcher's) pid")
    p.add_argument("--stacks-dir", required=True)
    p.add_argument("--record", required=True)
    p.add_argument("--grace", type=_positive, default=20.0, help="seconds for the stack dumps")
    p.add_argument("--ntasks", type=int, default=None, help="stop waiting once this many stack files grew")
    p.add_argument("--executor", choices=("slurm", "local"), default="slurm")
    p.add_argument("--job", default=os.environ.get("SLURM_JOB_ID") or None)
    p.add_argument("--poll", type=_positive, default=2.0)
    p.add_argument("--floor-factor", type=_positive, default=3.0)
    p.add_argument("--scancel", default="scancel")
    # The batch prelude's RUN_DIR rule (slurm_templates/partials/prelude.sh.j2): sbatch runs in the
    # run directory (SLURM_SUBMIT_DIR); the local executor sets LINGJUN_RUN_DIR.
    p.add_argument("--run-dir", default=os.environ.get("SLURM_SUBMIT_DIR") or os.environ.get("LINGJUN_RUN_DIR") or None,
                   help="the run directory: the hang's reason for `status` goes to stage-notes/train.txt")
    p.add_argument("--straggler-action", choices=("off", "log", "exclude", "requeue"), default="off")
    p.add_argument("--straggler-threshold", type=_positive, default=1.2)
    p.add_argument("--straggler-windows", type=int, default=10)
    p.add_argument("--straggler-window-s", type=_positive, default=60.0)
    p.add_argument("--steps", default=None, help="builtin: the trainer's steps/<attempt>.jsonl")
    p.add_argument("--straggler-record", default=None, help="stragglers/<attempt>.json")
    p.add_argument("--iterations", type=int, default=0, help="the run's training iterations (requeue's rule)")
    p.add_argument("--pipeline", type=int, default=1, help="pipeline parallel size (Megatron-LM's stages)")
    p.add_argument("--jobs-file", default=None, help="<run_dir>/jobs/<key>: this job's start/end markers")
    p.add_argument("--metrics", default=None, help="metrics.jsonl: first iterations and save times")
    p.add_argument("--plan", default=None, help="plan.json: Megatron-LM's parallel sizes, rank order and overlap "
                   "flags for the straggler detector (settings.parallelism, settings.training.extra_args)")
    p.add_argument("--textfile-dir", default=None, help="node_exporter's textfile collector directory: write "
                   "lingjun-slurm_<job>_<node>.prom there (docs/monitoring.md)")
    p.add_argument("--run-id", default=None, help="the run label of the metrics (--textfile-dir)")
    p.add_argument("--stage", default="train", help="the stage label of the metrics (--textfile-dir)")
    p.add_argument("--job-key", default=None, help="the job label and file name part (default --job)")
    p.add_argument("--textfile-staging", default=None, help="where the builtin trainer's rank 0 stages its "
                   "samples (<run_dir>/textfile/*.json): merged into the file in --textfile-dir at every poll")
    p.add_argument("--seq-length", type=int, default=None, help="megatron: tokens/s = global batch x this / step time")
    a = p.parse_args(argv)
    if a.log_interval < 1:
        p.error("--log-interval must be >= 1")
    if a.straggler_action != "off" and (not a.straggler_threshold > 1 or a.straggler_windows < 1 or a.pipeline < 1
                                        or not a.straggler_record):
        p.error("--straggler-action needs --straggler-threshold > 1, --straggler-windows >= 1, --pipeline >= 1 "
                "and --straggler-record")
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    opts = Options(a.format, a.progress, a.timeout, a.startup_timeout, a.log_interval, a.pid, a.stacks_dir,
                   a.record, a.grace, a.ntasks, a.poll, a.floor_factor, a.job, int(restart) if restart.isdigit() else 0,
                   hold_signals=True, run_dir=a.run_dir)
    actions = Actions(a.executor, a.pid, a.job, a.scancel)
    if a.textfile_dir:
        from .promfile import node_name

        key = a.job_key or a.job or "none"
        opts.exporter = Exporter(a.textfile_dir, a.format, a.run_id or os.path.basename(a.run_dir or "") or "none",
                                 a.stage, key, node_name(), a.run_dir, a.seq_length, staging=a.textfile_staging)
    if a.straggler_action != "off":
        from .straggler import PREFIX as S_PREFIX, Layout, Watch, layout_from_plan

        layout = Layout(pipeline=a.pipeline)
        if a.plan:
            try:
                with open(a.plan, encoding="utf-8") as fh:
                    layout = layout_from_plan(json.load(fh), a.format, a.pipeline)
            except (OSError, ValueError) as exc:  # the hang watchdog goes on; say what is not known
                print(f"{S_PREFIX} cannot read --plan {a.plan}: {exc}: Megatron-LM's flags are unknown, using "
                      f"--pipeline {a.pipeline} and the default rank order", file=sys.stderr, flush=True)
        opts.steps = a.steps
        opts.straggler = Watch(a.straggler_action, a.straggler_threshold, a.straggler_windows, a.straggler_window_s,
                               a.format, a.straggler_record, a.iterations, a.pipeline, a.run_dir, a.job,
                               a.jobs_file, a.metrics,
                               # the local executor has no requeue: a stop there would only end the run
                               request_stop=actions.request_save if a.executor == "slurm" else None,
                               layout=layout, world=a.ntasks)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))  # the batch script stops it (time limit, the step ended)
    exporter = opts.exporter
    rc = 0
    try:
        rc = watch(opts, actions)
        return rc
    finally:
        # Its file goes with it (the batch script removes the job's files at the job's end too), except
        # after a hang: the state "hang" stays visible until the job ends or is requeued.
        if exporter is not None and rc != HANG_EXIT:
            exporter.remove()


if __name__ == "__main__":
    sys.exit(main())
