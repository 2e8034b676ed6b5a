"""The rank count of an nccl-tests run and where it comes from (lingjun_slurm/nodes/nccltests/ranks.py): the
command line, the rank lines, the size and count columns, busbw/algbw. The real outputs are judged in
test_nccltests_real.py; here each rule on small made-up inputs, the real tables where they decide."""

from __future__ import annotations

from pathlib import Path

import pytest

from lingjun_slurm.nodes.nccltests.parse import NcclTestResult, RankInfo, Row, parse_runs, parse_text
from lingjun_slurm.nodes.nccltests.ranks import Ranks, derive, from_bandwidth, from_command, from_rank_lines, processes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


@pytest.mark.parametrize("command, started", [
    ("mpirun --allow-run-as-root -np 16 -x NCCL_DEBUG=INFO ./build/all_reduce_perf -b 8 -e 8G -g 1",
     (16, "mpirun -np 16")),
    ("mpirun -n 4 all_gather_perf -n 100", (4, "mpirun -np 4")),  # all_gather_perf's -n is iterations
    ("/usr/bin/mpiexec --np 8 --host a:4,b:4 /opt/nccl-tests/build/alltoall_perf_mpi", (8, "mpiexec -np 8")),
    ("srun -N 2 --ntasks-per-node=8 --mpi=pmix all_reduce_perf -b 1G", (16, "srun -N 2 --ntasks-per-node 8")),
    ("srun --nodes=4 --ntasks-per-node 4 all_reduce_perf", (16, "srun -N 4 --ntasks-per-node 4")),
    ("srun -N2 -n16 all_reduce_perf", (16, "srun -n 16")),
    ("srun --ntasks=8 -N 2-2 all_reduce_perf", (8, "srun -n 8")),
    ("srun -N 2 --ntasks-per-node 2-3 all_reduce_perf", None),  # a range: not one number
    ("srun -N 2 all_reduce_perf", None),  # one task per node, or the allocation's SLURM_NTASKS
    ("mpirun --hostfile hosts all_reduce_perf -g 8", None),  # the hostfile's slots
    ("[root@test nccl-tests-master]# ./build/all_reduce_perf -b 8 -e 128M -f 2 -g 8", (1, "one process, no launcher")),
    ("user@host:~/nccl-tests$ NCCL_DEBUG=INFO ./build/all_reduce_perf -g 2", (1, "one process, no launcher")),
    ("+ ./build/all_reduce_perf -g 8", (1, "one process, no launcher")),  # bash -x
    ("Running all_reduce_perf with 8 GPUs", None),  # prose, not a command
    ("bash -c './build/all_reduce_perf -g 8'", None),
    ("mpirun -np 2 ./build/nothing_perf", None),
])
def test_processes_a_command_line_starts(command, started):
    assert processes(command) == started


def result(command=None, rows=(), ranks=0, **params):
    return NcclTestResult(test="all_reduce_perf", rows=list(rows), command=command, params=params,
                          ranks=[RankInfo(rank=i, host=f"h{i // 8}", device=i % 8, bus_id="", name="H100")
                                 for i in range(ranks)])


def row(algbw, busbw, size=1 << 30):
    return Row(size_bytes=size, count=size // 4, dtype="float", redop="sum", root=-1, oop_time_us=1.0,
               oop_algbw=algbw, oop_busbw=busbw, oop_wrong=0, ip_time_us=1.0, ip_algbw=algbw, ip_busbw=busbw,
               ip_wrong=0)


def test_threads_and_gpus_per_process_multiply():
    # nccl-tests: nranks = nProcs * nThreads * nGpus; its "# nThread T nGpus G" line wins over -t/-g
    assert from_command(result("mpirun -np 2 all_reduce_perf -g 4", nThread="1", nGpus="8"))[:2] == \
        (16, "mpirun -np 2 x 8 GPUs per process")
    assert from_command(result("mpirun -np 2 all_reduce_perf -t 2 --ngpus=4"))[:2] == \
        (16, "mpirun -np 2 x 2 threads x 4 GPUs per process")
    assert from_command(result("mpirun -np 2 all_reduce_perf -g4"))[0] == 8
    assert from_command(result("./all_reduce_perf -g 8"))[0] is None  # no prompt: not known to be a shell command


def test_a_split_command_line_gives_no_count():
    # NCCL_TESTS_SPLIT / _SPLIT_MASK split MPI_COMM_WORLD into several tests (src/common.cu)
    count, how, notes = from_command(result("mpirun -np 16 -x NCCL_TESTS_SPLIT_MASK=0x7 all_reduce_perf"))
    assert (count, how) == (None, None) and "NCCL_TESTS_SPLIT" in notes[0]


@pytest.mark.parametrize("op, algbw, busbw, ranks", [
    ("all_reduce", 98.61, 191.05, 32),  # 2(n-1)/n
    ("all_reduce", 12.22, 22.92, 16),
    ("all_reduce", 0.81, 0.81, 2),
    ("all_reduce", 100.0, 0.0, 1),
    ("all_gather", 130.28, 122.14, 16),  # (n-1)/n
    ("reduce_scatter", 200.0, 175.0, 8),
    ("alltoall", 40.0, 20.0, 2),
    ("broadcast", 200.0, 200.0, None),  # factor 1: any n
    ("reduce", 200.0, 200.0, None),
    ("sendrecv", 50.0, 50.0, None),
    ("all_reduce", 183.83, 367.29, None),  # 1024 ranks: 2(n-1)/n rounds the same for many n
    ("all_reduce", 0.00, 0.00, None),  # nothing measured
    ("all_reduce", 100.0, 250.0, None),  # above 2: no rank count fits
])
def test_busbw_over_algbw(op, algbw, busbw, ranks):
    assert from_bandwidth(op, result(rows=[row(algbw, busbw)])) == ranks


def test_busbw_over_algbw_uses_every_row():
    # each printed value is +-0.005: 0.94/0.50 bounds the factor to [0.935/0.505, 0.945/0.495] =
    # [1.85, 1.91], n in 14..22; a larger row narrows it to one n, or to none
    small = row(0.50, 0.94)
    assert from_bandwidth("all_reduce", result(rows=[small])) is None
    assert from_bandwidth("all_reduce", result(rows=[small, row(98.61, 191.05)])) is None  # 32 is not in 14..22
    assert from_bandwidth("all_reduce", result(rows=[small, row(100.0, 187.5)])) == 16


def pair(ranks):
    return ranks.count, ranks.source


def test_the_order_of_trust():
    table = [row(98.61, 191.05)]  # 32 ranks by busbw/algbw
    # the command line first, and a note where the others disagree
    r = derive("all_reduce", result("mpirun -np 64 all_reduce_perf", rows=table, ranks=16), None)
    assert (r.count, r.source) == (64, "command line")
    assert r.notes == ("the command line starts 64 ranks (mpirun -np 64 x 1 GPU per process); the rank lines "
                       "show 16 (an excerpt?)",
                       "the command line starts 64 ranks (mpirun -np 64 x 1 GPU per process); busbw/algbw "
                       "(the all_reduce factor) give 32")
    # rank lines that the table agrees with
    assert pair(derive("all_reduce", result(rows=table, ranks=32), None)) == (32, "rank lines")
    # rank lines the table contradicts: an excerpt that kept some of them
    r = derive("all_reduce", result(rows=table, ranks=16), None)
    assert (r.count, r.source) == (32, "busbw/algbw") and "the rank lines are incomplete" in r.notes[0]
    # the size and count columns (exact) before busbw/algbw
    r = derive("all_gather", result(rows=[row(130.28, 122.14)]), 16)
    assert (r.count, r.source, r.notes) == (16, "sizes", ())
    r = derive("all_gather", result(rows=[row(130.28, 122.14)]), 8)
    assert (r.count, r.source) == (8, "sizes") and r.notes == ("the size and count columns give 8 ranks, "
                                                               "busbw/algbw 16",)
    assert pair(derive("broadcast", result(rows=[row(100.0, 100.0)]), None)) == (None, None)
    assert pair(derive("all_reduce", None, None)) == (None, None)


def test_a_command_continued_over_several_lines_is_read_whole():
    """h100_a3mega_all_reduce.txt shows its mpirun over five lines ending in a backslash, each after
    "> "; the -np 16 is on the second."""
    res = parse_text((FIXTURES / "h100_a3mega_all_reduce.txt").read_text())
    assert res.command.startswith("> mpirun -v --mca btl self,tcp") and "-np 16" in res.command
    assert res.command.endswith("/opt/src/nccl-tests/build/all_reduce_perf -b 8 -e 8G -f 2 -g 1")
    assert pair(derive("all_reduce", res, None)) == (16, "command line")


def test_each_run_of_a_log_keeps_its_own_command_line():
    one = (FIXTURES / "nccl_tests_290_h100_1node_all_reduce.txt").read_text()
    text = "$ mpirun -np 8 ./all_reduce_perf -g 1\n" + one + "$ srun -N 2 --ntasks-per-node 8 ./all_reduce_perf\n" + one
    first, second = parse_runs(text)
    assert first.command == "$ mpirun -np 8 ./all_reduce_perf -g 1"
    assert second.command == "$ srun -N 2 --ntasks-per-node 8 ./all_reduce_perf"


# Two real outputs of several GPUs per process under mpirun (SOURCES.md: schmaustech/nvidia-tools-image
# README.md @ 09abdba): `mpirun ... -np 2 ... all_reduce_perf -b 8 -e 16G -f2 -g 8` on 2 x 8 H200, and the
# same with -g 2 on 2 x 2 L40S. nccl-tests: nranks = nProcs * nThreads * nGpus (src/common.cu:985).
G8 = FIXTURES / "nvidia_tools_image_h200_2x8_mpirun_g8_all_reduce.txt"
G2 = FIXTURES / "nvidia_tools_image_l40s_2x2_mpirun_g2_all_reduce.txt"


@pytest.mark.parametrize("path, count, how", [
    (G8, 16, "mpirun -np 2 x 8 GPUs per process"),
    (G2, 4, "mpirun -np 2 x 2 GPUs per process"),
])
def test_a_real_mpirun_with_several_gpus_per_process(path, count, how):
    res = parse_text(path.read_text())
    assert "-np 2" in res.command and res.params["nThread"] == "1"
    # three witnesses, one count, no note
    assert from_command(res) == (count, how, [])
    assert from_rank_lines(res) == (count, "all", [])
    assert from_bandwidth("all_reduce", res) == count  # 2(n-1)/n: 92.33/49.24 = 1.875 for 16
    assert derive("all_reduce", res, None) == Ranks(count, "command line", ())


def without_header(path, **swap):
    """The real output as an excerpt without its '# nThread' line, its command line edited by swap."""
    text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("# nThread"))
    for old, new in swap.items():
        text = text.replace(old, new)
    res = parse_text(text)
    assert "nGpus" not in res.params
    return res


def test_without_the_header_the_g_of_the_command_line_counts():
    assert derive("all_reduce", without_header(G8), None) == Ranks(16, "command line", ())


@pytest.mark.parametrize("unreadable", ["-g $GPUS", "-g$GPUS", "--ngpus ${NGPUS}"])
def test_a_g_that_cannot_be_read_gives_no_command_line_count(unreadable):
    # -np 2 x an unknown number of GPUs is no count (it used to be read as 2 x 1); the rank lines and
    # busbw/algbw give 16 and nothing disagrees
    res = without_header(G8, **{"-f2 -g 8": f"-f2 {unreadable}"})
    assert unreadable in res.command
    assert from_command(res)[:2] == (None, None)
    assert derive("all_reduce", res, None) == Ranks(16, "rank lines", ())


@pytest.mark.parametrize("command", [
    "mpirun -np 2 all_reduce_perf -t 2 -g 4",
    "mpirun -np 2 all_reduce_perf --nthreads 2 --ngpus=4",
    "mpirun -np 2 -H a:1,b:1 ./build/all_reduce_perf -b 8 -e 8G -t2 -g4",
    "mpirun -np 2 all_reduce_perf -g 8",
    "srun -N 2 --ntasks-per-node=1 --mpi=pmix all_reduce_perf -t 2 -g 4",
    "srun -n 2 all_reduce_perf_mpi -g 8",
    "srun --nodes=2 --ntasks-per-node 1 all_reduce_perf --ngpus 8",
    "srun -N2 -n2 all_reduce_perf -t 8",
])
def test_threads_and_gpus_per_process_with_16_rank_lines(command):
    # 16 rank lines and busbw/algbw = 2 x 15/16 agree with processes x threads x GPUs: no note
    assert derive("all_reduce", result(command, rows=[row(100.0, 187.5)], ranks=16), None) == \
        Ranks(16, "command line", ())


def test_two_agreeing_witnesses_outvote_the_command_line():
    # the command line shown says 2 x 1 GPU (and nccl-tests' line nGpus 1: another run's header?), but 16 rank
    # lines and 2 x 15/16 say 16
    r = derive("all_reduce", result("mpirun -np 2 all_reduce_perf -g 1", rows=[row(100.0, 187.5)], ranks=16,
                                    nThread="1", nGpus="1"), None)
    assert (r.count, r.source) == (16, "rank lines")
    assert r.notes == ("the command line starts 2 ranks (mpirun -np 2 x 1 GPU per process), fewer than the 16 the "
                       "rank lines show (nccl-tests prints a line for every rank): the rank lines and busbw/algbw "
                       "(the all_reduce factor) give 16, which is taken",)


def test_the_table_outvotes_the_command_line():
    # all_gather: the size and count columns and (n-1)/n (96.88/100 = 31/32) agree on 32, the command line says 64
    r = derive("all_gather", result("mpirun -np 64 all_gather_perf -g 1", rows=[row(100.0, 96.88)]), 32)
    assert (r.count, r.source) == (32, "sizes")
    assert r.notes == ("the command line starts 64 ranks (mpirun -np 64 x 1 GPU per process), but the size and "
                       "count columns and busbw/algbw (the all_gather factor) give 32, which is taken",)


def test_a_command_line_below_the_rank_lines_loses_to_them():
    # broadcast's busbw = algbw says nothing: one witness against one, but 16 rank lines mean 16 ranks ran
    r = derive("broadcast", result("mpirun -np 2 broadcast_perf", rows=[row(50.0, 50.0)], ranks=16), None)
    assert (r.count, r.source) == (16, "rank lines")
    assert len(r.notes) == 1 and r.notes[0].startswith("the command line starts 2 ranks (mpirun -np 2 x 1 GPU per "
                                                        "process), fewer than the 16 the rank lines show")


def test_a_three_way_disagreement_goes_to_the_command_line():
    r = derive("all_reduce", result("mpirun -np 2 all_reduce_perf -g 8", rows=[row(98.61, 191.05)], ranks=8), None)
    assert (r.count, r.source) == (16, "command line")
    assert r.notes == ("the command line starts 16 ranks (mpirun -np 2 x 8 GPUs per process); the rank lines show 8 "
                       "(an excerpt?)",
                       "the command line starts 16 ranks (mpirun -np 2 x 8 GPUs per process); busbw/algbw (the "
                       "all_reduce factor) give 32")


def test_the_header_and_the_command_line_disagreeing_is_a_note():
    r = derive("all_reduce", result("mpirun -np 2 all_reduce_perf -t 1 -g 4", rows=[row(100.0, 187.5)], ranks=16,
                                    nThread="1", nGpus="8"), None)
    assert r == Ranks(16, "command line", ("the command line says -g 4 but nccl-tests printed 'nGpus 8', which is "
                                           "what it ran with",))


def ranklines(numbers, groups=None):
    return [RankInfo(rank=n, host=f"h{i // 8}", device=n % 8, bus_id="", name="H100",
                     group=None if groups is None else groups[i]) for i, n in enumerate(numbers)]


def test_repeated_rank_numbers_are_tests_that_each_ran_alone():
    # a binary built without MPI under mpirun -np 2 -g 8: each process is proc 0 of its own 8-rank test
    res = result("mpirun -np 2 all_reduce_perf -g 8", rows=[row(100.0, 175.0)])  # 2 x 7/8: 8 ranks
    res.ranks = ranklines(list(range(8)) * 2)
    r = derive("all_reduce", res, None)
    assert (r.count, r.source) == (8, "rank lines")
    assert r.notes == ("the rank lines repeat rank numbers: each process ran its own 8-rank test (a binary built "
                       "without MPI=1, or a launcher its MPI does not know)",
                       "so the command line's 16 ranks (mpirun -np 2 x 8 GPUs per process) are not one test's")


def test_several_groups_in_the_rank_lines_are_a_split():
    # NCCL_TESTS_SPLIT="%2" set in the environment, not on the command line: colour = proc % 2
    # (src/common.cu:1511-1514), so the table is group 0's 8 ranks of the 16 the lines show
    res = result("mpirun -np 16 all_reduce_perf -g 1", rows=[row(100.0, 175.0)])
    res.ranks = ranklines(range(16), [n % 2 for n in range(16)])
    r = derive("all_reduce", res, None)
    assert (r.count, r.source) == (8, "rank lines")
    assert r.notes[0] == ("the rank lines show 2 groups (NCCL_TESTS_SPLIT): the table is rank 0's group 0, 8 of "
                          "the 16 ranks")
    assert r.notes[1].startswith("so the command line's 16 ranks")


def test_a_split_without_rank_0s_line_gives_no_rank_line_count():
    res = result("mpirun -np 16 all_reduce_perf -g 1", rows=[row(100.0, 175.0)])
    res.ranks = ranklines(range(8, 16), [n % 2 for n in range(8, 16)])
    r = derive("all_reduce", res, None)
    assert (r.count, r.source) == (8, "busbw/algbw")  # neither the lines nor the command line count
    assert "but not rank 0's" in r.notes[0] and r.notes[1].startswith("so the command line's 16 ranks")
