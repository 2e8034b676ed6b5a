"""Verdicts: published references (Azure ND only, with sources), --expect, shapes, sizes, data errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from lingjun_slurm import network
from lingjun_slurm.nodes.nccltests.parse import NcclTestResult, RankInfo, Row, parse_text
from lingjun_slurm.nodes.nccltests.sizes import human_size, nccl_size, parse_size
from lingjun_slurm.nodes.nccltests.parse import op_of
from lingjun_slurm.nodes.nccltests.verdict import (FAIL, NONE, PASS, Shape, busbw_value, judge, observed_shape,
                                                   parse_expect, profile_references)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"
GIB16 = 16 << 30


def row(size: int, oop: float, ip: float, wrong: int = 0) -> Row:
    return Row(size_bytes=size, count=size // 4, dtype="float", redop="sum", root=-1, oop_time_us=1.0,
               oop_algbw=oop / 1.75, oop_busbw=oop, oop_wrong=wrong, ip_time_us=1.0, ip_algbw=ip / 1.75, ip_busbw=ip,
               ip_wrong=0)


def one_node(rows: list[Row], gpus: int = 8, host: str = "nd1") -> NcclTestResult:
    ranks = [RankInfo(rank=i, host=host, device=i, bus_id="", name="H100") for i in range(gpus)]
    # ended: nccl-tests printed its closing "Avg bus bandwidth" line (a finished run)
    return NcclTestResult(test="all_reduce_perf", rows=rows, avg_busbw=None, out_of_bounds=0, ranks=ranks, ended=True)


H100 = profile_references(network.get_profile("azure-nd-h100-v5"))


def test_published_figures_exist_only_for_azure_nd_with_their_source() -> None:
    figures = {name: [(r.op, r.busbw_gbps, r.size, r.nodes, r.gpus_per_node) for r in prof.nccl_references]
               for name, prof in network.profiles().items()}
    assert figures == {
        "lingjun": [], "generic-ib": [], "generic-roce": [], "tcp": [],
        "azure-nd-h100-v5": [("all_reduce", 460.0, "16G", 1, 8)],
        "azure-nd-h200-v5": [("all_reduce", 431.0, "16G", 1, 8)],
        "azure-nd-a100-v4": [("all_reduce", 228.0, "16G", 1, 8)],
    }
    for prof in network.profiles().values():
        for ref in prof.nccl_references:
            assert "Azure/azurehpc-health-checks conf/" in ref.source and "check_nccl_allreduce" in ref.source
            assert f"check_nccl_allreduce {ref.busbw_gbps:.1f}" in ref.source


def test_pass_at_the_reference_size_uses_the_mean_of_out_of_place_and_in_place() -> None:
    # Azure's check reads "Avg bus bandwidth" of a -b 16G -e 16G run: the mean of both columns.
    v = judge("all_reduce", one_node([row(8 << 30, 500, 500), row(GIB16, 470, 452)]),
              expected=Shape(1, 8), references=H100, profile="azure-nd-h100-v5")
    assert v.status == PASS and v.measured_gbps == pytest.approx(461.0)
    assert "460 GB/s" in v.reason and "nd96isr_h100_v5.conf" in v.reason
    v = judge("all_reduce", one_node([row(GIB16, 470, 440)]), expected=Shape(1, 8), references=H100, profile="x")
    assert v.status == FAIL and v.measured_gbps == pytest.approx(455.0) and "455.00 GB/s at 16 GiB < 460" in v.reason


def test_threshold_is_used_as_published_without_a_margin() -> None:
    v = judge("all_reduce", one_node([row(GIB16, 460.0, 460.0)]), expected=None, references=H100, profile="x")
    assert v.status == PASS
    v = judge("all_reduce", one_node([row(GIB16, 459.99, 459.99)]), expected=None, references=H100, profile="x")
    assert v.status == FAIL


def test_published_single_vm_figure_gives_no_verdict_for_another_shape() -> None:
    two_nodes = one_node([row(GIB16, 300, 300)], gpus=8)
    two_nodes.ranks += [RankInfo(rank=8 + i, host="nd2", device=i, bus_id="", name="H100") for i in range(8)]
    v = judge("all_reduce", two_nodes, expected=Shape(2, 8), references=H100, profile="azure-nd-h100-v5")
    assert v.status == NONE and "is for 1 node x 8 GPUs; this test ran 2 nodes x 8 GPUs" in v.reason
    # all_gather has no published figure at all.
    v = judge("all_gather", one_node([row(GIB16, 300, 300)]), expected=Shape(1, 8), references=H100,
              profile="azure-nd-h100-v5")
    assert v.status == NONE and "no published reference for all_gather_perf" in v.reason


def test_lingjun_has_no_reference_and_reports_measurements_only() -> None:
    refs = profile_references(network.get_profile("lingjun"))
    v = judge("all_reduce", one_node([row(GIB16, 1, 1)]), expected=Shape(1, 8), references=refs, profile="lingjun")
    assert refs == [] and v.status == NONE and "measurement only" in v.reason


def test_reference_size_not_measured_is_no_verdict() -> None:
    v = judge("all_reduce", one_node([row(8 << 30, 500, 500)]), expected=Shape(1, 8), references=H100, profile="x")
    assert v.status == NONE and "16 GiB was not measured" in v.reason and "--max-bytes" in v.reason


def test_data_errors_and_missing_output_fail() -> None:
    v = judge("all_reduce", one_node([row(GIB16, 500, 500, wrong=3)]), expected=None, references=H100, profile="x")
    assert v.status == FAIL and "3 wrong elements" in v.reason
    bad = one_node([row(GIB16, 500, 500)])
    bad.out_of_bounds = 2
    assert judge("all_reduce", bad, expected=None, references=H100, profile="x").status == FAIL
    v = judge("all_reduce", None, expected=None, references=H100, profile="x", problem="no all_reduce output: gone")
    assert v.status == FAIL and v.reason == "no all_reduce output: gone"
    empty = NcclTestResult(test=None)
    v = judge("all_reduce", empty, expected=None, references=[], profile=None)
    assert v.status == FAIL and v.reason == "no results table (nccl-tests did not run): the output is empty"
    # The same table without its closing average line: sizes were never measured, whatever the bandwidth.
    cut = one_node([row(8 << 30, 500, 500), row(GIB16, 500, 500)])
    cut.ended = False
    v = judge("all_reduce", cut, expected=None, references=[parse_expect("all_reduce=100")], profile=None)
    assert v.status == FAIL and v.reason.startswith("incomplete: the output stops after the 16 GiB row")


def test_a_rank_count_that_is_not_the_task_count_fails() -> None:
    """A binary without MPI runs one 1-rank test per task: each prints 'Rank 0'."""
    lone = one_node([row(GIB16, 500, 500)], gpus=1)
    v = judge("all_reduce", lone, expected=Shape(2, 8), references=[], profile="tcp")
    assert v.status == FAIL and "1 rank(s) but the job ran 16 tasks" in v.reason


def test_expect_option_parsing_and_its_verdict() -> None:
    ref = parse_expect("all_reduce=350@16G")
    assert (ref.op, ref.busbw_gbps, ref.size_bytes, ref.nodes) == ("all_reduce", 350.0, GIB16, None)
    assert parse_expect("all_gather=100").size_bytes is None
    for bad in ("all_reduce", "nope=1", "all_reduce=abc", "all_reduce=-1", "all_reduce=nan", "all_reduce=1@16Q"):
        with pytest.raises(ValueError):
            parse_expect(bad)
    # A user figure applies to any shape; peak = best row.
    result = parse_text((FIXTURES / "h100_a3mega_all_reduce.txt").read_text())
    v = judge("all_reduce", result, expected=Shape(2, 8), references=[parse_expect("all_reduce=330")] + H100,
              profile="azure-nd-h100-v5")
    assert v.status == PASS and v.measured_gbps == pytest.approx(338.82) and "peak" in v.reason


def test_real_output_shape_and_values() -> None:
    result = parse_text((FIXTURES / "h100_a3mega_all_reduce.txt").read_text())
    assert observed_shape(result) == Shape(2, 8)
    assert busbw_value(result, 8 << 30) == pytest.approx((338.82 + 337.35) / 2)
    assert busbw_value(result, None) == pytest.approx(338.82)
    assert busbw_value(result, 3) is None
    assert busbw_value(replace(result, rows=[]), None) is None


def test_sizes_and_op_names() -> None:
    assert parse_size("16G") == 1 << 34 and parse_size("512K") == 524288 and parse_size("8") == 8
    for bad in ("", "1.5G", "16GB", "0", "-8", "2048G"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert nccl_size(1 << 34) == "16G" and nccl_size(3 << 20) == "3M" and nccl_size(1000) == "1000"
    assert human_size(8) == "8 B" and human_size(1536) == "1.5 KiB" and human_size(1 << 34) == "16 GiB"
    assert op_of("all_reduce_perf") == "all_reduce" and op_of("all_gather_perf_mpi") == "all_gather"
    assert op_of("my_perf") is None and op_of(None) is None


def test_all_gather_sizes_rounded_to_the_rank_count_still_match_expect_at_size() -> None:
    # nccl-tests all_gather: recvcount = (count / nranks) * nranks (newer builds also align count /
    # nranks to 16 bytes), so 16G on 24 ranks (3 nodes x 8) prints 17179869120 (or 17179868928)
    # bytes; --expect all_gather=100@16G must read that row, not "not measured".
    nranks = 24
    rounded = (GIB16 // 4 // nranks) * nranks * 4
    assert rounded == 17179869120 and ((GIB16 // 4 // nranks) & -4) * nranks * 4 == 17179868928
    result = NcclTestResult(test="all_gather_perf", rows=[row((8 << 30) // 4 // nranks * nranks * 4, 90, 90),
                                                          row(rounded, 120, 110)], ended=True)
    ref = parse_expect("all_gather=100@16G")
    v = judge("all_gather", result, expected=None, references=[ref], profile=None)
    assert v.status == PASS and v.measured_gbps == pytest.approx(115.0)
    assert busbw_value(result, 1 << 20) is None  # far from any row: still not measured
