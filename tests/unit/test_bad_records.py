"""One bad record hurts one run (issue 26, item 3), through the real CLI with the local executor.

Two runs complete; then one record of the first is made hostile (an empty, truncated, `[]`,
wrong-shaped or non-UTF-8 local-state.json or manifest.json, a garbled marker) or deleted. `status`
(table and --json) shows every run, the bad one UNKNOWN with what is wrong and the fix; `report`
and `resubmit` of the other run work; a deleted local-state.json leaves a completed run COMPLETED
(from its jobs' markers), never PENDING.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.helpers import chain_spec, cli


def two_runs(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    env = {"LINGJUN_STATE_DIR": str(tmp_path / "state")}
    dirs = []
    for name in ("bad", "good"):
        spec = chain_spec(tmp_path / f"{name}.yaml", tmp_path / f"work-{name}",
                          [{"name": "a", "command": "echo a"}, {"name": "b", "command": "echo b"}], name=name)
        cli("submit", str(spec), "--executor", "local", "--run-id", f"{name}-1", env=env)
        dirs.append(tmp_path / f"work-{name}" / "runs" / f"{name}-1")
    return env, dirs[0], dirs[1]


STATE_CASES = {
    "empty": (b"", "local-state.json is empty"),
    "truncated": (b'{"schema": 1, "run_id": "bad-1", "tasks": [{"key": "1", "st', "local-state.json is truncated"),
    "list": (b"[]", "local-state.json is an empty list, not a JSON object"),
    "wrong-shape": (b'{"run_id": "bad-1", "tasks": {"key": "1"}}', "field tasks is an object, not a list"),
    "task-shape": (b'{"run_id": "bad-1", "tasks": [{"key": 1, "stage": "a", "job_id": "1", "state": "X"}]}',
                   "field tasks[0].key is a number, not a string"),
    "not-utf8": (b'{"run_id": "\xff\xfe"}', "local-state.json is not UTF-8 text"),
}
MANIFEST_CASES = {
    "empty": (b"", "manifest.json: not valid JSON"),
    "truncated": (b'{"schema": 1, "run_id": "bad-1", "na', "manifest.json: not valid JSON"),
    "list": (b"[]", "manifest schema None"),
    "wrong-shape": (b'{"schema": 1, "run_id": "bad-1"}', "Field required"),
    "not-utf8": (b"\xff\xfe{\x00", "manifest.json: not"),  # not UTF-8: not JSON either
    "deleted": (None, "no run manifest"),
}


def others_still_work(env: dict[str, str], good: Path, tmp_path: Path) -> None:
    cli("report", "good-1", "-o", str(tmp_path / "report"), env=env)
    assert (tmp_path / "report" / "index.html").is_file()
    out = cli("resubmit", "good-1", "--from", "b", env=env).stdout
    assert "b                3            COMPLETED" in out, out


def good_is_shown(doc: dict) -> None:
    good = next(r for r in doc["runs"] if r["run_id"] == "good-1")
    assert [s["state"] for s in good["stages"]] == ["COMPLETED", "COMPLETED"]


@pytest.mark.parametrize("case", sorted(STATE_CASES))
def test_a_bad_local_state_makes_its_run_unknown_only(tmp_path: Path, case: str) -> None:
    env, bad, good = two_runs(tmp_path)
    data, what = STATE_CASES[case]
    (bad / "local-state.json").write_bytes(data)
    table = cli("status", env=env).stdout
    assert "run good-1" in table and "run bad-1" in table, table
    doc = json.loads(cli("status", "--json", env=env).stdout)
    good_is_shown(doc)
    stages = next(r for r in doc["runs"] if r["run_id"] == "bad-1")["stages"]
    assert [s["state"] for s in stages] == ["UNKNOWN", "UNKNOWN"], stages
    reason = stages[0]["reason"]
    assert what in reason and f"rm {bad}/local-state.json" in reason and "lingjun-slurm forget bad-1" in reason, reason
    assert what in table, table
    # The bad run alone, named: shown, and its cancel / resubmit refuse clearly (never a traceback).
    assert json.loads(cli("status", "bad-1", "--json", env=env).stdout)["runs"][0]["stages"][0]["state"] == "UNKNOWN"
    assert what in cli("resubmit", "bad-1", "--from", "a", env=env, check=1).stderr
    others_still_work(env, good, tmp_path)


@pytest.mark.parametrize("case", sorted(MANIFEST_CASES))
def test_a_bad_manifest_makes_its_run_unknown_only(tmp_path: Path, case: str) -> None:
    env, bad, good = two_runs(tmp_path)
    data, what = MANIFEST_CASES[case]
    if data is None:
        (bad / "manifest.json").unlink()
    else:
        (bad / "manifest.json").write_bytes(data)
    table = cli("status", env=env).stdout
    assert "run good-1" in table and "run bad-1" in table and f"UNKNOWN: {bad}/manifest.json" in table, table
    assert "lingjun-slurm forget bad-1" in table, table
    doc = json.loads(cli("status", "--json", env=env).stdout)
    good_is_shown(doc)
    run = next(r for r in doc["runs"] if r["run_id"] == "bad-1")
    assert run["state"] == "UNKNOWN" and run["stages"] == [] and what in run["record_error"], run
    # Named with another run: both shown, then exit 1 for the one that cannot be read.
    named = cli("status", "bad-1", "good-1", "--json", env=env, check=1)
    good_is_shown(json.loads(named.stdout))
    assert what in named.stderr
    others_still_work(env, good, tmp_path)


def test_garbled_markers_do_not_hide_the_run(tmp_path: Path) -> None:
    env, bad, good = two_runs(tmp_path)
    (bad / "local-state.json").unlink()
    (bad / "jobs" / "1").write_text("start 1796429427 0 vm\nend x9 0\nstart\nend 1796429428 0\n")
    (bad / "jobs" / "2").write_bytes(b"start \xff\xfe 0 vm\n")
    doc = json.loads(cli("status", "--json", env=env).stdout)
    good_is_shown(doc)
    stages = next(r for r in doc["runs"] if r["run_id"] == "bad-1")["stages"]
    assert stages[0]["state"] == "COMPLETED", stages
    assert stages[1]["state"] == "UNKNOWN" and "local-state.json is missing" in stages[1]["reason"], stages
    others_still_work(env, good, tmp_path)


def test_a_deleted_local_state_leaves_a_completed_run_completed(tmp_path: Path) -> None:
    env, bad, _good = two_runs(tmp_path)
    (bad / "local-state.json").unlink()
    stages = json.loads(cli("status", "bad-1", "--json", env=env).stdout)["runs"][0]["stages"]
    assert [(s["state"], s["exit_code"]) for s in stages] == [("COMPLETED", 0), ("COMPLETED", 0)], stages
    # resubmit --from b keeps a as its marker says: COMPLETED, job 1, not run again.
    out = cli("resubmit", "bad-1", "--from", "b", env=env).stdout
    assert "a                1            COMPLETED" in out and "b                3            COMPLETED" in out, out
    assert "a                RUNNING" not in out, out
    (bad / "local-state.json").unlink()
    # A stage that never left a marker is not PENDING either: nothing will start it.
    for marker in (bad / "jobs").iterdir():
        marker.unlink()
    stages = json.loads(cli("status", "bad-1", "--json", env=env).stdout)["runs"][0]["stages"]
    assert [s["state"] for s in stages] == ["UNKNOWN", "UNKNOWN"], stages
    assert "local-state.json is missing and the stage left no marker" in stages[0]["reason"]
