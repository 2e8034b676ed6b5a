"""Runs on the real test Slurm cluster that several tests look at, each at different things of the
same run: made once per session (tests/integration/conftest.py makes them fixtures there, so that
every module shares one; a fixture imported into two test modules would run once per module).

killed_rank_run: a DP=2 builtin training (tests/integration/faults.py train_spec, pre-flight on)
whose rank 1 is SIGKILLed a few iterations after its first checkpoint; srun ends the step, the
script requeues, the next attempt resumes and completes. tests/integration/test_faults_slurm.py
looks at the recovery (no node blamed), tests/integration/test_goodput_slurm.py at its goodput
ledger; before, each made its own run of this (28 s and 36 s in CI). It runs in a thread
(killed_rank_started), started by test_faults_slurm.py's hang test when either of them will run
(start_early), so that its waits overlap that test's; killed_rank_run waits for it.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from .faults import last_iteration, train_spec, wait_for_rank
from .helpers import all_ended, cli, submitted_run_id, wait_for

SAVE = 10


@dataclass(frozen=True)
class KilledRankRun:
    env: dict[str, str]                  # the cluster's env and this run's own LINGJUN_STATE_DIR
    work: Path                           # the run's workdir (runs/, logs/, checkpoints/)
    run_id: str
    run_dir: Path
    at: int                              # the last iteration logged when rank 1 was killed
    stages: dict[str, dict[str, Any]]    # `status --json`'s stages once every stage had ended
    save_interval: int = SAVE


# The tests that look at killed_rank_run: a test before them may start it early (start_early).
KILLED_RANK_TESTS = ("test_a_killed_rank_requeues_and_resumes",
                     "test_a_requeued_run_has_its_lost_work_and_requeue_gap_and_buckets_summing_to_slurms_allocation")


class Background:
    """fn() in a thread; result() waits for it and returns its value or raises its exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(fn,), name="shared-run", daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test that waits for it
            self._error = exc

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def start_early(request: pytest.FixtureRequest, fixture: str, tests: tuple[str, ...]) -> None:
    """Start a shared run now, in the background, when a test of this session will look at it: a test
    that mostly waits (a hang timeout, a requeue) names this so the shared run's own waits overlap it."""
    if any(item.name in tests for item in request.session.items):
        request.getfixturevalue(fixture)


@pytest.fixture(scope="session")
def killed_rank_started(slurm_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Background:
    tmp = tmp_path_factory.mktemp("killed-rank")
    return Background(lambda: _killed_rank(slurm_cluster, tmp))


@pytest.fixture(scope="session")
def killed_rank_run(killed_rank_started: Background) -> KilledRankRun:
    return killed_rank_started.result()


def _killed_rank(slurm_cluster: Any, tmp: Path) -> KilledRankRun:
    env = {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp / "state")}
    # SAVE + 3: iterations resumed+1..at then run twice (the ledger's lost work is > 0).
    spec = train_spec(tmp, "killed", iterations=30, save_interval=SAVE, hang_timeout=60, preflight=True)
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    run_dir = tmp / "killed" / "runs" / run_id
    _, pid = wait_for_rank(run_dir, 1, SAVE + 3, timeout=480)
    at = last_iteration(run_dir)
    os.kill(pid, signal.SIGKILL)
    stages = wait_for(run_id, env, all_ended, timeout=400)
    return KilledRankRun(env=env, work=tmp / "killed", run_id=run_id, run_dir=run_dir, at=at, stages=stages)
