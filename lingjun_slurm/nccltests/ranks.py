"""How many ranks an nccl-tests run had, and how that is known, in this order of trust:

1. **The command line** shown in the output (``mpirun -np N``, ``srun -n N``, ``srun -N A
   --ntasks-per-node B``, or the binary run alone after a shell prompt: one process), times the
   threads and GPUs of each process: nccl-tests has ``nranks = nProcs * nThreads * nGpus``
   (NVIDIA/nccl-tests a0b82b2 ``src/common.cu:796``, ``:985``), ``nThreads``/``nGpus`` from its
   ``# nThread T nGpus G`` line (``src/util.cu:625``), else from ``-t``/``-g`` on that line. Not when
   the line sets ``NCCL_TESTS_SPLIT``/``NCCL_TESTS_SPLIT_MASK``, which split the processes into
   several communicators (``src/common.cu:1496-1524``).
2. **The ``#  Rank N ...`` lines** (``writeDeviceReport``), when what the table implies agrees: an
   excerpt may keep only some of them.
3. **The table**: the size and count columns of the tests that print the per-rank count (exact,
   ``results.size_ratio``), else **busbw / algbw**, which nccl-tests computes as algbw x a factor of
   the rank count (the ``*GetBw`` functions): all_reduce ``2(n-1)/n`` (``src/all_reduce.cu:59-64``);
   all_gather, reduce_scatter, alltoall, gather, scatter ``(n-1)/n`` (``all_gather.cu:38-43``,
   ``reduce_scatter.cu:37-42``, ``alltoall.cu:48-53``, ``gather.cu:38-43``, ``scatter.cu:34-39``);
   broadcast, reduce, sendrecv and hypercube ``1`` (``broadcast.cu:34-39``, ``reduce.cu:36-39``,
   ``sendrecv.cu:38-43``, ``hypercube.cu:40-45``), so not for those. Both are printed rounded
   (``getFloatStr``, ``src/util.cu:487-492``: two decimals, fewer above 999.99), so each row bounds
   the factor, and the rank count is taken only when one whole number fits every row (the factor
   nears 2 or 1 as n grows: beyond some tens of ranks the rounding no longer tells n from n+1).
"""

from __future__ import annotations

import math
import os
import re
import shlex
from dataclasses import dataclass
from typing import Optional

from .parse import NcclTestResult, op_of

# The launchers whose own options give the number of processes.
_MPI = {"mpirun", "mpiexec", "mpiexec.hydra", "orterun", "oshrun"}
_SRUN = "srun"
# Bus bandwidth = algbw x scale x (n-1)/n for these tests (the *GetBw functions cited above).
_SCALE = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "alltoall": 1.0, "gather": 1.0,
          "scatter": 1.0}
# What must stand before a binary run on its own for the line to be a command a shell ran: a prompt
# ("user@host:~$ ", "[root@h dir]# ") or bash's xtrace "+ ", then VAR=value assignments. A bare
# "all_reduce_perf ..." line may be a script saying what it runs under a launcher elsewhere.
_BARE = re.compile(r"(?:.*[$#%>]\s+|\++\s+)(?:[A-Za-z_]\w*=\S*\s+)*")


@dataclass(frozen=True)
class Ranks:
    count: Optional[int]
    source: Optional[str]  # "command line", "rank lines", "sizes", "busbw/algbw"; None with no count
    notes: tuple[str, ...] = ()


def _tokens(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:  # an unbalanced quote (a line cut short)
        return command.split()


def _option(args: list[str], long: tuple[str, ...], short: tuple[str, ...], attached: tuple[str, ...] = ()
            ) -> Optional[str]:
    """The value of the last of these options in args: --long=V, --long V, -short V, -xV (attached)."""
    found = None
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if eq and name in long:
            found = value
        elif arg in long or arg in short:
            found = args[i + 1] if i + 1 < len(args) else None
        else:
            for flag in attached:
                if arg.startswith(flag) and arg[len(flag):].isdigit():
                    found = arg[len(flag):]
    return found


def _count(value: Optional[str]) -> Optional[int]:
    """A whole number >= 1; Slurm's "2-2" range of one value too."""
    if value is None:
        return None
    low, dash, high = value.partition("-")
    if dash and low != high:
        return None
    return int(low) if low.isdigit() and int(low) >= 1 else None


def processes(command: str) -> Optional[tuple[int, str]]:
    """(the processes a command line starts, how it says so), None when it does not say."""
    tokens = _tokens(command)
    binary = next((i for i, tok in enumerate(tokens) if op_of(os.path.basename(tok))), None)
    if binary is None:
        return None
    before = tokens[:binary]
    launchers = [i for i, tok in enumerate(before) if os.path.basename(tok) in _MPI | {_SRUN}]
    if not launchers:
        raw = command.find(tokens[binary])
        if raw >= 0 and _BARE.fullmatch(command[:raw]):
            return 1, "one process, no launcher"
        return None
    start = launchers[-1]
    launcher, opts = os.path.basename(before[start]), before[start + 1:]
    if launcher == _SRUN:
        tasks = _count(_option(opts, ("--ntasks",), ("-n",), ("-n",)))
        if tasks:
            return tasks, f"srun -n {tasks}"
        nodes = _count(_option(opts, ("--nodes",), ("-N",), ("-N",)))
        per_node = _count(_option(opts, ("--ntasks-per-node",), ()))
        if nodes and per_node:
            return nodes * per_node, f"srun -N {nodes} --ntasks-per-node {per_node}"
        return None
    procs = _count(_option(opts, ("--np", "--n"), ("-np", "-n")))
    return (procs, f"{launcher} -np {procs}") if procs else None


def from_command(result: NcclTestResult) -> tuple[Optional[int], Optional[str], list[str]]:
    """(ranks, how, notes) from the command line the output shows."""
    command = result.command
    if not command:
        return None, None, []
    if "NCCL_TESTS_SPLIT" in command:
        return None, None, ["the command line sets NCCL_TESTS_SPLIT: its processes are split into several "
                            "tests, so it does not give the ranks of one"]
    started = processes(command)
    if started is None:
        return None, None, []
    procs, how = started
    tokens = _tokens(command)
    binary = next(i for i, tok in enumerate(tokens) if op_of(os.path.basename(tok)))
    args = tokens[binary + 1:]
    threads = _count(result.params.get("nThread")) or _count(_option(args, ("--nthreads",), ("-t",), ("-t",))) or 1
    gpus = _count(result.params.get("nGpus")) or _count(_option(args, ("--ngpus",), ("-g",), ("-g",))) or 1
    per = [f"{threads} threads" if threads > 1 else "", f"{gpus} GPUs" if gpus > 1 else "1 GPU"]
    return procs * threads * gpus, f"{how} x {' x '.join(p for p in per if p)} per process", []


def _tolerance(value: float) -> Optional[float]:
    """Half a unit of the last digit getFloatStr prints for a bandwidth (width 6)."""
    value = abs(value)
    if value < 999.995:
        return 0.005
    if value < 9999.95:
        return 0.05
    if value < 999999.5:
        return 0.5
    return None  # printed as 1e+06: too coarse to use


def from_bandwidth(op: str, result: NcclTestResult) -> Optional[int]:
    """The one rank count whose busbw/algbw factor fits every row, None when none or several do."""
    scale = _SCALE.get(op)
    if scale is None:
        return None
    low, high, used = 0.0, math.inf, 0
    for row in result.rows:
        for alg, bus in ((row.oop_algbw, row.oop_busbw), (row.ip_algbw, row.ip_busbw)):
            if alg is None or bus is None or math.isnan(alg) or math.isnan(bus):
                continue
            ta, tb = _tolerance(alg), _tolerance(bus)
            if ta is None or tb is None or alg - ta <= 0:
                continue
            low = max(low, max(0.0, bus - tb) / (alg + ta))
            high = min(high, (bus + tb) / (alg - ta))
            used += 1
    if not used or low > high or scale - low <= 0:
        return None
    # factor = scale - scale/n, so scale/n lies in [scale - high, scale - low]
    least = math.ceil(scale / (scale - low) - 1e-9)
    most = math.floor(scale / (scale - high) + 1e-9) if scale - high > 0 else None
    return least if most == least and least >= 1 else None


def derive(op: str, result: Optional[NcclTestResult], sizes: Optional[int]) -> Ranks:
    """The rank count of a run and where it came from; `sizes` is what the size and count columns
    imply (results.ranks_from_sizes). Notes say where the sources disagree."""
    if result is None:
        return Ranks(None, None)
    command, how, notes = from_command(result)
    lines = result.rank_count
    bandwidth = from_bandwidth(op, result)
    table, table_from = (sizes, "sizes") if sizes else (bandwidth, "busbw/algbw") if bandwidth else (None, None)
    what = {"sizes": "the size and count columns", "busbw/algbw": f"busbw/algbw (the {op} factor)"}
    if sizes and bandwidth and sizes != bandwidth:
        notes.append(f"the size and count columns give {sizes} ranks, busbw/algbw {bandwidth}")
    if command:
        if lines and lines != command:
            notes.append(f"the command line starts {command} ranks ({how}); the rank lines show {lines} "
                         "(an excerpt?)")
        if table and table != command:
            notes.append(f"the command line starts {command} ranks ({how}); {what[table_from]} give {table}")
        return Ranks(command, "command line", tuple(notes))
    if lines:
        if table and table != lines:
            notes.append(f"the rank lines show {lines} ranks, but {what[table_from]} give {table}: "
                         "the rank lines are incomplete (an excerpt?)")
            return Ranks(table, table_from, tuple(notes))
        return Ranks(lines, "rank lines", tuple(notes))
    if table:
        return Ranks(table, table_from, tuple(notes))
    return Ranks(None, None, tuple(notes))
