"""Whether a failed train attempt is requeued: decided from what its step's tasks did, not from
srun's exit code.

    python3 -m lingjun_slurm.injob.host.retry --log FILE --offset N --rc RC --start-iteration S \\
        --last-iteration L [--time-limit] [--hang-record PATH] [--moved-away] [--run-dir DIR]

prints one line, `retry: <why>` or `stop: <why>`, and exits 0 (2 for bad arguments). With
--run-dir a `stop` is also left in <run_dir>/stage-notes/train.txt, where `lingjun-slurm status`
shows it in the stage's REASON.

Why not the exit code: the train step runs `srun --kill-on-bad-exit=1`. When one rank ends with
`exit 1`, srun kills the others (launch_slurm.c _task_finish -> _step_signal(SIG_TERM_KILL), Slurm
22.05; src/srun/launch.c from 23.02), and srun's own exit code is the *highest signal* of any
task when one was signalled ("keep the highest signal so that it's predictable to the user",
same function): 143 or 137 for a deterministic `exit 1`. The old rule "rc >= 128 is retryable"
requeued such a crash max_restarts times, each time paying the requeue delay, the queue and a
container start on every node.

The facts, in order (the first that applies decides):

1. the time limit was reached (the save-and-exit signal) -> retry;
2. the hang watchdog ended the step (its record is non-empty) -> retry;
3. the job is moving away from a node this attempt blamed (a device error in the log, a hung
   node, a node where the step could not start while it started elsewhere, a failed pre-flight:
   `--moved-away`) -> retry on other nodes;
4. a newer checkpoint than at this attempt's start (progress) -> retry: it resumes from there;
5. the step could not start ("task N launch failed: ...", "Task launch for ... failed on node
   X: ...", "Application launch failed: ...": a binding srun cannot satisfy, pyxis failing to
   import or start the image) and no node was blamed -> stop: it would fail the same way. srun
   exits 0 when every task failed to launch through a SPANK plugin, and 128 + the low byte of a
   Slurm error code (e.g. 192) when slurmd refused the launch: neither is a clean exit or a signal;
6. the step exited 0 with iterations left -> retry;
7. srun reported a node failure ("Node failure on X") -> retry;
8. a collective timed out (torch's NCCL watchdog: "Watchdog caught collective operation timeout";
   crashlog's nccl-timeout) -> retry, as for a hang: torch aborts every rank (`Aborted (core
   dumped)`) when its timeout (Megatron-LM: 10 minutes) ends before the hang watchdog's;
9. the first task srun reports as failed (its "task N: ..." line, read by crashlog.SRUN_TASK; the
   formats are identical in Slurm 22.05 to 25.11):
   - "Exited with exit code N" -> stop: the program failed by itself, before any progress;
     it would fail the same way again;
   - a crash signal of the program itself (Segmentation fault, Aborted, Bus error, Floating
     point exception, Illegal instruction, Trace/breakpoint trap, Bad system call) -> stop, except
     `Aborted` with NCCL's remote/network errors in the log (a peer or the network failed and
     NCCL's error handling aborted the rank) -> retry;
   - "Out Of Memory" (task/cgroup's OOM report) -> stop: the same run needs the same memory;
   - a signal from outside (Killed, Terminated, Hangup, Interrupt, Quit, User defined signal,
     Power failure, CPU time limit, Alarm clock, a real-time signal) -> retry: the operator, the
     kernel or the node stopped it;
10. no task line at all (srun was itself killed, or printed nothing we know): the cause is
   unknown; retry only when srun ended by a signal (rc >= 128), and say that the cause was not
   read.

Standard library only: it runs on the batch host with plain python3 (>= 3.8).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Tuple

from . import stagenotes
from .crashlog import blame

STAGE = "train"

# strsignal() texts (glibc) of signals a program raises on itself: it crashed.
CRASH_SIGNALS = ("Segmentation fault", "Aborted", "Bus error", "Floating point exception", "Illegal instruction",
                 "Trace/breakpoint trap", "Bad system call", "Stack fault")
# strsignal() texts of signals sent from outside the program (srun, slurmstepd, the kernel, a person).
OUTSIDE_SIGNALS = ("Killed", "Terminated", "Hangup", "Interrupt", "Quit", "User defined signal", "Power failure",
                   "CPU time limit exceeded", "File size limit exceeded", "Alarm clock", "Real-time signal",
                   "Unknown signal", "Broken pipe", "Virtual timer expired", "Profiling timer expired")


def _task_words(first: dict) -> str:
    tasks = str(first.get("tasks", "?"))
    word = "tasks" if any(c in tasks for c in ",-") else "task"
    return f"{word} {tasks} on {first.get('node', '?')}"


def decide(*, rc: int, start_iteration: int, last_iteration: int, time_limit: bool = False, hung: bool = False,
           moved_away: bool = False, analysis: Optional[dict] = None) -> Tuple[bool, str]:
    """(retry?, why) for one ended attempt; `analysis` is crashlog.blame()'s result for the
    attempt's part of the job log (None: the log could not be read)."""
    if time_limit:
        return True, f"saved at the time limit (iteration {last_iteration})"
    if hung:
        return True, "the hang watchdog ended the step"
    if moved_away:
        return True, f"step exit {rc}; away from the node(s) this attempt blamed"
    if last_iteration > start_iteration:
        return True, f"step exit {rc} after progress (iteration {start_iteration} -> {last_iteration})"
    a = analysis or {}
    launch = a.get("launch_failure")
    if launch:
        where_l = (f"on {', '.join(launch['nodes'])}" if launch.get("nodes") else
                   f"task(s) {','.join(map(str, launch.get('tasks') or []))}" if launch.get("tasks") else "")
        return False, (f"the step could not start{' ' + where_l if where_l else ''}: {launch.get('why')} "
                       f"(srun exit {rc}); not requeued: it would fail the same way (the image, the container "
                       "options or the binding)")
    if rc == 0:
        return True, f"the step exited 0 at iteration {last_iteration}"
    if a.get("node_failures"):
        return True, f"step exit {rc}: srun reported a node failure ({', '.join(a['node_failures'])})"
    seen = {str(n.get("class")) for n in a.get("not_blamed") or [] if isinstance(n, dict)}
    if "nccl-timeout" in seen:
        return True, f"step exit {rc}: a collective timed out (NCCL), as in a hang"
    first = a.get("first_failure")
    where = f"iteration {last_iteration}, no new checkpoint since this start"
    if first:
        status = str(first.get("status", ""))
        who = _task_words(first)
        if status.startswith("Exited with exit code"):
            code = status.rsplit(" ", 1)[-1]
            return False, (f"{who} exited with code {code} first ({where}): a failure that would repeat; "
                           f"not requeued (srun exit {rc})")
        if status.startswith("Aborted") and "nccl-remote" in seen:
            return True, f"{who} aborted first on NCCL's remote/network errors: a peer or the network (srun exit {rc})"
        if status.startswith(CRASH_SIGNALS):
            return False, f"{who} crashed first: {status} ({where}); not requeued (srun exit {rc})"
        if status.startswith("Out Of Memory"):
            return False, (f"{who} ran out of memory first ({where}); not requeued: the same run needs the same "
                           f"memory (srun exit {rc})")
        if status.startswith(OUTSIDE_SIGNALS):
            return True, f"{who} was stopped from outside first: {status} (srun exit {rc})"
        return rc >= 128, f"{who} ended first: {status} (srun exit {rc})"
    if analysis is None:
        cause = "the job log could not be read"
    else:
        cause = "no srun task-exit line in this attempt's log"
    if rc >= 128:
        return True, f"srun ended by signal {rc - 128} and the cause was not read ({cause})"
    return False, f"step exit {rc} without progress and the cause was not read ({cause}); not requeued"


def write_note(run_dir: str, text: str) -> None:
    """The stop's reason for `status` (<run_dir>/stage-notes/train.txt, stagenotes.py). A note this
    job's trainer or watchdog left already (a checkpoint from a newer megatron-core, a hang) says the
    cause: it stays first, and the stop decision follows it."""
    cause = stagenotes.read_note(run_dir, STAGE, [stagenotes.current_job()])
    if cause and text not in cause:
        text = f"{cause}; {text}"
    try:
        stagenotes.write_note(run_dir, STAGE, text)
    except OSError as exc:
        print(f"lingjun-slurm: warning: cannot record the failure for `status` in {run_dir}: {exc}",
              file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m lingjun_slurm.injob.host.retry",
                                 description="Requeue a failed train attempt or not, from what its tasks did.")
    ap.add_argument("--log", default="", help="the train job's output log (srun's task lines are in it)")
    ap.add_argument("--offset", type=int, default=0, help="its size in bytes when this attempt's srun started")
    ap.add_argument("--nodes", default="", help="the job's nodes (space- or comma-separated)")
    ap.add_argument("--rc", type=int, required=True, help="srun's exit status")
    ap.add_argument("--start-iteration", type=int, required=True, help="latest checkpoint at this attempt's start")
    ap.add_argument("--last-iteration", type=int, required=True, help="latest checkpoint now")
    ap.add_argument("--time-limit", action="store_true", help="the save-at-the-time-limit signal came")
    ap.add_argument("--hang-record", default="", help="the watchdog's record of this attempt (non-empty: a hang)")
    ap.add_argument("--moved-away", action="store_true", help="this attempt blamed a node and the requeue excludes it")
    ap.add_argument("--run-dir", default="", help="leave the decision for `status` (stage-notes/train.txt)")
    args = ap.parse_args(argv)
    if args.offset < 0:
        ap.error("--offset must be >= 0")
    hung = bool(args.hang_record) and os.path.isfile(args.hang_record) and os.path.getsize(args.hang_record) > 0
    analysis = None
    if args.log:
        try:
            analysis = blame(args.log, args.offset, args.nodes.replace(",", " ").split())
        except (OSError, ValueError):  # unreadable log; a malformed XID table (health/xid.py)
            analysis = None
    retry, why = decide(rc=args.rc, start_iteration=args.start_iteration, last_iteration=args.last_iteration,
                        time_limit=args.time_limit, hung=hung, moved_away=args.moved_away, analysis=analysis)
    if args.run_dir and not retry:
        write_note(args.run_dir, why)
    print(("retry: " if retry else "stop: ") + why)
    return 0


if __name__ == "__main__":
    sys.exit(main())
