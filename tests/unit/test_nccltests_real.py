"""`lingjun-slurm nccl-test --report` over every real nccl-tests output in tests/fixtures/nccl (sources in
SOURCES.md there), compared with how a person reading each one judges it (expected.json): the collective,
the ranks, the busbw at the largest size, the average, whether every size was measured, and the verdict
with the line that says why. report.json is checked against the schema shipped in the package."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from lingjun_slurm.nodes.nccltests.parse import parse_runs
from lingjun_slurm.nodes.nccltests.schema import validate
from tests.unit.test_nccltests_cli import run_cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())["samples"]
SIX = {"all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter", "alltoall"}
# nccl-tests' traceback line (".. host pid N: Test failure common.cu:891"), which never says why.
TRACEBACK = re.compile(r"(?<!CUDA )(?<!NCCL )Test failure \S+:\d+|\.\. \S+ pid \d+")


def largest(op: dict[str, Any]) -> list[Any] | None:
    if not op["rows"]:
        return None
    row = max(op["rows"], key=lambda r: r["size_bytes"])
    return [row["size_bytes"], row["busbw_out"], row["busbw_in"]]


def judged(sample: dict[str, Any], op: dict[str, Any]) -> None:
    name = sample["file"]
    assert op["op"] == sample["op"], name
    assert (op["ranks"], op["ranks_from"]) == (sample["ranks"], sample["ranks_from"]), name
    assert largest(op) == sample["largest"], name
    assert op["avg_busbw"] == sample["avg_busbw"], name
    assert op["complete"] is sample["complete"], name
    assert op["verdict"] == sample["verdict"], (name, op["reason"])
    for words in sample["reason_has"]:
        assert words in op["reason"], (name, op["reason"])
    assert not TRACEBACK.search(op["reason"]), (name, op["reason"])


def test_the_corpus_covers_what_it_must() -> None:
    assert len(EXPECTED) >= 15
    assert SIX <= {s["op"] for s in EXPECTED}
    assert sum(s["verdict"] == "FAIL" and s["complete"] is False and s["largest"] is None for s in EXPECTED) >= 2
    assert sorted(p.relative_to(FIXTURES).as_posix() for p in FIXTURES.rglob("*")
                  if p.is_file() and p.suffix in (".txt", ".log") and "standin" not in p.parts) == \
        sorted(s["file"] for s in EXPECTED)  # every real output has its expected judgement, and only those
    sources = (FIXTURES / "SOURCES.md").read_text()
    for sample in EXPECTED:
        assert f"`{sample['file']}`" in sources, f"{sample['file']} is not cited in SOURCES.md"
    # The layouts issue 14 item 7 names, each in a real output of the corpus.
    prefixes = {s["file"]: parse_runs((FIXTURES / s["file"]).read_text())[0].prefix for s in EXPECTED}
    assert prefixes["nccl_tests_290_h100_2node_srun_l_all_reduce.txt"] == "0: "  # srun -l (" 0: ", padded)
    assert prefixes["eks_efa_g4dn_t4_2node_all_reduce_mpi_tagged.log"] == "[1,0]<stdout>:"  # mpirun --tag-output
    assert prefixes["skypilot_gke_h200_all_gather_launcher_prefix.txt"] == "(head, rank=0, pid=3808) [1,0]<stdout>:"
    alltoall = parse_runs((FIXTURES / "superbench" / "nccl_alltoall.log").read_text())[0]
    assert "redop" in alltoall.columns and {r.redop for r in alltoall.rows} == {None}  # the blank redop
    assert {s["file"] for s in EXPECTED if s["file"].startswith("superbench/nccl_")} >= {
        "superbench/nccl_allreduce.log", "superbench/nccl_allgather.log", "superbench/nccl_reducescatter.log"}


@pytest.mark.parametrize("sample", EXPECTED, ids=[s["file"] for s in EXPECTED])
def test_report_judges_each_real_output_as_a_person_would(sample: dict[str, Any], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # A copy, so that report.json lands in tmp_path, beside the output as it would on a cluster.
    copy = tmp_path / Path(sample["file"]).name
    shutil.copyfile(FIXTURES / sample["file"], copy)
    code, out, err = run_cli(capsys, "--report", str(copy), "--no-chart", "--json")
    doc = json.loads(out)
    assert validate(doc) == [] and err == ""
    assert code == (1 if sample["verdict"] == "FAIL" else 0)
    [op] = doc["ops"]
    judged(sample, op)
    assert op["file"] == str(copy)
    assert json.loads((tmp_path / "report.json").read_text()) == doc


def test_ranks_a_reader_derives(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The outputs whose rank count needs more than the rank lines (ranks.py): the command line wins over
    an excerpt's rank lines and says so; without either, busbw/algbw gives the all_reduce count."""
    by_file = {s["file"]: s for s in EXPECTED}
    files = ["nccl_tests_322_h100_unhandled_cuda_error_excerpt.txt", "deepops_dgx_a100_4node_all_reduce.txt",
             "deepops_roce_sriov_k8s_all_reduce.txt", "nccl_tests_264_h100_system_not_yet_initialized.txt"]
    code, out, _ = run_cli(capsys, "--report", *(str(FIXTURES / f) for f in files), "--no-chart",
                           "--report-json", str(tmp_path / "r.json"))
    doc = json.loads((tmp_path / "r.json").read_text())
    assert validate(doc) == []
    assert [(op["ranks"], op["ranks_from"]) for op in doc["ops"]] == [
        (1024, "command line"), (32, "busbw/algbw"), (16, "busbw/algbw"), (8, "command line")]
    assert [(by_file[f]["ranks"], by_file[f]["ranks_from"]) for f in files] == \
        [(op["ranks"], op["ranks_from"]) for op in doc["ops"]]
    note = ("the command line starts 1024 ranks (mpirun -np 1024 x 1 GPU per process); the rank lines show 16 "
            "(an excerpt?)")
    assert doc["ops"][0]["notes"] == [note]
    assert f"all_reduce: note: {note}" in out
    assert [op["notes"] for op in doc["ops"][1:]] == [[], [], []]


def test_one_report_over_every_real_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(FIXTURES / s["file"]) for s in EXPECTED]
    target = tmp_path / "all.json"
    code, out, _ = run_cli(capsys, "--report", *files, "--no-chart", "--report-json", str(target))
    assert code == 1  # some of them failed
    doc = json.loads(target.read_text())
    assert validate(doc) == [] and doc["ok"] is False and len(doc["ops"]) == len(EXPECTED)
    for sample, op in zip(EXPECTED, doc["ops"]):
        judged(sample, op)
    # The text report says the same: one verdict line per output, the failures with their cause.
    assert "all_reduce (nccl_tests_369_gh200_busy_or_unavailable.txt): FAIL: no results table (nccl-tests did " \
           "not run): gpu-1-1: Test CUDA failure common.cu:1304 'CUDA-capable device(s) is/are busy or " \
           "unavailable'" in out
    assert "alltoall (nccl_alltoall.log): no verdict: no published reference for alltoall_perf" in out
    assert f"report.json: {target}" in out


def test_a_job_log_with_several_tests_is_one_report_per_test(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # A job's log holds each test's output one after the other: here two real ones, no name in the file.
    first, second = EXPECTED[7], EXPECTED[9]  # superbench all_reduce, alltoall
    assert (first["op"], second["op"]) == ("all_reduce", "alltoall")
    log = tmp_path / "nccl-test-1234.out"
    log.write_text((FIXTURES / first["file"]).read_text() + (FIXTURES / second["file"]).read_text())
    code, out, _ = run_cli(capsys, "--report", str(log), "--no-chart", "--json")
    doc = json.loads(out)
    assert code == 0 and validate(doc) == [] and [op["op_from"] for op in doc["ops"]] == ["table", "table"]
    for sample, op in zip((first, second), doc["ops"]):
        judged(sample, op)
    assert doc["ops"][0]["notes"][0].startswith("run 1 of 2 in this file (lines 1-")


def test_run_directories_judge_the_same_outputs_the_same_way(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A run directory (<op>.txt per test, as nccl-test's job writes it) of real outputs."""
    run = tmp_path / "run"
    run.mkdir()
    picks = {s["op"]: s for s in EXPECTED if s["file"] in (
        "nccl_tests_290_h100_2node_srun_l_all_reduce.txt", "nccl_tests_355_h800_alltoall_illegal_memory_access.txt",
        "skypilot_gke_h200_all_gather_launcher_prefix.txt")}
    for op, sample in picks.items():
        shutil.copyfile(FIXTURES / sample["file"], run / f"{op}.txt")
    code, out, _ = run_cli(capsys, "--report", str(run), "--no-chart", "--nodes", "2")
    assert code == 1
    doc = json.loads((run / "report.json").read_text())
    assert validate(doc) == [] and [op["op"] for op in doc["ops"]] == ["all_reduce", "all_gather", "alltoall"]
    for op in doc["ops"]:
        judged(picks[op["op"]], op)
    assert "all_gather: no verdict: no published reference for all_gather_perf" in out


def test_several_gpus_per_process_and_a_command_line_outvoted(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """mpirun -np 2 with -g 8 (and -g 2): processes x GPUs per process, the rank lines and busbw/algbw agree,
    no note. The same output with its command line edited to -np 1 has one witness for 8 against two for
    16: 16 is taken and the note says why, in report.json and in the text report."""
    real = [FIXTURES / "nvidia_tools_image_h200_2x8_mpirun_g8_all_reduce.txt",
            FIXTURES / "nvidia_tools_image_l40s_2x2_mpirun_g2_all_reduce.txt"]
    edited = tmp_path / "all_reduce_np1.txt"
    edited.write_text(real[0].read_text().replace(" -np 2 ", " -np 1 ", 1))
    code, out, _ = run_cli(capsys, "--report", *(str(p) for p in real), str(edited), "--no-chart",
                           "--report-json", str(tmp_path / "r.json"))
    doc = json.loads((tmp_path / "r.json").read_text())
    assert validate(doc) == [] and code == 0
    assert [(op["ranks"], op["ranks_from"], op["notes"]) for op in doc["ops"][:2]] == [
        (16, "command line", []), (4, "command line", [])]
    note = ("the command line starts 8 ranks (mpirun -np 1 x 8 GPUs per process), fewer than the 16 the rank lines "
            "show (nccl-tests prints a line for every rank): the rank lines and busbw/algbw (the all_reduce factor) "
            "give 16, which is taken")
    assert (doc["ops"][2]["ranks"], doc["ops"][2]["ranks_from"], doc["ops"][2]["notes"]) == (16, "rank lines", [note])
    assert f"note: {note}" in out
