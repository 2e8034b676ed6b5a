"""Issue 26 item 7: a workdir deleted while a local run goes ends that run FAILED with "workdir ...
vanished", said by submit and kept in this machine's copy of runs (runs/mirror.py), never an
internal error, and the deleted directory is not made again."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

from .helpers import PY, chain_spec


def test_a_workdir_deleted_mid_run_ends_the_run_failed(tmp_path: Path) -> None:
    work = tmp_path / "work"
    spec = chain_spec(tmp_path / "s.yaml", work, [{"name": "slow", "command": "sleep 30"},
                                                  {"name": "after", "command": "true"}], name="gone")
    state = tmp_path / "state"

    def delete_when_running() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            logs = list((work / "logs").glob("*slow*")) if (work / "logs").is_dir() else []
            if logs:
                break
            time.sleep(0.05)
        while work.exists() and time.monotonic() < deadline:  # the runner may write a file meanwhile
            subprocess.run(["rm", "-rf", str(work)], capture_output=True)

    thread = threading.Thread(target=delete_when_running, daemon=True)
    thread.start()
    started = time.monotonic()
    proc = subprocess.run([PY, "-m", "lingjun_slurm.cli", "submit", str(spec), "--executor", "local"],
                          env={"PATH": "/usr/bin:/bin", "LINGJUN_STATE_DIR": str(state),
                               "LINGJUN_LOCAL_KILL_GRACE_S": "2"}, capture_output=True, text=True, timeout=60)
    thread.join(5)
    assert time.monotonic() - started < 25, "the run went on after its workdir vanished"
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert f"workdir {work} vanished" in proc.stdout, proc.stdout
    assert proc.stderr.startswith(f"run gone-") and f"FAILED: workdir {work} vanished" in proc.stderr, proc.stderr
    assert not work.exists(), "the runner made the deleted workdir again"
    (copy,) = (state / "runs").iterdir()
    doc = json.loads((copy / "status.json").read_text())["run"]
    stages = {s["name"]: s for s in doc["stages"]}
    assert stages["slow"]["state"] == "FAILED" and f"workdir {work} vanished" in stages["slow"]["reason"]
    assert stages["after"]["state"] == "CANCELLED" and "vanished" in stages["after"]["reason"]
    # `status` shows the run as it ended, from the copy kept here, with where its directory went.
    shown = subprocess.run([PY, "-m", "lingjun_slurm.cli", "status", "--json"],
                           env={"PATH": "/usr/bin:/bin", "LINGJUN_STATE_DIR": str(state)},
                           capture_output=True, text=True, timeout=60)
    assert "Traceback" not in shown.stderr and "skipping run" not in shown.stderr, shown.stderr
    (run,) = json.loads(shown.stdout)["runs"]
    assert f"{work}/runs/" in run["dir_gone"] and "is gone" in run["dir_gone"]
    stages = {s["name"]: s for s in run["stages"]}
    assert stages["slow"]["state"] == "FAILED" and f"workdir {work} vanished" in stages["slow"]["reason"]
    table = subprocess.run([PY, "-m", "lingjun_slurm.cli", "status"],
                           env={"PATH": "/usr/bin:/bin", "LINGJUN_STATE_DIR": str(state), "COLUMNS": "200"},
                           capture_output=True, text=True, timeout=60)
    assert "GONE: its run directory" in table.stdout and "vanished" in table.stdout, (table.stdout, table.stderr)
