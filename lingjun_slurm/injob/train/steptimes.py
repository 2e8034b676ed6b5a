"""Each rank's own step time, split into compute and the wait in collectives, for the straggler
watchdog (lingjun_slurm/injob/host/straggler.py).

Per step a rank measures its wall time t and the time it spent inside the step's collectives w:
the gradient reduction (megatron-core's finalize_model_grads, which all-reduces the gradients over
data parallel ranks and, with overlap_grad_reduce, waits for the bucketed all-reduces started
during the backward) and the loop's own per-step all-reduce of [loss, tokens, stop] (loop.py
Trainer._reduce). Compute is c = t - w: the forward, the backward and the optimizer, plus the
pipeline's point-to-point waits (not separated here: peers are compared within one pipeline
stage, where those waits are alike). A slow rank computes longer; the others wait longer in the
collectives for it, so their c stays at the healthy value while their w grows.

To be gentle on a shared file system, nothing is written per rank: every `every` steps (the
training log interval) the ranks' summaries (median c, median w, step count since the last line)
go to every rank with one small all_gather, and rank 0 appends ONE json line to
$LINGJUN_STEPS_FILE (the batch script sets it to <run_dir>/steps/<attempt>.jsonl):

  {"time": UNIX, "iteration": N, "ranks": [{"rank", "node", "stage", "compute", "wait", "steps"}, ...]}

A line is written with one os.write on an O_APPEND descriptor (atomic for a reader that reads
whole lines). The all_gather happens on every rank at the same iteration (the iteration is
agreed on), so it cannot deadlock; its own time is outside both c and w.

Test hook LINGJUN_TRAIN_SLOW=/path/file.json (docs/fault-tolerance.md, "Stragglers"): each step
every rank stats the file (cheap); once it exists and holds {"node": "node3", "sleep_s": 0.3}
or {"rank": 1, "sleep_s": 0.3}, the matching ranks sleep sleep_s inside the compute part of
every step from then on. Unset: nothing happens.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import statistics
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

SLOW_ENV = "LINGJUN_TRAIN_SLOW"
STEPS_ENV = "LINGJUN_STEPS_FILE"


def node_name() -> str:
    """Slurm's name for this node (slurmd sets SLURMD_NODENAME in every task), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


class SlowHook:
    """LINGJUN_TRAIN_SLOW: a sleep inside the compute part of each step on the matching ranks."""

    def __init__(self, rank: int, node: str, path: str | None = None) -> None:
        self.rank, self.node = rank, node
        self.path = path if path is not None else os.environ.get(SLOW_ENV, "").strip()
        self._seen: tuple[float, int] | None = None
        self.sleep_s = 0.0

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            self._seen, self.sleep_s = None, 0.0
            return
        key = (st.st_mtime, st.st_size)
        if key == self._seen:
            return
        self._seen = key
        try:
            with open(self.path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as exc:
            log.warning("%s=%s: cannot read it (%s): no slowdown", SLOW_ENV, self.path, exc)
            self.sleep_s = 0.0
            return
        if not isinstance(doc, dict):
            self.sleep_s = 0.0
            return
        match = (("node" in doc and str(doc["node"]) == self.node)
                 or ("rank" in doc and isinstance(doc["rank"], int) and doc["rank"] == self.rank))
        sleep_s = doc.get("sleep_s", 0)
        ok = isinstance(sleep_s, (int, float)) and not isinstance(sleep_s, bool) and sleep_s >= 0
        self.sleep_s = float(sleep_s) if (match and ok) else 0.0
        if self.sleep_s:
            log.warning("%s: rank %d on %s sleeps %.3f s in every step from now on (test hook)",
                        SLOW_ENV, self.rank, self.node, self.sleep_s)

    def __call__(self, sleep: Callable[[float], None] = time.sleep) -> float:
        if not self.path:
            return 0.0
        self._reload()
        if self.sleep_s:
            sleep(self.sleep_s)
        return self.sleep_s


class StepTimes:
    """One rank's (compute, wait) per step; every `every` steps one gathered line from rank 0."""

    def __init__(self, rank: int, world: int, stage: int, every: int, path: str | None,
                 gather: Callable[[list[float]], list[list[float]]] | None = None,
                 node: str | None = None, clock: Callable[[], float] = time.perf_counter,
                 sync: Callable[[], None] | None = None) -> None:
        self.rank, self.world, self.stage, self.every = rank, world, stage, max(1, every)
        self.path, self.node, self.clock = path, node or node_name(), clock
        self.sync = sync  # on GPUs: the current CUDA stream's synchronize (see timed)
        self._gather = gather
        self.wait = 0.0  # this step's time in collectives so far
        self._t0: float | None = None
        self.compute: list[float] = []
        self.waits: list[float] = []
        self._nodes: list[str] | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.path)

    def begin(self) -> None:
        self.wait, self._t0 = 0.0, self.clock()

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """fn, with its duration counted as this step's wait in collectives.

        On GPUs a collective only queues work and returns: CUDA execution is asynchronous and NCCL
        work is enqueued on its own stream (torch 2.13 distributed_c10d.py 1625, 5772-5776; only
        TORCH_NCCL_BLOCKING_WAIT blocks, 1627), so a healthy rank's wait for a slow one would surface
        at the next CPU<-GPU sync (optimizer.step's total_norm.item() and found_inf.item(), the
        loop's total.tolist(), torch.cuda.synchronize() after the step), counted as compute. With
        `sync` (the current stream's synchronize, StepTimes(sync=...)), the stream is drained just
        before t0 (the compute queued so far stays compute) and just after fn (the collective's
        wait is counted here). The current stream only: the bucketed all-reduces that
        overlap_grad_reduce starts during the backward run on other streams and are waited for by
        finalize_model_grads (finish_grad_sync), so they land in this wait, not in compute."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.sync is not None:
                self.sync()
            t0 = self.clock()
            try:
                out = fn(*args, **kwargs)
                if self.sync is not None:
                    self.sync()
                return out
            finally:
                self.wait += self.clock() - t0

        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    def end(self, iteration: int) -> None:
        if self._t0 is None:
            return
        total = self.clock() - self._t0
        self._t0 = None
        self.compute.append(max(0.0, total - self.wait))
        self.waits.append(self.wait)
        if self.enabled and iteration % self.every == 0:
            self.flush(iteration)

    def summary(self) -> list[float]:
        if not self.compute:
            return [float(self.rank), float(self.stage), 0.0, 0.0, 0.0]
        return [float(self.rank), float(self.stage), statistics.median(self.compute),
                statistics.median(self.waits), float(len(self.compute))]

    def flush(self, iteration: int) -> None:
        rows = self._gather(self.summary()) if self._gather else [self.summary()]
        self.compute, self.waits = [], []
        if self.rank != 0 or not self.path:
            return
        nodes = self._nodes or [self.node]
        ranks = []
        for row in sorted(rows, key=lambda r: r[0]):
            r = int(row[0])
            if int(row[4]) == 0:
                continue
            ranks.append({"rank": r, "node": nodes[r] if r < len(nodes) else None, "stage": int(row[1]),
                          "compute": round(row[2], 6), "wait": round(row[3], 6), "steps": int(row[4])})
        append_line(self.path, {"time": round(time.time(), 3), "iteration": iteration, "ranks": ranks})

    def set_nodes(self, nodes: list[str]) -> None:
        self._nodes = nodes


def append_line(path: str, record: dict[str, Any]) -> None:
    """One json line, one write(2) with O_APPEND; a failure is a warning, never the step's end."""
    data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("cannot append step times to %s: %s", path, exc)


def steps_path(run_dir: str) -> str:
    """$LINGJUN_STEPS_FILE, else <run_dir>/steps/<job>-<restart>.jsonl (the batch script's $attempt)."""
    explicit = os.environ.get(STEPS_ENV, "").strip()
    if explicit:
        return explicit
    attempt = f"{os.environ.get('SLURM_JOB_ID') or 'local'}-{os.environ.get('SLURM_RESTART_COUNT') or '0'}"
    return os.path.join(run_dir, "steps", f"{attempt}.jsonl")


def for_runtime(rt: Any, run_dir: str, every: int, action: str) -> StepTimes:
    """The trainer's StepTimes: torch.distributed all_gather of the 5-number summaries (and, once,
    of the node names); disabled (no file, no gather) when straggler_action is off."""
    import torch
    import torch.distributed as dist

    path = steps_path(run_dir) if action != "off" else None
    world = rt.world_size

    def gather(row: list[float]) -> list[list[float]]:
        mine = torch.tensor(row, dtype=torch.float64, device=rt.device)
        out = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(out, mine)
        return [t.tolist() for t in out]

    def cuda_sync() -> None:  # the stream current at the call (timed's docstring)
        torch.cuda.current_stream().synchronize()

    sync = cuda_sync if getattr(rt, "use_cuda", False) else None
    st = StepTimes(rt.rank, world, rt.pp_rank, every, path, gather=gather if world > 1 else None, sync=sync)
    if path and world > 1:
        names: list[Any] = [None] * world
        dist.all_gather_object(names, st.node)
        st.set_nodes([str(n) for n in names])
    elif path:
        st.set_nodes([st.node])
    return st
