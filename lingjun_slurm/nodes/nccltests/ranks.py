"""How many ranks an nccl-tests run had, from every source the output offers, each a witness:

1. **The command line** shown in the output (``mpirun -np N``, ``srun -n N``, ``srun -N A
   --ntasks-per-node B``, or the binary run alone after a shell prompt: one process), times the
   threads and GPUs of each process: nccl-tests has ``nranks = nProcs * nThreads * nGpus``
   (NVIDIA/nccl-tests a0b82b2 ``src/common.cu:796``, ``:985``), ``nThreads``/``nGpus`` from its
   ``# nThread T nGpus G`` line (``src/util.cu:625``), else from ``-t``/``-g`` on that line (a note
   where the two disagree; no count where ``-g``/``-t`` is there but unreadable, ``-g $GPUS``). Not
   when the line sets ``NCCL_TESTS_SPLIT``/``NCCL_TESTS_SPLIT_MASK``, which split the processes into
   several communicators (``src/common.cu:1496-1525``).
2. **The ``#  Rank N Group G ...`` lines** (``writeDeviceReport``): nccl-tests numbers them
   ``proc*nThreads*nGpus + i`` (``src/util.cu:677``) and rank 0 prints every process' lines
   (``:697-706``), so the highest rank + 1. A lower bound: an excerpt keeps fewer, and each process'
   lines are cut at 2048 bytes (``MAX_LINE``, ``:668-694``), but no more ranks are ever shown than ran.
   Several Group values (the split colour) mean several tests: the table is rank 0's group's.
   Repeated rank numbers mean each process ran alone (a binary built without MPI).
3. **The size and count columns** of the tests that print the per-rank count (exact,
   ``results.size_ratio``).
4. **busbw / algbw**, which nccl-tests computes as algbw x a factor of the rank count (the ``*GetBw``
   functions): all_reduce ``2(n-1)/n`` (``src/all_reduce.cu:59-64``); all_gather, reduce_scatter,
   alltoall, gather, scatter ``(n-1)/n`` (``all_gather.cu:38-43``, ``reduce_scatter.cu:37-42``,
   ``alltoall.cu:48-53``, ``gather.cu:38-43``, ``scatter.cu:34-39``); broadcast, reduce, sendrecv and
   hypercube ``1`` (``broadcast.cu:34-39``, ``reduce.cu:36-39``, ``sendrecv.cu:38-43``,
   ``hypercube.cu:40-45``), so not for those. Both are printed rounded (``getFloatStr``,
   ``src/util.cu:487-492``: two decimals, fewer above 999.99), so each row bounds the factor, and the
   rank count is taken only when one whole number fits every row (the factor nears 2 or 1 as n grows:
   beyond some tens of ranks the rounding no longer tells n from n+1).

``derive`` takes the count most witnesses give; a count below the rank lines' cannot be and does not
vote; a tie goes to the command line, then the sizes, then busbw/algbw, then the rank lines (which may
be an excerpt). ``ranks_from`` names the first agreeing witness in the order above; ``notes`` each one
that disagrees.
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


def _per_process(result: NcclTestResult, args: list[str]) -> tuple[Optional[int], Optional[int], list[str]]:
    """(threads, GPUs) of each process: nccl-tests' own ``# nThread T nGpus G`` line (the -J file's
    ``nthreads``/``ngpus``), else ``-t``/``-g`` of the command line (getopt_long in ``src/common.cu``
    L1203-1216), else 1 (its defaults, L90-91); None when the option is there but its value cannot be
    read (``-g $GPUS``, a line cut short). A note where the line and the command line disagree."""
    notes = []
    got: dict[str, Optional[int]] = {}
    for what, flag, long, header, key in (("threads", "-t", "--nthreads", "nThread", "nthreads"),
                                          ("gpus", "-g", "--ngpus", "nGpus", "ngpus")):
        said = _count(result.params.get(header) or result.params.get(key))
        raw = _option(args, (long,), (flag,), (flag,))
        given = _count(raw)
        if said and given and said != given:
            notes.append(f"the command line says {flag} {given} but nccl-tests printed '{header} {said}', which is "
                         "what it ran with")
        got[what] = said or given or (None if raw is not None or _attached(args, flag) else 1)
    return got["threads"], got["gpus"], notes


def _attached(args: list[str], flag: str) -> bool:
    """An option given as -gVALUE whose value is not a number (-g$GPUS): present, value unknown."""
    return any(arg.startswith(flag) and len(arg) > len(flag) and not arg.startswith("--") for arg in args)


def from_command(result: NcclTestResult) -> tuple[Optional[int], Optional[str], list[str]]:
    """(ranks, how, notes) from the command line the output shows: processes x threads x GPUs per
    process (``nranks = nProcs*nThreads*nGpus``, ``src/common.cu`` L796, L985)."""
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
    threads, gpus, notes = _per_process(result, tokens[binary + 1:])
    if threads is None or gpus is None:  # processes x an unknown number: no count
        return None, None, notes
    per = [f"{threads} threads" if threads > 1 else "", f"{gpus} GPUs" if gpus > 1 else "1 GPU"]
    return procs * threads * gpus, f"{how} x {' x '.join(p for p in per if p)} per process", notes


def from_rank_lines(result: NcclTestResult) -> tuple[Optional[int], Optional[str], list[str]]:
    """(ranks, kind, notes) from the ``#  Rank N Group G Pid P on HOST device D`` lines.

    nccl-tests numbers them ``rank = proc*nThreads*nGpus + i`` over MPI_COMM_WORLD (``src/util.cu``
    L677) and rank 0 prints every process' lines (L697-706), so the highest rank + 1 is the count:
    kind ``"all"``. It is a lower bound: an excerpt may drop lines, and each process' lines are cut
    at 2048 bytes (``MAX_LINE``, L668-694: about 20 lines of ``-t``/``-g``), but never more ranks than
    ran. Kind ``"group"``: the Group column (the MPI_Comm_split color, ``src/common.cu`` L1496-1525)
    holds several values, so NCCL_TESTS_SPLIT made several tests and the table is rank 0's group's:
    the lines of that group are counted. Kind ``"alone"``: a rank number repeats, so each process ran
    its own test (a binary built without MPI, whose processes all are proc 0): the count is one test's."""
    if not result.ranks:
        return None, None, []
    numbers = [r.rank for r in result.ranks]
    if len(set(numbers)) < len(numbers):
        count = max(numbers) + 1
        return count, "alone", [f"the rank lines repeat rank numbers: each process ran its own {count}-rank test "
                                "(a binary built without MPI=1, or a launcher its MPI does not know)"]
    groups = {r.group for r in result.ranks if r.group is not None}
    if len(groups) > 1:
        first = min(result.ranks, key=lambda r: r.rank)
        if first.rank != 0 or first.group is None:
            return None, "group", [f"the rank lines show {len(groups)} groups (NCCL_TESTS_SPLIT) but not rank 0's, "
                                   "whose group's test the table is"]
        count = len({r.rank for r in result.ranks if r.group == first.group})
        return count, "group", [f"the rank lines show {len(groups)} groups (NCCL_TESTS_SPLIT): the table is rank "
                                f"0's group {first.group}, {count} of the {len(numbers)} ranks"]
    return max(numbers) + 1, "all", []


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


@dataclass(frozen=True)
class Witness:
    source: str  # "command line", "rank lines", "sizes", "busbw/algbw"
    count: int
    says: str  # "the command line starts 16 ranks (mpirun -np 2 x 8 GPUs per process)"


# Where two or more witnesses agree, ranks_from names the first of them in this order.
_LABEL = ("command line", "rank lines", "sizes", "busbw/algbw")
# Which count wins a tied vote: the rank lines last, as they may be an excerpt (fewer, never more).
_TIE = ("command line", "sizes", "busbw/algbw", "rank lines")


def _witnesses(op: str, result: NcclTestResult, sizes: Optional[int]) -> tuple[list[Witness], list[str]]:
    notes: list[str] = []
    found: list[Witness] = []
    command, how, said = from_command(result)
    notes += said
    lines, kind, said = from_rank_lines(result)
    notes += said
    if command and kind in ("alone", "group"):
        notes.append(f"so the command line's {command} ranks ({how}) are not one test's")
        command = None
    if command:
        found.append(Witness("command line", command, f"the command line starts {command} ranks ({how})"))
    if lines:
        found.append(Witness("rank lines", lines, f"the rank lines show {lines}"))
    if sizes:
        found.append(Witness("sizes", sizes, f"the size and count columns give {sizes}"))
    bandwidth = from_bandwidth(op, result)
    if bandwidth:
        found.append(Witness("busbw/algbw", bandwidth, f"busbw/algbw (the {op} factor) gives {bandwidth}"))
    return found, notes


def derive(op: str, result: Optional[NcclTestResult], sizes: Optional[int]) -> Ranks:
    """The rank count of a run and where it came from; `sizes` is what the size and count columns
    imply (results.ranks_from_sizes). Each source that gives a count is a witness: the command line
    (processes x threads x GPUs per process), the rank lines, the size and count columns, busbw/algbw.
    A count below what the rank lines show cannot be (nccl-tests prints a line for every rank that
    ran, an excerpt keeps fewer), so it does not vote; of the rest, the count most witnesses give
    wins, a tie going to the command line, then the sizes, then busbw/algbw, then the rank lines.
    ``notes`` names each witness that disagrees."""
    if result is None:
        return Ranks(None, None)
    found, notes = _witnesses(op, result, sizes)
    if not found:
        return Ranks(None, None, tuple(notes))
    lines = next((w.count for w in found if w.source == "rank lines"), 0)
    voters = [w for w in found if w.count >= lines]
    votes = {w.count: sum(v.count == w.count for v in voters) for w in voters}
    most = max(votes.values())
    count = next(w.count for source in _TIE for w in voters if w.source == source and votes[w.count] == most)
    agree = [w for source in _LABEL for w in found if w.source == source and w.count == count]
    label = agree[0].source
    what = {"command line": "the command line", "rank lines": "the rank lines", "sizes": "the size and count columns",
            "busbw/algbw": f"busbw/algbw (the {op} factor)"}
    giving = " and ".join(what[w.source] for w in agree)
    command = next((w for w in found if w.source == "command line"), None)
    for w in found:
        if w.count == count:
            continue
        if w.source == "rank lines":  # fewer: the others are more
            if label == "command line":
                notes.append(f"{command.says}; the rank lines show {w.count} (an excerpt?)")
            else:
                notes.append(f"the rank lines show {w.count} ranks, but {giving} give {count}: the rank lines are "
                             "incomplete (an excerpt?)")
        elif w.count < lines:
            notes.append(f"{w.says}, fewer than the {lines} the rank lines show (nccl-tests prints a line for every "
                         f"rank): {giving} give {count}, which is taken")
        elif label == "command line" and command is not None:
            notes.append(f"{command.says}; {what[w.source]} give {w.count}")
        elif label == "sizes" and w.source == "busbw/algbw" and len(agree) == 1:
            notes.append(f"the size and count columns give {count} ranks, busbw/algbw {w.count}")
        else:
            notes.append(f"{w.says}, but {giving} give {count}, which is taken")
    return Ranks(count, label, tuple(notes))
