"""The goodput ledger (lingjun_slurm/injob/host/ledger.py): sacct's allocation lines, one attempt cut into
buckets, a run's ledger, the watchdog's job_buckets and the CLI's `status --goodput`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lingjun_slurm.injob.host import ledger

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "goodput"


def test_sacct_lines_recorded_on_the_test_cluster_parse_into_runs() -> None:
    """tests/fixtures/goodput/sacct_22.05_requeue.txt: ledger.sacct_argv's command on Slurm 22.05.8 (SOURCES.md)."""
    rows = ledger.parse_sacct((FIXTURES / "sacct_22.05_requeue.txt").read_text())
    assert rows, "the fixture has job lines"
    jobs = [r["job"] for r in rows]
    train = json.loads((FIXTURES / "sacct_22.05_requeue.json").read_text())
    # The requeued train job appears once per run, oldest first; every run started has a start and
    # an elapsed time, and its CPUs (the test cluster has no GPUs in its CPU partition).
    runs = [r for r in rows if r["job"] == train["train_job"]]
    assert len(runs) == train["runs"] and runs[0]["state"] == "REQUEUED" and runs[-1]["state"] == "COMPLETED"
    assert all(r["start"] and r["elapsed"] >= 0 and r["cpus"] >= 1 and r["gpus"] == 0 for r in runs)
    assert runs[0]["end"] <= runs[1]["start"]
    assert all(r["eligible"] and r["submit"] for r in rows)
    assert len(set(jobs)) >= 2


def test_alloc_tres_counts_gpus_once_and_cpus() -> None:
    # AllocTRES as sacct prints it (src/sacct/print.c PRINT_TRESA): typed gres repeat the untyped count.
    assert ledger.tres_counts("billing=8,cpu=8,gres/gpu:h100=8,gres/gpu=8,mem=64G,node=1") == (8, 8)
    assert ledger.tres_counts("billing=2,cpu=2,mem=1000M,node=1") == (0, 2)
    assert ledger.tres_counts("") == (0, 0)


def test_alloc_tres_with_only_typed_gpus_tracked_sums_the_types() -> None:
    """AccountingStorageTRES=gres/gpu:tesla,gres/gpu:volta (no untyped gres/gpu, slurm.conf.5:190-199 at
    slurm-22-05-8-1): a job's GPUs are recorded under its type only, so the typed entries are its GPUs."""
    assert ledger.tres_counts("billing=16,cpu=16,gres/gpu:h100=8,mem=64G,node=1") == (8, 16)
    assert ledger.tres_counts("billing=16,cpu=16,gres/gpu:tesla=2,gres/gpu:volta=4,mem=64G,node=2") == (6, 16)
    # Another gres is not a GPU.
    assert ledger.tres_counts("cpu=4,gres/craynetwork=1,gres/gpumem=8,node=1") == (0, 4)


def test_a_line_of_another_shape_is_an_error_naming_the_line() -> None:
    with pytest.raises(ledger.LedgerError, match="sacct line 1 has 3 fields"):
        ledger.parse_sacct("1|2|3\n")


def _rec(kind: str, t: float, **kw: object) -> dict:
    return {"type": kind, "time": t, **kw}


def test_a_train_attempt_is_cut_into_buckets_that_sum_to_its_window() -> None:
    # 100 s window: pre-flight 5..12, trainer start at 20, steps of 2 s from 22, a save, an eval,
    # then a crash (no stop record): the rest is the failed attempt's tail.
    recs = [_rec("start", 20, iteration=10)]
    recs += [_rec("train", 22 + 2 * i, iteration=11 + i, step_time_s=2.0) for i in range(10)]  # 11..20 up to t=40
    recs += [_rec("save", 45, iteration=20, seconds=4.5), _rec("eval", 50, iteration=20)]
    recs += [_rec("train", 52 + 2 * i, iteration=21 + i, step_time_s=2.0) for i in range(5)]  # 21..25 up to t=60
    got = ledger.train_attempt(0.0, 100.0, recs, failed=True, running=False, resumed_next=20,
                               preflight=(5.0, 12.0))
    assert set(got) == set(ledger.BUCKETS)
    assert sum(got.values()) == pytest.approx(100.0)
    assert got["container_start"] == 5.0 and got["preflight"] == 7.0
    assert got["startup"] == pytest.approx(20 - 12 + 0)  # up to the first step's start (22 - 2)
    assert got["productive"] == pytest.approx(20.0)      # iterations 11..20
    assert got["checkpoint_save"] == 5.0 and got["evaluation"] == 5.0
    assert got["lost_work"] == pytest.approx(10.0)       # 21..25: the next attempt resumed from 20
    assert got["failed_tail"] == pytest.approx(40.0)
    assert got["unattributed"] == 0.0


def test_a_hang_is_its_wait_then_the_tail_and_a_clean_end_is_unattributed() -> None:
    recs = [_rec("train", 10 + i, iteration=i + 1, step_time_s=1.0) for i in range(5)]  # up to t=14
    hang = {"type": "hang", "since": 14.0, "detected": 44.0}
    got = ledger.train_attempt(0.0, 60.0, recs, failed=True, running=False, resumed_next=None, hang=hang)
    assert got["hang_wait"] == 30.0 and got["failed_tail"] == 16.0 and got["startup"] == 9.0
    assert sum(got.values()) == pytest.approx(60.0)
    clean = recs + [_rec("stop", 15, iteration=5, reason="done")]
    got = ledger.train_attempt(0.0, 20.0, clean, failed=False, running=False, resumed_next=None)
    assert got["unattributed"] == 5.0 and got["failed_tail"] == 0.0 and got["productive"] == 6.0


def test_records_outside_the_window_are_clipped_never_negative() -> None:
    recs = [_rec("train", 5, iteration=1, step_time_s=50.0), _rec("save", 3, iteration=1, seconds=1)]
    got = ledger.train_attempt(10.0, 20.0, sorted(recs, key=lambda r: r["time"]), failed=False, running=True,
                               resumed_next=None)
    assert all(v >= 0 for v in got.values()) and sum(got.values()) == pytest.approx(10.0)


def _run_dir(tmp: Path, *, gpus: int) -> Path:
    run = tmp / "run"
    (run / "jobs").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({
        "schema": 1, "run_id": "r1", "executor": "slurm", "stages": [
            {"name": "preprocess", "kind": "preprocess", "job_ids": ["7"], "depends_on": [], "submitted_at": 90.0},
            {"name": "train", "kind": "train", "job_ids": ["8"], "submitted_at": 90.0,
             "depends_on": [{"stage": "preprocess", "type": "afterok", "job_ids": ["7"]}]}]}))
    (run / "plan.json").write_text(json.dumps({"stages": [
        {"name": "preprocess", "kind": "preprocess",
         "resources": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 4}},
        {"name": "train", "kind": "train", "resources": {"nodes": 2, "tasks_per_node": 1, "gpus_per_node": gpus,
                                                         "cpus_per_task": 1}}],
        "settings": {"monitoring": {"gpu_hour_price": 2.5, "textfile_dir": None}}}))
    (run / "jobs" / "7").write_text("start 100 0 node1\nend 110 0\n")
    # train: a first attempt killed at 150 (no end line: the requeue's start ends it), a second that completes
    (run / "jobs" / "8").write_text("start 120 0 node1,node2\nstart 160 1 node1,node2\nend 200 0\n")
    recs = [_rec("start", 125, iteration=0)] + [_rec("train", 130 + i, iteration=i + 1, step_time_s=1.0)
                                                 for i in range(15)]
    recs += [_rec("save", 137.5, iteration=8, seconds=0.5)]
    recs += [_rec("start", 165, iteration=8)] + [_rec("train", 170 + i, iteration=9 + i, step_time_s=1.0)
                                                  for i in range(20)]
    recs += [_rec("stop", 195, iteration=28, reason="done")]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sorted(recs, key=lambda r: r["time"])))
    return run


def test_a_run_from_its_markers_sums_per_kind_and_counts_lost_work_and_waits(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, gpus=4)
    read, listdir = ledger._dir_reader(str(run))
    doc = ledger.build(read, listdir, json.loads((run / "manifest.json").read_text()),
                       json.loads((run / "plan.json").read_text()), None, now=300.0)
    gpu, cpu = doc["gpu"], doc["cpu"]
    assert gpu["allocated_seconds"] == (200 - 120) * 8          # 2 nodes x 4 GPUs
    assert cpu["allocated_seconds"] == (110 - 100) * 4
    for part in (gpu, cpu):
        assert sum(part["buckets"].values()) == pytest.approx(part["allocated_seconds"])
    assert cpu["buckets"]["preprocessing"] == 40
    # iterations 9..15 ran in the first attempt and again after the resume from 8: iteration 9's time
    # is counted from the save record (137.5) to its own (138), 10..15 one second each
    assert gpu["buckets"]["lost_work"] == pytest.approx(6.5 * 8)
    assert gpu["buckets"]["failed_tail"] == pytest.approx((160 - 144) * 8)  # killed: no stop record
    assert doc["waits"] == {"queue": 10.0 + 10.0, "requeue_gap": 0.0}  # 90->100; the upstream's end 110 -> 120
    assert doc["goodput_of"] == "gpu" and doc["goodput"] == pytest.approx(gpu["buckets"]["productive"] / (80 * 8))
    assert doc["cost"] == pytest.approx(80 * 8 / 3600 * 2.5, rel=1e-6)
    assert doc["run"] == "r1" and doc["source"] == "markers"


def test_a_run_without_gpus_is_judged_on_its_cpu_seconds(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, gpus=0)
    read, listdir = ledger._dir_reader(str(run))
    doc = ledger.build(read, listdir, json.loads((run / "manifest.json").read_text()),
                       json.loads((run / "plan.json").read_text()), None, now=300.0)
    assert doc["gpu"]["allocated_seconds"] == 0 and doc["goodput_of"] == "cpu" and doc["cost"] is None
    assert doc["cpu"]["allocated_seconds"] == 40 + 80 * 2


def test_job_buckets_is_the_current_jobs_own_allocation_so_far(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, gpus=4)
    (run / "jobs" / "8").write_text("start 120 0 node1,node2\nstart 160 1 node1,node2\n")  # still running
    got = ledger.job_buckets(str(run), "8", now=180.0)
    assert set(got) == set(ledger.BUCKETS)
    assert sum(got.values()) == pytest.approx((180 - 120) * 8)
    assert got["preprocessing"] == 0.0 and got["lost_work"] > 0 and got["productive"] > 0
    assert ledger.job_buckets(str(run), "999", now=180.0) == dict.fromkeys(ledger.BUCKETS, 0.0)
    assert ledger.job_buckets(str(tmp_path / "nowhere"), "8", now=1.0) == dict.fromkeys(ledger.BUCKETS, 0.0)


def test_the_report_draws_a_bar_per_attempt_and_a_goodput_section(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from lingjun_slurm.report import charts, page

    run = _run_dir(tmp_path, gpus=4)
    read, listdir = ledger._dir_reader(str(run))
    ledger_doc = ledger.build(read, listdir, json.loads((run / "manifest.json").read_text()),
                              json.loads((run / "plan.json").read_text()), None, now=300.0)
    doc = {"schema": 1, "run": {"run_id": "r1", "name": "r", "executor": "slurm", "host": "h", "run_dir": str(run),
                                "created_at": 1.0},
           "stages": [], "goodput": ledger_doc, "metrics": {"train": [], "eval": [], "save": [], "events": []},
           "nccl_tests": [], "checkpoints": {"dir": None, "readable": False, "tracker": None, "iterations": []}}
    out = tmp_path / "report"
    out.mkdir()
    names = charts.draw(doc, out, now=300.0)
    assert names == ["goodput.png"]
    plt = charts.pyplot()
    img = plt.imread(str(out / "goodput.png"))
    # productive's green (tab:green, #2ca02c) and lost work's red (tab:red, #d62728) are drawn
    rgb = (img[..., :3] * 255).round().astype(int).reshape(-1, 3).tolist()
    assert [44, 160, 44] in rgb and [214, 39, 40] in rgb
    html = page.render(doc, names, out, "lingjun-slurm report r1")
    section = html[html.index("<h2>Goodput</h2>"):html.index("<h2>Training</h2>")]
    assert f"<p>Goodput {100 * ledger_doc['goodput']:.1f}% (productive / allocated GPU-hours" in section
    assert "lost_work" in section and "requeue_gap" in section and "cost 0.44 at 2.5 per GPU-hour" in section
    assert 'src="data:image/png;base64,' in section
    assert page.embedded_data(html)["goodput"]["gpu"]["allocated_seconds"] == 640


@pytest.mark.parametrize("bad", ["manifest", "plan", "metrics", "hang", "preflight", "local"])
def test_hostile_records_never_raise_and_still_sum(tmp_path: Path, bad: str) -> None:
    run = _run_dir(tmp_path, gpus=4)
    junk = {"manifest": ("manifest.json", '{"stages": [1, {"name": "train", "job_ids": [3], "previous": "x"}]}'),
            "plan": ("plan.json", '{"stages": [{"name": "train", "resources": [1]}], "settings": []}'),
            "metrics": ("metrics.jsonl", '{"type": "train", "time": "x"}\n[1]\n{"type": 5, "time": 1}\ncut'),
            "hang": ("hangs/8-0.json", '{"type": "hang", "since": "x", "detected": 150}'),
            "preflight": ("preflight/8-0/n1.json", '{"started_at": 121, "timings": {"total": "x"}}'),
            "local": ("local-state.json", '{"tasks": {"a": 1}}')}[bad]
    (run / junk[0]).parent.mkdir(parents=True, exist_ok=True)
    (run / junk[0]).write_text(junk[1])
    got = ledger.job_buckets(str(run), "8", now=300.0)
    assert all(v >= 0 for v in got.values())
    read, listdir = ledger._dir_reader(str(run))
    manifest = json.loads((run / "manifest.json").read_text())
    plan = json.loads((run / "plan.json").read_text())
    doc = ledger.build(read, listdir, manifest, plan if isinstance(plan, dict) else {}, None, now=300.0,
                       local_state={"tasks": {"a": 1}})
    for kind in ledger.KINDS:
        assert sum(doc[kind]["buckets"].values()) == pytest.approx(doc[kind]["allocated_seconds"])


def test_an_attempt_sacct_has_no_line_for_comes_from_the_markers(tmp_path: Path) -> None:
    """Slurm 22.05.8 keeps one line for a job a node failure requeued (the last run's; bench/faults.py
    node-lost): the first attempt, in the markers only, still counts, with sacct's units. It has no end
    marker: it ends at the next run's Submit (the requeue moment, job_mgr.c:16113-16117 batch_requeue_fini),
    not at the next Start; Submit -> Start (the delayed eligibility, then the queue) is requeue_gap."""
    run = _run_dir(tmp_path, gpus=4)
    read, listdir = ledger._dir_reader(str(run))
    sacct = [{"job": "7", "state": "COMPLETED", "gpus": 0, "cpus": 4, "elapsed": 10, "submit": 90.0,
              "eligible": 90.0, "start": 100.0, "end": 110.0},
             {"job": "8", "state": "COMPLETED", "gpus": 8, "cpus": 2, "elapsed": 40, "submit": 150.0,
              "eligible": 155.0, "start": 160.0, "end": 200.0}]
    doc = ledger.build(read, listdir, json.loads((run / "manifest.json").read_text()),
                       json.loads((run / "plan.json").read_text()), sacct, now=300.0)
    train = [a for a in doc["attempts"] if a["stage"] == "train"]
    assert [(a["source"], a["start"], a["end"], a["units"]) for a in train] == [
        ("markers", 120.0, 150.0, 8), ("sacct", 160.0, 200.0, 8)]
    assert train[0]["failed"] and train[0]["buckets"]["failed_tail"] == pytest.approx((150 - 144) * 8)
    assert doc["gpu"]["allocated_seconds"] == (30 + 40) * 8 and doc["gpu"]["buckets"]["lost_work"] > 0
    assert sum(doc["gpu"]["buckets"].values()) == pytest.approx(doc["gpu"]["allocated_seconds"])
    # preprocess: Start - Eligible (10); train's first attempt is the markers': from its upstream's end (10)
    assert doc["waits"] == {"queue": 20.0, "requeue_gap": 10.0}
    assert "note" not in doc


def test_an_attempt_sacct_has_no_line_for_ends_at_its_end_marker_or_the_pending_runs_submit(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, gpus=4)
    read, listdir = ledger._dir_reader(str(run))
    manifest = json.loads((run / "manifest.json").read_text())
    plan = json.loads((run / "plan.json").read_text())
    pre = {"job": "7", "state": "COMPLETED", "gpus": 0, "cpus": 4, "elapsed": 10, "submit": 90.0,
           "eligible": 90.0, "start": 100.0, "end": 110.0}
    # Its own end marker (145) is before the next run's Submit (150): the marker ends it.
    (run / "jobs" / "8").write_text("start 120 0 node1,node2\nend 145 1\nstart 160 1 node1,node2\nend 200 0\n")
    doc = ledger.build(read, listdir, manifest, plan, [pre, {"job": "8", "state": "COMPLETED", "gpus": 8, "cpus": 2,
                       "elapsed": 40, "submit": 150.0, "eligible": 155.0, "start": 160.0, "end": 200.0}], now=300.0)
    first = next(a for a in doc["attempts"] if a["job"] == "8")
    assert (first["source"], first["end"]) == ("markers", 145.0) and doc["waits"]["requeue_gap"] == 15.0
    # The requeued run still pending (no Start): the killed attempt ends at its Submit; the wait so far
    # (now - that end) is requeue_gap.
    (run / "jobs" / "8").write_text("start 120 0 node1,node2\n")
    doc = ledger.build(read, listdir, manifest, plan, [pre, {"job": "8", "state": "PENDING", "gpus": 0, "cpus": 0,
                       "elapsed": 0, "submit": 150.0, "eligible": 186.0, "start": None, "end": None}], now=170.0)
    first = next(a for a in doc["attempts"] if a["job"] == "8")
    assert (first["end"], first["running"], first["failed"]) == (150.0, False, True)
    assert doc["gpu"]["allocated_seconds"] == 30 * 8 and doc["waits"]["requeue_gap"] == 20.0


def _sacct_without_gpus(tres: str) -> list[dict]:
    """sacct's lines for _run_dir's jobs as Slurm prints them when it does not track the GPUs."""
    text = (f"7|7|COMPLETED|billing=4,cpu=4,mem=1000M,node=1|10|90|90|100|110\n"
            f"8|8|COMPLETED|{tres}|80|95|110|120|200\n")
    return ledger.parse_sacct(text)


@pytest.mark.parametrize("tres,gpus,note", [
    # AccountingStorageTRES=gres/gpu: Slurm's own count.
    ("billing=2,cpu=2,gres/gpu=8,mem=2000M,node=2", 8, False),
    # Only typed entries tracked: their sum.
    ("billing=2,cpu=2,gres/gpu:h100=8,mem=2000M,node=2", 8, False),
    # No gres/gpu tracked (Slurm's default TRES, slurm.conf.5:174-176): the plan's 2 nodes x 4 GPUs, and a note.
    ("billing=2,cpu=2,mem=2000M,node=2", 8, True)])
def test_a_gpu_job_slurm_records_no_gpus_for_is_still_a_gpu_job(tmp_path: Path, tres: str, gpus: int,
                                                                  note: bool) -> None:
    run = _run_dir(tmp_path, gpus=4)
    (run / "jobs" / "8").write_text("start 120 0 node1,node2\nend 200 0\n")
    read, listdir = ledger._dir_reader(str(run))
    doc = ledger.build(read, listdir, json.loads((run / "manifest.json").read_text()),
                       json.loads((run / "plan.json").read_text()), _sacct_without_gpus(tres), now=300.0)
    train = next(a for a in doc["attempts"] if a["stage"] == "train")
    assert (train["kind"], train["units"]) == ("gpu", gpus)
    assert doc["goodput_of"] == "gpu" and doc["gpu"]["allocated_seconds"] == 80 * gpus
    assert doc["cpu"]["allocated_seconds"] == 10 * 4  # the preprocess job only
    assert doc["cost"] == pytest.approx(80 * gpus / 3600 * 2.5, rel=1e-6)
    if note:
        assert "Slurm recorded no GPUs for job 8" in doc["note"] and "gres/gpu" in doc["note"]
    else:
        assert "note" not in doc


def test_without_accounting_a_killed_attempt_ending_at_the_next_start_is_said(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, gpus=4)
    read, listdir = ledger._dir_reader(str(run))
    doc = ledger.build(read, listdir, json.loads((run / "manifest.json").read_text()),
                       json.loads((run / "plan.json").read_text()), None, now=300.0)
    assert "attempt 8-0 left no end marker" in doc["note"] and "requeue_gap" in doc["note"]


def test_the_trainers_launched_at_is_its_process_start() -> None:
    """entry.process_started_at (the `start` record's launched_at, container_start's end): a fresh
    interpreter's own start, read from /proc, is before its first line ran and less than its
    start-up earlier (the import of this module alone costs far less than 20 s)."""
    import subprocess
    import sys

    code = ("import time; t = time.time(); from lingjun_slurm.injob.train.entry import process_started_at; "
            "print(t, process_started_at())")
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    first_line, started = float(out[0]), float(out[1])
    assert before - 0.05 <= started <= first_line + 0.02  # ticks of 10 ms; btime + ticks was 0.5 s early here
    assert first_line - started < 20


def _bench_allocation(tmp_path: Path, sacct_lines: str, kind: str) -> tuple[float, float]:
    """bench/faults.py Bench.allocation (the 1% check's own reference) against a stand-in sacct on PATH
    that prints the given lines (JobIDRaw|ElapsedRaw|AllocTRES|Start|Submit)."""
    import os
    import sys
    import types

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench import faults

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "sacct.out").write_text(sacct_lines)
    (bin_dir / "sacct").write_text(f"#!/bin/sh\ncat '{tmp_path / 'sacct.out'}'\n")
    (bin_dir / "sacct").chmod(0o755)
    stub = types.SimpleNamespace(env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"},
                                 planned_units=faults.Bench.planned_units)
    return faults.Bench.allocation(stub, tmp_path / "run", ["7", "8"], kind)  # type: ignore[arg-type]


def test_the_benchs_own_allocation_ends_a_lost_run_at_the_next_submit(tmp_path: Path) -> None:
    _run_dir(tmp_path, gpus=4)
    # job 8: one line (the requeued run, Submit 150, Start 160); its first attempt (start 120, no end
    # marker) is the markers': 120 -> 150, not -> 160 and not -> the second attempt's end marker (200).
    total, extra = _bench_allocation(tmp_path, "7|10|billing=4,cpu=4,node=1|100|90\n"
                                               "8|40|billing=2,cpu=2,gres/gpu=8,node=2|160|150\n", "gpu")
    assert (total, extra) == (40 * 8, 30 * 8)


@pytest.mark.parametrize("tres", ["billing=2,cpu=2,gres/gpu:h100=8,node=2", "billing=2,cpu=2,node=2"])
def test_the_benchs_own_allocation_counts_gpus_slurm_does_not_record_untyped(tmp_path: Path, tres: str) -> None:
    run = _run_dir(tmp_path, gpus=4)
    (run / "jobs" / "8").write_text("start 120 0 node1,node2\nend 200 0\n")
    total, extra = _bench_allocation(tmp_path, f"7|10|billing=4,cpu=4,node=1|100|90\n8|80|{tres}|120|95\n", "gpu")
    assert (total, extra) == (80 * 8, 0)  # typed h100=8, or the plan's 2 nodes x 4
