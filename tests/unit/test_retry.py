"""The requeue decision (lingjun_slurm/injob/host/retry.py) on real job logs of the test cluster's srun
(Slurm 22.05.8, tests/fixtures/srun_exits/SOURCES.md) and on each rule alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lingjun_slurm.injob.host.crashlog import blame
from lingjun_slurm.injob.host.retry import decide, main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "srun_exits"


def analysis(name: str, offset: int = 0) -> dict:
    return blame(str(FIXTURES / name), offset)


def test_fixtures_are_the_real_srun_lines() -> None:
    """Guard: the recordings hold srun's own task-exit lines (not something written for the test)."""
    text = (FIXTURES / "exit1-first.log").read_text()
    assert "srun: error: " in text and ": task 1: Exited with exit code 1" in text
    assert "Terminating StepId=" in text  # srun's --kill-on-bad-exit at work


def test_one_rank_exit_1_is_not_retried_although_srun_exits_143() -> None:
    retry, why = decide(rc=143, start_iteration=0, last_iteration=0, analysis=analysis("exit1-first.log"))
    assert not retry
    assert "exited with code 1 first" in why and "srun exit 143" in why and "task 1 on node" in why


def test_a_rank_killed_from_outside_is_retried() -> None:
    retry, why = decide(rc=137, start_iteration=0, last_iteration=0, analysis=analysis("killed-first.log"))
    assert retry and "stopped from outside first: Killed" in why


@pytest.mark.parametrize("status, retried", [
    ("Exited with exit code 3", False),
    ("Segmentation fault (core dumped)", False),
    ("Aborted", False),
    ("Bus error", False),
    ("Out Of Memory", False),
    ("Killed", True),
    ("Terminated", True),
    ("Hangup", True),
    ("User defined signal 1", True),
])
def test_the_first_failed_task_decides(status: str, retried: bool) -> None:
    first = {"node": "gpu7", "tasks": "3", "status": status, "at": 0, "unique": True}
    retry, why = decide(rc=143, start_iteration=5, last_iteration=5, analysis={"first_failure": first})
    assert retry is retried, why
    assert "task 3 on gpu7" in why


def test_facts_before_the_first_failure() -> None:
    """Time limit, clean exit, hang, a move away from a blamed node, progress and a node failure each
    retry, whatever the first task did."""
    exit1 = analysis("exit1-first.log")
    assert decide(rc=143, start_iteration=0, last_iteration=0, time_limit=True, analysis=exit1)[0]
    assert decide(rc=0, start_iteration=0, last_iteration=0, analysis=exit1)[0]
    assert decide(rc=143, start_iteration=0, last_iteration=0, hung=True, analysis=exit1)[0]
    assert decide(rc=1, start_iteration=0, last_iteration=0, moved_away=True, analysis=exit1)[0]
    assert decide(rc=143, start_iteration=10, last_iteration=20, analysis=exit1)[0]
    node_fail = {**exit1, "node_failures": ["node2"]}
    assert decide(rc=1, start_iteration=0, last_iteration=0, analysis=node_fail)[0]


def test_no_task_line_retries_only_a_signalled_srun_and_says_the_cause_was_not_read() -> None:
    retry, why = decide(rc=143, start_iteration=0, last_iteration=0, analysis={"first_failure": None})
    assert retry and "cause was not read" in why
    retry, why = decide(rc=1, start_iteration=0, last_iteration=0, analysis={"first_failure": None})
    assert not retry and "cause was not read" in why
    retry, why = decide(rc=1, start_iteration=0, last_iteration=0, analysis=None)
    assert not retry and "could not be read" in why


def test_only_this_attempts_part_of_the_log_counts(tmp_path: Path) -> None:
    """An earlier attempt's `exit 1` before the offset is not this attempt's failure."""
    log = tmp_path / "job.out"
    earlier = (FIXTURES / "exit1-first.log").read_bytes()
    log.write_bytes(earlier + (FIXTURES / "killed-first.log").read_bytes())
    assert decide(rc=137, start_iteration=0, last_iteration=0, analysis=blame(str(log), len(earlier)))[0]
    assert not decide(rc=137, start_iteration=0, last_iteration=0, analysis=blame(str(log), 0))[0]


def test_main_prints_the_decision_and_leaves_a_stop_for_status(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    run_dir = tmp_path / "run"
    rc = main(["--log", str(FIXTURES / "exit1-first.log"), "--offset", "0", "--rc", "143", "--start-iteration", "0",
               "--last-iteration", "0", "--run-dir", str(run_dir)])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("stop: ") and out.count("\n") == 1
    note = json.loads((run_dir / "stage-notes" / "train.txt").read_text())
    assert note["job"] == "77" and "exited with code 1 first" in note["note"]
    # A retry leaves no note; status shows the exclusion or the restart count instead.
    other = tmp_path / "run2"
    main(["--log", str(FIXTURES / "killed-first.log"), "--rc", "137", "--start-iteration", "0",
          "--last-iteration", "0", "--run-dir", str(other)])
    assert capsys.readouterr().out.startswith("retry: ")
    assert not (other / "stage-notes").exists()


def test_the_trainers_own_cause_stays_first_in_the_note(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer said why it stopped (a checkpoint from a newer megatron-core) in this job's note:
    the stop decision is added after it, never in its place; another job's note is replaced."""
    from lingjun_slurm.injob.host import stagenotes

    run_dir = tmp_path / "run"
    monkeypatch.setenv("SLURM_JOB_ID", "76")
    stagenotes.write_note(str(run_dir), "train", "an earlier job's note")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    argv = ["--log", str(FIXTURES / "exit1-first.log"), "--rc", "143", "--start-iteration", "0",
            "--last-iteration", "0", "--run-dir", str(run_dir)]
    main(argv)
    note = json.loads((run_dir / "stage-notes" / "train.txt").read_text())["note"]
    assert "earlier job" not in note and "exited with code 1 first" in note
    cause = "cannot resume from /ckpt: iter_0000003: saved by megatron-core >= 0.19"
    stagenotes.write_note(str(run_dir), "train", cause)
    main(argv)
    capsys.readouterr()
    note = json.loads((run_dir / "stage-notes" / "train.txt").read_text())["note"]
    assert note.startswith(cause + "; ") and "exited with code 1 first" in note


def test_main_with_a_missing_log_and_hang_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = tmp_path / "hang.json"
    record.write_text('{"hang": true}')
    assert main(["--log", str(tmp_path / "nope.out"), "--rc", "143", "--start-iteration", "0",
                 "--last-iteration", "0", "--hang-record", str(record)]) == 0
    assert capsys.readouterr().out.startswith("retry: the hang watchdog")
    assert main(["--log", str(tmp_path / "nope.out"), "--rc", "1", "--start-iteration", "0",
                 "--last-iteration", "0", "--hang-record", str(tmp_path / "absent.json")]) == 0
    assert "could not be read" in capsys.readouterr().out


def test_runs_with_plain_python_and_the_standard_library_only(tmp_path: Path) -> None:
    """The batch host's python3 runs it with nothing installed (-S: no site-packages, -I: isolated)."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-S", "-c",
                           f"import sys; sys.path.insert(0, {str(root)!r}); import lingjun_slurm.injob.host.retry as r; "
                           "mods = [m for m in sys.modules if m.split('.')[0] not in sys.stdlib_module_names "
                           "and m.split('.')[0] not in ('lingjun_slurm', '__main__')]; print(mods)"],
                          capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_a_crash_blamed_on_a_node_retries_only_when_the_requeue_moves_away_from_it() -> None:
    """Every rank exited 1 (srun exit 1); the ECC line with its [rank1] prefix blames node2."""
    found = analysis("ecc-blamed.log")
    assert [f["node"] for f in found["found"]] == ["node2"]
    assert decide(rc=1, start_iteration=0, last_iteration=0, moved_away=True, analysis=found)[0]
    # The node could not be excluded (bound reached): the same nodes would fail the same way.
    retry, why = decide(rc=1, start_iteration=0, last_iteration=0, analysis=found)
    assert not retry and "task 1 on node2 exited with code 1 first" in why


REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real_pyxis_enroot" / "pyxis-0.24.0_enroot-4.1.2"


def test_a_step_that_could_not_start_anywhere_is_not_retried_even_when_srun_exits_0() -> None:
    """A SPANK plugin (pyxis) failing on every node: srun printed `task N launch failed` and exited
    0 (no task exit, so no exit code): not a clean exit to requeue after."""
    found = analysis("launch-spank-every-node.log")
    assert found["launch_failure"]["tasks"] == [0, 1] and found["found"] == []
    retry, why = decide(rc=0, start_iteration=0, last_iteration=0, analysis=found)
    assert not retry and "could not start" in why and "Slurmd could not execve job" in why


def test_a_binding_srun_refuses_is_not_a_signal() -> None:
    """slurmd refused the launch: srun exits 192 (128 + the low byte of the Slurm error code), which
    the old rule read as a signal and requeued."""
    retry, why = decide(rc=192, start_iteration=0, last_iteration=0,
                        analysis=blame(str(FIXTURES / "launch-cpu-bind.log"), 0, ["node1"]))
    assert not retry and "Unable to satisfy cpu bind request" in why


def test_real_pyxis_an_unknown_image_is_the_images_fault_not_a_nodes() -> None:
    """Real pyxis 0.24.0 + enroot 4.1.2: the import fails in task_init; srun says `Exited with exit
    code 1`, pyxis and enroot say why. Nobody is blamed, even when only one node's lines made it
    into the log (srun kills the others), and the job stops with enroot's error in the reason."""
    found = blame(str(REAL / "p07-unknown-image" / "stderr"), 0, ["node1", "node2"])
    assert found["found"] == []
    retry, why = decide(rc=1, start_iteration=0, last_iteration=0, analysis=found)
    assert not retry and "failed to import docker image" in why and "404 Not Found" in why


def test_real_pyxis_a_mount_source_missing_on_one_node_blames_that_node() -> None:
    """A shared directory missing on one node of two (real pyxis 0.24.0 output for that node): the
    node is blamed, so the requeue moves away from it."""
    found = blame(str(REAL / "p13-mount-missing-source" / "stderr"), 0, ["node1", "node2"])
    assert [(f["node"], f["source"]) for f in found["found"]] == [("node1", "launch")]
    assert "source path does not exist: /no/such/src" in found["found"][0]["reason"]
    assert decide(rc=1, start_iteration=0, last_iteration=0, moved_away=True, analysis=found)[0]


def test_a_collective_timeout_is_retried_like_a_hang() -> None:
    """torch's NCCL watchdog (Megatron-LM: 10 minutes, before the hang watchdog's 30) aborts every rank:
    a real log of every rank timing out (milabench#269) is retried, where a plain `Aborted` with no
    NCCL error (WeatherGenerator#1572) stays the program's crash."""
    crashlogs = Path(__file__).resolve().parents[1] / "fixtures" / "crashlogs"
    nccl = blame(str(crashlogs / "milabench_269_nccl_timeout.log"), 0)
    assert decide(rc=134, start_iteration=0, last_iteration=0, analysis=nccl) == (
        True, "step exit 134: a collective timed out (NCCL), as in a hang")
    aborted = blame(str(crashlogs / "weathergenerator_1572_srun_aborted.log"), 0)
    retry, why = decide(rc=134, start_iteration=0, last_iteration=0, analysis=aborted)
    assert not retry and "crashed first: Aborted" in why


def test_aborted_on_nccls_remote_errors_is_a_peers_or_the_networks_fault() -> None:
    first = {"node": "gpu2", "tasks": "8-15", "status": "Aborted (core dumped)", "at": 0, "unique": False}
    remote = {"first_failure": first, "not_blamed": [{"node": None, "class": "nccl-remote"}]}
    assert decide(rc=134, start_iteration=0, last_iteration=0, analysis=remote)[0]
    # An exit code first stays the program's, whatever NCCL said after it.
    first_exit = {**first, "status": "Exited with exit code 1"}
    assert not decide(rc=1, start_iteration=0, last_iteration=0, analysis={**remote, "first_failure": first_exit})[0]
