"""Locks that match what is shared (issue 26, item 4), with the local executor, through the real CLI:
two specs with different workdirs and one checkpoint.dir cannot train into it at once (the second
is refused up front, naming the holder); the lock goes when the run ends; `resubmit` of a local
run that still runs is refused with its holder unless --force, which says what it stops; `forget`
of a live run is refused. Slurm runs: tests/cluster/test_ckpt_lock_slurm.py."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from lingjun_slurm.common.holderlock import read_holder
from tests.integration.helpers import PY, chain_spec, cli, submitted_run_id, wait_for


def ckpt_spec(path: Path, workdir: Path, ckpt: Path, command: str, name: str) -> Path:
    """A command stage `hold`, then the built-in checkpoint stage: a chain that writes into ckpt."""
    doc: dict[str, Any] = {
        "version": 1, "run": {"name": name, "workdir": str(workdir)},
        "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": "cpu", "time": "00:05:00"}},
        "container": {"runtime": "none"}, "checkpoint": {"dir": str(ckpt)},
        "stages": {"preprocess": {"skip": True}, "merge": {"skip": True}, "train": {"skip": True},
                   "commands": [{"name": "hold", "command": command, "before": "checkpoint"}]},
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def waiting(go: Path) -> str:
    return f"for i in $(seq 600); do test -e {go} && exit 0; sleep 0.2; done; exit 9"


def test_one_checkpoint_dir_is_trained_into_by_one_run_at_a_time(tmp_path: Path) -> None:
    env = {"LINGJUN_STATE_DIR": str(tmp_path / "state"), "LINGJUN_LOCAL_KILL_GRACE_S": "2"}
    ckpt, go = tmp_path / "ckpt", tmp_path / "go"
    first = ckpt_spec(tmp_path / "a.yaml", tmp_path / "wa", ckpt, waiting(go), "a")
    second = ckpt_spec(tmp_path / "b.yaml", tmp_path / "wb", ckpt, "true", "b")
    run = submitted_run_id(cli("submit", str(first), "--executor", "local", "--detach", env=env).stdout)
    wait_for(run, env, lambda s: s["hold"]["state"] == "RUNNING")
    holder = read_holder(ckpt / "checkpoint.lock")
    assert holder is not None and holder.run_id == run and holder.run_dir == str(tmp_path / "wa" / "runs" / run)

    # Another workdir, the same checkpoint.dir: refused before anything is written, naming the holder.
    refused = cli("submit", str(second), "--executor", "local", env=env, check=1).stderr
    assert f"checkpoint directory {ckpt} is in use by run {run}: pid {holder.pid} on {socket.gethostname()}" \
        in refused, refused
    assert "another checkpoint.dir" in refused and not (tmp_path / "wb" / "runs").exists()

    # The run still runs: resubmit is refused with its holder, forget too.
    said = cli("resubmit", run, "--from", "hold", env=env, check=1).stderr
    assert f"run {run} is still running: its local runner pid {holder.pid} on {socket.gethostname()}, " \
           "running stage hold (pid" in said and "--force" in said, said
    said = cli("forget", run, env=env, check=2).stderr
    assert f"run {run} is still running" in said and "nothing was forgotten" in said, said
    assert run in cli("list", env=env).stdout

    # --force says what it stops, then runs the stages again.
    path = f"{os.path.dirname(PY)}{os.pathsep}{os.environ.get('PATH', '')}"
    proc = subprocess.Popen([PY, "-m", "lingjun_slurm.cli", "resubmit", run, "--from", "hold", "--force"],
                            env={**os.environ, "PATH": path, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = read_holder(ckpt / "checkpoint.lock")
        if now is not None and now.pid not in (holder.pid,):
            break
        time.sleep(0.2)
    go.touch()
    out, err = proc.communicate(timeout=120)
    assert f"--force: stopping run {run} first: its local runner pid {holder.pid}" in out, out + err
    assert f"--force: stopped runner pid {holder.pid}" in out, out + err
    assert "hold           COMPLETED" in out, out + err

    # Ended (the checkpoint stage fails: no checkpoint yet): both locks are gone, the other spec runs.
    assert not (ckpt / "checkpoint.lock").exists() and not (tmp_path / "wa" / "run.lock").exists()
    out = cli("submit", str(second), "--executor", "local", env=env, check=1).stdout
    assert "hold           COMPLETED" in out, out
    assert not (ckpt / "checkpoint.lock").exists()


def test_a_chain_without_train_or_checkpoint_takes_no_checkpoint_lock(tmp_path: Path) -> None:
    env = {"LINGJUN_STATE_DIR": str(tmp_path / "state")}
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "w", [{"name": "a", "command": "true"}])
    cli("submit", str(spec), "--executor", "local", env=env)
    assert not (tmp_path / "w" / "checkpoints").exists()
