"""Straggler detection: name a rank whose own step time stays above its peers', and decide the action.

    python3 -m lingjun_slurm.injob.host.straggler --format builtin|megatron --progress FILE
        [--threshold 1.2] [--windows 10] [--window-s 60] [--pipeline N]

reads a whole file and prints the stragglers it names (the watchdog, watchdog.py, runs the same
Detector while the step runs). Standard library only: it runs on the batch host, outside the
container.

Input, per entrypoint (the "windows"):
  builtin   <run_dir>/steps/<attempt>.jsonl, one line per log interval from rank 0 of the builtin
            trainer (lingjun_slurm/injob/train/steptimes.py): {"time", "iteration", "ranks": [{"rank",
            "node", "stage", "compute", "wait", "steps"}]}: per rank the median compute and wait (s)
            of its steps since the line before.
  megatron  the job's stdout log. Two formats Megatron-LM prints (NVIDIA/Megatron-LM main d98e8a64dd):
            1. `--timing-log-option all` (megatron/core/timers.py _get_all_ranks_time_string,
               lines 357-376): "times across ranks (ms):", then per timer "\\n  {name}:" and per rank
               "\\n     rank {:2d}: {:.2f}", ms per iteration (training.py training_log calls
               timers.log(timers_to_log, normalizer=args.log_interval), line 3717). Compute is
               forward-compute + backward-compute, which Megatron-LM times only at
               `--timing-log-level 2` (training.py 3334-3338; schedules.py 494, 552: log_level=2);
               the wait is forward-backward (level 1) minus that compute. Each timer start/stop
               calls torch.cuda.synchronize() (timers.py 152, 165): at level 2 that is two per
               micro-batch, which is why training_config.py (267-274) warns that levels 1-2 "might
               cause increase in iteration time"; the tool does not add these flags by itself.
               A rank's pipeline stage is rank // (world / --pipeline): Megatron-LM's default rank
               order is "tp-cp-ep-dp-pp" (parallel_state.py 617), pp outermost; --use-tp-pp-dp-mapping
               and the overlap flags change that: see Layout (the watchdog reads them from plan.json).
            2. `--log-straggler` (StragglerDetector.report, megatron/core/utils.py 1822-1837; a
               recorded sample in megatron/core/README_STRAGGLER.md): "MnRtt/Rnk: 3453.08ms/8 |
               MxRtt/Rnk: 3468.20ms/0 | ...": only the fastest and the slowest rank (CUDA only).
               Such a window has no median: its slowest rank is slow when MxRtt > threshold x
               MnRtt (a stricter test: against the fastest rank, not the median). With pipeline > 1
               a line whose two ranks are in different stages is dropped (MegatronTimes.feed).

Detection. Windows of --window-s seconds (by the lines' time); in each, a rank's compute is the
median of its values there. Peers are the other ranks of the same pipeline stage (stages do
different work; within one, data/tensor parallel ranks do the same). A rank is slow in a window
when its compute > threshold x the median of its peers AND it is more than MAD_K (3) median
absolute deviations of the peers above that median (the noise guard of Megatron-LM's GPU sniff
test, megatron/training/gpu_sniff_test.py 104-110: median and MAD, an outlier beyond
max(MAD, a fraction of the median); NVIDIA nvidia-resiliency-ext d8686d9 (attribution/straggler/
reporting.py 52-120) instead scores a rank against the best rank, best/rank < 0.75: one noisy fast
rank moves that reference, a median does not). A rank slow in --windows consecutive windows
(a window where it is not slow resets the count; a window without its data, a save or an
evaluation, neither counts nor resets) is named a straggler. Of the ranks of one model-parallel
pipeline slow in one window only the one with the largest ratio counts (Detector._one_per_pipeline).

Requeue cost rule (action requeue): requeue when (slow compute - peers' median) x remaining
iterations > the restart cost measured from this run's own history: per earlier restart, the gap
from an attempt's end to the next one's start (<run_dir>/jobs/<key> "start"/"end" markers: the
requeue and the queue) plus that attempt's start to its first iteration (metrics.jsonl "train"
records: image start, imports, checkpoint load), the median over the restarts seen; this
attempt's own start-to-first-iteration when there was none; plus the last save's duration
(metrics.jsonl "save" seconds: the save-and-exit). Without any history the requeue is not done.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from lingjun_slurm.common.jsonobj import json_object

PREFIX = "lingjun-slurm: straggler:"
SCHEMA = 1
MAD_K = 3.0
RECORD_DIR = "stragglers"
ACTIONS = ("off", "log", "exclude", "requeue")


@dataclass
class RankTime:
    rank: int
    compute: float  # seconds per step
    node: Optional[str] = None
    stage: Optional[int] = None
    wait: Optional[float] = None


@dataclass
class Sample:
    time: float
    ranks: List[RankTime]
    iteration: Optional[int] = None
    partial: bool = False  # StragglerDetector: only the fastest and the slowest rank


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v >= 0


def parse_steps_line(line: str) -> Optional[Sample]:
    """One line of steps/<attempt>.jsonl (steptimes.py); None for anything else."""
    rec = json_object(line)
    if rec is None or not _num(rec.get("time")) or not isinstance(rec.get("ranks"), list):
        return None
    ranks = []
    for r in rec["ranks"]:
        if not isinstance(r, dict) or not isinstance(r.get("rank"), int) or not _num(r.get("compute")):
            continue
        ranks.append(RankTime(r["rank"], float(r["compute"]), r.get("node") if isinstance(r.get("node"), str) else None,
                              r.get("stage") if isinstance(r.get("stage"), int) else None,
                              float(r["wait"]) if _num(r.get("wait")) else None))
    it = rec.get("iteration")
    return Sample(float(rec["time"]), ranks, it if isinstance(it, int) else None) if ranks else None


@dataclass(frozen=True)
class Layout:
    """Where a rank sits in Megatron-LM's rank grid, and which of its timers hold only compute.

    Rank order (NVIDIA/Megatron-LM main d98e8a64dd): "tp-cp-ep-dp-pp" by default
    (megatron/core/parallel_state.py 617), pp outermost: stage = rank // (world / pp), and the ranks
    of one model-parallel pipeline (one per stage) share rank % (world / pp). --use-tp-pp-dp-mapping
    makes it "tp-cp-ep-pp-dp" (megatron/training/initialize.py 395, training/config/common_config.py
    105-106); the dense layers' RankGenerator has ep=1 (parallel_state.py 859-865), so there
    stage = (rank // (tp * cp)) % pp and a pipeline is (rank % (tp * cp), rank // (tp * cp * pp)).

    Overlap: each Timer.start/stop calls torch.cuda.synchronize() (megatron/core/timers.py 152, 165),
    which waits for every stream of the device. With --overlap-grad-reduce the bucketed gradient
    all-reduces start during the last micro-batch's backward (megatron/core/distributed/
    param_and_grad_buffer.py start_grad_sync, 600), so "backward-compute" (schedules.py 552-597)
    includes the wait for the slowest data parallel rank on every rank: only "forward-compute" is
    used. With --overlap-param-gather too, the forward's pre-hooks wait for the parameter
    all-gathers, so "forward-compute" holds that wait as well: neither timer is used."""

    pipeline: int = 1
    tensor: int = 1
    context: int = 1
    tp_pp_dp: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False

    def stage(self, rank: int, world: int) -> int:
        if self.pipeline <= 1:
            return 0
        if self.tp_pp_dp:
            return (rank // max(1, self.tensor * self.context)) % self.pipeline
        return min(rank // max(1, world // self.pipeline), self.pipeline - 1)

    def pipe(self, rank: int, world: int) -> Any:
        """The ranks of one model-parallel pipeline (one per stage) share this key."""
        if self.tp_pp_dp:
            mp = max(1, self.tensor * self.context)
            return (rank % mp, rank // (mp * self.pipeline))
        return rank % max(1, world // max(1, self.pipeline))

    @property
    def timers(self) -> Tuple[str, ...]:
        """The Megatron-LM timers that hold only this rank's compute."""
        if self.overlap_grad_reduce and self.overlap_param_gather:
            return ()
        if self.overlap_grad_reduce:
            return ("forward-compute",)
        return ("forward-compute", "backward-compute")

    def degraded(self) -> Optional[str]:
        """Why per-rank detection from `--timing-log-option all` is weaker (or off) in this run."""
        if self.overlap_grad_reduce and self.overlap_param_gather:
            return ("per-rank detection from Megatron-LM's timers is off for this run: with --overlap-grad-reduce "
                    "and --overlap-param-gather both forward-compute and backward-compute include the wait for "
                    "the slowest data parallel rank (Timer.stop synchronizes every stream); only --log-straggler "
                    "lines are used")
        if self.overlap_grad_reduce:
            return ("per-rank detection is degraded for this run: with --overlap-grad-reduce backward-compute "
                    "includes the wait for the slowest data parallel rank, so only forward-compute is compared")
        return None


def _flag_value(args: List[str], flag: str) -> Optional[str]:
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def layout_from_plan(doc: Any, fmt: str, pipeline: int = 1) -> Layout:
    """The Layout from plan.json: settings.parallelism (what lingjun_slurm/megatron/args.py renders:
    --overlap-grad-reduce, --overlap-param-gather, the parallel sizes) and settings.training.extra_args
    (appended after them, so a flag there wins). Raises ValueError on a plan without settings."""
    settings = doc.get("settings") if isinstance(doc, dict) else None
    if not isinstance(settings, dict):
        raise ValueError("no 'settings' object")
    par = settings.get("parallelism") if isinstance(settings.get("parallelism"), dict) else {}
    tr = settings.get("training") if isinstance(settings.get("training"), dict) else {}
    extra = [str(a) for a in tr.get("extra_args") or [] if isinstance(a, (str, int, float))]

    def size(key: str, flag: str, default: int) -> int:
        v = _flag_value(extra, flag)
        try:
            return max(1, int(v if v is not None else par.get(key, default) or default))
        except (TypeError, ValueError):
            return default

    megatron = fmt == "megatron"
    return Layout(pipeline=size("pipeline", "--pipeline-model-parallel-size", pipeline),
                  tensor=size("tensor", "--tensor-model-parallel-size", 1),
                  context=size("context", "--context-parallel-size", 1),
                  tp_pp_dp=megatron and "--use-tp-pp-dp-mapping" in extra,
                  overlap_grad_reduce=megatron and (bool(par.get("overlap_grad_reduce")) or "--overlap-grad-reduce" in extra),
                  overlap_param_gather=megatron and (bool(par.get("overlap_param_gather"))
                                                     or "--overlap-param-gather" in extra))


# megatron/core/timers.py _get_all_ranks_time_string (main d98e8a64dd, 357-376); `srun -l` adds "N: ".
TIMES_HEADER = re.compile(r"times across ranks \(ms\):\s*$")
TIMER_NAME = re.compile(r"^(?:\s*\d+:)?\s{1,4}([A-Za-z][^:]*):\s*$")
TIMER_RANK = re.compile(r"^(?:\s*\d+:)?\s+rank\s+(\d+):\s+([0-9]+(?:\.[0-9]*)?)\s*$")
# megatron/core/utils.py StragglerDetector.report (main d98e8a64dd, 1822-1823): "{min_elapsed}" is
# "{value:.2f}ms/{rank}" (_ValueWithRank.__str__ with the unit "ms").
STRAGGLER_LINE = re.compile(r"MnRtt/Rnk:\s*([0-9.]+)ms/(\d+)\s*\|\s*MxRtt/Rnk:\s*([0-9.]+)ms/(\d+)")
MEGATRON_WHEN = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)?\]")
MEGATRON_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|")


class MegatronTimes:
    """Feed the job log's lines; get Samples from `--timing-log-option all` blocks and
    `--log-straggler` lines. Times: the line's own "[YYYY-mm-dd HH:MM:SS]" where it has one, else
    the time the line was read (`now`), which is what the watchdog has while following the log."""

    def __init__(self, pipeline: int = 1, layout: Optional[Layout] = None, world: Optional[int] = None) -> None:
        self.layout = layout or Layout(pipeline=max(1, pipeline))
        self.pipeline = self.layout.pipeline
        self.world = world  # the step's tasks (--ntasks): the stages of --log-straggler's two ranks
        self.seen = False  # any per-rank timing (a block or a --log-straggler line), used or not
        self.notes: List[str] = []
        self._dropped = 0
        self._block: Optional[Dict[str, Dict[int, float]]] = None
        self._timer: Optional[str] = None
        self._block_time = 0.0
        self._last_when: Optional[float] = None
        self.iteration: Optional[int] = None

    def _when(self, line: str, now: float) -> float:
        """The line's own time; else the newest time a line before it had (training_log's
        " [YYYY-mm-dd HH:MM:SS] iteration N/ M |"); else `now`."""
        m = MEGATRON_WHEN.search(line)
        if m:
            try:
                return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
            except ValueError:
                pass
        return self._last_when if self._last_when is not None else now

    def _close(self) -> List[Sample]:
        block, self._block, self._timer = self._block, None, None
        if not block:
            return []
        self.seen = True
        timers = [block.get(name, {}) for name in self.layout.timers]  # see Layout: overlap
        fb = block.get("forward-backward", {})
        ranks = sorted(set().union(*timers)) if timers else []
        if not ranks:
            return []
        world = self.world or (max(max(ranks), max(fb, default=0)) + 1)
        out = []
        for r in ranks:
            c = sum(t.get(r, 0.0) for t in timers) / 1000.0
            w = max(0.0, fb[r] / 1000.0 - c) if r in fb else None
            out.append(RankTime(r, c, None, self.layout.stage(r, world), w))
        return [Sample(self._block_time, out, self.iteration)]

    def feed(self, line: str, now: float) -> List[Sample]:
        line = line.rstrip("\n")
        if MEGATRON_WHEN.search(line):
            self._last_when = self._when(line, now)
        it = MEGATRON_ITERATION.search(line)
        if it:
            self.iteration = int(it.group(1))
        if self._block is not None:
            m = TIMER_RANK.match(line)
            if m and self._timer is not None:
                self._block[self._timer][int(m.group(1))] = float(m.group(2))
                return []
            n = TIMER_NAME.match(line)
            if n:
                self._timer = n.group(1).strip()
                self._block.setdefault(self._timer, {})
                return []
        out = self._close() if self._block is not None else []
        if TIMES_HEADER.search(line):
            self._block, self._timer, self._block_time = {}, None, self._when(line, now)
            return out
        s = STRAGGLER_LINE.search(line)
        if s:
            mn, mn_r, mx, mx_r = float(s.group(1)), int(s.group(2)), float(s.group(3)), int(s.group(4))
            self.seen = True
            ranks = [RankTime(mn_r, mn / 1000.0), RankTime(mx_r, mx / 1000.0)] if mn_r != mx_r else []
            if ranks and self.pipeline > 1 and not self._same_stage(mn_r, mx_r):
                # StragglerDetector times each rank's forward (pretrain_gpt.py 351; min/max over the whole
                # world, megatron/core/utils.py 1960-2007): the last stage's output layer alone makes
                # MxRtt > MnRtt on a healthy run, so only two ranks of one stage are compared.
                self._dropped += 1
                if self._dropped == 1:
                    self.notes.append(f"{PREFIX} --log-straggler sample dropped: its fastest rank {mn_r} and slowest "
                                      f"rank {mx_r} are in different pipeline stages (or the stages are unknown), "
                                      f"which do different work; such samples are dropped from now on")
                ranks = []
            if ranks:
                out.append(Sample(self._when(line, now), ranks, self.iteration, partial=True))
        return out

    def _same_stage(self, a: int, b: int) -> bool:
        if self.world is None and not self.layout.tp_pp_dp:
            return False  # stage = rank // (world / pp) needs the world size
        world = self.world or 0
        return self.layout.stage(a, world) == self.layout.stage(b, world)

    def flush(self) -> List[Sample]:
        return self._close()


@dataclass
class Verdict:
    rank: int
    slow: bool
    ratio: float
    compute: float
    peers: float  # the peers' median compute


def _mad(values: List[float]) -> float:
    med = statistics.median(values)
    return statistics.median(abs(v - med) for v in values)


def judge_window(ranks: Dict[int, Tuple[Optional[int], float]], threshold: float, partial: bool = False,
                 mad_k: float = MAD_K) -> Dict[int, Verdict]:
    """Per rank of one window, {rank: (stage, compute)}: slow or not, against its stage's peers."""
    out: Dict[int, Verdict] = {}
    if partial:  # StragglerDetector: the slowest against the fastest
        if len(ranks) == 2:
            (fa, (_, ca)), (sl, (_, cb)) = sorted(ranks.items(), key=lambda kv: kv[1][1])
            ratio = cb / ca if ca > 0 else float("inf")
            out[sl] = Verdict(sl, ratio > threshold, ratio, cb, ca)
            out[fa] = Verdict(fa, False, 1.0, ca, ca)
        return out
    stages: Dict[Optional[int], List[int]] = {}
    for r, (stage, _c) in ranks.items():
        stages.setdefault(stage, []).append(r)
    for members in stages.values():
        if len(members) < 2:
            continue  # a rank alone in its stage has no peers
        for r in members:
            peers = [ranks[p][1] for p in members if p != r]
            med = statistics.median(peers)
            c = ranks[r][1]
            ratio = c / med if med > 0 else (float("inf") if c > 0 else 1.0)
            slow = ratio > threshold and (c - med) > mad_k * _mad(peers)
            out[r] = Verdict(r, slow, ratio, c, med)
    return out


@dataclass
class Straggler:
    rank: int
    node: Optional[str]
    ratio: float  # median slow/peers ratio over the streak
    compute: float  # the rank's median compute over the streak (s/step)
    peers: float  # its peers' median compute over the streak (s/step)
    since: float  # UNIX time the first slow window of the streak began
    windows: int
    detected: float
    stage: Optional[int] = None

    @property
    def duration_s(self) -> float:
        return max(0.0, self.detected - self.since)


@dataclass
class Detector:
    """Pure: feed Samples in time order; `named` gathers the stragglers (each rank once)."""

    threshold: float = 1.2
    windows: int = 10
    window_s: float = 60.0
    layout: Layout = field(default_factory=Layout)  # pipelines: see _one_per_pipeline
    world: Optional[int] = None
    _start: Optional[float] = None
    _current: Optional[int] = None
    _samples: List[Sample] = field(default_factory=list)
    _streak: Dict[int, List[Tuple[float, Verdict]]] = field(default_factory=dict)
    _nodes: Dict[int, str] = field(default_factory=dict)
    _stages: Dict[int, int] = field(default_factory=dict)
    named: Dict[int, Straggler] = field(default_factory=dict)

    def feed(self, sample: Sample) -> List[Straggler]:
        if self._start is None:
            self._start = sample.time
        index = int(max(0.0, sample.time - self._start) // self.window_s)
        new: List[Straggler] = []
        if self._current is not None and index != self._current:
            new = self._close()
        self._current = index
        self._samples.append(sample)
        for r in sample.ranks:
            if r.node:
                self._nodes[r.rank] = r.node
            if r.stage is not None:
                self._stages[r.rank] = r.stage
        return new

    def finish(self) -> List[Straggler]:
        """Judge the window still open (a whole file read after the fact)."""
        return self._close() if self._samples else []

    def _close(self) -> List[Straggler]:
        samples, self._samples = self._samples, []
        assert self._start is not None and self._current is not None
        begin = self._start + self._current * self.window_s
        partial = all(s.partial for s in samples)
        values: Dict[int, List[float]] = {}
        for s in samples:
            if s.partial != partial:
                continue
            for r in s.ranks:
                values.setdefault(r.rank, []).append(r.compute)
        ranks = {r: (self._stages.get(r), statistics.median(v)) for r, v in values.items()}
        if partial:  # the extremes of each line: the slowest seen against the fastest seen
            lo = min(ranks, key=lambda r: ranks[r][1])
            hi = max(ranks, key=lambda r: ranks[r][1])
            ranks = {lo: ranks[lo], hi: ranks[hi]} if lo != hi else {}
        verdicts = judge_window(ranks, self.threshold, partial=partial)
        if not partial:
            self._one_per_pipeline(verdicts)
        new = []
        for r, v in verdicts.items():
            if not v.slow:
                self._streak.pop(r, None)
                continue
            streak = self._streak.setdefault(r, [])
            streak.append((begin, v))
            if len(streak) >= self.windows and r not in self.named:
                st = Straggler(r, self._nodes.get(r), statistics.median(x.ratio for _, x in streak),
                               statistics.median(x.compute for _, x in streak),
                               statistics.median(x.peers for _, x in streak), streak[0][0], len(streak),
                               begin + self.window_s, self._stages.get(r))
                self.named[r] = st
                new.append(st)
        return new

    def _one_per_pipeline(self, verdicts: Dict[int, Verdict]) -> None:
        """Pipeline point-to-point waits are in compute (steptimes.py; Megatron-LM's forward/backward-
        compute timers): when a stage-0 rank of one pipeline is slow, the other stages' ranks of that
        same pipeline (other nodes) wait for it in every micro-batch's recv and look slow against their
        own stage's peers. Of the ranks of one pipeline slow in a window, only the one with the largest
        ratio stays slow; the others are not (their streak resets)."""
        if self.layout.pipeline <= 1:
            return
        world = self.world or (max(verdicts, default=-1) + 1)
        best: Dict[Any, int] = {}
        for r, v in verdicts.items():
            if v.slow:
                key = self.layout.pipe(r, world)
                if key not in best or v.ratio > verdicts[best[key]].ratio:
                    best[key] = r
        keep = set(best.values())
        for r, v in verdicts.items():
            if v.slow and r not in keep:
                v.slow = False


def _minutes(seconds: float) -> str:
    if seconds >= 90:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def status_text(node: Optional[str], rank: int, ratio: float, duration_s: float) -> str:
    """What `lingjun-slurm status` shows: "straggler: node3 rank 17 at 1.4× the median step for 10 min"."""
    where = f"{node} rank {rank}" if node else f"rank {rank}"
    return f"straggler: {where} at {ratio:.1f}\u00d7 the median step for {_minutes(duration_s)}"


def message(st: Straggler, action: str, decision: str) -> str:
    """The job log's line: "lingjun-slurm: straggler: node3 rank 17 at 1.4x the median step for 10 min (...)"."""
    where = f"{st.node} rank {st.rank}" if st.node else f"rank {st.rank}"
    return (f"{PREFIX} {where} at {st.ratio:.1f}x the median step for {_minutes(st.duration_s)} "
            f"({st.compute:.3g} s of compute per step against {st.peers:.3g} s for its peers, {st.windows} windows "
            f"in a row; action {action}: {decision})")


# ---- the restart cost, from this run's own history -------------------------------------------

def _read_lines(path: str) -> List[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()
    except OSError:
        return []


def job_markers(path: str) -> List[Tuple[str, float]]:
    """<run_dir>/jobs/<key>: "start UNIX RESTART NODES" / "end UNIX RC" (slurm_templates/partials/prelude.sh.j2)."""
    out = []
    for line in _read_lines(path):
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("start", "end"):
            try:
                out.append((parts[0], float(parts[1])))
            except ValueError:
                continue
    return out


def metrics_records(path: str) -> List[dict]:
    out = []
    for line in _read_lines(path):
        rec = json_object(line)
        if rec is not None and _num(rec.get("time")):
            out.append(rec)
    return out


def restart_cost(markers: List[Tuple[str, float]], records: List[dict]) -> Tuple[Optional[float], str]:
    """(seconds, how it was measured) or (None, why not): see the module's docstring."""
    starts = [t for k, t in markers if k == "start"]
    ends = [t for k, t in markers if k == "end"]
    trains = sorted(r["time"] for r in records if r.get("type") == "train")
    costs: List[float] = []
    gaps: List[float] = []
    for i, s in enumerate(starts):
        first = next((t for t in trains if t >= s and (i + 1 >= len(starts) or t < starts[i + 1])), None)
        if first is None:
            continue
        before = [e for e in ends if e <= s]
        if i > 0 and before:
            gaps.append(s - before[-1])
            costs.append(s - before[-1] + first - s)
        elif i == len(starts) - 1 and not costs:
            costs.append(first - s)  # this attempt's own startup: no restart seen yet
    saves = [r for r in records if r.get("type") == "save" and _num(r.get("seconds"))]
    save_s = float(saves[-1]["seconds"]) if saves else 0.0
    if not costs:
        return None, "no attempt of this run has reached its first iteration after a start marker"
    base = statistics.median(costs)
    how = (f"median of {len(gaps)} earlier restart(s): requeue and queue gap plus start to first iteration"
           if gaps else "this attempt's start to its first iteration (no earlier restart)")
    return base + save_s, f"{how}, plus the last save ({save_s:.1f} s)"


def requeue_decision(st: Straggler, remaining_iterations: int, cost_s: Optional[float], cost_how: str,
                     slowdown_s: Optional[float] = None) -> Tuple[bool, str]:
    """(requeue now?, why): the time saved over the remaining iterations against the restart cost."""
    per_step = slowdown_s if slowdown_s is not None else max(0.0, st.compute - st.peers)
    saved = per_step * max(0, remaining_iterations)
    if cost_s is None:
        return False, f"not requeued: the restart cost is unknown ({cost_how})"
    if saved > cost_s:
        return True, (f"requeue: {saved:.0f} s saved over {remaining_iterations} remaining iterations "
                      f"({per_step:.3g} s/step) > restart cost {cost_s:.0f} s ({cost_how})")
    return False, (f"not requeued: {saved:.0f} s saved over {remaining_iterations} remaining iterations "
                   f"({per_step:.3g} s/step) <= restart cost {cost_s:.0f} s ({cost_how}); excluded at the next requeue")


# ---- the record and status --------------------------------------------------------------------

def record_path(run_dir: str, attempt: str) -> str:
    return os.path.join(run_dir, RECORD_DIR, f"{attempt}.json")


def make_record(st: Straggler, action: str, decision: str, requeue: bool, job: Optional[str]) -> dict:
    return {"type": "straggler", "schema": SCHEMA, "job": job, "node": st.node, "rank": st.rank,
            "stage": st.stage, "ratio": round(st.ratio, 3), "compute_s": round(st.compute, 6),
            "peers_s": round(st.peers, 6), "since": round(st.since, 3), "detected": round(st.detected, 3),
            "windows": st.windows, "action": action, "decision": decision, "requeue": requeue,
            "status": status_text(st.node, st.rank, st.ratio, st.duration_s)}


def write_record(path: str, records: List[dict]) -> None:
    """{"stragglers": [...]} atomically; OSError is the caller's."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"schema": SCHEMA, "stragglers": records}, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)


def read_record(path: str) -> List[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return []
    items = doc.get("stragglers") if isinstance(doc, dict) else None
    return [d for d in items if isinstance(d, dict)] if isinstance(items, list) else []


def excluded_nodes(path: str) -> List[Tuple[str, str]]:
    """(node, reason) of a record's stragglers whose action is exclude or requeue (the batch script)."""
    out = []
    for d in read_record(path):
        if d.get("action") in ("exclude", "requeue") and isinstance(d.get("node"), str) and d["node"]:
            out.append((d["node"], str(d.get("status") or "straggler")))
    return out


def describe(docs: Iterable[dict], job_ids: List[str]) -> Optional[str]:
    """status's words for the stragglers of the stage's jobs (the newest attempt's first)."""
    parts = [str(d["status"]) for d in docs if str(d.get("job")) in job_ids and isinstance(d.get("status"), str)]
    return "; ".join(dict.fromkeys(parts)) or None


# ---- the watchdog's part ----------------------------------------------------------------------

@dataclass
class Watch:
    """Run by the hang watchdog (watchdog.py) on every poll: feed it the new lines of the steps file
    (builtin) or of the job log (megatron); it names stragglers, records them, says the line, and
    for `requeue` decides and asks the step to save and exit (request_stop)."""

    action: str
    threshold: float
    windows: int
    window_s: float
    fmt: str
    record: str
    iterations: int = 0
    pipeline: int = 1
    run_dir: Optional[str] = None
    job: Optional[str] = None
    jobs_file: Optional[str] = None
    metrics: Optional[str] = None
    request_stop: Any = None  # () -> str, how the step was asked to save and exit
    say: Any = None  # (str) -> None
    clock: Any = time.time
    records: List[dict] = field(default_factory=list)
    stop_requested: bool = False
    _last_iteration: Optional[int] = None
    layout: Optional[Layout] = None  # from plan.json (layout_from_plan); else Layout(pipeline)
    world: Optional[int] = None  # the step's tasks
    _first_iteration_at: Optional[float] = None
    _seen: bool = False
    _said_none: bool = False
    _said_layout: bool = False

    def __post_init__(self) -> None:
        self.layout = self.layout or Layout(pipeline=max(1, self.pipeline))
        self.detector = Detector(self.threshold, self.windows, self.window_s, self.layout, self.world)
        self.megatron = MegatronTimes(self.pipeline, self.layout, self.world) if self.fmt == "megatron" else None

    def _say(self, text: str) -> None:
        (self.say or (lambda t: print(t, file=sys.stderr, flush=True)))(text)

    def no_timings_text(self) -> str:
        if self.fmt == "megatron":
            return ("straggler detection: no per-rank timings in the log (add --timing-log-option all "
                    "--timing-log-level 2 to training.extra_args, or --log-straggler on GPUs)")
        return "straggler detection: no per-rank step times from the builtin trainer (no steps file)"

    def _check_timings(self, now: float) -> None:
        """Once: no per-rank timing 2 x window_s after the first iteration -> say so, and in the note."""
        if self._seen or self._said_none or self._first_iteration_at is None:
            return
        if now - self._first_iteration_at < 2 * self.window_s:
            return
        self._said_none = True
        text = self.no_timings_text()
        self._say(f"{PREFIX} {text}: nothing can be detected in this run")
        if self.run_dir and not self.records:
            from . import stagenotes

            try:
                stagenotes.write_note(self.run_dir, "train", text)
            except OSError as exc:
                self._say(f"{PREFIX} cannot write the stage note in {self.run_dir}: {exc}")

    def poll(self, lines: List[str], last_iteration: Optional[int] = None) -> List[dict]:
        if not self._said_layout:
            self._said_layout = True
            why = self.layout.degraded() if self.fmt == "megatron" and self.layout else None
            if why:
                self._say(f"{PREFIX} {why}")
        if last_iteration is not None:
            self._last_iteration = last_iteration
        samples: List[Sample] = []
        now = self.clock()
        if self._last_iteration is not None and self._first_iteration_at is None:
            self._first_iteration_at = now
        for line in lines:
            if self.megatron is not None:
                samples += self.megatron.feed(line, now)
            else:
                s = parse_steps_line(line)
                if s:
                    samples.append(s)
        if self.megatron is not None:
            self._seen = self._seen or self.megatron.seen
            for note in self.megatron.notes:
                self._say(note)
            self.megatron.notes.clear()
        else:
            self._seen = self._seen or bool(samples)
        self._check_timings(now)
        new: List[dict] = []
        for s in samples:
            if s.iteration is not None:
                self._last_iteration = max(self._last_iteration or 0, s.iteration)
            for st in self.detector.feed(s):
                new.append(self._act(st))
        return new

    def _act(self, st: Straggler) -> dict:
        requeue = False
        if self.action == "log":
            decision = "logged"
        elif self.action == "exclude":
            decision = "its node is excluded at the next requeue"
        else:
            markers = job_markers(self.jobs_file) if self.jobs_file else []
            recs = metrics_records(self.metrics) if self.metrics else []
            cost, how = restart_cost(markers, recs)
            remaining = max(0, self.iterations - (self._last_iteration or 0))
            requeue, decision = requeue_decision(st, remaining, cost, how)
            if requeue and self.request_stop is None:
                requeue = False
                decision += "; not done: this executor cannot requeue (local)"
            elif requeue and not self.stop_requested:
                self.stop_requested = True
                decision += f"; the step was asked to save and exit ({self.request_stop()})"
        rec = make_record(st, self.action, decision, requeue, self.job)
        self.records.append(rec)
        self._say(message(st, self.action, decision))
        try:
            write_record(self.record, self.records)
        except OSError as exc:
            print(f"{PREFIX} cannot write {self.record}: {exc}", file=sys.stderr, flush=True)
        if self.run_dir:
            from . import stagenotes

            try:
                stagenotes.write_note(self.run_dir, "train", "; ".join(dict.fromkeys(r["status"] for r in self.records)))
            except OSError as exc:
                print(f"{PREFIX} cannot record the straggler for `status` in {self.run_dir}: {exc}",
                      file=sys.stderr, flush=True)
        return rec


# ---- one-shot command -------------------------------------------------------------------------

def samples_of(fmt: str, lines: Iterable[str], pipeline: int = 1, now: Optional[float] = None,
               layout: Optional[Layout] = None, world: Optional[int] = None,
               notes: Optional[List[str]] = None) -> List[Sample]:
    out: List[Sample] = []
    if fmt == "builtin":
        for line in lines:
            s = parse_steps_line(line)
            if s:
                out.append(s)
        return out
    mt = MegatronTimes(pipeline, layout, world)
    t = time.time() if now is None else now
    for line in lines:
        out += mt.feed(line, t)
    out += mt.flush()
    if notes is not None:
        notes += mt.notes
    return out


def detect(samples: Iterable[Sample], threshold: float, windows: int, window_s: float,
           layout: Optional[Layout] = None, world: Optional[int] = None) -> List[Straggler]:
    det = Detector(threshold, windows, window_s, layout or Layout(), world)
    for s in samples:
        det.feed(s)
    det.finish()
    return list(det.named.values())


def _nodes_command(argv: List[str]) -> int:
    """`nodes --record FILE`: "NODE<TAB>REASON" per straggler to exclude (the batch script feeds
    them to `exclusion add --node N --reason R --source straggler`)."""
    ap = argparse.ArgumentParser(prog="python3 -m lingjun_slurm.injob.host.straggler nodes")
    ap.add_argument("--record", required=True)
    a = ap.parse_args(argv)
    for node, reason in excluded_nodes(a.record):
        reason = reason[len("straggler: "):] if reason.startswith("straggler: ") else reason
        print(f"{node}\t{' '.join(reason.split())}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["nodes"]:
        return _nodes_command(argv[1:])
    ap = argparse.ArgumentParser(prog="python3 -m lingjun_slurm.injob.host.straggler",
                                 description="Name the stragglers in a steps file or a Megatron-LM log.")
    ap.add_argument("--format", choices=("builtin", "megatron"), required=True)
    ap.add_argument("--progress", required=True, help="steps/<attempt>.jsonl (builtin) or the job log (megatron)")
    ap.add_argument("--threshold", type=float, default=1.2)
    ap.add_argument("--windows", type=int, default=10)
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--pipeline", type=int, default=1, help="pipeline parallel size (Megatron-LM's stage of a rank)")
    a = ap.parse_args(argv)
    if not a.threshold > 1 or a.windows < 1 or not a.window_s > 0 or a.pipeline < 1:
        ap.error("need --threshold > 1, --windows >= 1, --window-s > 0, --pipeline >= 1")
    try:
        with open(a.progress, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        print(f"{PREFIX} cannot read {a.progress}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    layout, notes = Layout(pipeline=a.pipeline), []
    samples = samples_of(a.format, lines, a.pipeline, layout=layout, notes=notes)
    for note in notes:
        print(note, file=sys.stderr)
    for st in detect(samples, a.threshold, a.windows, a.window_s, layout):
        print(message(st, "log", "reported"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
