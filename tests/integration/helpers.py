"""Helpers for tests that drive the real CLI against the test Slurm cluster or the local executor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

PY = sys.executable


def cli(*args: str, env: dict[str, str], timeout: float = 120, check: Optional[int] = 0) -> subprocess.CompletedProcess[str]:
    """Run `lingjun-slurm ARGS` as a user would (a fresh process); assert the exit code."""
    # As a user with the venv activated: sbatch exports PATH, so jobs' python3 is the venv's.
    path = f"{os.path.dirname(PY)}{os.pathsep}{os.environ.get('PATH', '')}"
    proc = subprocess.run([PY, "-m", "lingjun_slurm.cli", *args], env={**os.environ, "PATH": path, **env},
                          capture_output=True, text=True, timeout=timeout)
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def chain_spec(path: Path, workdir: Path, commands: list[dict[str, Any]], name: str = "chain",
               extra: Optional[dict[str, Any]] = None) -> Path:
    """A spec whose stages are all `command` stages (the built-ins skipped), chained a -> b -> ..."""
    stages: dict[str, Any] = {s: {"skip": True} for s in ("preprocess", "merge", "train", "checkpoint")}
    cmds = []
    for i, c in enumerate(commands):
        item = dict(c)
        if "before" not in item and "after" not in item:
            if i == 0:
                item["before"] = "preprocess"
            else:
                item["after"] = commands[i - 1]["name"]
        cmds.append(item)
    stages["commands"] = cmds
    doc: dict[str, Any] = {
        "version": 1,
        "run": {"name": name, "workdir": str(workdir)},
        "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": "cpu", "time": "00:05:00"}},
        "container": {"runtime": "none"},
        "stages": stages,
    }
    for key, value in (extra or {}).items():
        doc[key] = value
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def submitted_run_id(stdout: str) -> str:
    for line in stdout.splitlines():
        for lead in ("submitted run ", "running ", "started run "):
            if line.startswith(lead):
                return line[len(lead):].split()[0]
    raise AssertionError(f"no run id in:\n{stdout}")


def status(run_id: str, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    doc = json.loads(cli("status", run_id, "--json", env=env).stdout)
    assert doc["schema"] == 1
    return {s["name"]: s for s in doc["runs"][0]["stages"]}


def wait_for(run_id: str, env: dict[str, str], pred: Callable[[dict[str, dict[str, Any]]], bool],
             timeout: float = 90) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    last: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        last = status(run_id, env)
        if pred(last):
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out; last status: {json.dumps(last, indent=1)}")


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "NOT_SUBMITTED")


def all_ended(stages: dict[str, dict[str, Any]]) -> bool:
    return all(s["state"] in ENDED for s in stages.values())
