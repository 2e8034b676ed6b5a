"""lingjun_slurm.nodes.nccltests.parse against real nccl-tests outputs (see tests/fixtures/nccl/SOURCES.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lingjun_slurm.nodes.nccltests.parse import (
    NcclParseError,
    busbw_at,
    max_busbw,
    parse_json,
    parse_runs,
    parse_text,
)

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"


def _load(name: str):
    return parse_text((FIX / name).read_text())


def test_h100_a3mega_all_reduce_full_run() -> None:
    """2x8 H100 (GCP a3-megagpu) all_reduce_perf, full verbatim log.

    Source: github.com/lessizzmore/create-a3mega-ztan-fork, file ztan-NCCL-test-result
    (commit 02dd8f455c43ced1cf442ef29334bda97149264b); nccl-tests >= 2.13 layout ("agg iters",
    "graph", Group column, domain-qualified bus ids); exact version not printed.
    """
    r = _load("h100_a3mega_all_reduce.txt")
    assert r.test == "all_reduce_perf"  # taken from the mpirun command line
    assert len(r.rows) == 31
    first, last = r.rows[0], r.rows[-1]
    assert (first.size_bytes, first.count, first.dtype, first.redop, first.root) == (8, 2, "float", "sum", -1)
    assert first.oop_time_us == pytest.approx(135.8) and first.ip_time_us == pytest.approx(123.5)
    assert last.size_bytes == 8589934592 and last.count == 2147483648
    assert last.oop_time_us == 47535 and last.oop_algbw == pytest.approx(180.71)
    assert last.oop_busbw == pytest.approx(338.82) and last.ip_busbw == pytest.approx(337.35)
    assert last.oop_wrong == 0 and last.ip_wrong == 0
    assert r.avg_busbw == pytest.approx(70.742)
    assert r.out_of_bounds == 0
    assert len(r.ranks) == 16
    assert r.ranks[0].host == "ztan-mig-235z" and r.ranks[0].bus_id == "0000:04:00"
    assert r.ranks[0].name == "NVIDIA H100 80GB HBM3"
    assert (r.ranks[15].rank, r.ranks[15].host, r.ranks[15].device) == (15, "ztan-mig-gq73", 7)
    assert r.ranks[15].bus_id == "0000:8c:00"
    assert r.params["maxBytes"] == "8589934592" and r.params["step"] == "2(factor)"
    assert r.params["warmup iters"] == "5" and r.params["agg iters"] == "1" and r.params["graph"] == "0"
    assert max_busbw(r) == pytest.approx(338.82)
    assert busbw_at(r, 268435456) == pytest.approx(213.28)  # best of oop 213.19 / ip 213.28
    assert busbw_at(r, 12345) is None


def test_gb10_all_reduce_nccl_tests_2_20_header() -> None:
    """DGX Spark (GB10) 2-node all_reduce_perf, nccl-tests 2.20.0 (b4d5bee), excerpt (rows trimmed).

    Source: https://github.com/NVIDIA/dgx-spark-playbooks/pull/103 (comment by murat-magomedov).
    """
    r = _load("gb10_all_reduce_v2_20_excerpt.txt")
    assert r.test == "all_reduce_perf"  # "# Collective test starting:" line
    assert r.params["nccl_tests_version"] == "2.20.0"
    assert r.params["unalign"] == "0" and r.params["iters"] == "100"
    assert [x.size_bytes for x in r.rows] == [8192, 16384, 32768, 65536]
    assert r.rows[-1].ip_busbw == pytest.approx(1.01)
    assert [(k.rank, k.host, k.bus_id, k.name) for k in r.ranks] == [
        (0, "spark-d708", "000f:01:00", "NVIDIA GB10"),
        (1, "spark-dbf4", "000f:01:00", "NVIDIA GB10"),
    ]
    assert r.avg_busbw is None and r.out_of_bounds is None  # trailer not in the excerpt


def test_gb200_nvl72_excerpt() -> None:
    """GB200 NVL72 rack all_reduce_perf, excerpt (last rank line + table + trailer).

    Source: https://github.com/coreweave/nccl-tests/pull/43 (description).
    """
    r = _load("gb200_nvl72_all_reduce_excerpt.txt")
    assert r.ranks[0].rank == 71 and r.ranks[0].host == "slurm-gb200-207-171"
    assert r.ranks[0].name == "NVIDIA Graphics Device" and r.ranks[0].bus_id == "0x01"
    assert r.rows[0].size_bytes == 536870912 and r.rows[-1].size_bytes == 8589934592
    assert r.avg_busbw == pytest.approx(745.53)
    assert max_busbw(r) == pytest.approx(846.82)
    assert r.test is None


def test_gke_a3plus_all_gather() -> None:
    """2x8 H100 (GKE A3+ / TCPXO) all_gather table with redop "none"; verbatim as published.

    Source: "Instructions for GKE" A3 plus GPUDirect-TCPXO guide, a public GitHub README
    (see SOURCES.md; exact repository not resolvable with the tools used).
    """
    r = _load("gke_a3plus_tcpxo_all_gather.txt")
    assert len(r.rows) == 11
    assert all(x.redop == "none" and x.root == -1 for x in r.rows)
    assert r.rows[0].size_bytes == 1048576 and r.rows[0].count == 16384
    assert r.rows[-1].size_bytes == 1073741824 and r.rows[-1].oop_busbw == pytest.approx(122.14)
    assert r.rows[9].ip_time_us == 11706
    assert r.avg_busbw == pytest.approx(22.449) and r.out_of_bounds == 0
    assert busbw_at(r, 1073741824) == pytest.approx(122.14)


def test_a100_all_gather_bfloat16_excerpt() -> None:
    """all_gather_perf -d bfloat16 on 2 GPUs (NCCL 2.x), excerpt: header + first 7 rows.

    Source: https://github.com/NVIDIA/nccl/issues/1435 (description).
    """
    r = _load("a100_all_gather_bf16_excerpt.txt")
    assert len(r.rows) == 7
    assert r.rows[0].dtype == "bfloat16" and r.rows[0].redop == "none"
    assert r.rows[0].oop_algbw == pytest.approx(154.20) and r.rows[0].oop_busbw == pytest.approx(77.10)
    assert r.rows[-1].size_bytes == 117440512
    assert max_busbw(r) == pytest.approx(144.59)


def test_old_layout_broadcast_without_redop_and_na_errors() -> None:
    """Old nccl-tests (NCCL 2.9.6 era) broadcast_perf -c 0: no redop column, "error" + N/A.

    Source: https://github.com/NVIDIA/nccl-tests/issues/82 (comment by rahul-bothra), excerpt;
    NCCL WARN lines interleaved as in the original.
    """
    r = _load("v100_broadcast_old_format.txt")
    assert r.test == "broadcast_perf"
    assert len(r.rows) == 1
    row = r.rows[0]
    assert (row.size_bytes, row.count, row.dtype, row.redop, row.root) == (8, 2, "float", None, 0)
    assert row.oop_time_us == pytest.approx(45.82) and row.ip_time_us == pytest.approx(38.17)
    assert row.oop_wrong is None and row.ip_wrong is None
    assert [(k.rank, k.host, k.bus_id) for k in r.ranks] == [(0, "v100-gpu-1", "0x00"), (1, "v100-gpu-5", "0x00")]
    assert r.ranks[1].name == "Tesla V100-PCIE-16GB"
    assert r.params["validation"] == "0" and "agg iters" not in r.params


def test_nonzero_wrong_counts_and_ellipsis_line() -> None:
    """DGX-H100 all_reduce with data corruption (#wrong > 0); user-trimmed with "...".

    Source: https://github.com/NVIDIA/nccl/issues/1184 (description), excerpt.
    """
    r = _load("dgx_h100_all_reduce_wrong_excerpt.txt")
    assert [x.size_bytes for x in r.rows] == [8, 262144, 524288]
    assert r.rows[-1].oop_wrong == 237858 and r.rows[-1].ip_wrong == 238038


# --- synthetic inputs for edge and error cases -------------------------------------------------

HEADER = (
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n"
)


GOOD_ROW = "        2048           512     float     sum      -1    12.5    0.16    0.30      0    12.4    0.17    0.31      0\n"


def test_malformed_row_reports_line_number() -> None:
    # A short row followed by more rows is not a test that stopped there: it is a malformed row.
    text = "# nThread 1 nGpus 8\n" + HEADER + "        1024           256     float     sum      -1    12.5\n" + GOOD_ROW
    with pytest.raises(NcclParseError) as exc:
        parse_text(text)
    assert exc.value.line == 4 and "line 4" in str(exc.value)
    assert isinstance(exc.value, ValueError)


def test_non_numeric_value_in_row() -> None:
    text = HEADER + "  8  2  float  sum  -1  abc  0.00  0.00  0  1.0  0.00  0.00  0\n"
    with pytest.raises(NcclParseError, match="line 3"):
        parse_text(text)


def test_an_output_that_stops_in_a_row_is_a_test_that_died_there() -> None:
    # writeBenchmarkLinePreamble prints the size columns before measuring (src/util.cu): a job killed
    # during a size leaves them alone (or with the out-of-place half only) at the end of the output.
    for last in ("        4096          1024     float     sum      -1",
                 "        4096          1024     float     sum      -1    12.5    0.33    0.61      0"):
        r = parse_text(HEADER + GOOD_ROW + last + "\n")
        assert [x.size_bytes for x in r.rows] == [2048] and not r.complete
        assert r.interrupted is not None and r.interrupted.size_bytes == 4096 and r.interrupted.text == ""
    # ... or followed on the same line by the error that ended it (NVIDIA/nccl-tests#355).
    r = parse_text(HEADER + "     2097152         32768     float    none      -1 node0: Test CUDA failure "
                            "common.cu:389 'an illegal memory access was encountered'\n")
    assert r.rows == [] and r.interrupted.size_bytes == 2097152
    assert r.failures == ["node0: Test CUDA failure common.cu:389 'an illegal memory access was encountered'"]


def test_log_noise_and_rows_before_header_are_ignored() -> None:
    text = ("8 more processes have sent help message help-mtl-ofi.txt\n"
            "  8  2  float  sum  -1  1.0  0.00  0.00  0  1.0  0.00  0.00  0\n" + HEADER +
            "8 more processes have sent help message help-mtl-ofi.txt\n"
            "[1,0]<stdout>:  16  4  float  sum  -1  2.0  0.01  0.02  0  2.0  0.01  0.02  0\n")
    r = parse_text(text)
    assert [x.size_bytes for x in r.rows] == [16]


def test_extra_trailing_columns_are_ignored() -> None:
    # nccl-tests -S 1 appends a timestamp; RCCL appends algo/proto/nchannels.
    text = HEADER + "  16  4  float  sum  -1  2.0  0.01  0.02  0  2.0  0.01  0.03  0  2025-01-01 12:00:00\n"
    assert parse_text(text).rows[0].ip_busbw == pytest.approx(0.03)


def test_empty_input_and_max_busbw_error() -> None:
    r = parse_text("")
    assert r.rows == [] and r.test is None and r.avg_busbw is None
    with pytest.raises(ValueError):
        max_busbw(r)


# JSON: no real `-J` output file was found in public sources; this document is built to match
# the writer in NVIDIA/nccl-tests src/util.cu (JSON_FILE_VERSION 1): doubles via "%lf", root as a
# "%6i" string, booleans as "true"/"false" strings, nwrong null when validation is off.
JSON_DOC = {
    "version": 1, "start_time": "2025-06-01 10:00:00",
    "args": ["/opt/nccl-tests/build/all_reduce_perf", "-b", "8", "-e", "16", "-J", "out.json"],
    "env": [], "nccl_version": 22703,
    "config": {
        "nthreads": 1, "ngpus": 1, "minimum_bytes": 8, "maximum_bytes": 16, "step_factor": 2,
        "warmup_iters": 5, "iterations": 20, "aggregated_iterations": 1, "validation": 1,
        "graph": 0, "blocking_collectives": "false", "parallel_init": "false",
        "devices": [{"rank": 0, "group": 0, "pid": 6899, "hostname": "node1", "device": 0,
                     "device_hex": "0000:04:00", "device_info": "NVIDIA H100 80GB HBM3"}],
    },
    "results": [
        {"size": 8, "count": 2, "type": "float", "redop": "sum", "root": "    -1",
         "out_of_place": {"time": 135.8, "alg_bw": 0.0, "bus_bw": 0.0, "nwrong": 0.0},
         "in_place": {"time": 123.5, "alg_bw": 0.0, "bus_bw": 0.0, "nwrong": 0.0},
         "actual_iterations": 20, "experiment_name": "all_reduce_perf"},
        {"size": 16, "count": 4, "type": "float", "redop": "sum", "root": "    -1",
         "out_of_place": None,
         "in_place": {"time": 122.3, "alg_bw": 0.01, "bus_bw": "nan", "nwrong": None},
         "actual_iterations": 20, "experiment_name": "all_reduce_perf"},
    ],
    "out_of_bounds": {"count": 0, "okay": "true"},
    "average_bus_bandwidth": {"bandwidth": 0.005, "okay": "unchecked"},
    "errors": [], "end_time": "2025-06-01 10:00:05",
}


def test_parse_json_writer_format() -> None:
    r = parse_json(json.dumps(JSON_DOC))
    assert r.test == "all_reduce_perf"
    assert r.params["maximum_bytes"] == "16" and r.params["blocking_collectives"] == "false"
    assert r.params["nccl_version"] == "22703"
    assert r.ranks[0].host == "node1" and r.ranks[0].bus_id == "0000:04:00"
    a, b = r.rows
    assert (a.size_bytes, a.root, a.redop, a.oop_wrong, a.ip_time_us) == (8, -1, "sum", 0, 123.5)
    assert b.oop_time_us is None and b.ip_wrong is None and math.isnan(b.ip_busbw)
    assert r.out_of_bounds == 0 and r.avg_busbw == pytest.approx(0.005)
    assert max_busbw(r) == 0.0 and busbw_at(r, 16) is None


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", json.dumps({"results": [{"size": 8}]})])
def test_parse_json_errors(text: str) -> None:
    with pytest.raises(NcclParseError):
        parse_json(text)


def test_launcher_prefixes_are_learned_from_rank_0s_header_line() -> None:
    """srun -l, Open MPI --tag-output, SkyPilot and kubectl --timestamps prefixes (real outputs in
    tests/unit/test_nccltests_real.py); here the same real table behind made-up prefix combinations."""
    real = (FIX / "nccl_tests_290_h100_1node_all_reduce.txt").read_text().splitlines()
    for prefix in ("12: ", "[1,0]<stdout>: ", "\x1b[36m(head, rank=0, pid=1)\x1b[0m ", "2026-01-02T03:04:05.678Z "):
        r = parse_text("\n".join(prefix + line for line in real) + "\n")
        assert len(r.rows) == 6 and r.rank_count == 8 and r.avg_busbw == pytest.approx(439.369) and r.complete
        assert r.rows[-1].oop_busbw == pytest.approx(473.60)


def test_tasks_that_each_print_their_own_table_are_seen() -> None:
    """A binary built without MPI under srun -l: every task prints a whole 1-rank test with its label."""
    from lingjun_slurm.nodes.nccltests.verdict import failure_reasons

    real = (FIX / "nccl_tests_290_h100_2node_srun_l_all_reduce.txt").read_text().splitlines()
    mine = [line for line in real if "Rank " not in line or "Rank  0 " in line]
    text = "\n".join(line for pair in zip(mine, [" 1:" + line[3:] for line in mine]) for line in pair)
    r = parse_text(text)
    assert r.prefix == "0: " and r.streams == 2 and r.rank_count == 1 and len(r.rows) == 11
    assert any("2 tasks each printed their own nccl-tests header" in why for why in failure_reasons(r))
    # Without labels the tasks' lines interleave in one stream: the repeated rank lines say it.
    r = parse_text("\n".join(line[4:] for line in text.splitlines()))
    assert r.streams == 1 and any("the rank lines repeat" in why for why in failure_reasons(r))


def test_several_runs_in_one_text_and_old_error_columns() -> None:
    one = (FIX / "superbench" / "nccl_reduce.log").read_text()
    two = (FIX / "nccl_tests_369_gh200_wrong_elements.txt").read_text()
    runs = parse_runs(one + "+ srun ... all_gather_perf -b 8\n" + two)
    assert [len(r.rows) for r in runs] == [34, 25] and [r.test for r in runs] == [None, "all_reduce_perf"]
    assert runs[0].columns == ("size", "count", "type", "redop", "root") and runs[0].rows[0].root == 0
    # Before nccl-tests 2.13 the last column was the maximum deviation, not a count of wrong elements.
    dgx = parse_text((FIX / "deepops_dgx_a100_4node_all_reduce.txt").read_text())
    assert dgx.rows[0].oop_error == pytest.approx(7e-07) and dgx.rows[0].wrong is None
    assert runs[1].rows[17].wrong == 128 and runs[1].out_of_bounds == 4 and runs[1].tracebacks == 2


def test_the_group_column_of_the_rank_lines_is_kept() -> None:
    """writeDeviceReport prints "#  Rank %2d Group %2d Pid %6d on %10s device %2d ..." (src/util.cu:687 at
    a0b82b2): the Group is the NCCL_TESTS_SPLIT colour, which ranks.py needs to tell a split run."""
    r = _load("nvidia_tools_image_h200_2x8_mpirun_g8_all_reduce.txt")
    assert [(x.rank, x.group, x.host, x.device) for x in r.ranks[7:9]] == [
        (7, 0, "nvidiatools-dgx-2d-workload", 7), (8, 0, "nvidiatools-dgx-9d-workload", 0)]
    old = _load("v100_broadcast_old_format.txt")  # before the Group column
    assert old.ranks and {x.group for x in old.ranks} == {None}
    doc = json.loads(json.dumps(JSON_DOC))
    doc["config"]["devices"][0]["group"] = 3
    assert parse_json(json.dumps(doc)).ranks[0].group == 3


@pytest.mark.parametrize("device", [{"group": 0}, {"rank": "x", "hostname": "h", "device": 0}, "node1"])
def test_a_bad_device_record_in_the_json_is_a_parse_error(device: object) -> None:
    doc = json.loads(json.dumps(JSON_DOC))
    doc["config"]["devices"] = [device]
    with pytest.raises(NcclParseError, match=r"config\.devices\[0\]"):
        parse_json(json.dumps(doc))
