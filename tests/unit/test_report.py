"""The report's readers and page (issue 16 item 4), on hand-made run directories."""

from __future__ import annotations

import json
from pathlib import Path

from lingjun_slurm.report import data, page


def test_a_restart_supersedes_earlier_records_and_garbage_is_skipped() -> None:
    text = "\n".join([
        json.dumps({"type": "start", "iteration": 0}),
        json.dumps({"type": "train", "iteration": 1, "loss": 9.0}),
        json.dumps({"type": "train", "iteration": 2, "loss": 8.0}),
        '{"type": "train", "iteration": 3, "lo',  # cut short by a kill
        json.dumps({"type": "start", "iteration": 1}),
        json.dumps({"type": "train", "iteration": 2, "loss": 7.5}),
        json.dumps([1, 2]),
        json.dumps({"type": "eval", "iteration": 2, "loss": 7.9}),
    ])
    got = data.metrics(text)
    assert [(r["iteration"], r["loss"]) for r in got["train"]] == [(1, 9.0), (2, 7.5)]
    assert [r["type"] for r in got["events"]] == ["start", "start"] and len(got["eval"]) == 1


def test_markers_give_one_attempt_per_start() -> None:
    """A requeued job writes a second start line (status.py read_marker keeps only the last)."""
    got = data.attempts("start 100 0 node1\nend 160 143\nstart 200 1 node2\nend 260 0\ngarbage\nstart x\n")
    assert got == [{"start": 100.0, "end": 160.0, "exit_code": 143, "restarts": 0, "nodes": "node1"},
                   {"start": 200.0, "end": 260.0, "exit_code": 0, "restarts": 1, "nodes": "node2"}]


def test_the_page_escapes_what_it_shows_and_embeds_the_data_intact(tmp_path: Path) -> None:
    hostile = "</script><script>alert(1)</script>"
    doc = {"schema": 1, "run": {"run_id": "r1", "name": hostile, "executor": "local", "host": "h", "run_dir": "/x",
                                "created_at": 0},
           "stages": [{"name": "train", "kind": "train", "job_ids": ["1"], "previous_attempts": 0, "state": "FAILED",
                       "reason": hostile, "exit_code": 1, "restarts": 0, "nodes": None, "submitted_at": 1.0,
                       "attempts": [], "started_at": None, "ended_at": None, "queue_wait_s": None, "run_s": None,
                       "requeues": 0}],
           "metrics": {"train": [], "eval": [], "save": [], "events": []},
           "checkpoints": {"dir": None, "readable": False}}
    text = page.render(doc, [], tmp_path, "lingjun-slurm report r1")
    assert "<script>alert(1)" not in text and text.count("<script") == 1
    assert page.embedded_data(text) == doc


def test_nccl_test_reports_attached_to_the_run(tmp_path: Path) -> None:
    """A real report.json, written by `nccl-test --report` from a public all_reduce output
    (tests/fixtures/nccl/deepops_dgx_a100_4node_all_reduce.txt, SOURCES.md there)."""
    import subprocess
    import sys

    from lingjun_slurm.transport.local import LocalTransport

    repo = Path(__file__).resolve().parents[2]
    target = tmp_path / "run" / "nccl-tests" / "a100"
    target.mkdir(parents=True)
    (tmp_path / "run" / "nccl-tests" / "stray-file").write_text("not a report")
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", "nccl-test", "--report",
                           str(repo / "tests/fixtures/nccl/deepops_dgx_a100_4node_all_reduce.txt"),
                           "--report-json", str(target / "report.json"), "--no-chart"],
                          capture_output=True, text=True, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    real = json.loads((target / "report.json").read_text())
    [got] = data.nccl_tests(LocalTransport(), str(tmp_path / "run"))
    [op] = got["ops"]
    busbw = [r["busbw_out"] for r in real["ops"][0]["rows"] if r["busbw_out"] is not None]
    assert got["name"] == "a100" and op["op"] == "all_reduce" and op["peak_busbw"] == max(busbw)
    assert op["verdict"] == real["ops"][0]["verdict"]
    assert data.nccl_tests(LocalTransport(), str(tmp_path / "none")) == []


def test_a_diverged_loss_is_null_and_the_json_strict(tmp_path: Path) -> None:
    """The trainer writes NaN (allow_nan); browsers' JSON.parse rejects it: null in the report."""
    doc = data.finite({"metrics": {"train": [{"iteration": 1, "loss": float("nan"), "lr": float("inf")}]}})
    assert doc == {"metrics": {"train": [{"iteration": 1, "loss": None, "lr": None}]}}
    json.dumps(doc, allow_nan=False)


def test_a_long_run_embeds_every_nth_record_and_the_last() -> None:
    train = [{"iteration": i, "loss": 1.0} for i in range(1, 12_346)]
    doc = {"metrics": {"train": train, "eval": []}}
    got = data.thinned(doc)
    kept = got["metrics"]["train"]
    assert len(kept) <= data.EMBED_POINTS + 1 and kept[0]["iteration"] == 1 and kept[-1]["iteration"] == 12_345
    assert got["metrics"]["train_every"] == 3 and doc["metrics"]["train"] is train  # the full one is untouched
    assert data.thinned({"metrics": {"train": train[:10]}})["metrics"]["train"] == train[:10]


def test_an_attempt_killed_without_an_end_line_ends_at_the_requeue() -> None:
    """A SIGKILL or a lost node leaves a start without an end; the requeued attempt that follows
    completes: the stage has a run time, and the first attempt ends where the second starts."""
    from types import SimpleNamespace

    from lingjun_slurm.transport.local import LocalTransport

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "jobs").mkdir()
        (Path(tmp) / "jobs" / "7").write_text("start 100 0 n1\nstart 300 1 n2\nend 400 0\n")
        rec = SimpleNamespace(job_ids=["7"], submitted_at=90.0)
        got = data.stage_timeline(LocalTransport(), tmp, rec, ["7"])
    assert [(a["start"], a["end"]) for a in got["attempts"]] == [(100.0, 300.0), (300.0, 400.0)]
    assert got["run_s"] == 300.0 and got["queue_wait_s"] == 10.0 and got["requeues"] == 1


def test_charts_skip_what_a_record_lacks(tmp_path: Path) -> None:
    from lingjun_slurm.report import charts

    doc = {"metrics": {"train": [{"iteration": 1, "loss": 2.0}, {"iteration": 2, "loss": None, "lr": 0.1,
                                                                 "tokens_per_s": 5.0}],
                       "eval": [], "save": [], "events": []},
           "stages": [{"name": "train", "state": "RUNNING", "submitted_at": 1.0, "started_at": 2.0,
                       "attempts": [{"start": 2.0, "end": None, "exit_code": None}]}]}
    names = charts.draw(doc, tmp_path, now=10.0)
    assert names == ["loss.png", "lr.png", "throughput.png", "timeline.png"]
    assert all((tmp_path / n).stat().st_size > 1000 for n in names)
