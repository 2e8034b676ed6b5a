"""Reading run outputs (JSON preferred, text kept as fallback), the table, the JSON report, the PNG chart."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from lingjun_slurm import network
from lingjun_slurm.nodes.nccltests.chart import Series, Threshold, series_of, write_chart
from lingjun_slurm.nodes.nccltests.parse import parse_text
from lingjun_slurm.nodes.nccltests.report import build, format_plain, table, to_json
from lingjun_slurm.nodes.nccltests.results import OpOutput, load_file, load_op, load_paths
from lingjun_slurm.nodes.nccltests.schema import validate
from lingjun_slurm.nodes.nccltests.run import JobEnd
from lingjun_slurm.nodes.nccltests.verdict import FAIL, PASS, Shape, Verdict, parse_expect, profile_references
from lingjun_slurm.transport import LocalTransport

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"
ALL_REDUCE = (FIXTURES / "h100_a3mega_all_reduce.txt").read_text()
ALL_GATHER = (FIXTURES / "gke_a3plus_tcpxo_all_gather.txt").read_text()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def need_matplotlib() -> None:
    """Skip without matplotlib, except under CI (the test extra installs it): there it is a failure."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("matplotlib is required in CI (pip install -e '.[test]')")
        pytest.skip("matplotlib is not installed (pip install 'lingjun-slurm[plot]')")


def json_report(rows: list[tuple[int, float]]) -> str:
    """A -J document in the writer's layout (src/util.cu), as in test_nccltests_parse.py."""
    return json.dumps({"version": 1, "args": ["/opt/nccl-tests/build/all_reduce_perf", "-J", "x.json"],
                       "config": {"devices": [{"rank": 0, "hostname": "n1", "device": 0}]},
                       "results": [{"size": s, "count": s // 4, "type": "float", "redop": "sum", "root": "    -1",
                                    "out_of_place": {"time": 1.0, "alg_bw": b / 2, "bus_bw": b, "nwrong": 0.0},
                                    "in_place": {"time": 1.0, "alg_bw": b / 2, "bus_bw": b, "nwrong": 0.0}}
                                   for s, b in rows],
                       "out_of_bounds": {"count": 0, "okay": "true"}})


def test_json_is_preferred_and_text_is_the_fallback(tmp_path: Path) -> None:
    t = LocalTransport()
    (tmp_path / "all_reduce.txt").write_text(ALL_REDUCE)
    out = load_op(t, str(tmp_path), "all_reduce")
    assert out.path.endswith("all_reduce.txt") and len(out.result.rows) == 31 and out.problem is None
    (tmp_path / "all_reduce.json").write_text(json_report([(8, 0.5), (16, 0.75)]))
    out = load_op(t, str(tmp_path), "all_reduce")
    assert out.path.endswith("all_reduce.json") and [r.size_bytes for r in out.result.rows] == [8, 16]
    (tmp_path / "all_reduce.json").write_text("{broken")  # a job killed while writing it
    out = load_op(t, str(tmp_path), "all_reduce")
    assert out.path.endswith("all_reduce.txt") and len(out.result.rows) == 31 and out.problem is None
    assert [n for n in out.notes if "all_reduce.json unreadable" in n]


def verdict_of(out: OpOutput) -> Verdict:
    return build([out], title="t", expected=None, references=[], profile=None).ops[0].verdict


def test_missing_and_tableless_outputs_explain_themselves(tmp_path: Path) -> None:
    t = LocalTransport()
    out = load_op(t, str(tmp_path), "all_gather")
    assert out.result is None and "all_gather.txt is missing" in out.problem
    assert verdict_of(out).status == FAIL and "all_gather.txt is missing" in verdict_of(out).reason
    (tmp_path / "all_gather.txt").write_text("srun: error: Invalid MPI type 'pmix'\n")
    out = load_op(t, str(tmp_path), "all_gather")
    assert not out.result.rows and out.problem is None
    assert verdict_of(out).reason == "no results table (nccl-tests did not run): srun: error: Invalid MPI type 'pmix'"
    # The line that says why, not srun's follow-up nor nccl-tests' traceback.
    (tmp_path / "all_gather.txt").write_text("+ srun x\nn1: Test NCCL failure common.cu:1007 'unhandled system error'\n"
                                            " .. n1 pid 77: Test failure common.cu:891\n"
                                            "srun: error: node1: task 0: Exited with exit code 3\n"
                                            "srun: launch/slurm: _step_signal: Terminating StepId=5.0\n")
    assert verdict_of(load_op(t, str(tmp_path), "all_gather")).reason == \
        "no results table (nccl-tests did not run): n1: Test NCCL failure common.cu:1007 'unhandled system error'"
    (tmp_path / "all_gather.txt").write_text("")
    assert verdict_of(load_op(t, str(tmp_path), "all_gather")).reason.endswith(": the output is empty")


def test_report_paths_accept_files_and_run_directories(tmp_path: Path) -> None:
    t = LocalTransport()
    run = tmp_path / "run"
    run.mkdir()
    (run / "all_reduce.txt").write_text(ALL_REDUCE)
    (run / "all_gather.txt").write_text(ALL_GATHER)
    loose = tmp_path / "gke_tcpxo_all_gather.log"  # no test name inside: the op comes from the file name
    loose.write_text(ALL_GATHER)
    outs = load_paths(t, [str(run), str(loose), str(tmp_path / "nope.txt")])
    assert [o.op for o in outs] == ["all_reduce", "all_gather", "all_gather", "?"]
    assert [o.op_from for o in outs[:3]] == ["command line", "run directory", "file name"]
    assert outs[-1].result is None and "cannot read" in outs[-1].problem
    assert [o.op for o in load_file(t, str(FIXTURES / "h100_a3mega_all_reduce.txt"))] == ["all_reduce"]


def test_table_rows_cover_every_size_of_every_op(tmp_path: Path) -> None:
    t = LocalTransport()
    (tmp_path / "all_reduce.txt").write_text(ALL_REDUCE)
    (tmp_path / "all_gather.txt").write_text(ALL_GATHER)
    outs = [load_op(t, str(tmp_path), op) for op in ("all_reduce", "all_gather")]
    report = build(outs, title="2 nodes", expected=Shape(2, 8),
                   references=[parse_expect("all_reduce=330@8G")], profile="tcp",
                   jobs=[JobEnd("12", "COMPLETED", 0, None, "node[1-2]")])
    header, body = table(report)
    assert header == ["size", "all_reduce algbw", "all_reduce busbw", "all_gather algbw", "all_gather busbw"]
    assert body[0] == ["8 B", "0.00", "0.00", "-", "-"]
    assert body[-1] == ["8 GiB", "180.71", "338.82", "-", "-"]
    assert ["1 GiB", "158.86", "297.86", "130.28", "122.14"] in body
    text = format_plain(report)
    assert text.splitlines()[0] == "2 nodes"
    assert "all_reduce: PASS: busbw 338.09 GB/s at 8 GiB >= 330 GB/s" in text
    assert "all_gather: no verdict: no published reference for all_gather_perf (profile tcp)" in text
    assert report.ok and report.ops[0].verdict.status == PASS


def test_json_report_schema(tmp_path: Path) -> None:
    [out] = load_file(LocalTransport(), str(FIXTURES / "h100_a3mega_all_reduce.txt"))
    refs = profile_references(network.get_profile("azure-nd-h100-v5"))
    report = build([out], title="t", expected=None, references=refs, profile="azure-nd-h100-v5",
                   jobs=[JobEnd("7", "FAILED", 1, "NonZeroExitCode", "n[1-2]")])
    doc = json.loads(json.dumps(to_json(report)))
    assert validate(doc) == []  # the schema shipped in the package (report.schema.json)
    assert doc["schema"] == 2 and doc["ok"] is False  # the job failed, whatever the verdict
    op = doc["ops"][0]
    assert op["op"] == "all_reduce" and op["ranks"] == 16 and op["ranks_from"] == "command line" and len(op["rows"]) == 31
    assert op["hosts"] == ["ztan-mig-235z", "ztan-mig-gq73"] and op["op_from"] == "command line"
    assert op["rows"][-1] == {"size_bytes": 8589934592, "count": 2147483648, "type": "float", "redop": "sum", "root": -1,
                              "time_out_us": 47535.0, "algbw_out": 180.71, "busbw_out": 338.82,
                              "time_in_us": 47743.0, "algbw_in": 179.92, "busbw_in": 337.35, "wrong": 0,
                              "max_error": None}
    assert op["avg_busbw"] == 70.742 and op["complete"] is True and op["out_of_bounds"] == 0
    assert op["verdict"] == "NONE" and "1 node x 8 GPUs" in op["reason"] and op["reference"] is None
    assert doc["jobs"] == [{"job_id": "7", "state": "FAILED", "exit_code": 1, "reason": "NonZeroExitCode",
                            "nodes": "n[1-2]"}]


def test_the_schema_checker_catches_what_the_schema_forbids() -> None:
    [out] = load_file(LocalTransport(), str(FIXTURES / "h100_a3mega_all_reduce.txt"))
    good = to_json(build([out], title="t", expected=None, references=[], profile=None))
    assert validate(good) == []
    bad = json.loads(json.dumps(good))
    bad["schema"] = 1
    del bad["ops"][0]["complete"]
    bad["ops"][0]["verdict"] = {"status": "NONE"}  # schema 1's nested verdict
    bad["ops"][0]["rows"][0]["busbw_out"] = "0.00"
    bad["ops"][0]["rows"][1]["wrong"] = -1
    bad["ops"][0]["extra"] = True
    assert validate(bad) == [
        "$.schema: expected 2, got 1",
        "$.ops[0]: missing required 'complete'",
        "$.ops[0]: unexpected property 'extra'",
        "$.ops[0].rows[0].busbw_out: expected number or null, got string '0.00'",
        "$.ops[0].rows[1].wrong: -1 is below the minimum 0",
        "$.ops[0].verdict: {'status': 'NONE'} is not one of ['PASS', 'FAIL', 'NONE']",
    ]
    with pytest.raises(ValueError, match="not supported"):
        validate({}, {"type": "object", "pattern": "x"})


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_chart_is_a_png_of_busbw_by_size(tmp_path: Path) -> None:
    need_matplotlib()
    reduce_series = series_of("all_reduce", parse_text(ALL_REDUCE))
    gather_series = series_of("all_gather", parse_text(ALL_GATHER))
    assert reduce_series.sizes[0] == 8 and reduce_series.busbw[-1] == 338.82 and len(reduce_series.sizes) == 31
    path = write_chart(str(tmp_path / "sub" / "busbw.png"), [reduce_series, gather_series], title="2 x 8 H100",
                       thresholds=(Threshold("expected", 330.0),))
    png = Path(path)
    assert png.stat().st_size > 10_000 and png_size(png) == (1000, 550)
    # A bisection chart: one series per pair, slow ones highlighted.
    pairs = [Series("n1+n2", (1 << 30, 2 << 30), (300.0, 320.0)),
             Series("n3+n4", (1 << 30, 2 << 30), (150.0, 160.0), highlight=True)]
    assert png_size(Path(write_chart(str(tmp_path / "pairs.png"), pairs, title="pairs"))) == (1000, 550)
    assert not list(tmp_path.glob(".*tmp*"))  # written atomically: no temp file left


def test_chart_without_matplotlib_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    from lingjun_slurm.common.errors import UsageError
    from lingjun_slurm.nodes.nccltests.chart import require_matplotlib

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(UsageError, match=r"pip install 'lingjun-slurm\[plot\]'"):
        require_matplotlib()
    with pytest.raises(UsageError, match="--no-chart"):
        write_chart(str(tmp_path / "x.png"), [Series("a", (8,), (1.0,))], title="x")


def test_rich_output_has_the_same_content(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rich")
    from lingjun_slurm.cli.nccltest import print_rich

    [out] = load_file(LocalTransport(), str(FIXTURES / "h100_a3mega_all_reduce.txt"))
    report = build([out], title="rich run", expected=None, references=[parse_expect("all_reduce=400")],
                   profile=None, jobs=[JobEnd("3", "TIMEOUT", None, None, None)])
    print_rich(report)
    text = capsys.readouterr().out
    assert "rich run" in text and "338.82" in text and "8 GiB" in text
    assert "all_reduce: FAIL: busbw 338.82 GB/s peak < 400 GB/s" in text and "job 3: TIMEOUT" in text


def test_a_table_cut_short_fails_whatever_its_bandwidth(tmp_path: Path) -> None:
    # --no-wait then --report before the job ended, or a job killed at its time limit mid-sweep:
    # the rows so far may beat the figure, but the sizes after them were never measured.
    lines = ALL_REDUCE.splitlines()
    cut = next(i for i, line in enumerate(lines) if line.strip().startswith("1073741824"))
    (tmp_path / "all_reduce.txt").write_text("\n".join(lines[:cut]) + "\n")
    out = load_op(LocalTransport(), str(tmp_path), "all_reduce")
    assert out.incomplete and not out.complete and len(out.result.rows) == 27 and out.problem is None
    report = build([out], title="t", expected=None, references=[parse_expect("all_reduce=100")], profile=None)
    assert not report.ok and report.ops[0].verdict.status == "FAIL"
    assert report.ops[0].verdict.reason == ("incomplete: the output stops after the 512 MiB row without the 'Avg bus "
                                            "bandwidth' line (the test was killed, failed or is still running)")
    assert sum("Avg bus bandwidth" in line for line in format_plain(report).splitlines()) == 1  # no repeated note
    (tmp_path / "all_reduce.txt").write_text(ALL_REDUCE)  # the whole output: as before
    assert not load_op(LocalTransport(), str(tmp_path), "all_reduce").incomplete
