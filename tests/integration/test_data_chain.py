"""The built-in preprocess (array) -> merge chain, through the real CLI, on the test Slurm cluster
and with the local executor: the merged .bin/.idx equal the single-pass goldens byte for byte."""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from lingjun_slurm import __version__

from .helpers import all_ended, cli, submitted_run_id, wait_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


def data_spec(tmp_path: Path, shards: int = 2, commands: list[dict[str, Any]] | None = None) -> Path:
    corpus = tmp_path / "corpus"
    shutil.copytree(FIXTURES / "corpus", corpus)
    doc: dict[str, Any] = {
        "version": 1,
        "run": {"name": "data", "workdir": str(tmp_path / "work")},
        "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": "cpu", "time": "00:05:00"}},
        "container": {"runtime": "none"},
        "data": {"inputs": [str(corpus / "*.jsonl")], "json_keys": ["text", "title"], "shards": shards, "workers": 1,
                 "tokenizer": {"type": "huggingface", "path": str(FIXTURES / "tokenizers" / "hf" / "tokenizer.json")}},
        "stages": {"train": {"skip": True}, "checkpoint": {"skip": True}, **({"commands": commands} if commands else {})},
    }
    path = tmp_path / "data.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def assert_golden(tmp_path: Path) -> None:
    out = tmp_path / "work" / "data"
    for key in ("text", "title"):
        for ext in ("bin", "idx"):
            got = out / f"corpus_{key}_document.{ext}"
            want = FIXTURES / "golden" / "hf" / f"corpus_{key}_document.{ext}"
            assert filecmp.cmp(got, want, shallow=False), f"{got} differs from {want}"


@pytest.mark.slurm
def test_preprocess_array_and_merge_on_slurm(tmp_path: Path, slurm_cluster: Any) -> None:
    env = {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}
    run_id = submitted_run_id(cli("submit", str(data_spec(tmp_path)), "--executor", "slurm", env=env).stdout)
    stages = wait_for(run_id, env, all_ended, timeout=120)
    assert stages["preprocess"]["state"] == "COMPLETED" and stages["merge"]["state"] == "COMPLETED", stages
    assert_golden(tmp_path)
    log = cli("logs", run_id, "preprocess", "--task", "1", env=env).stdout
    assert "shard 1" in log.lower() or "shard_00001" in log
    # The code the jobs ran is the wheel shipped into the run directory at submit.
    run_dir = tmp_path / "work" / "runs" / run_id
    assert f"lingjun_slurm {__version__} from {run_dir}/site/lingjun_slurm" in log
    manifest = __import__("json").loads((run_dir / "manifest.json").read_text())
    assert manifest["shipped"] == [f"lingjun_slurm-{__version__}-py3-none-any.whl"]


def test_preprocess_and_merge_with_the_local_executor(tmp_path: Path) -> None:
    env = {"LINGJUN_STATE_DIR": str(tmp_path / "state")}
    spec = data_spec(tmp_path)
    proc = cli("submit", str(spec), "--executor", "local", env=env)
    assert_golden(tmp_path)
    # A rerun of the same chain skips the finished shards (resume) and gives the same bytes.
    run2 = cli("submit", str(spec), "--executor", "local", env=env)
    run_id = submitted_run_id(run2.stdout)
    assert "skip" in cli("logs", run_id, "preprocess", env=env).stdout.lower()
    assert_golden(tmp_path)
    assert proc.returncode == 0


def test_one_shard_has_no_merge_job_and_the_preprocess_task_writes_the_outputs(tmp_path: Path) -> None:
    """shards: 1 -> no merge stage (plan.merge_in_preprocess): the preprocess task merges (hard links),
    a command `after: merge` waits on preprocess, and the outputs equal the goldens; a rerun skips both."""
    import json

    env = {"LINGJUN_STATE_DIR": str(tmp_path / "state")}
    spec = data_spec(tmp_path, shards=1, commands=[{"name": "after-merge", "after": "merge", "command": "true"}])
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", env=env).stdout)
    plan = json.loads((tmp_path / "work" / "runs" / run_id / "plan.json").read_text())
    stages = {st["name"]: st for st in plan["stages"]}
    assert "merge" not in stages and plan["settings"]["data"]["merge_in_preprocess"] is True
    assert [d["stage"] for d in stages["after-merge"]["depends_on"]] == ["preprocess"]
    assert_golden(tmp_path)
    out = tmp_path / "work" / "data"
    assert (out / "corpus.shards" / "merge.done").is_file()
    assert (out / "corpus_text_document.bin").stat().st_ino == (
        out / "corpus.shards" / "shard_00000_text_document.bin").stat().st_ino
    run2 = submitted_run_id(cli("submit", str(spec), "--executor", "local", env=env).stdout)
    log = cli("logs", run2, "preprocess", env=env).stdout
    assert "already done" in log and "merge: already done" in log, log
    assert_golden(tmp_path)
