"""The hang watchdog (lingjun_slurm.injob.host.watchdog): parsing recorded Megatron-LM output and the builtin
trainer's metrics.jsonl, timeouts and their floor, following a file that moves, and the whole
hang path with stand-ins and with real processes behind the local launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lingjun_slurm.injob.host import watchdog as wd
from tests.conftest import REPO

LOGS = REPO / "tests" / "fixtures" / "megatron_logs"


def lines(name: str) -> list[str]:
    return (LOGS / name).read_text(encoding="utf-8").splitlines()


def iterations(text_lines: list[str]) -> list[tuple[int | None, float | None]]:
    return [(e.iteration, None if e.step_time_s is None else round(e.step_time_s, 6))
            for e in map(wd.parse_megatron, text_lines) if e and e.kind == "iteration"]


# --- parsing -------------------------------------------------------------------------------------

def test_recorded_megatron_lines_log_interval_10() -> None:
    """NVIDIA/nccl#743: the pre-2023 format; the timer lines between are not iterations."""
    assert iterations(lines("nccl-743-bert-log-interval-10.log")) == [(10, 0.3562), (20, 0.1406)]


def test_recorded_megatron_lines_with_timestamps() -> None:
    """NVIDIA/Megatron-LM#756: ' [date] iteration N/ M | ... elapsed time per iteration (ms): T |'."""
    assert iterations(lines("megatron-lm-756-mixtral.log")) == [(71, 5.3616), (72, 5.4707), (73, 5.8299)]


def test_format_of_core_v0_16_1_and_main() -> None:
    got = [wd.parse_megatron(x) for x in lines("format-core_v0.16.1-and-main.log")]
    assert [e.kind if e else None for e in got] == ["activity", "activity", "iteration", "iteration", "iteration",
                                                   None, "activity", None]
    assert [(e.iteration, round(e.step_time_s, 6)) for e in got if e and e.kind == "iteration"] == [
        (101, 9.8765), (110, 1.5234), (120, 1.5234)]


@pytest.mark.parametrize("prefix", ["0: ", " 15: ", "123: ", "pyxis: "])
def test_srun_label_prefixes_do_not_matter(prefix: str) -> None:
    raw = lines("megatron-lm-756-mixtral.log") + lines("nccl-743-bert-log-interval-10.log")
    assert iterations([prefix + x for x in raw]) == iterations(raw) != []


def test_lines_that_are_not_iterations() -> None:
    for text in ["saving checkpoint at iteration     100 to /ckpt in torch_dist format",
                 "[before the start of training step] datetime: 2022-10-31 08:35:51 ",
                 "iteration 5 of something else", "WARNING: iteration 3/ not a number |"]:
        e = wd.parse_megatron(text)
        assert e is None or e.kind == "activity", text


def test_builtin_records() -> None:
    rec = {"type": "train", "time": 1.0, "run_id": "r", "iteration": 7, "loss": float("nan"), "step_time_s": 0.25}
    e = wd.parse_builtin(json.dumps(rec, allow_nan=True))  # metrics.py writes NaN as NaN
    assert e == wd.Event("iteration", 7, 0.25)
    assert wd.parse_builtin(json.dumps({"type": "save", "iteration": 7, "seconds": 3})) == wd.Event("activity")
    assert wd.parse_builtin(json.dumps({"type": "train", "iteration": 8, "step_time_s": float("nan")})) == \
        wd.Event("iteration", 8, None)
    assert wd.parse_builtin('{"type": "train", "iterat') is None  # a line cut short
    assert wd.parse_builtin("not json") is None


# --- timeouts ------------------------------------------------------------------------------------

def test_startup_timeout_until_the_first_iteration_then_the_timeout() -> None:
    s = wd.State(timeout=10, startup_timeout=100, log_interval=1, started=0.0)
    assert not s.due(99) and s.due(101)
    s.feed(wd.Event("iteration", 1, 0.1), now=50, wall=1e9)
    assert s.phase == "training" and not s.due(59) and s.due(61)


def test_activity_restarts_the_clock_without_being_an_iteration() -> None:
    s = wd.State(timeout=10, startup_timeout=100, log_interval=1, started=0.0)
    s.feed(wd.Event("iteration", 5, 0.1), now=1, wall=1e9)
    s.feed(wd.Event("activity"), now=9, wall=1e9)  # a checkpoint save started
    assert s.last_iteration == 5 and not s.due(18) and s.due(20)


def test_floor_is_log_interval_times_step_time_times_margin_and_said_once() -> None:
    s = wd.State(timeout=5, startup_timeout=100, log_interval=10, floor_factor=3, started=0.0)
    for line in lines("nccl-743-bert-log-interval-10.log"):  # 10 iterations of 0.1406 s: floor 4.2 s < 5 s
        s.feed(wd.parse_megatron(line), now=0.0, wall=1e9)
    assert s.effective_timeout() == 5 and s.notes == []
    s.feed(wd.Event("iteration", 30, 0.5), now=0.0, wall=1e9)  # 10 x 0.5 s x 3 = 15 s > 5 s
    assert s.effective_timeout() == pytest.approx(15)
    assert not s.due(14) and s.due(16)
    assert len(s.notes) == 1 and "raised from 5 s to 15 s" in s.notes[0] and "every 10 iteration" in s.notes[0]


# --- following a file ----------------------------------------------------------------------------

def test_follower_missing_then_created_truncated_and_rotated(tmp_path: Path) -> None:
    path = tmp_path / "log"
    f = wd.Follower(str(path))
    assert f.lines() == []  # missing
    path.write_text("a\nb\npart")
    assert f.lines() == ["a", "b"]
    with path.open("a") as fh:
        fh.write("ial\n")
    assert f.lines() == ["partial"]
    path.write_text("x\n")  # truncated in place and rewritten shorter
    assert f.lines() == ["x"]
    os.rename(path, tmp_path / "log.1")  # rotated: a new file under the name
    with (tmp_path / "log.1").open("a") as fh:
        fh.write("late\n")
    path.write_text("new\n")
    assert f.lines() == ["late", "new"]
    path.unlink()
    assert f.lines() == []


def test_follower_starts_at_the_end_and_keeps_the_tail_for_calibration(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_text("\n".join(lines("megatron-lm-756-mixtral.log")) + "\n 0: [2024-04-06 03:02:30] iter")
    f = wd.Follower(str(path))
    assert iterations(f.initial) == [(71, 5.3616), (72, 5.4707), (73, 5.8299)]
    assert f.lines() == []
    with path.open("a") as fh:
        fh.write("ation       74/     100 | elapsed time per iteration (ms): 5000.0 |\n")
    assert iterations(f.lines()) == [(74, 5.0)]


# --- the watch loop with stand-in actions ---------------------------------------------------------

class Recorder(wd.Actions):
    def __init__(self, pid: int) -> None:
        super().__init__("local", pid, None)
        self.calls: list[tuple[str, float]] = []
        self.proc: subprocess.Popen | None = None

    def signal_tasks(self) -> str:
        self.calls.append(("USR2", time.monotonic()))
        return "stand-in"

    def end_step(self) -> None:
        self.calls.append(("KILL", time.monotonic()))
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def force(self) -> None:
        self.calls.append(("FORCE", time.monotonic()))


@pytest.fixture
def step():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def options(tmp_path: Path, pid: int, **kw) -> wd.Options:
    base = dict(format="megatron", progress=str(tmp_path / "job.out"), timeout=1.0, startup_timeout=1.5,
                log_interval=1, pid=pid, stacks_dir=str(tmp_path / "stacks"), record=str(tmp_path / "hang.json"),
                grace=0.5, poll=0.05, job="42", restart=2)
    base.update(kw)
    return wd.Options(**base)


def writer(path: Path, start: int, count: int, every: float, prefix: str = "0: ") -> threading.Thread:
    def run() -> None:
        for i in range(start, start + count):
            with path.open("a") as fh:
                fh.write(f"{prefix} [2026-01-02 03:05:00.000000] iteration {i:8d}/{10**6:8d} | consumed samples: "
                         f"{i:12d} | elapsed time per iteration (ms): {every * 1000:.1f} |\n")
            time.sleep(every)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_progress_continues_nothing_is_signalled(tmp_path: Path, step) -> None:
    """Iterations every 0.25 s for 3 s against a 1 s timeout: no signal; exits 0 when the step ends."""
    acts = Recorder(step.pid)
    t = writer(tmp_path / "job.out", 1, 12, 0.25)
    threading.Timer(3.2, step.kill).start()  # the step ends by itself after the writer
    rc = wd.watch(options(tmp_path, step.pid), acts)
    t.join()
    assert rc == 0 and acts.calls == [] and not (tmp_path / "hang.json").exists()


def test_stall_signals_usr2_then_ends_the_step_and_writes_the_record(tmp_path: Path, step) -> None:
    acts = Recorder(step.pid)
    acts.proc = step
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "node1-rank3-pid77.txt").write_text("# header\n")

    real_signal = acts.signal_tasks

    def signal_and_dump() -> str:  # a rank that answers SIGUSR2 with its stack
        with (stacks / "node1-rank3-pid77.txt").open("a") as fh:
            fh.write('Thread 0x1 (most recent call first):\n  File "x.py", line 1 in hung\n')
        return real_signal()

    acts.signal_tasks = signal_and_dump  # type: ignore[method-assign]
    t0 = time.monotonic()
    writer(tmp_path / "job.out", 100, 3, 0.1)  # three iterations, then nothing
    rc = wd.watch(options(tmp_path, step.pid, startup_timeout=5.0), acts)
    assert rc == wd.HANG_EXIT
    assert [c for c, _ in acts.calls] == ["USR2", "KILL"]
    assert 1.2 <= acts.calls[0][1] - t0 < 3.0  # the last line + the 1 s timeout, not the 5 s startup one
    assert acts.calls[1][1] - acts.calls[0][1] >= 0.45  # the grace for the dumps
    rec = json.loads((tmp_path / "hang.json").read_text())
    assert rec["type"] == "hang" and rec["phase"] == "training" and rec["last_iteration"] == 102
    assert rec["job"] == "42" and rec["restart"] == 2 and rec["timeout_s"] == 1.0 and rec["step_ended"] is True
    assert rec["stacks"] == [{"path": str(stacks / "node1-rank3-pid77.txt"), "node": "node1", "rank": 3,
                              "pid": 77, "bytes": (stacks / "node1-rank3-pid77.txt").stat().st_size}]
    assert rec["since"] <= rec["detected"] - 1.0 and rec["step_time_s"] == pytest.approx(0.1)


def test_startup_timeout_when_no_iteration_ever_appears(tmp_path: Path, step, capsys) -> None:
    acts = Recorder(step.pid)
    acts.proc = step
    (tmp_path / "job.out").write_text(" iteration       50/     100 | elapsed time per iteration (ms): 10.0 |\n")
    t0 = time.monotonic()  # ^ an earlier attempt's line: calibration only, not this attempt's progress
    rc = wd.watch(options(tmp_path, step.pid), acts)
    assert rc == wd.HANG_EXIT and acts.calls[0][1] - t0 >= 1.45
    rec = json.loads((tmp_path / "hang.json").read_text())
    assert rec["phase"] == "startup" and rec["last_iteration"] is None and rec["timeout_s"] == 1.5
    err = capsys.readouterr().err
    assert "lingjun-slurm: watchdog: no new iteration for 2 s (last: none since the start at" in err
    assert "collecting stack traces and ending the step" in err


def test_a_raised_floor_keeps_a_slow_logger_alive(tmp_path: Path, step, capsys) -> None:
    """log interval 4 x 0.3 s x 3 = 3.6 s > the 1 s timeout: lines 1.2 s apart are no hang."""
    acts = Recorder(step.pid)
    path = tmp_path / "job.out"

    def run() -> None:
        for i in (4, 8, 12):
            with path.open("a") as fh:
                fh.write(f" iteration {i:8d}/     100 | elapsed time per iteration (ms): 300.0 |\n")
            time.sleep(1.2)
        step.kill()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    rc = wd.watch(options(tmp_path, step.pid, log_interval=4), acts)
    t.join()
    assert rc == 0 and acts.calls == []
    err = capsys.readouterr().err
    assert err.count("hang timeout raised from 1 s to 4 s") == 1


# --- the command line, with a stand-in scancel ----------------------------------------------------

def test_cli_slurm_path_usr2_to_srun_then_sigterm_never_scancel(tmp_path: Path) -> None:
    """SIGUSR2 goes to srun, which forwards it to its own step's tasks (srun/signals.c), not through
    `scancel --signal=USR2 JOB`, which also hits the extern step (its sleep dies of it in 22.05-24.11);
    then SIGTERM to srun (its tasks get SIGKILL), never scancel --signal=KILL (that cancels the job)."""
    log = tmp_path / "scancel.log"
    scancel = tmp_path / "scancel"
    scancel.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    scancel.chmod(0o755)
    got = tmp_path / "srun-got-usr2"
    srun = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                             f"signal.signal(signal.SIGUSR2, lambda *a: open({str(got)!r}, 'w').close())\n"
                             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(137))\n"
                             "while True: time.sleep(0.05)"])
    try:
        time.sleep(0.5)  # its handlers are in place
        env = {**os.environ, "PYTHONPATH": str(REPO), "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1"}
        r = subprocess.run([sys.executable, "-m", "lingjun_slurm.injob.host.watchdog", "--format", "builtin",
                            "--progress", str(tmp_path / "metrics.jsonl"), "--timeout", "1", "--startup-timeout", "1",
                            "--log-interval", "10", "--pid", str(srun.pid), "--stacks-dir", str(tmp_path / "st"),
                            "--record", str(tmp_path / "rec" / "hang.json"), "--grace", "0.5", "--poll", "0.1",
                            "--scancel", str(scancel)], env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 3, r.stderr
        assert got.exists() and not log.exists()
        assert srun.wait(5) == 137  # srun got SIGTERM (it turns that into SIGKILL for its tasks)
        rec = json.loads((tmp_path / "rec" / "hang.json").read_text())
        assert rec["job"] == "4242" and rec["restart"] == 1 and rec["signal"] == f"kill -USR2 {srun.pid}"
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()


def test_cli_falls_back_to_scancel_when_srun_is_gone(tmp_path: Path) -> None:
    log = tmp_path / "scancel.log"
    scancel = tmp_path / "scancel"
    scancel.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    scancel.chmod(0o755)
    actions = wd.Actions("slurm", 999999999, "4242", str(scancel))
    assert actions.signal_tasks() == f"{scancel} --signal=USR2 4242"
    assert log.read_text().split("\n")[:1] == ["--signal=USR2 4242"]


def test_cli_exits_quietly_when_the_step_ends(tmp_path: Path) -> None:
    srun = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    r = subprocess.run([sys.executable, "-m", "lingjun_slurm.injob.host.watchdog", "--format", "megatron", "--progress",
                        str(tmp_path / "x"), "--timeout", "30", "--startup-timeout", "30", "--pid", str(srun.pid),
                        "--stacks-dir", str(tmp_path), "--record", str(tmp_path / "r.json"), "--poll", "0.1",
                        "--executor", "local"], env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=30)
    srun.wait()
    assert (r.returncode, r.stderr, r.stdout) == (0, "", "") and not (tmp_path / "r.json").exists()


# --- real processes: hung ranks behind the local launcher ------------------------------------------

HUNG_RANK = """
import os, sys, time
from lingjun_slurm.injob import stacks
stacks.install()
def hung_rank_sleeping_in_a_collective():
    open(os.path.join(sys.argv[1], "ready-" + os.environ["SLURM_PROCID"]), "w").close()
    time.sleep(120)
hung_rank_sleeping_in_a_collective()
"""


def test_hung_ranks_get_their_stacks_dumped_and_the_step_ended(tmp_path: Path) -> None:
    stacks_dir, ready = tmp_path / "stacks", tmp_path / "ready"
    ready.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(HUNG_RANK)
    env = {**os.environ, "PYTHONPATH": str(REPO), "LINGJUN_STACKS_DIR": str(stacks_dir)}
    launcher = subprocess.Popen([sys.executable, "-m", "lingjun_slurm.executors.launch", "--ntasks", "2", "--",
                                 sys.executable, str(script), str(ready)], env=env, cwd=tmp_path,
                                stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while len(list(ready.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(list(ready.iterdir())) == 2, "the ranks did not start"
        r = subprocess.run([sys.executable, "-m", "lingjun_slurm.injob.host.watchdog", "--format", "builtin", "--progress",
                            str(tmp_path / "metrics.jsonl"), "--timeout", "1", "--startup-timeout", "1", "--pid",
                            str(launcher.pid), "--stacks-dir", str(stacks_dir), "--record", str(tmp_path / "h.json"),
                            "--grace", "10", "--ntasks", "2", "--poll", "0.1", "--executor", "local"],
                           env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60)
        assert r.returncode == 3, r.stderr
        assert launcher.wait(10) == 128 + signal.SIGKILL  # the tasks were killed; the launcher reported it
        rec = json.loads((tmp_path / "h.json").read_text())
        assert sorted(s["rank"] for s in rec["stacks"]) == [0, 1] and rec["step_ended"] is True
        for s in rec["stacks"]:
            text = Path(s["path"]).read_text()
            assert text.startswith("# lingjun-slurm stacks: node ")
            assert "in hung_rank_sleeping_in_a_collective" in text and "rank.py" in text
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_the_probe_reads_each_ranks_process_state_before_any_signal(tmp_path: Path) -> None:
    """Actions.probe (local executor: /proc directly): a stopped rank reads T, a waiting one S,
    one whose process is gone 'gone'; exclusion.stuck_by_state then names only the stopped one's node."""
    from lingjun_slurm.injob.host import exclusion

    waiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        time.sleep(0.3)
        for node, rank, pid in (("n1", 0, waiting.pid), ("n2", 1, stopped.pid), ("n3", 2, 999999999)):
            (tmp_path / f"{node}-rank{rank}-pid{pid}.txt").write_text("# header\n")
        states = wd.Actions("local", os.getpid(), None).probe(str(tmp_path))
        by_rank = {s["rank"]: (s["node"], s["state"]) for s in states}
        assert by_rank == {0: ("n1", "S"), 1: ("n2", "T"), 2: ("n3", "gone")}, states
        assert exclusion.stuck_by_state(states) == {"n2": [(1, "stopped")], "n3": [(2, "gone")]}
        # every rank alike (the whole job stopped): no node to blame
        assert exclusion.stuck_by_state([{**s, "state": "T"} for s in states]) == {}
    finally:
        for p in (waiting, stopped):
            p.kill()
            p.wait()


def test_a_term_during_the_hang_handling_waits_for_the_record(tmp_path: Path) -> None:
    """The batch script stops the watchdog (SIGTERM) as soon as srun ends, which the watchdog itself
    caused: the record must still be finished (signal, stacks, step_ended), not left half written."""
    srun = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                             "signal.signal(signal.SIGUSR2, lambda *a: None)\n"
                             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(137))\n"
                             "while True: time.sleep(0.05)"])
    record = tmp_path / "hang.json"
    try:
        time.sleep(0.5)
        wdog = subprocess.Popen([sys.executable, "-m", "lingjun_slurm.injob.host.watchdog", "--format", "builtin",
                                 "--progress", str(tmp_path / "metrics.jsonl"), "--timeout", "1", "--startup-timeout",
                                 "1", "--pid", str(srun.pid), "--stacks-dir", str(tmp_path / "st"), "--record",
                                 str(record), "--grace", "1", "--poll", "0.1", "--executor", "local"],
                                env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while not record.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        wdog.send_signal(signal.SIGTERM)  # as the batch script would, right away
        assert wdog.wait(30) == 3
        rec = json.loads(record.read_text())
        assert rec["signal"] == f"kill -USR2 {srun.pid}" and rec["step_ended"] is True, rec
    finally:
        for p in (srun,):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_stopped_ranks_dump_is_not_waited_for_the_whole_grace(tmp_path: Path, step,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank SIGSTOPped (state T in /proc, read by the probe), the other answers SIGUSR2 with its
    stack: the watchdog ends the step STOPPED_DUMP_WAIT_S after the signal, not after the 20 s grace,
    and the record names the stopped rank's state."""
    monkeypatch.setattr(wd, "STOPPED_DUMP_WAIT_S", 1.5)
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        acts = Recorder(step.pid)
        acts.proc = step
        stacks = tmp_path / "stacks"
        stacks.mkdir()
        live = stacks / f"node1-rank0-pid{step.pid}.txt"
        live.write_text("# header\n")
        (stacks / f"node1-rank1-pid{stopped.pid}.txt").write_text("# header\n")
        real_signal = acts.signal_tasks

        def signal_and_dump() -> str:  # rank 0 answers; rank 1 is stopped and cannot
            with live.open("a") as fh:
                fh.write('Thread 0x1 (most recent call first):\n  File "x.py", line 1 in wait\n')
            return real_signal()

        acts.signal_tasks = signal_and_dump  # type: ignore[method-assign]
        writer(tmp_path / "job.out", 100, 3, 0.1)
        rc = wd.watch(options(tmp_path, step.pid, startup_timeout=5.0, grace=20.0, ntasks=2), acts)
        assert rc == wd.HANG_EXIT
        waited = acts.calls[1][1] - acts.calls[0][1]
        assert 1.4 <= waited < 5.0, waited  # was the whole 20 s grace
        rec = json.loads((tmp_path / "hang.json").read_text())
        assert {s["rank"]: s["state"] for s in rec["states"]} == {0: "S", 1: "T"}, rec["states"]
        assert [s["rank"] for s in rec["stacks"]] == [0]
    finally:
        stopped.kill()
        stopped.wait()
