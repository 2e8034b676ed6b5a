"""The rank count of an nccl-tests run and where it comes from (lingjun_slurm/nccltests/ranks.py): the
command line, the rank lines, the size and count columns, busbw/algbw. The real outputs are judged in
test_nccltests_real.py; here each rule on small made-up inputs, the real tables where they decide."""

from __future__ import annotations

from pathlib import Path

import pytest

from lingjun_slurm.nccltests.parse import NcclTestResult, RankInfo, Row, parse_runs, parse_text
from lingjun_slurm.nccltests.ranks import derive, from_bandwidth, from_command, processes

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
