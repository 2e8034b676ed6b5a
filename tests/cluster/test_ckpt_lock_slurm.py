"""The checkpoint directory's lock with Slurm runs (issue 26, item 4), on the real test cluster: a
chain that trains holds <checkpoint.dir>/checkpoint.lock through its job ids as it holds its
workdir (one squeue judges them); a second spec with another workdir and the same checkpoint.dir
is refused before any sbatch, naming the holder, by the Slurm and the local executor alike; once
the chain is cancelled the lock is gone and the second spec runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lingjun_slurm.common.holderlock import read_holder
from tests.integration.helpers import all_ended, cli, submitted_run_id, wait_for
from tests.integration.test_locks_local import ckpt_spec, waiting

pytestmark = pytest.mark.slurm


def test_a_slurm_chain_holds_its_checkpoint_dir(slurm_cluster: Any, tmp_path: Path) -> None:
    env = {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}
    ckpt = tmp_path / "ckpt"
    first = ckpt_spec(tmp_path / "a.yaml", tmp_path / "wa", ckpt, waiting(tmp_path / "never"), "a")
    second = ckpt_spec(tmp_path / "b.yaml", tmp_path / "wb", ckpt, "true", "b")
    run = submitted_run_id(cli("submit", str(first), "--executor", "slurm", env=env).stdout)
    manifest = json.loads((tmp_path / "wa" / "runs" / run / "manifest.json").read_text())
    ids = [j for st in manifest["stages"] for j in st["job_ids"]]
    holder = read_holder(ckpt / "checkpoint.lock")
    assert holder is not None and holder.run_id == run and list(holder.jobs) == ids
    for executor in ("slurm", "local"):
        refused = cli("submit", str(second), "--executor", executor, env=env, check=1).stderr
        assert f"checkpoint directory {ckpt} is in use by run {run}: Slurm jobs {', '.join(ids)} (Slurm chain)" \
            in refused, refused
        assert "Slurm says job(s)" in refused and not (tmp_path / "wb" / "runs").exists()
    # Cancelled: the jobs are gone, cancel removes both locks, and the other spec's chain is queued.
    cli("cancel", run, env=env)
    wait_for(run, env, all_ended)
    assert not (ckpt / "checkpoint.lock").exists() and not (tmp_path / "wa" / "run.lock").exists()
    other = submitted_run_id(cli("submit", str(second), "--executor", "slurm", env=env).stdout)
    assert read_holder(ckpt / "checkpoint.lock").run_id == other
    wait_for(other, env, all_ended, timeout=120)
