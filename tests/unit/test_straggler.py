"""Straggler detection (lingjun_slurm/injob/host/straggler.py) on recorded and source-built windows,
the requeue cost rule, the watchdog's part, and the builtin trainer's step times and test hook
(lingjun_slurm/injob/train/steptimes.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lingjun_slurm.injob.host import straggler as sg
from lingjun_slurm.injob.train import steptimes

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "straggler"


def _sample(t: float, computes: dict[int, float], stages: dict[int, int] | None = None,
            it: int | None = None) -> sg.Sample:
    return sg.Sample(t, [sg.RankTime(r, c, f"node{r + 1}", (stages or {}).get(r, 0)) for r, c in computes.items()], it)


def _noisy(rng: random.Random, base: float, n: int, noise: float = 0.08) -> dict[int, float]:
    return {r: base * (1 + rng.uniform(-noise, noise)) for r in range(n)}


# ---- detection -------------------------------------------------------------------------------

def test_noise_alone_names_nobody():
    rng = random.Random(7)
    det = sg.Detector(threshold=1.2, windows=3, window_s=10)
    for k in range(200):
        det.feed(_sample(k * 2.0, _noisy(rng, 0.5, 16, noise=0.15)))
    det.finish()
    assert det.named == {}


def test_slow_rank_named_after_consecutive_windows():
    rng = random.Random(1)
    det = sg.Detector(threshold=1.2, windows=3, window_s=10)
    named_at = None
    for k in range(60):  # 2 s per sample, 5 samples per window; rank 5 at 1.4x from t=20
        c = _noisy(rng, 0.5, 8)
        if k * 2.0 >= 20:
            c[5] *= 1.4
        for st in det.feed(_sample(k * 2.0, c)):
            named_at = (k * 2.0, st)
    assert named_at is not None
    t, st = named_at
    assert st.rank == 5 and st.node == "node6" and st.windows == 3
    assert st.since == 20.0 and 1.3 < st.ratio < 1.5
    assert t == 50.0  # the 3rd slow window [40, 50) closes when a sample of the next arrives
    assert sg.status_text(st.node, st.rank, 1.4, 600) == "straggler: node6 rank 5 at 1.4\u00d7 the median step for 10 min"


def test_a_fast_window_resets_the_count():
    det = sg.Detector(threshold=1.2, windows=3, window_s=10)
    slow = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.5}
    ok = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    pattern = [slow, slow, ok, slow, slow, ok, slow, slow]  # never 3 in a row
    for k, c in enumerate(pattern + [ok]):
        det.feed(_sample(k * 10.0, c))
    assert det.named == {}
    for k, c in enumerate([slow, slow, slow, ok], start=len(pattern) + 1):
        det.feed(_sample(k * 10.0, c))
    assert list(det.named) == [3]


def test_a_window_without_data_neither_counts_nor_resets():
    det = sg.Detector(threshold=1.2, windows=3, window_s=10)
    slow = {0: 1.0, 1: 1.0, 2: 1.5}
    det.feed(_sample(0, slow))
    det.feed(_sample(10, slow))
    det.feed(_sample(50, slow))  # 20-50: a save, no lines
    det.feed(_sample(60, {0: 1.0, 1: 1.0, 2: 1.0}))
    assert list(det.named) == [2]


def test_peers_are_the_ranks_of_the_same_pipeline_stage():
    # stage 1 does 1.5x the work of stage 0: nobody is a straggler; against all ranks stage 1 would be
    stages = {r: r // 4 for r in range(8)}
    det = sg.Detector(threshold=1.2, windows=2, window_s=10)
    for k in range(6):
        det.feed(_sample(k * 10.0, {r: (1.0 if r < 4 else 1.5) for r in range(8)}, stages))
    det.finish()
    assert det.named == {}
    flat = sg.judge_window({r: (None, 1.0 if r < 4 else 1.5) for r in range(8)}, 1.2)
    assert [r for r, v in flat.items() if v.slow] == [4, 5, 6, 7]  # what the grouping by stage prevents


def test_mad_guard_against_noisy_peers():
    # peers spread widely: 1.25x the median is within their noise
    ranks = {0: (0, 1.0), 1: (0, 0.6), 2: (0, 1.4), 3: (0, 0.7), 4: (0, 1.3), 5: (0, 1.25)}
    v = sg.judge_window(ranks, 1.2)
    assert v[5].ratio > 1.2 and not v[5].slow
    tight = {0: (0, 1.0), 1: (0, 1.01), 2: (0, 0.99), 3: (0, 1.0), 4: (0, 1.02), 5: (0, 1.25)}
    assert sg.judge_window(tight, 1.2)[5].slow


# ---- parsers ---------------------------------------------------------------------------------

def test_steps_line_round_trip(tmp_path):
    path = tmp_path / "steps" / "1-0.jsonl"
    rows = {0: [0, 0, 0.5, 0.1, 4], 1: [1, 0, 0.9, 0.0, 4]}
    st = steptimes.StepTimes(0, 2, 0, 1, str(path), gather=lambda row: [rows[0], rows[1]], node="node1")
    st.set_nodes(["node1", "node2"])
    st.begin()
    st.end(1)
    line = path.read_text().splitlines()[0]
    s = sg.parse_steps_line(line)
    assert s is not None and s.iteration == 1
    assert [(r.rank, r.node, r.stage, r.compute, r.wait) for r in s.ranks] == [
        (0, "node1", 0, 0.5, 0.1), (1, "node2", 0, 0.9, 0.0)]
    assert sg.parse_steps_line("not json") is None and sg.parse_steps_line('{"time": 1}') is None


def test_megatron_timers_all_fixture():
    lines = (FIX / "megatron_timers_all.log").read_text().splitlines()
    samples = sg.samples_of("megatron", lines, pipeline=2, now=0.0)
    assert len(samples) == 12
    first = {r.rank: r for r in samples[0].ranks}
    assert sorted(first) == list(range(8))
    assert first[0].compute == pytest.approx(0.3) and first[0].stage == 0  # (100 + 200) ms
    assert first[5].stage == 1 and first[4].stage == 1 and first[3].stage == 0
    assert first[0].wait == pytest.approx(0.3)  # forward-backward 600 ms minus compute
    assert samples[1].time - samples[0].time == 60  # from training_log's timestamps
    named = sg.detect(samples, threshold=1.2, windows=3, window_s=60)
    assert [(s.rank, s.stage, s.windows) for s in named] == [(5, 1, 3)]
    assert named[0].ratio == pytest.approx(1.5, abs=0.08)
    # without the pipeline size, one group: stage 1's 150 ms against all ranks' median
    flat = sg.detect(sg.samples_of("megatron", lines, pipeline=1, now=0.0), 1.2, 3, 60)
    assert {s.rank for s in flat} != {5}


def test_megatron_straggler_detector_readme_sample():
    lines = (FIX / "readme_straggler_sample.log").read_text().splitlines()
    samples = sg.samples_of("megatron", lines, now=0.0)
    assert len(samples) == 1 and samples[0].partial
    assert {r.rank: r.compute for r in samples[0].ranks} == {8: pytest.approx(3.45308), 0: pytest.approx(3.4682)}
    v = sg.judge_window({r.rank: (None, r.compute) for r in samples[0].ranks}, 1.2, partial=True)
    assert not v[0].slow and v[0].ratio == pytest.approx(3468.20 / 3453.08)
    slow = lines[0].replace("MxRtt/Rnk: 3468.20ms/0", "MxRtt/Rnk: 4468.20ms/0")
    s = sg.samples_of("megatron", [slow], now=0.0)
    assert sg.judge_window({r.rank: (None, r.compute) for r in s[0].ranks}, 1.2, partial=True)[0].slow


# ---- the requeue cost rule -------------------------------------------------------------------

def _st(compute: float = 1.5, peers: float = 1.0) -> sg.Straggler:
    return sg.Straggler(3, "node4", compute / peers, compute, peers, since=0.0, windows=3, detected=600.0)


def test_restart_cost_from_history():
    markers = [("start", 1000.0), ("end", 2000.0), ("start", 2100.0), ("end", 3000.0), ("start", 3050.0)]
    recs = [{"type": "train", "time": 1040.0}, {"type": "train", "time": 1500.0},
            {"type": "save", "time": 1990.0, "seconds": 5.0},
            {"type": "train", "time": 2160.0},  # restart 1: 100 s gap + 60 s startup
            {"type": "train", "time": 3090.0}]  # restart 2: 50 s gap + 40 s startup
    cost, how = sg.restart_cost(markers, recs)
    assert cost == pytest.approx((160 + 90) / 2 + 5.0)
    assert "2 earlier restart" in how
    first = sg.restart_cost([("start", 1000.0)], [{"type": "train", "time": 1030.0}])
    assert first[0] == pytest.approx(30.0) and "no earlier restart" in first[1]
    assert sg.restart_cost([], [])[0] is None


def test_requeue_decision():
    yes, why = sg.requeue_decision(_st(1.5, 1.0), remaining_iterations=1000, cost_s=300.0, cost_how="x")
    assert yes and "500 s saved" in why
    no, why = sg.requeue_decision(_st(1.5, 1.0), remaining_iterations=500, cost_s=300.0, cost_how="x")
    assert not no and "<= restart cost 300 s" in why
    unknown, why = sg.requeue_decision(_st(), 10**6, None, "none measured")
    assert not unknown and "unknown" in why


def test_watch_requeue_asks_for_a_save_once(tmp_path):
    run = tmp_path / "run"
    (run / "jobs").mkdir(parents=True)
    (run / "jobs" / "7").write_text("start 1000 0 node[1-4]\n")
    (run / "metrics.jsonl").write_text(json.dumps({"type": "train", "time": 1020.0}) + "\n")
    asked, said = [], []
    w = sg.Watch("requeue", 1.2, 2, 10, "builtin", str(run / "stragglers" / "7-0.json"), iterations=1000,
                 run_dir=str(run), job="7", jobs_file=str(run / "jobs" / "7"), metrics=str(run / "metrics.jsonl"),
                 request_stop=lambda: asked.append(1) or "scancel --signal=TERM 7", say=said.append)
    lines = [json.dumps({"time": 1100 + 10 * k, "iteration": 10 * k, "ranks": [
        {"rank": r, "node": f"node{r + 1}", "stage": 0, "compute": 1.5 if r == 2 else 1.0, "wait": 0.1,
         "steps": 10} for r in range(4)]}) for k in range(5)]
    new = w.poll(lines)
    assert len(new) == 1 and asked == [1]
    rec = sg.read_record(str(run / "stragglers" / "7-0.json"))[0]
    assert rec["node"] == "node3" and rec["rank"] == 2 and rec["action"] == "requeue" and rec["requeue"]
    assert "asked to save and exit (scancel --signal=TERM 7)" in rec["decision"]
    assert said[0].startswith("lingjun-slurm: straggler: node3 rank 2 at 1.5x the median step for 20 s (")
    assert sg.excluded_nodes(str(run / "stragglers" / "7-0.json")) == [("node3", rec["status"])]
    note = json.loads((run / "stage-notes" / "train.txt").read_text())
    assert note["note"] == "straggler: node3 rank 2 at 1.5\u00d7 the median step for 20 s"


def test_watch_log_only_never_stops(tmp_path):
    asked = []
    w = sg.Watch("log", 1.2, 1, 10, "builtin", str(tmp_path / "s.json"), iterations=10**6,
                 request_stop=lambda: asked.append(1) or "x", say=lambda t: None)
    lines = [json.dumps({"time": 10 * k, "iteration": k, "ranks": [
        {"rank": r, "compute": 2.0 if r == 0 else 1.0} for r in range(3)]}) for k in range(3)]
    assert len(w.poll(lines)) == 1 and asked == []
    assert sg.excluded_nodes(str(tmp_path / "s.json")) == []


def test_nodes_command(tmp_path, capsys):
    path = tmp_path / "s.json"
    sg.write_record(str(path), [sg.make_record(_st(), "exclude", "d", False, "7")])
    assert sg.main(["nodes", "--record", str(path)]) == 0
    assert capsys.readouterr().out == "node4\tnode4 rank 3 at 1.5\u00d7 the median step for 10 min\n"


def test_cli_bad_file_is_one_line(tmp_path, capsys):
    assert sg.main(["--format", "builtin", "--progress", str(tmp_path / "none.jsonl")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lingjun-slurm: straggler: cannot read") and "Traceback" not in err


# ---- the builtin trainer's side ---------------------------------------------------------------

def test_step_times_split_compute_and_wait(tmp_path):
    t = [0.0]
    clock = lambda: t[0]  # noqa: E731
    st = steptimes.StepTimes(0, 1, 0, 2, str(tmp_path / "s.jsonl"), node="n1", clock=clock)

    def collective() -> None:
        t[0] += 0.25

    wrapped = st.timed(collective)
    for _ in range(2):
        st.begin()
        t[0] += 1.0  # compute
        wrapped()
        st.end(_ + 1)
    rec = json.loads((tmp_path / "s.jsonl").read_text())
    assert rec["ranks"] == [{"rank": 0, "node": "n1", "stage": 0, "compute": 1.0, "wait": 0.25, "steps": 2}]


def test_step_times_off_writes_nothing(tmp_path):
    st = steptimes.StepTimes(0, 1, 0, 1, None, node="n1")
    st.begin()
    st.end(1)
    assert not st.enabled and list(tmp_path.iterdir()) == []


def test_slow_hook(tmp_path, monkeypatch):
    path = tmp_path / "slow.json"
    slept: list[float] = []
    monkeypatch.setenv("LINGJUN_TRAIN_SLOW", str(path))
    node3 = steptimes.SlowHook(rank=2, node="node3")
    other = steptimes.SlowHook(rank=1, node="node2")
    assert node3(slept.append) == 0.0  # no file yet: no onset
    path.write_text(json.dumps({"node": "node3", "sleep_s": 0.3}))
    assert node3(slept.append) == 0.3 and other(slept.append) == 0.0
    assert slept == [0.3]
    path.write_text(json.dumps({"rank": 1, "sleep_s": 0.2, "pad": "x" * 3}))
    assert other(slept.append) == 0.2 and node3(slept.append) == 0.0
    monkeypatch.delenv("LINGJUN_TRAIN_SLOW")
    assert steptimes.SlowHook(rank=2, node="node3")(slept.append) == 0.0  # unset: nothing


def test_recorded_steps_from_the_test_cluster():
    """Recorded by the builtin trainer on the test cluster (SOURCES.md): node2 slowed after iteration 5."""
    lines = (FIX / "steps_recorded.jsonl").read_text().splitlines()
    samples = sg.samples_of("builtin", lines)
    assert len(samples) == 17 and all(len(s.ranks) == 3 for s in samples)
    named = sg.detect(samples, threshold=1.5, windows=3, window_s=2)
    assert [(s.node, s.rank) for s in named] == [("node2", 1)]
    assert named[0].ratio > 5
    # the healthy start alone: nobody
    assert sg.detect(samples[:5], threshold=1.2, windows=1, window_s=0.2) == []


def test_watchdog_straggler_arguments_are_checked(capsys):
    from lingjun_slurm.injob.host import watchdog

    with pytest.raises(SystemExit) as exc:
        watchdog.main(["--format", "builtin", "--progress", "x", "--timeout", "5", "--startup-timeout", "5",
                       "--pid", "1", "--stacks-dir", "s", "--record", "r", "--straggler-action", "requeue"])
    assert exc.value.code == 2 and "--straggler-record" in capsys.readouterr().err


def test_the_watchdog_feeds_the_steps_file_to_the_detector(tmp_path):
    """watchdog.watch() with a straggler Watch: it reads steps/<attempt>.jsonl from its start on
    every poll; the hang clock is untouched (the step ends by itself: exit 0)."""
    import subprocess

    from lingjun_slurm.injob.host import watchdog

    steps = tmp_path / "steps.jsonl"
    steps.write_text("".join(json.dumps({"time": 10 * k, "iteration": k, "ranks": [
        {"rank": r, "node": f"node{r + 1}", "compute": 3.0 if r == 1 else 1.0} for r in range(3)]}) + "\n"
        for k in range(4)))
    proc = subprocess.Popen(["sleep", "60"])
    said: list[str] = []
    w = sg.Watch("log", 1.2, 2, 10, "builtin", str(tmp_path / "rec.json"), say=said.append)
    opts = watchdog.Options("builtin", str(tmp_path / "metrics.jsonl"), 100, 100, 1, proc.pid, str(tmp_path / "st"),
                            str(tmp_path / "hang.json"), straggler=w, steps=str(steps))

    def sleep(_s: float) -> None:
        proc.kill()
        proc.wait()

    assert watchdog.watch(opts, watchdog.Actions("local", proc.pid, None), sleep=sleep) == 0
    assert [r["node"] for r in sg.read_record(str(tmp_path / "rec.json"))] == ["node2"]
    assert said and said[0].startswith("lingjun-slurm: straggler: node2 rank 1 at 3.0x")
    assert not (tmp_path / "hang.json").exists()


def test_requeue_without_a_requeue_path_only_records(tmp_path):
    w = sg.Watch("requeue", 1.2, 1, 10, "builtin", str(tmp_path / "s.json"), iterations=10**6,
                 jobs_file=None, metrics=None, request_stop=None, say=lambda t: None)
    w._act(_st())  # no history: not requeued, whatever the executor
    rec = sg.read_record(str(tmp_path / "s.json"))[0]
    assert not rec["requeue"] and "restart cost is unknown" in rec["decision"]
    (tmp_path / "jobs").write_text("start 1000 0 n1\n")
    (tmp_path / "m.jsonl").write_text(json.dumps({"type": "train", "time": 1010.0}) + "\n")
    w = sg.Watch("requeue", 1.2, 1, 10, "builtin", str(tmp_path / "s2.json"), iterations=10**6,
                 jobs_file=str(tmp_path / "jobs"), metrics=str(tmp_path / "m.jsonl"), request_stop=None,
                 say=lambda t: None)
    rec = w._act(_st())
    assert not rec["requeue"] and rec["decision"].endswith("not done: this executor cannot requeue (local)")


# ---- review fixes (issue 28) -------------------------------------------------------------------

def test_timed_drains_the_current_cuda_stream_around_the_collective(monkeypatch):
    """On GPUs a collective only queues work: StepTimes.timed synchronizes the current stream just
    before its t0 and just after the collective (a fake torch.cuda stream; not run on a GPU here)."""
    import types

    import torch

    events: list[str] = []

    class FakeStream:
        def synchronize(self) -> None:
            events.append("sync")

    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: FakeStream())
    rt = types.SimpleNamespace(rank=0, world_size=1, pp_rank=0, device="cpu", use_cuda=True)
    st = steptimes.for_runtime(rt, "/nonexistent-run-dir", 10, "off")
    ticks = iter(range(100))

    def clock() -> float:
        events.append("clock")
        return float(next(ticks))

    st.clock = clock
    assert st.timed(lambda: events.append("collective") or 7)() == 7
    assert events == ["sync", "clock", "collective", "sync", "clock"]
    # on CPUs (gloo blocks): no stream, nothing synchronized
    events.clear()
    cpu = steptimes.for_runtime(types.SimpleNamespace(rank=0, world_size=1, pp_rank=0, device="cpu", use_cuda=False),
                                "/nonexistent-run-dir", 10, "off")
    cpu.clock = clock
    cpu.timed(lambda: events.append("collective"))()
    assert events == ["clock", "collective", "clock"]


def _block(when: str, timers: dict[str, dict[int, float]]) -> list[str]:
    lines = [f" [{when}] iteration       10/     500 | elapsed time per iteration (ms): 900.0 |",
             "(min, max) time across ranks (ms):", "times across ranks (ms):"]
    for name, per_rank in timers.items():
        lines.append(f"    {name}:")
        lines += [f"     rank {r:2d}: {v:.2f}" for r, v in per_rank.items()]
    return lines


def test_overlap_grad_reduce_uses_forward_compute_only():
    """--overlap-grad-reduce: Timer.stop's torch.cuda.synchronize puts the bucket all-reduces' wait for
    a slow rank into every healthy rank's backward-compute: only forward-compute is compared; with
    --overlap-param-gather too, neither (no sample), and the watchdog says so."""
    # rank 3 is slow in forward (300 vs 200); healthy ranks' backward holds the wait (600 vs 400)
    timers = {"forward-compute": {0: 200, 1: 200, 2: 200, 3: 300},
              "backward-compute": {0: 600, 1: 600, 2: 600, 3: 400},
              "forward-backward": {0: 900, 1: 900, 2: 900, 3: 900}}
    lines: list[str] = []
    for k in range(4):
        lines += _block(f"2026-01-01 00:0{k}:00", timers)
    plan = {"settings": {"parallelism": {"pipeline": 1, "overlap_grad_reduce": True}, "training": {"extra_args": []}}}
    layout = sg.layout_from_plan(plan, "megatron")
    named = sg.detect(sg.samples_of("megatron", lines, layout=layout, now=0.0), 1.2, 3, 60, layout)
    assert [s.rank for s in named] == [3]
    # fwd + bwd (the old rule) hides it: 700 against 800
    assert sg.detect(sg.samples_of("megatron", lines, now=0.0), 1.2, 3, 60) == []
    both = sg.layout_from_plan({"settings": {"parallelism": {"overlap_grad_reduce": True},
                                             "training": {"extra_args": ["--overlap-param-gather"]}}}, "megatron")
    assert both.timers == () and sg.samples_of("megatron", lines, layout=both, now=0.0) == []
    said: list[str] = []
    w = sg.Watch("log", 1.2, 3, 60, "megatron", "/nonexistent/rec.json", layout=both, say=said.append)
    w.poll([])
    assert said and "off for this run" in said[0]
    # the builtin trainer times its collectives itself: the flags change nothing there
    assert sg.layout_from_plan(plan, "builtin").timers == ("forward-compute", "backward-compute")


def test_pipeline_names_one_rank_per_pipeline():
    """pp=2, world 8 (stage = r // 4, pipeline = r % 4): rank 1 (stage 0) is slow; its pipeline's
    stage-1 rank 5 (another node) waits in recv and looks slow against its stage peers too: only
    the one with the larger ratio (rank 1) is named."""
    stages = {r: r // 4 for r in range(8)}
    det = sg.Detector(1.2, 3, 10, sg.Layout(pipeline=2), 8)
    for k in range(20):
        c = {r: 1.0 + 0.01 * (r % 3) for r in range(8)}
        c[1], c[5] = 1.6, 1.3
        det.feed(_sample(k * 5.0, c, stages))
    det.finish()
    assert sorted(det.named) == [1]
    # without the pipeline layout both are named (the old rule)
    flat = sg.Detector(1.2, 3, 10)
    for k in range(20):
        c = {r: 1.0 + 0.01 * (r % 3) for r in range(8)}
        c[1], c[5] = 1.6, 1.3
        flat.feed(_sample(k * 5.0, c, stages))
    flat.finish()
    assert sorted(flat.named) == [1, 5]


def test_log_straggler_sample_across_stages_is_dropped():
    """--log-straggler compares the world's min and max forward time: with pp > 1 a pair from two
    stages (the last stage's output layer) is dropped, and that is said once."""
    line = "0: MnRtt/Rnk: 3000.00ms/1 | MxRtt/Rnk: 4000.00ms/6 | MnPwr/Rnk: 1W/0"
    notes: list[str] = []
    assert sg.samples_of("megatron", [line], pipeline=2, now=0.0, world=8, notes=notes) == []
    assert len(notes) == 1 and "dropped" in notes[0]
    same = "0: MnRtt/Rnk: 3000.00ms/1 | MxRtt/Rnk: 4000.00ms/2 | MnPwr/Rnk: 1W/0"
    assert len(sg.samples_of("megatron", [same], pipeline=2, now=0.0, world=8)) == 1
    assert len(sg.samples_of("megatron", [line], pipeline=1, now=0.0, world=8)) == 1


def test_use_tp_pp_dp_mapping_stage_numbers():
    """--use-tp-pp-dp-mapping: order tp-cp-ep-pp-dp (initialize.py 395), dense ep=1: stage =
    (rank // (tp*cp)) % pp. tp=2, pp=2, world 8: ranks 0,1,4,5 are stage 0; 2,3,6,7 stage 1."""
    plan = {"settings": {"parallelism": {"tensor": 2, "pipeline": 2, "context": 1},
                         "training": {"extra_args": ["--use-tp-pp-dp-mapping"]}}}
    layout = sg.layout_from_plan(plan, "megatron")
    assert layout.tp_pp_dp and [layout.stage(r, 8) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    timers = {"forward-compute": {r: 100.0 for r in range(8)}, "backward-compute": {r: 200.0 for r in range(8)}}
    s = sg.samples_of("megatron", _block("2026-01-01 00:00:00", timers), layout=layout, now=0.0)[0]
    assert {r.rank: r.stage for r in s.ranks} == {0: 0, 1: 0, 2: 1, 3: 1, 4: 0, 5: 0, 6: 1, 7: 1}
    default = sg.layout_from_plan({**plan, "settings": {**plan["settings"], "training": {"extra_args": []}}}, "megatron")
    assert [default.stage(r, 8) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_no_per_rank_timings_said_once(tmp_path):
    """Megatron-LM without --timing-log-option all: 2 x window_s after the first iteration the watch
    says once that nothing can be detected, and leaves it for `status`."""
    now = [1000.0]
    said: list[str] = []
    w = sg.Watch("log", 1.2, 3, 60, "megatron", str(tmp_path / "rec.json"), run_dir=str(tmp_path),
                 say=said.append, clock=lambda: now[0])
    it = " [2026-01-01 00:00:00] iteration       10/     500 | elapsed time per iteration (ms): 900.0 |"
    w.poll([it], last_iteration=10)
    for _ in range(5):
        now[0] += 60
        w.poll([it], last_iteration=10)
    assert len(said) == 1 and "no per-rank timings in the log (add --timing-log-option all" in said[0]
    note = json.loads((tmp_path / "stage-notes" / "train.txt").read_text())
    assert note["note"].startswith("straggler detection: no per-rank timings")
    # with timings, nothing is said
    said.clear()
    w2 = sg.Watch("log", 1.2, 3, 60, "builtin", str(tmp_path / "rec2.json"), say=said.append, clock=lambda: now[0])
    line = json.dumps({"time": 1.0, "iteration": 10, "ranks": [{"rank": 0, "compute": 1.0}, {"rank": 1, "compute": 1.0}]})
    w2.poll([line], last_iteration=10)
    now[0] += 600
    w2.poll([], last_iteration=20)
    assert said == []


def test_the_watchdog_stops_after_the_straggler_requeue_asks_for_a_save(tmp_path):
    """After request_save the hang watchdog stops (as at the time limit): a save longer than the
    hang timeout is no hang."""
    from lingjun_slurm.injob.host import watchdog

    class FakeWatch:
        stop_requested = False

        def poll(self, lines, last_iteration):
            self.stop_requested = True  # the requeue action asked the step to save
            return []

    class NoActions:
        def __getattr__(self, name):
            raise AssertionError(f"the watchdog acted on a save: {name}")

    clock = iter(float(t) for t in range(0, 10**6, 50))
    opts = watchdog.Options("builtin", str(tmp_path / "metrics.jsonl"), 10, 10, 1, __import__("os").getpid(),
                            str(tmp_path / "st"), str(tmp_path / "hang.json"), straggler=FakeWatch())
    assert watchdog.watch(opts, NoActions(), clock=lambda: next(clock), sleep=lambda s: None) == 0
    assert not (tmp_path / "hang.json").exists()


def test_the_watchdog_reads_the_layout_from_the_plan(tmp_path, monkeypatch, capsys):
    from lingjun_slurm.injob.host import watchdog

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"settings": {"parallelism": {"tensor": 2, "pipeline": 2, "overlap_grad_reduce": True},
                                             "training": {"extra_args": ["--use-tp-pp-dp-mapping"]}}}))
    seen: list = []
    monkeypatch.setattr(watchdog, "watch", lambda opts, actions: seen.append(opts.straggler) or 0)
    monkeypatch.setattr(watchdog.signal, "signal", lambda *a: None)
    argv = ["--format", "megatron", "--progress", "x", "--timeout", "5", "--startup-timeout", "5", "--pid", "1",
            "--stacks-dir", "s", "--record", "r", "--straggler-action", "log", "--straggler-record",
            str(tmp_path / "rec.json"), "--ntasks", "8", "--pipeline", "2", "--plan", str(plan)]
    assert watchdog.main(argv) == 0
    assert seen[0].layout == sg.Layout(pipeline=2, tensor=2, tp_pp_dp=True, overlap_grad_reduce=True)
    assert seen[0].world == 8
    (tmp_path / "bad.json").write_text("{")
    assert watchdog.main(argv[:-1] + [str(tmp_path / "bad.json")]) == 0  # the hang watchdog goes on
    assert seen[1].layout == sg.Layout(pipeline=2)
    assert "cannot read --plan" in capsys.readouterr().err
