"""The collective smoke test's runner: every rank of the train step's layout, inside the container.

    srun <the train step's flags> python3 -m lingjun_slurm.stages collective --plan PLAN.json --out DIR

started by slurm_templates/partials/faults.sh.j2 after the per-node pre-flight passed; judged on
the host by lingjun_slurm/injob/preflight/collective.py (its docstring: what is judged, busbw).

- torch.distributed, NCCL on GPUs, gloo on CPUs; rank/world/local rank from SLURM_PROCID,
  SLURM_NTASKS, SLURM_LOCALID (set by srun in every task), MASTER_ADDR from the batch script.
  The port is not MASTER_PORT: training binds MASTER_PORT right after this step, and the rank 0
  store's accepted connections that this step closes linger in TIME_WAIT on that port (60 s on
  Linux), while the train template puts every job's MASTER_PORT in 10000-29999 (10000 + job id
  mod 20000), so MASTER_PORT+1 is the next job id's training port on a shared first node. This
  step takes 30000 + job id mod 2767 (30000-32766): below Linux's ephemeral range (32768-60999)
  and outside every training port.
- Phases: (1) per node: the ranks of each node side by side (new_subgroups_by_enumeration);
  (2) the whole allocation; (3) pairs of nodes, planned round by round by
  lingjun_slurm/nodes/nccltests/bisect.py (rank 0 plans and broadcasts, every rank creates every
  group), while the time bound allows. Each op: WARMUP untimed, then ITERS timed back to back
  (nccl-tests' way), the median op; the time is the slowest member's.
- A deadline timer per rank: at timeout_s - 3 s it writes its rank file (state "deadline", the
  phase) and os._exit(EXIT_DEADLINE); srun --time is the backstop. A hang fails this step only.
  Each rank's clock starts when its process does (the ranks start apart: container start, import
  torch), so right after the layout phase the ranks all_reduce(MIN) their time left and every rank
  re-arms its timer and plans with that one deadline (rank 0 plans the pair rounds alone: with its
  own clock, an earlier-started rank could hit its deadline mid-round).
- Rank 0 rewrites results.json after every phase (and every pair round) with "complete_run": false
  and "phases_done", true only at the end: a deadline keeps what finished, which the judge uses.
- Test hook LINGJUN_PREFLIGHT_SLOW="NODE=FACTOR[,...]": ranks on NODE sleep elapsed*(1/FACTOR-1)
  after each timed collective (a stand-in for a NIC at FACTOR of its rate).
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..preflight import write_json
from ..preflight.collective import (EXIT_DEADLINE, ITERS_CPU, ITERS_GPU, OPS, REL, RESULTS, SIZES_CPU, SIZES_GPU,
                                    WARMUP, busbw, collective_knobs, parse_size, parse_slow, rank_file, wave)

MARGIN_S = 3.0  # the deadline fires this long before the step's bound, leaving rank files written


class Runner:
    def __init__(self, plan: dict, out: Path, env: Dict[str, str]) -> None:
        import warnings

        import torch
        import torch.distributed as dist

        warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)

        self.torch, self.dist = torch, dist
        self.out = out
        self.env = env
        self.knob = collective_knobs(plan)
        self.timeout = float(self.knob.get("timeout_s") or 60)
        self.start = time.monotonic()
        self.skew = 0.0  # this rank's time left above the world's least, from the layout phase on
        self.deadline_at: Optional[float] = None
        self.rank = int(env["SLURM_PROCID"])
        self.world = int(env["SLURM_NTASKS"])
        self.local = int(env.get("SLURM_LOCALID", "0"))
        self.node = env.get("SLURMD_NODENAME") or socket.gethostname()
        self.slow = parse_slow(env.get("LINGJUN_PREFLIGHT_SLOW")).get(self.node)
        self.job, self.restart = env.get("SLURM_JOB_ID"), env.get("SLURM_RESTART_COUNT", "0")
        self.phase = "init"
        self.gpu = torch.cuda.is_available() and bool(int(plan_gpus(plan)))
        self.backend = "nccl" if self.gpu else "gloo"
        self.sizes = [int(s) for s in self.knob.get("sizes_gpu" if self.gpu else "sizes_cpu") or
                      (SIZES_GPU if self.gpu else SIZES_CPU)]
        self.iters = ITERS_GPU if self.gpu else ITERS_CPU
        self.device = "cpu"

    # --- bookkeeping --------------------------------------------------------------------
    def left(self) -> float:
        return self.timeout - MARGIN_S - (time.monotonic() - self.start) - self.skew

    def agree_deadline(self) -> None:
        """Every rank takes the least time left of all (all_reduce MIN): one deadline for the world."""
        torch, dist = self.torch, self.dist
        mine = self.left()
        least = torch.tensor([mine], dtype=torch.float64, device=self.device)
        dist.all_reduce(least, op=dist.ReduceOp.MIN)
        self.skew = max(0.0, mine - float(least.item()))
        self.deadline_at = time.time() + self.left()  # the same on every rank (wall clock, for the record)
        self.state("running")

    def save(self, results: Dict[str, Any], done: Optional[str] = None, complete: bool = False) -> None:
        """Rank 0 rewrites results.json (atomically) with what has finished so far."""
        if done:
            results.setdefault("phases_done", []).append(done)
        results["complete_run"] = complete
        results["elapsed_s"] = round(time.monotonic() - self.start, 3)
        if self.rank == 0:
            write_json(str(self.out / RESULTS), results)

    def state(self, state: str, **extra: Any) -> None:
        doc = {"rank": self.rank, "node": self.node, "job": self.job, "restart": self.restart, "state": state,
               "phase": self.phase, "at": time.time(), "deadline_at": self.deadline_at, "skew_s": round(self.skew, 3),
               **extra}
        try:
            write_json(str(self.out / rank_file(self.rank)), doc)
        except OSError:
            pass

    def arm(self) -> threading.Timer:
        def fire() -> None:
            self.state("deadline")
            print(f"lingjun-slurm: collective: rank {self.rank} on {self.node}: deadline {self.timeout:g} s reached "
                  f"in {self.phase}: exiting {EXIT_DEADLINE}", file=sys.stderr, flush=True)
            os._exit(EXIT_DEADLINE)

        timer = threading.Timer(max(1.0, self.left()), fire)
        timer.daemon = True
        timer.start()
        return timer

    # --- measuring ----------------------------------------------------------------------
    def sync(self) -> None:
        if self.gpu:
            self.torch.cuda.synchronize()

    def time_op(self, op: str, size: int, group: Any, n: int) -> float:
        """Seconds per op for this rank (WARMUP untimed, then ITERS back to back)."""
        torch, dist = self.torch, self.dist
        elems = max(1, size // 4)
        if op == "all_reduce":
            buf = torch.ones(elems, dtype=torch.float32, device=self.device)
            run = lambda: dist.all_reduce(buf, group=group)  # noqa: E731
        else:
            part = max(1, elems // n)
            src = torch.ones(part, dtype=torch.float32, device=self.device)
            dst = torch.empty(part * n, dtype=torch.float32, device=self.device)
            run = lambda: dist.all_gather_into_tensor(dst, src, group=group)  # noqa: E731
        for _ in range(WARMUP):
            run()
        self.sync()
        dist.barrier(group=group)
        times = []
        for _ in range(self.iters):
            a = time.perf_counter()
            run()
            self.sync()
            if self.slow:
                time.sleep((time.perf_counter() - a) * (1 / self.slow - 1))
            times.append(time.perf_counter() - a)
        # The median op (nccl-tests takes the mean of back-to-back ops: a median shrugs off a
        # scheduling hiccup of a loaded host, which a smoke test of a few ops cannot average out).
        return statistics.median(times)

    def floor_sizes(self, ranks: int) -> List[int]:
        """The sizes of the published single-node floors this node can be judged against (all_reduce)."""
        out = []
        for ref in self.knob.get("floors") or []:
            if (isinstance(ref, dict) and self.gpu and ref.get("op") == "all_reduce" and int(ref.get("nodes") or 0) == 1
                    and int(ref.get("gpus_per_node") or 0) == ranks):
                try:
                    out.append(parse_size(str(ref.get("size"))))
                except ValueError:
                    pass
        return out

    def measure(self, group: Any, n: int, extra: Optional[List[int]] = None) -> List[Dict[str, Any]]:
        rows = []
        for op in OPS:
            sizes = self.sizes + [s for s in extra or [] if s not in self.sizes] if op == "all_reduce" else self.sizes
            for size in sizes:
                nbytes = (max(1, size // 4 // n) * n * 4) if op == "all_gather" else max(1, size // 4) * 4
                rows.append({"op": op, "bytes": nbytes, "n": n, "time_s": self.time_op(op, size, group, n)})
        return rows

    def slowest(self, rows: List[Dict[str, Any]], group: Any = None) -> List[Dict[str, Any]]:
        """Every rank's times -> the slowest member's per row (all ranks of the world take part)."""
        gathered: List[Any] = [None] * self.world
        self.dist.all_gather_object(gathered, rows, group=group)
        return gathered

    # --- phases -------------------------------------------------------------------------
    def run(self) -> int:
        dist, torch = self.dist, self.torch
        self.out.mkdir(parents=True, exist_ok=True)
        self.state("started")
        timer = self.arm()
        if self.gpu:
            torch.cuda.set_device(self.local)
            self.device = f"cuda:{self.local}"
        addr = self.env.get("MASTER_ADDR", "127.0.0.1")
        port = int(self.env.get("LINGJUN_COLLECTIVE_PORT") or 30000 + int(self.job or 0) % 2767)
        dist.init_process_group(self.backend, init_method=f"tcp://{addr}:{port}", rank=self.rank,
                                world_size=self.world, timeout=timedelta(seconds=max(5.0, self.left())))
        self.phase = "layout"
        names: List[Any] = [None] * self.world
        dist.all_gather_object(names, self.node)
        order = [n for n in (self.env.get("LINGJUN_NODES") or "").split() if n in names]
        order += [n for i, n in enumerate(names) if n not in order and n not in names[:i]]
        ranks = {n: [r for r, m in enumerate(names) if m == n] for n in order}
        device = torch.cuda.get_device_name(self.local) if self.gpu else "cpu"
        results: Dict[str, Any] = {
            "schema": 1, "job": self.job, "restart": self.restart, "backend": self.backend, "device": device,
            "world": self.world, "nodes": order, "ranks_per_node": ranks, "sizes": self.sizes, "iters": self.iters,
            "timeout_s": self.timeout, "slow_hook": self.env.get("LINGJUN_PREFLIGHT_SLOW") or None,
            "env": {k: v for k, v in sorted(self.env.items()) if k.startswith(("NCCL_", "GLOO_", "UCX_"))},
            "per_node": {}, "whole": [], "pairs": [], "rounds": 0, "narrowing": "not needed", "phases_done": []}
        self.agree_deadline()
        timer.cancel()
        timer = self.arm()
        results["deadline_skew_s"] = round(self.skew, 3)  # rank 0's; each rank's own is in no file
        self.save(results, "layout")
        # (1) per node, side by side: every rank creates every group.
        self.phase = "per-node"
        mine: List[Dict[str, Any]] = []
        if max(len(r) for r in ranks.values()) > 1:  # the same on every rank: all create the groups or none
            local_group, _ = dist.new_subgroups_by_enumeration([ranks[n] for n in order], backend=self.backend)
            if len(ranks[self.node]) > 1:
                mine = self.measure(local_group, len(ranks[self.node]), self.floor_sizes(len(ranks[self.node])))
        every = self.slowest(mine)
        for node in order:
            rows = [every[r] for r in ranks[node]]
            if rows and rows[0]:
                results["per_node"][node] = self.rows(rows, len(ranks[node]))
        self.save(results, "per-node")
        # (2) the whole allocation.
        self.phase = "whole"
        if len(order) > 1:
            whole = self.measure(None, self.world)
            results["whole"] = self.rows(self.slowest(whole), self.world)
        self.save(results, "whole")
        # (3) pairs of nodes, narrowed round by round within the time bound.
        if len(order) >= 3:
            self.pairs(order, ranks, results)
        results["phases_done"].append("pairs")  # finished, or nothing to do (fewer than 3 nodes)
        self.save(results, complete=True)
        dist.barrier()
        timer.cancel()
        self.phase = "done"
        self.state("done")
        dist.destroy_process_group()
        return 0

    def rows(self, per_rank: List[List[Dict[str, Any]]], n: int) -> List[Dict[str, Any]]:
        out = []
        for i, row in enumerate(per_rank[0]):
            t = max(r[i]["time_s"] for r in per_rank if r)
            out.append({**row, "time_s": round(t, 6), "busbw_gbps": round(busbw(row["op"], row["bytes"], t, n), 6)})
        return out

    def pairs(self, order: List[str], ranks: Dict[str, List[int]], results: Dict[str, Any]) -> None:
        from lingjun_slurm.nodes.nccltests.bisect import Bisection, PairResult

        dist = self.dist
        rel = float(self.knob.get("rel") or REL)
        bis = Bisection(order, rel=rel)
        size = max(self.sizes)
        round_s = 0.0
        while True:
            self.phase = f"pairs round {bis.round + 1}"
            plan: List[Any] = [None]
            if self.rank == 0:
                # Round 1 always (it gives the allocation's median); a later round only when the
                # last one left something to learn and fits in the time left.
                nxt = bis.next_pairs() if bis.round == 0 or 2.5 * round_s < self.left() else []
                plan = [nxt]
            dist.broadcast_object_list(plan, src=0)
            pairs = [tuple(p) for p in plan[0]]
            if not pairs:
                if self.rank == 0 and bis.round > 1:
                    results["narrowing"] = "done"
                break
            t0 = time.monotonic()
            if self.rank != 0:
                bis.round += 1
            found: List[Any] = []
            for w in wave(pairs):
                groups = {p: dist.new_group(ranks[p[0]] + ranks[p[1]], backend=self.backend) for p in w}
                mine: List[Any] = []
                for p, g in groups.items():
                    if self.node in p:
                        n = len(ranks[p[0]]) + len(ranks[p[1]])
                        t = self.time_op("all_reduce", size, g, n)
                        mine.append([list(p), n, t])
                every = self.slowest(mine)
                for p in w:
                    n = len(ranks[p[0]]) + len(ranks[p[1]])
                    t = max((x[2] for r in every for x in r if tuple(x[0]) == p), default=None)
                    nbytes = max(1, size // 4) * 4
                    bw = busbw("all_reduce", nbytes, t, n) if t else None
                    found.append(PairResult(p, bw, bis.round))
                    results["pairs"].append({"nodes": list(p), "round": bis.round, "op": "all_reduce",
                                             "bytes": nbytes, "n": n, "time_s": round(t, 6) if t else None,
                                             "busbw_gbps": round(bw, 6) if bw else None})
            bis.record(found)
            round_s = time.monotonic() - t0
            results["rounds"] = bis.round
            if self.rank == 0:
                outcome = bis.outcome()
                results["narrowing"] = "done" if not outcome.undetermined else "stopped"
            self.save(results)  # this round's pairs survive a deadline in the next
            if self.left() <= 0:
                break


def plan_gpus(plan: dict) -> int:
    for st in plan.get("stages") or []:
        if st.get("kind") == "train":
            return int((st.get("resources") or {}).get("gpus_per_node") or 0)
    return 0


def main(plan: dict, out: Path, env: Optional[Dict[str, str]] = None) -> int:
    env = dict(os.environ if env is None else env)
    for name in ("SLURM_PROCID", "SLURM_NTASKS"):
        if name not in env:
            print(f"lingjun-slurm: collective: {name} is not set: run this under srun", file=sys.stderr)
            return 2
    try:
        parse_slow(env.get("LINGJUN_PREFLIGHT_SLOW"))
        runner = Runner(plan, out, env)
    except ValueError as exc:
        print(f"lingjun-slurm: collective: {exc}", file=sys.stderr)
        return 2
    try:
        return runner.run()
    except Exception as exc:  # recorded for the judge, then a plain failure of this step
        runner.state("error", error=f"{type(exc).__name__}: {exc}"[:500])
        print(f"lingjun-slurm: collective: rank {runner.rank} on {runner.node}: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        return 1


__all__ = ["MARGIN_S", "Runner", "main", "plan_gpus"]
