"""A pre-flight the batch script gives up on leaves its cause for `status` (the train stage's note),
written by `python3 -m lingjun_slurm.injob.preflight.judge note` from the judge's verdict.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from lingjun_slurm.injob.host.stagenotes import read_note
from lingjun_slurm.injob.preflight.judge import failure_note
from tests.conftest import REPO


def test_the_note_names_the_job_wide_problem_first_else_the_first_bad_node() -> None:
    job_wide = {"problems": ["gpus fails on 2 of 2 nodes (n1: no GPU): most likely the spec", "second"],
                "bad_nodes": {"n3": "eth0 down"}}
    assert failure_note(job_wide) == ("pre-flight failed, not training: gpus fails on 2 of 2 nodes (n1: no GPU): "
                                      "most likely the spec (+1 more problems)")
    assert failure_note({"problems": [], "bad_nodes": {"n4": "x", "n3": "eth0 down"}}) == \
        "pre-flight failed, not training: node n3: eth0 down (+1 more nodes)"
    assert failure_note({}) == "pre-flight failed, not training: no bad node or problem recorded"


def _note(tmp_path: Path, verdict: Path, job: str = "77") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLURM_JOB_ID": job}
    env.pop("SLURM_PROCID", None)
    env.pop("RANK", None)
    return subprocess.run([sys.executable, "-m", "lingjun_slurm.injob.preflight.judge", "note", "--verdict",
                           str(verdict), "--run-dir", str(tmp_path / "run")], capture_output=True, text=True,
                          env=env, timeout=60)


def test_the_command_writes_the_train_note_for_this_job(tmp_path: Path) -> None:
    verdict = tmp_path / "verdict.json"
    verdict.write_text(json.dumps({"exit": 1, "bad_nodes": {"node1": "eth0 down (NCCL_SOCKET_IFNAME=eth0)"},
                                   "problems": []}))
    proc = _note(tmp_path, verdict)
    assert proc.returncode == 0, proc.stderr
    assert read_note(str(tmp_path / "run"), "train", ["77"]) == \
        "pre-flight failed, not training: node node1: eth0 down (NCCL_SOCKET_IFNAME=eth0)"
    assert read_note(str(tmp_path / "run"), "train", ["78"]) is None  # another job's row never shows it


def test_an_unreadable_verdict_still_leaves_a_note_and_exits_0(tmp_path: Path) -> None:
    proc = _note(tmp_path, tmp_path / "missing.json")
    assert proc.returncode == 0, proc.stderr
    note = read_note(str(tmp_path / "run"), "train", ["77"]) or ""
    assert note.startswith("pre-flight failed, not training: cannot read ") and "missing.json" in note


def test_the_template_writes_it_only_where_the_job_gives_up() -> None:
    text = (REPO / "slurm_templates" / "partials" / "faults.sh.j2").read_text()
    give_up = text.index('not training" >&2')
    assert text.count("lingjun_slurm.injob.preflight.judge note") == 1
    assert give_up < text.index("lingjun_slurm.injob.preflight.judge note") < text.index("exit 1", give_up)
    assert text.index("requeue_excluding") < give_up  # the requeue path leaves before: no stale note
