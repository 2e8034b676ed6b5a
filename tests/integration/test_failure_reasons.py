"""Issue 26 item 6: every failure says why, in `status`. The real stages fail through the local
executor and `status --json` shows the cause in the stage's REASON, not "NonZeroExitCode":
a preprocess input glob that matches no file, a tokenizer file that is gone, and the hang
watchdog's kill of a stopped training rank (lingjun_slurm/injob/host/stagenotes.py, docs/status-reasons.md)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from .faults import last_iteration, ranks, train_spec, wait_until
from .helpers import all_ended, cli, submitted_run_id, wait_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


def _data_spec(tmp_path: Path, inputs: list[str], tokenizer: str, before: str) -> Path:
    doc: dict[str, Any] = {
        "version": 1,
        "run": {"name": "why", "workdir": str(tmp_path / "work")},
        "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": "cpu", "time": "00:05:00"}},
        "container": {"runtime": "none"},
        "data": {"inputs": inputs, "shards": 2, "workers": 1,
                 "tokenizer": {"type": "huggingface", "path": tokenizer}},
        # A command before preprocess, as examples/tiny-gpt.yaml's make-corpus: the files it may
        # write are not checked at submit (spec/checks.py check_local_paths), so the stage meets it.
        "stages": {"train": {"skip": True}, "checkpoint": {"skip": True},
                   "commands": [{"name": "prepare", "before": "preprocess", "container": False, "command": before}]},
    }
    path = tmp_path / "why.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _env(tmp_path: Path) -> dict[str, str]:
    return {"LINGJUN_STATE_DIR": str(tmp_path / "state")}


def test_a_missing_input_is_the_preprocess_reason(tmp_path: Path) -> None:
    pattern = str(tmp_path / "nowhere" / "*.jsonl")
    tok = str(FIXTURES / "tokenizers" / "hf" / "tokenizer.json")
    env = _env(tmp_path)
    run_id = submitted_run_id(cli("submit", str(_data_spec(tmp_path, [pattern], tok, "true")), "--executor", "local",
                                  env=env, check=1).stdout)
    stages = wait_for(run_id, env, all_ended)
    assert stages["preprocess"]["state"] == "FAILED", stages
    assert stages["preprocess"]["reason"] == f"input {pattern!r} matches no file", stages["preprocess"]
    assert stages["merge"]["reason"].startswith("DependencyNeverSatisfied"), stages["merge"]


def test_a_missing_tokenizer_file_is_the_preprocess_reason(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(FIXTURES / "corpus", corpus)
    tok = tmp_path / "tok" / "tokenizer.json"
    tok.parent.mkdir()
    shutil.copy(FIXTURES / "tokenizers" / "hf" / "tokenizer.json", tok)
    env = _env(tmp_path)
    spec = _data_spec(tmp_path, [str(corpus / "*.jsonl")], str(tok), f"rm -f {shlex.quote(str(tok))}")
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", env=env, check=1).stdout)
    stages = wait_for(run_id, env, all_ended)
    assert stages["preprocess"]["state"] == "FAILED", stages
    assert stages["preprocess"]["reason"] == (f"tokenizer file {str(tok)!r} (huggingface tokenizer.json, "
                                              "data.tokenizer.path) does not exist"), stages["preprocess"]


def test_the_watchdogs_kill_is_the_train_reason(tmp_path: Path) -> None:
    """The real watchdog beside a real local train step: SIGSTOP on the only rank after its first
    iterations; after hang_timeout the watchdog ends the step and says why."""
    spec = train_spec(tmp_path, "hang", nodes=1, iterations=400, save_interval=1000, hang_timeout=10,
                      preflight=False, max_restarts=0)
    env = _env(tmp_path)
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", "--detach", env=env).stdout)
    run_dir = tmp_path / "hang" / "runs" / run_id
    wait_until(lambda: last_iteration(run_dir) >= 3 and ranks(run_dir).get(0), 240, "rank 0 past iteration 3")
    _node, pid = ranks(run_dir)[0]
    os.kill(pid, signal.SIGSTOP)
    try:
        stages = wait_for(run_id, env, all_ended, timeout=120)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    train = stages["train"]
    assert train["state"] == "FAILED", stages
    at = last_iteration(run_dir)
    hang = f"hang: no iteration for 10 s at iteration {at}; the watchdog ended the step"
    assert hang in (train["reason"] or ""), train


@pytest.mark.slurm
def test_on_slurm_the_preprocess_task_leaves_its_cause_for_status(tmp_path: Path, slurm_cluster: Any) -> None:
    """The same failure on the test Slurm cluster: every array task has its own SLURM_JOB_ID, and the
    note carries the array's job id, the one the run's manifest (and so `status`) knows."""
    import json

    pattern = str(tmp_path / "nowhere" / "*.jsonl")
    tok = str(FIXTURES / "tokenizers" / "hf" / "tokenizer.json")
    env = {**slurm_cluster.env, **_env(tmp_path)}
    spec = _data_spec(tmp_path, [pattern], tok, "true")
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    stages = wait_for(run_id, env, all_ended, timeout=120)
    assert stages["preprocess"]["state"] == "FAILED", stages
    run_dir = tmp_path / "work" / "runs" / run_id
    note = json.loads((run_dir / "stage-notes" / "preprocess.txt").read_text())
    assert (note["job"], note["note"]) == (stages["preprocess"]["job_ids"][0], f"input {pattern!r} matches no file")
